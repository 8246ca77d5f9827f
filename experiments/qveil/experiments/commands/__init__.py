"""The command-line module of `qveil experiments`."""
