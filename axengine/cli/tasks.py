"""``ax tasks list|show|cancel|retry`` (and the ``ax cancel`` / ``ax retry`` shortcuts)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from dataclasses import asdict
from typing import Any

from axengine.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    add_home,
    fail,
    node_table,
    parse_json_arg,
    print_timeline,
)
from axengine.cli._runtime import with_engine
from axengine.engine import Engine
from axengine.errors import AxError, Conflict, InputError, NotFound


def register(sub: Any) -> None:
    p = sub.add_parser("tasks", help="list, show, cancel or retry tasks")
    tsub = p.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)

    lp = tsub.add_parser("list", help="list tasks")
    lp.add_argument("--status", help="only tasks with this status (RUNNING, PAUSED, ...)")
    lp.add_argument("--dag", help="only tasks of this DAG name")
    lp.add_argument("--limit", type=int, default=50)
    lp.add_argument("--json", action="store_true")
    add_home(lp)
    lp.set_defaults(func=cmd_list)

    sp = tsub.add_parser("show", help="node table and timeline of a task")
    sp.add_argument("task")
    sp.add_argument("--json", action="store_true")
    add_home(sp)
    sp.set_defaults(func=cmd_show)

    for parent in (tsub, sub):
        cp = parent.add_parser("cancel", help="cancel a task (running nodes are fenced out)")
        cp.add_argument("task")
        cp.add_argument("--by", default="cli")
        add_home(cp)
        cp.set_defaults(func=cmd_cancel)

        rp = parent.add_parser("retry", help="re-run a task from a node (admin)")
        rp.add_argument("task")
        rp.add_argument("--from", dest="from_node", required=True, metavar="NODE",
                        help="node to re-run; committed nodes before it stay untouched")
        rp.add_argument("--input", help="override the node's input (JSON or file)")
        rp.add_argument("--by", default="cli")
        add_home(rp)
        rp.set_defaults(func=cmd_retry)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def cmd_list(args: argparse.Namespace) -> int:
    tasks = with_engine(args, lambda e: e.list_tasks(status=args.status, dag_name=args.dag,
                                                      limit=args.limit))
    if args.json:
        print(json.dumps([{"task_id": t.task_id, "dag": t.dag_name, "status": t.status.value,
                           "created_at": t.created_at} for t in tasks], indent=2))
        return EXIT_OK
    print(f"{'TASK':<20} {'DAG':<28} {'STATUS':<10} CREATED")
    for t in tasks:
        print(f"{t.task_id:<20} {t.dag_name:<28} {t.status.value:<10} {_when(t.created_at)}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    async def op(engine: Engine) -> Any:
        return await engine.get_task(args.task), await engine.events(args.task)

    try:
        view, events = with_engine(args, op)
    except NotFound as exc:
        return fail(str(exc), EXIT_FAILED)
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
    print(node_table(view))
    print("\ntimeline:")
    print_timeline(events)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        result = with_engine(args, lambda e: e.cancel(args.task, by=args.by))
    except NotFound as exc:
        return fail(str(exc), EXIT_FAILED)
    print(f"task {args.task}: {'cancelled' if result == 'committed' else 'already finished'}")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    try:
        override = parse_json_arg(args.input, "--input")
        with_engine(args, lambda e: e.retry(args.task, args.from_node, input_override=override,
                                            by=args.by))
    except (NotFound, InputError, Conflict) as exc:
        return fail(str(exc), EXIT_FAILED)
    except AxError as exc:
        return fail(str(exc))
    home = f" --home {args.home}" if args.home else ""
    print(f"task {args.task}: {args.from_node} and what follows it will run again; "
          f"continue with: ax run --resume {args.task}{home}")
    return EXIT_OK
