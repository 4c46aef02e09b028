"""The ``ax`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` (the exit
code). ``main`` only assembles them, with the global options ``--config FILE`` (the
ax.toml of this run, see docs/configuration.md) and ``--version``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# Imported, not looked up by name: a command module that fails to import is an error
# of `ax` itself, never a command quietly missing from `ax --help`.
from axengine.cli import (
    config,
    decide,
    executor,
    graph,
    inbox,
    k8s,
    replays,
    run,
    services,
    simulate,
    snapshot,
    tasks,
    validate,
)
from axengine.errors import AxError
from axengine.limits import is_utf8
from axengine.settings import CONFIG_ENV, SettingsError, use_config_file

__all__ = ["main"]

#: The ``register(subparsers)`` of every sub-command module, in help order.
COMMANDS: tuple[Callable[[Any], None], ...] = (
    validate.register,
    graph.register,
    run.register,
    tasks.register,
    decide.register,
    inbox.register,
    snapshot.register,
    replays.register,
    services.register,
    executor.register,
    k8s.register,
    simulate.register,
    config.register,
)


def package_version() -> str:
    """The installed version of the ``axengine`` distribution."""
    try:
        return version("axengine")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ax", description="ax: a durable DAG workflow engine for agentic work"
    )
    parser.add_argument("--version", action="version", version=f"ax {package_version()}")
    parser.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                        help=f"settings file of this run (default: ${CONFIG_ENV}, else "
                             f"./ax.toml when present); see docs/configuration.md")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ax`` console script; returns the exit code."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.config_file is not None and not Path(args.config_file).is_file():
        print(f"ax: error: --config {args.config_file}: no such file", file=sys.stderr)
        return 2
    use_config_file(args.config_file)
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"ax: error: {exc}", file=sys.stderr)
        return 2
    except AxError as exc:
        # What a command did not answer itself (a store that cannot be opened, say):
        # one line, as every other refusal, not a traceback.
        print(f"ax: error: {exc}", file=sys.stderr)
        return 1
    except UnicodeEncodeError:
        # Bytes that are not UTF-8 in an argument (the shell passes them on; Python keeps
        # them as lone surrogates) fit a file name, never a task, node or DAG name.
        bad = next((a for a in argv if not is_utf8(a)), None)
        if bad is None:
            raise
        print(f"ax: error: argument {ascii(bad)[:80]} is not UTF-8 text: task ids, node "
              "ids, names and labels are", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        use_config_file(None)
