"""The ``ax`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` (the exit
code). ``main`` only assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

#: Modules of this package that register sub-commands, in help order.
COMMAND_MODULES: tuple[str, ...] = (
    "validate",
    "graph",
    "run",
    "tasks",
    "decide",
    "snapshot",
    "services",
    "executor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ax", description="ax: a durable DAG workflow engine for agentic work"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"axengine.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"axengine.cli.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ax`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
