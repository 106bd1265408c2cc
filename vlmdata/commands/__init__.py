"""Subcommands of the `vlmdata` CLI, one module each."""
