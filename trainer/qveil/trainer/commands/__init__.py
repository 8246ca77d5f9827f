"""The trainer's command-line modules, one per `qveil` subcommand, named after it (train,
evaluate, and dataset collect: collect)."""
