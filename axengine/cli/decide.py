"""``ax approve|reject TASK NODE``: decide a human gate (who, when and a comment);
``ax resume TASK NODE [--data JSON]``: resume a node its handler paused.

On the local store the decision is recorded ``by`` ``--by`` or your user name; with
``--server`` the server records the name of the token.
"""

from __future__ import annotations

import argparse
import getpass
from typing import TYPE_CHECKING, Any

from axengine.cli._common import EXIT_FAILED, EXIT_OK, add_home, fail, parse_json_arg
from axengine.cli._remote import add_remote, remote_of, with_client
from axengine.cli._runtime import with_engine
from axengine.cli.tasks import refuse_by
from axengine.errors import AxError, Conflict, InputError, NotFound
from axengine.records import NO_EDITS

if TYPE_CHECKING:
    from axengine.client import Client


def register(sub: Any) -> None:
    for decision in ("approve", "reject"):
        p = sub.add_parser(decision, help=f"{decision} a waiting human gate")
        p.add_argument("task", help="the task id")
        p.add_argument("node", help="the human_gateway node")
        p.add_argument("--comment", "-m", default="", help="recorded with the decision")
        if decision == "approve":
            p.add_argument("--data", default=None, metavar="JSON",
                           help="approve with edits: JSON the gate passes on instead of "
                           "what was reviewed (recorded as edited)")
        p.add_argument("--by", default=None,
                       help="who decides (default: your user name; with --server the "
                       "token's name is recorded)")
        add_home(p)
        add_remote(p)
        p.set_defaults(func=cmd_decide, decision=decision)
    p = sub.add_parser("resume", help="resume a node its handler paused (a vendor's "
                       "callback, by hand)")
    p.add_argument("task", help="the task id")
    p.add_argument("node", help="the paused node")
    p.add_argument("--data", default=None, metavar="JSON",
                   help="JSON handed to the node's next run as request.resume")
    p.add_argument("--by", default=None,
                   help="who resumes (default: your user name; with --server the token's "
                   "name is recorded)")
    add_home(p)
    add_remote(p)
    p.set_defaults(func=cmd_resume)


def cmd_resume(args: argparse.Namespace) -> int:
    try:
        data = parse_json_arg(args.data, "--data")
        remote = remote_of(args)
        if remote is not None:
            refuse_by(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        def op(client: Client) -> int:
            result = client.resume(args.task, args.node, data)
            print(f"{args.node} was already resumed" if result == "already-done" else
                  f"{args.node} resumed on {remote.url}; follow with ax run --resume "
                  f"{args.task}{remote.flags()}")
            return EXIT_OK

        return with_client(remote, op)
    by = args.by or getpass.getuser()
    try:
        result = with_engine(args, lambda e: e.resume(args.task, args.node, data=data, by=by))
    except (NotFound, InputError, Conflict) as exc:
        return fail(str(exc), EXIT_FAILED)
    home = f" --home {args.home}" if args.home else ""
    print(f"{args.node} was already resumed" if result == "already-done" else
          f"{args.node} resumed by {by}; continue with: ax run --resume {args.task}{home}")
    return EXIT_OK


def _word(decision: str) -> str:
    return "approved" if decision == "approve" else "rejected"


def cmd_decide(args: argparse.Namespace) -> int:
    try:
        edits = NO_EDITS if getattr(args, "data", None) is None else parse_json_arg(
            args.data, "--data")
        remote = remote_of(args)
        if remote is not None:
            refuse_by(args)
    except AxError as exc:
        return fail(str(exc))
    word = _word(args.decision) + (" with edits" if edits is not NO_EDITS else "")
    if remote is not None:
        def op(client: Client) -> int:
            result = client.decide(args.task, args.node, args.decision, args.comment,
                                   data=edits)
            if result == "already-done":
                print(f"{args.node} was already {word}")
            else:
                print(f"{args.node} {word} on {remote.url}; the server's executors continue "
                      f"the task: follow with ax run --resume {args.task}{remote.flags()}")
            return EXIT_OK

        return with_client(remote, op)
    by = args.by or getpass.getuser()
    try:
        result = with_engine(args, lambda e: e.decide(args.task, args.node,
                                                       decision=args.decision, by=by,
                                                       comment=args.comment, data=edits))
    except (NotFound, InputError, Conflict) as exc:
        return fail(str(exc), EXIT_FAILED)
    if result == "already-done":
        print(f"{args.node} was already {word}")
    else:
        home = f" --home {args.home}" if args.home else ""
        print(f"{args.node} {word} by {by}; continue with: ax run --resume {args.task}{home}")
    return EXIT_OK
