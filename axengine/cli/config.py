"""``ax config show``: the effective configuration and where each value comes from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from axengine.cli._common import EXIT_OK, add_home, fail, flags_of
from axengine.settings import SettingsError, load_settings

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "config", help="show the effective configuration",
        description="The configuration layer: flags > AX_* environment > ax.toml > "
                    "defaults (docs/configuration.md).")
    sub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = sub.add_parser(
        "show", help="every setting, its value (secrets masked) and its source",
        description="Print every setting with its value and where it comes from: "
                    "default, the ax.toml file and line, the AX_* variable, or flag. "
                    "Secrets are masked.")
    add_home(show)
    show.add_argument("--store", help="as for ax server / ax api")
    show.add_argument("--queue", help="as for ax server / ax api")
    show.add_argument("--blobs", metavar="DIR", help="as for ax server / ax api")
    show.add_argument("--prefix", help="as for ax server / ax api")
    show.add_argument("--json", action="store_true",
                      help='one JSON object: {"config_file", "settings": {key: '
                           '{"value", "source"}}}')
    show.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    try:
        loaded = load_settings(flags=flags_of(args))
    except SettingsError as exc:
        return fail(str(exc))
    rows = loaded.rows()
    if args.json:
        print(json.dumps({
            "config_file": str(loaded.config_file) if loaded.config_file else None,
            "settings": {key: {"value": value, "source": source}
                         for key, value, source in rows},
        }, indent=2, default=str))
        return EXIT_OK
    print(f"# config file: {loaded.config_file or '(none)'}")
    width = max(len(key) for key, _, _ in rows)
    for key, value, source in rows:
        shown = "-" if value is None else json.dumps(value, default=str)
        print(f"{key:<{width}}  {shown}  ({source})")
    return EXIT_OK
