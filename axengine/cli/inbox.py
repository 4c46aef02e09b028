"""``ax dags`` (stored DAG versions) and ``ax approvals`` (gates waiting for a decision).

Both read the local store (``--home``) through the engine reads behind ``GET /v1/dags``
and ``GET /v1/approvals``, or, with ``--server URL``, those routes themselves
(:mod:`axengine.cli._remote`); ``--json`` prints the routes' items either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from axengine.api._ops import MAX_PAGE, approval_json, dag_info_json
from axengine.cli._common import EXIT_OK, add_home, fail, positive_int
from axengine.cli._remote import add_remote, remote_of, with_client
from axengine.cli._runtime import with_engine
from axengine.cli.tasks import pipe_safe
from axengine.engine import Engine
from axengine.errors import AxError

__all__ = ["ago", "register"]

#: Characters of a gate's description shown in the table.
DESCRIPTION_WIDTH = 48


def register(sub: Any) -> None:
    dp = sub.add_parser("dags", help="list the stored DAG versions, by hash")
    dp.add_argument("--limit", type=positive_int, default=100, metavar="N",
                    help="at most this many (default 100)")
    dp.add_argument("--json", action="store_true",
                    help="print a JSON list (hash, name, nodes, stored_revision)")
    add_home(dp)
    add_remote(dp)
    dp.set_defaults(func=pipe_safe(cmd_dags))

    ap = sub.add_parser("approvals", help="list the gates waiting for a decision, newest "
                        "task first")
    ap.add_argument("--limit", type=positive_int, default=100, metavar="N",
                    help="at most this many gates (default 100)")
    ap.add_argument("--json", action="store_true",
                    help="print a JSON list (task_id, dag_name, submitted_by, node_id, "
                    "description, input, waiting_since, gate_until)")
    add_home(ap)
    add_remote(ap)
    ap.set_defaults(func=pipe_safe(cmd_approvals))


# ---------------------------------------------------------------------------- printing


def ago(ts: float, now: float | None = None) -> str:
    """How long ago ``ts`` was, in its largest unit: ``"12m ago"``, ``"3h ago"``."""
    seconds = max(0, int((time.time() if now is None else now) - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _local(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _short(text: str, width: int = DESCRIPTION_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _print_dags(args: argparse.Namespace, dags: Sequence[dict[str, Any]]) -> int:
    if args.json:
        print(json.dumps(list(dags), indent=2))
        return EXIT_OK
    print(f"{'HASH':<12}  {'NAME':<32} NODES")
    for d in dags:
        print(f"{str(d['hash'])[:12]:<12}  {d['name']:<32} {d['nodes']}")
    return EXIT_OK


def _print_approvals(args: argparse.Namespace, gates: Sequence[dict[str, Any]]) -> int:
    if args.json:
        print(json.dumps(list(gates), indent=2, default=str))
        return EXIT_OK
    print(f"{'TASK':<20} {'NODE':<24} {'WAITING SINCE':<30} {'DEADLINE':<19} DESCRIPTION")
    for g in gates:
        since = (f"{_local(g['waiting_since'])} ({ago(g['waiting_since'])})"
                 if g["waiting_since"] else "-")
        print(f"{g['task_id']:<20} {g['node_id']:<24} {since:<30} "
              f"{_local(g['gate_until']):<19} {_short(str(g['description'] or ''))}")
    return EXIT_OK


# ---------------------------------------------------------------------------- commands


async def _local_pages(read: Callable[..., Any], to_json: Callable[[Any], dict[str, Any]],
                       limit: int, token_arg: str) -> list[dict[str, Any]]:
    """Pages of an engine read until ``limit`` items, as ``Client._pages`` walks a route."""
    out: list[dict[str, Any]] = []
    token: str | None = None
    while len(out) < limit:
        items, token = await read(limit=min(MAX_PAGE, limit - len(out)),
                                  **{token_arg: token or ""})
        out.extend(to_json(item) for item in items)
        if not token:
            break
    return out[:limit]


def _run(args: argparse.Namespace, remote_op: Callable[[Any], list[dict[str, Any]]],
         local_op: Callable[[Engine], Any],
         show: Callable[[argparse.Namespace, Sequence[dict[str, Any]]], int]) -> int:
    try:
        remote = remote_of(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        return with_client(remote, lambda c: show(args, remote_op(c)))
    return show(args, with_engine(args, local_op))


def cmd_dags(args: argparse.Namespace) -> int:
    return _run(args, lambda c: c.list_dags(limit=args.limit),
                lambda e: _local_pages(e.dag_page, dag_info_json, args.limit, "after"),
                _print_dags)


def cmd_approvals(args: argparse.Namespace) -> int:
    return _run(args, lambda c: c.list_approvals(limit=args.limit),
                lambda e: _local_pages(e.approvals_page, approval_json, args.limit,
                                       "page_token"),
                _print_approvals)
