"""The client's command-line module, named after its `qveil` subcommand (query)."""
