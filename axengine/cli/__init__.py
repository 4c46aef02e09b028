"""The ``ax`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` (the exit
code). ``main`` only assembles them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

# Imported, not looked up by name: a command module that fails to import is an error
# of `ax` itself, never a command quietly missing from `ax --help`.
from axengine.cli import decide, executor, graph, k8s, run, services, snapshot, tasks, validate

__all__ = ["main"]

#: The ``register(subparsers)`` of every sub-command module, in help order.
COMMANDS: tuple[Callable[[Any], None], ...] = (
    validate.register,
    graph.register,
    run.register,
    tasks.register,
    decide.register,
    snapshot.register,
    services.register,
    executor.register,
    k8s.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ax", description="ax: a durable DAG workflow engine for agentic work"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
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
