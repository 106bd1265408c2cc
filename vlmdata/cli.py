"""`vlmdata` command line: one subcommand per capability, each defined in vlmdata/commands/."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Each module defines `register(subparsers)`, which adds its subcommand and sets
# `func(args) -> int` as the handler.
COMMAND_MODULES = ("shard", "index", "inspect", "tune", "cache_daemon", "dashboard", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlmdata", description="Multimodal data pipeline for VLM training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"vlmdata.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"vlmdata.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
