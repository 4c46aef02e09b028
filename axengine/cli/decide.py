"""``ax approve|reject TASK NODE``: decide a human gate (who, when and a comment)."""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from axengine.cli._common import EXIT_FAILED, EXIT_OK, add_home, fail
from axengine.cli._runtime import with_engine
from axengine.errors import Conflict, InputError, NotFound


def register(sub: Any) -> None:
    for decision in ("approve", "reject"):
        p = sub.add_parser(decision, help=f"{decision} a waiting human gate")
        p.add_argument("task")
        p.add_argument("node", help="the human_gateway node")
        p.add_argument("--comment", "-m", default="")
        p.add_argument("--by", default=None, help="who decides (default: your user name)")
        add_home(p)
        p.set_defaults(func=cmd_decide, decision=decision)


def cmd_decide(args: argparse.Namespace) -> int:
    by = args.by or getpass.getuser()
    try:
        result = with_engine(args, lambda e: e.decide(args.task, args.node,
                                                       decision=args.decision, by=by,
                                                       comment=args.comment))
    except (NotFound, InputError, Conflict) as exc:
        return fail(str(exc), EXIT_FAILED)
    word = "approved" if args.decision == "approve" else "rejected"
    if result == "already-done":
        print(f"{args.node} was already {word}")
    else:
        home = f" --home {args.home}" if args.home else ""
        print(f"{args.node} {word} by {by}; continue with: ax run --resume {args.task}{home}")
    return EXIT_OK
