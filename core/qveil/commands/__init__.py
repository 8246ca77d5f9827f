"""The command-line modules of core, one per `qveil` subcommand, named after it (noise, dataset,
inspect, privacy)."""
