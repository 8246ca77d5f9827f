"""The server's command-line modules, one per `qveil` subcommand, named after it (serve, admin,
budget, audit), and the flags they share."""
