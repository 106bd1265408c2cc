"""`vlmdata` command line: one subcommand per capability, each defined in a module of `vlmdata.cli`.

Applications built on the library add subcommands through the `vlmdata.commands`
entry-point group (each entry names a `register(subparsers)` function); this is how
`vlmdata demo`, which lives in the `pipelines` application, joins the CLI without the
library importing the application.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from importlib.metadata import entry_points

# Each module defines `register(subparsers)`, which adds its subcommand and sets
# `func(args) -> int` as the handler.
COMMAND_MODULES = ("shard", "index", "retokenize", "inspect_dataset", "show", "tune", "cache_daemon", "dashboard")
PLUGIN_GROUP = "vlmdata.commands"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every built-in and plugged-in subcommand."""
    parser = argparse.ArgumentParser(prog="vlmdata", description="Multimodal data pipeline for VLM training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"vlmdata.cli.{name}").register(sub)
    for entry in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        entry.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
