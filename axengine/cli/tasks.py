"""``ax tasks list|show|cancel|retry|fork|diff`` (and the ``ax cancel`` / ``ax retry`` /
``ax fork`` shortcuts; fork and diff are in :mod:`axengine.cli.forks`).

Each works on the local store (``--home``) or, with ``--server URL``, through the REST
API (:mod:`axengine.cli._remote`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import getpass
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from axengine.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    ITEM_ROWS,
    add_home,
    fail,
    node_table,
    parse_json_arg,
    positive_int,
    print_timeline,
)
from axengine.cli._remote import Remote, add_remote, remote_of, with_client
from axengine.cli._runtime import with_engine
from axengine.cli.forks import add_diff, add_fork
from axengine.engine import Engine, Event, TaskRecord, TaskView
from axengine.errors import AxError, Conflict, InputError, NotFound
from axengine.limits import parse_json_text
from axengine.records import TaskStatus

if TYPE_CHECKING:
    from axengine.client import Client

__all__ = ["json_input", "pipe_safe", "refuse_by", "register", "status_arg"]


def pipe_safe(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``ax … | head`` closes the pipe early: stop writing quietly instead of a
    ``BrokenPipeError`` traceback (the recipe of the :mod:`signal` docs)."""

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            code = func(args)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at devnull so that flush
            # cannot raise a second time.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK

    return wrapper


def status_arg(value: str) -> str:
    """``--status``: a task status in any case; unknown ones are refused."""
    try:
        return TaskStatus(value.upper()).value
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown status {value!r} (use one of "
            f"{', '.join(s.value for s in TaskStatus)})") from None


def json_input(value: str | None, what: str) -> Any:
    """A JSON document inline or in a file; a name that is neither says "no such file"."""
    if value is None:
        return None
    if os.path.isdir(value):
        raise AxError(f"{what}: {value} is a directory, not a JSON file")
    if not value.lstrip().startswith(("{", "[", '"')) and not os.path.exists(value):
        try:
            return parse_json_text(value, what)  # a bare scalar: 42, true, null
        except InputError:
            raise AxError(f"{what}: no such file: {value} (give a JSON file or inline "
                          "JSON)") from None
    return parse_json_arg(value, what)


def refuse_by(args: argparse.Namespace) -> None:
    """``--by`` names the author on the local store; a server records the token's name."""
    if getattr(args, "by", None):
        raise AxError("--by applies to the local store: with --server the server records "
                      "the name of the token")


def _user() -> str:
    return getpass.getuser()


def register(sub: Any) -> None:
    p = sub.add_parser("tasks", help="list, show, cancel, retry, fork or compare tasks")
    tsub = p.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)

    lp = tsub.add_parser("list", help="list tasks, newest first")
    lp.add_argument("--status", type=status_arg, metavar="STATUS",
                    help="only tasks with this status: "
                    + ", ".join(s.value for s in TaskStatus))
    lp.add_argument("--dag", help="only tasks of this DAG name")
    lp.add_argument("--limit", type=positive_int, default=50, metavar="N",
                    help="at most this many, 1 or more (default 50)")
    lp.add_argument("--json", action="store_true", help="print a JSON list")
    add_home(lp)
    add_remote(lp)
    lp.set_defaults(func=pipe_safe(cmd_list))

    sp = tsub.add_parser("show", help="node table and timeline of a task")
    sp.add_argument("task", help="the task id")
    sp.add_argument("--json", action="store_true", help="print the task as JSON")
    sp.add_argument("--all", action="store_true", dest="every_item",
                    help=f"every item of a map (without: the first {ITEM_ROWS} and a count)")
    add_home(sp)
    add_remote(sp)
    sp.set_defaults(func=pipe_safe(cmd_show))
    add_diff(tsub)

    for parent in (tsub, sub):
        cp = parent.add_parser("cancel", help="cancel a task (running nodes are fenced out)")
        cp.add_argument("task", help="the task id")
        cp.add_argument("--by", default=None,
                        help="who cancels (default: your user name; with --server the "
                        "token's name is recorded)")
        add_home(cp)
        add_remote(cp)
        cp.set_defaults(func=cmd_cancel)

        rp = parent.add_parser("retry", help="re-run a task from a node (admin)")
        rp.add_argument("task", help="the task id")
        rp.add_argument("--from", dest="from_node", required=True, metavar="NODE",
                        help="node to re-run; committed nodes before it stay untouched")
        rp.add_argument("--input", help="override the node's input (JSON or file)")
        rp.add_argument("--by", default=None,
                        help="who retries (default: your user name; with --server the "
                        "token's name is recorded)")
        add_home(rp)
        add_remote(rp)
        rp.set_defaults(func=cmd_retry)
        add_fork(parent)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _remote(args: argparse.Namespace) -> Remote | None:
    return remote_of(args)


def _newest_first(tasks: Sequence[TaskRecord]) -> list[TaskRecord]:
    # The index already lists newest first; sorting again makes ties (same second)
    # and servers of other versions answer the same way.
    return sorted(tasks, key=lambda t: (t.created_at, t.task_id), reverse=True)


def _print_list(args: argparse.Namespace, tasks: Sequence[TaskRecord]) -> int:
    tasks = _newest_first(tasks)
    if args.json:
        print(json.dumps([{"task_id": t.task_id, "dag": t.dag_name, "status": t.status.value,
                           "created_at": t.created_at} for t in tasks], indent=2))
        return EXIT_OK
    print(f"{'TASK':<20} {'DAG':<28} {'STATUS':<10} CREATED")
    for t in tasks:
        print(f"{t.task_id:<20} {t.dag_name:<28} {t.status.value:<10} {_when(t.created_at)}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    try:
        remote = _remote(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        return with_client(remote, lambda c: _print_list(args, c.list_tasks(
            status=args.status, dag=args.dag, limit=args.limit)))
    tasks = with_engine(args, lambda e: e.list_tasks(status=args.status, dag_name=args.dag,
                                                      limit=args.limit))
    return _print_list(args, tasks)


def _print_show(args: argparse.Namespace, view: TaskView, events: Sequence[Event]) -> int:
    if args.json:
        from axengine.fixtures import _plain

        print(json.dumps({
            "task_id": view.task.task_id, "dag": view.dag.name, "status": view.task.status.value,
            "submitted_by": view.task.submitted_by,
            "nodes": {n: {"state": s.state.value, "attempt": s.attempt, "fence": s.fence,
                          "output": s.output, "error": s.error,
                          "next_hops": [[h.target_node_id, h.is_taken] for h in s.next_hops]}
                      for n, s in view.snapshots.items()},
            "events": [_plain(asdict(e)) for e in events],
        }, indent=2, default=str))
        return EXIT_OK
    t = view.task
    print(f"task {t.task_id}  dag {view.dag.name} ({t.dag_hash[:12]})  status {t.status.value}")
    print(f"created {_when(t.created_at)} by {t.submitted_by or '?'}  "
          f"finished {_when(t.finished_at)}"
          + (f"  deadline {_when(t.deadline)}" if t.deadline else ""))
    print()
    print(node_table(view, every_item=args.every_item))
    print("\ntimeline:")
    print_timeline(events)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    try:
        remote = _remote(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        return with_client(remote, lambda c: _print_show(args, c.task_view(args.task),
                                                         c.events(args.task)))

    async def op(engine: Engine) -> Any:
        return await engine.get_task(args.task), await engine.events(args.task)

    try:
        view, events = with_engine(args, op)
    except NotFound as exc:
        return fail(str(exc), EXIT_FAILED)
    return _print_show(args, view, events)


def _cancelled(args: argparse.Namespace, result: str) -> int:
    print(f"task {args.task}: {'cancelled' if result == 'committed' else 'already finished'}")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        remote = _remote(args)
        if remote is not None:
            refuse_by(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        return with_client(remote, lambda c: _cancelled(args, c.cancel(args.task)))
    by = args.by or _user()
    try:
        result = with_engine(args, lambda e: e.cancel(args.task, by=by))
    except NotFound as exc:
        return fail(str(exc), EXIT_FAILED)
    return _cancelled(args, result)


def cmd_retry(args: argparse.Namespace) -> int:
    try:
        remote = _remote(args)
        if remote is not None:
            refuse_by(args)
        override = json_input(args.input, "--input")
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        def op(client: Client) -> int:
            client.retry(args.task, args.from_node, input=override)
            print(f"task {args.task}: {args.from_node} and what follows it run again on "
                  f"{remote.url}; follow with: ax run --resume {args.task}{remote.flags()}")
            return EXIT_OK

        return with_client(remote, op)
    by = args.by or _user()
    try:
        with_engine(args, lambda e: e.retry(args.task, args.from_node, input_override=override,
                                            by=by))
    except (NotFound, InputError, Conflict) as exc:
        return fail(str(exc), EXIT_FAILED)
    home = f" --home {args.home}" if args.home else ""
    print(f"task {args.task}: {args.from_node} and what follows it will run again; "
          f"continue with: ax run --resume {args.task}{home}")
    return EXIT_OK
