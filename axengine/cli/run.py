"""``ax run``: run a DAG on the embedded engine with live progress; resume it."""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

from axengine.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PAUSED,
    add_home,
    config_of,
    fail,
    format_event,
    node_table,
    parse_json_arg,
)
from axengine.credentials import redact_url
from axengine.engine import Event, TaskRecord, TaskView
from axengine.errors import AxError, DagError
from axengine.local import LocalSession, RunResult, load_any_dag
from axengine.runners import RUNNER_NAMES, THREAD, runner_help
from axengine.wire import result_json


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a DAG (embedded engine, durable in --home)",
                       description="Run a DAG end to end on the embedded engine, printing "
                       "each transition. Exit 0 on SUCCEEDED, 1 on FAILED/DEAD/CANCELLED, "
                       "3 when a human gate waits for a decision.")
    p.add_argument("dag", nargs="?", help="DAG file (not needed with --resume)")
    p.add_argument("--input", "-i", help="task input: a JSON file or inline JSON")
    p.add_argument("--resume", metavar="TASK", help="continue an interrupted task")
    p.add_argument("--decide", action="append", default=[], metavar="NODE=approve|reject",
                   help="decide a gate up front (repeatable)")
    p.add_argument("--idempotency-key", default="", help="same key + same input = same task")
    p.add_argument("--label", action="append", default=[], metavar="K=V")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--runner", choices=RUNNER_NAMES, default=THREAD,
                   help=runner_help("the embedded executor"))
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--server", metavar="URL",
                   help="run on an ax api server (e.g. http://127.0.0.1:8080) instead of "
                   "the embedded engine")
    p.add_argument("--token", default="", help="bearer token for --server")
    add_home(p)
    p.set_defaults(func=cmd_run)


def _pairs(values: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise AxError(f"{what} must look like KEY=VALUE, not {value!r}")
        out[key] = val
    return out


def cmd_run(args: argparse.Namespace) -> int:
    try:
        decide = _pairs(args.decide, "--decide")
        for node, decision in decide.items():
            if decision not in ("approve", "reject"):
                return fail(f"--decide {node}={decision}: use approve or reject")
        labels = _pairs(args.label, "--label")
        if args.resume:
            dag = None
            task_input = None
        else:
            if not args.dag:
                return fail("give a DAG file, or --resume TASK")
            dag = load_any_dag(args.dag)
            task_input = parse_json_arg(args.input, "--input")
            if task_input is None:
                task_input = {}
    except DagError as exc:
        for problem in exc.problems:
            print(problem.format(), file=sys.stderr)
        return fail(f"{args.dag} is not a valid DAG ({len(exc.problems)} problem(s))")
    except AxError as exc:
        return fail(str(exc))
    try:
        if args.server:
            if args.runner != THREAD:
                return fail("--runner applies to the embedded engine; with --server the "
                            "server's executors choose where nodes run")
            return _run_server(args, dag, task_input, decide, labels)
        return asyncio.run(_run(args, dag, task_input, decide, labels))
    except AxError as exc:
        return fail(str(exc), EXIT_FAILED)


async def _run(args: argparse.Namespace, dag: Any, task_input: Any, decide: dict[str, str],
               labels: dict[str, str]) -> int:
    config = config_of(args)
    t0 = time.time()
    printer = _Printer(quiet=args.quiet or args.json, t0=t0)
    async with LocalSession(config, concurrency=args.concurrency,
                            runner=args.runner) as session:
        session.engine.add_listener(printer)
        if args.resume:
            task_id = args.resume
            view = await session.engine.get_task(task_id)
            printer.say(f"resuming task {task_id} ({view.dag.name}, {view.task.status.value}) "
                        f"from {redact_url(config.resolved_store_url)}")
        else:
            wanted = f"t-{secrets.token_hex(8)}"
            printer.say(f"task {wanted}: running {dag.name} ({len(dag.nodes)} nodes) — "
                        f"state in {redact_url(config.resolved_store_url)}")
            printer.task_id = wanted
            task_id = await session.submit(dag, task_input, labels=labels, task_id=wanted,
                                           idempotency_key=args.idempotency_key)
            if task_id != wanted:
                printer.say(f"idempotency key {args.idempotency_key!r} names task {task_id}")
        printer.task_id = task_id
        on_gate = _prompt_gate if sys.stdin.isatty() and not args.json else None
        result = await session.wait(task_id, decide=decide, decided_by="cli", on_gate=on_gate)
        view = await session.engine.get_task(task_id)
    return _summary(args, result, view, time.time() - t0)


def _run_server(args: argparse.Namespace, dag: Any, task_input: Any, decide: dict[str, str],
                labels: dict[str, str]) -> int:
    """``--server``: the same run through an ``ax api`` server (the SDK client)."""
    from axengine.client import Client

    t0 = time.time()
    printer = _Printer(quiet=args.quiet or args.json, t0=t0)

    def show(event: Event) -> None:
        if not printer.quiet and (event.kind != "progress" or len(event.detail) < 60):
            print(format_event(event, t0), flush=True)

    with Client(args.server, args.token) as client:
        if args.resume:
            task_id = args.resume
            printer.say(f"resuming task {task_id} on {args.server}")
        else:
            sub = client.submit(dag, task_input, idempotency_key=args.idempotency_key,
                                labels=labels)
            task_id = sub.task_id
            printer.say(f"task {task_id}: running {dag.name} ({len(dag.nodes)} nodes) on "
                        f"{args.server}" + ("" if sub.created else " (idempotent repeat)"))
        result = client.wait(task_id, decide=decide, on_event=show)
        view = client.task_view(task_id)
    return _summary(args, result, view, time.time() - t0)


class _Printer:
    def __init__(self, *, quiet: bool, t0: float) -> None:
        self.quiet = quiet
        self.t0 = t0
        self.task_id = ""

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def __call__(self, task: TaskRecord, events: Sequence[Event]) -> None:
        if self.quiet or (self.task_id and task.task_id != self.task_id):
            return
        for event in events:
            if event.kind != "progress" or len(event.detail) < 60:
                print(format_event(event, self.t0), flush=True)


async def _prompt_gate(view: TaskView, gate: str) -> str | None:
    snap = view.snapshots[gate]
    params = snap.input or {}
    print(f"\n== gate {gate}: {params.get('description') or view.dag.nodes[gate].description}")
    if params.get("input") is not None:
        print(f"   input: {json.dumps(params['input'])[:500]}")
    answer = await asyncio.to_thread(
        input, "   approve or reject? [a/r, empty = decide later]: ")
    answer = answer.strip().lower()
    if answer in ("a", "approve", "y", "yes"):
        return "approve"
    if answer in ("r", "reject", "n", "no"):
        return "reject"
    return None


def _summary(args: argparse.Namespace, result: RunResult, view: TaskView, elapsed: float) -> int:
    if args.json:
        print(json.dumps(result_json(result), indent=2, default=str))
    else:
        print()
        print(node_table(view))
        print(f"\n{result.status} in {elapsed:.2f}s — task {result.task_id}")
        print("path: " + (" -> ".join(result.path) or "(nothing committed)"))
    if result.status == "SUCCEEDED":
        return EXIT_OK
    if result.status == "PAUSED":
        home = f" --home {args.home}" if args.home else ""
        for gate in result.waiting:
            print(f"waiting for a decision at gate {gate!r}: run\n"
                  f"  ax approve {result.task_id} {gate}{home}   (or: ax reject ...)\n"
                  f"  ax run --resume {result.task_id}{home}", file=sys.stderr)
        return EXIT_PAUSED
    for node, error in result.errors.items():
        if result.states.get(node) in ("FAILED", "DEAD"):
            print(f"{node}: {result.states[node]}: {error}", file=sys.stderr)
    if result.status in ("RUNNING",):
        print(f"stopped waiting; resume with: ax run --resume {result.task_id}", file=sys.stderr)
    return EXIT_FAILED
