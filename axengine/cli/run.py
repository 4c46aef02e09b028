"""``ax run``: run a DAG on the embedded engine with live progress; resume it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import getpass
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from axengine.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PAUSED,
    add_home,
    config_of,
    display_path,
    duration_text,
    fail,
    format_event,
    key_value_pairs,
    node_table,
    positive_int,
)
from axengine.cli._remote import Remote, add_remote, remote_of, with_client
from axengine.cli.tasks import json_input
from axengine.credentials import redact_url
from axengine.engine import Event, TaskRecord, TaskView
from axengine.errors import AxError, DagError
from axengine.limits import check_labels
from axengine.local import LocalSession, RunResult, load_any_dag
from axengine.runners import RUNNER_NAMES, THREAD, runner_help
from axengine.wire import result_json

if TYPE_CHECKING:
    from axengine.client import Client
    from axengine.dag import Dag

T = TypeVar("T")

#: Exit code after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a DAG (embedded engine, durable in --home)",
                       description="Run a DAG end to end on the embedded engine, printing "
                       "each transition. Exit 0 on SUCCEEDED, 1 on FAILED/DEAD/CANCELLED, "
                       "3 when a human gate waits for a decision. Ctrl-C stops (the task "
                       "can be resumed); a second Ctrl-C aborts at once.")
    p.add_argument("dag", nargs="?", help="DAG file (not needed with --resume)")
    p.add_argument("--input", "-i", help="task input: a JSON file or inline JSON")
    p.add_argument("--resume", metavar="TASK", help="continue an interrupted task")
    p.add_argument("--decide", action="append", default=[], metavar="NODE=approve|reject",
                   help="decide a gate up front (repeatable; NODE must be a human_gateway)")
    p.add_argument("--idempotency-key", default="", help="same key + same input = same task")
    p.add_argument("--label", action="append", default=[], metavar="K=V",
                   help="label the task (repeatable; ax tasks list finds tasks by them)")
    p.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                   help="nodes the embedded executor runs at once, 1 or more (default 4)")
    p.add_argument("--runner", choices=RUNNER_NAMES, default=THREAD,
                   help=runner_help("the embedded executor"))
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_home(p)
    add_remote(p)
    p.set_defaults(func=cmd_run)


def check_gates(dag: Dag, decide: Mapping[str, str]) -> None:
    """Every ``--decide`` names a ``human_gateway`` of ``dag``.

    Raises:
        AxError: One does not (the message lists the DAG's gates).
    """
    gates = sorted(n for n, node in dag.nodes.items() if node.type == "human_gateway")
    for name in sorted(decide):
        if name not in gates:
            raise AxError(f"--decide {name}: {dag.name} has no human_gateway node {name!r} "
                          f"(its gates: {', '.join(gates) or 'none'})")


def cmd_run(args: argparse.Namespace) -> int:
    try:
        decide = key_value_pairs(args.decide, "--decide")
        for node, decision in decide.items():
            if decision not in ("approve", "reject"):
                return fail(f"--decide {node}={decision}: use approve or reject")
        labels = key_value_pairs(args.label, "--label")
        check_labels(labels)  # before the task's line is printed: no task is made
        remote = remote_of(args)
        if args.resume:
            dag = None
            task_input = None
            if args.dag:
                return fail("give a DAG file or --resume TASK, not both")
        else:
            if not args.dag:
                return fail("give a DAG file, or --resume TASK")
            dag = load_any_dag(args.dag)
            check_gates(dag, decide)
            task_input = json_input(args.input, "--input")
            if task_input is None:
                task_input = {}
    except DagError as exc:
        for problem in exc.problems:
            print(problem.format(), file=sys.stderr)
        return fail(f"{args.dag} is not a valid DAG ({len(exc.problems)} problem(s))")
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        if args.runner != THREAD:
            return fail("--runner applies to the embedded engine; with --server the "
                        "server's executors choose where nodes run")
        return with_client(remote, lambda client: _run_server(
            args, remote, client, dag, task_input, decide, labels))
    printer = _Printer(quiet=args.quiet or args.json, t0=time.time())
    try:
        return _interruptible(_run(args, printer, dag, task_input, decide, labels), printer,
                              args)
    except AxError as exc:
        return fail(str(exc), EXIT_FAILED)


#: Printed at the first Ctrl-C, before the graceful stop (which may take a moment).
STOPPING = "stopping… (Ctrl-C again to abort)"


class _Stopped(Exception):
    """The first Ctrl-C: stop waiting, leave the task to ``ax run --resume``."""


def _interruptible(run: Coroutine[Any, Any, int], printer: _Printer,
                   args: argparse.Namespace) -> int:
    """Run ``run``; the first SIGINT says so at once and stops gracefully (the session
    hands running nodes back), a second one exits at once with 130. The store is
    durable either way: ``ax run --resume`` continues."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        presses = 0

        def on_sigint() -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                print(f"\n{STOPPING}", file=sys.stderr, flush=True)
                printer.stop.set()
            else:
                print("aborted", file=sys.stderr, flush=True)
                os._exit(EXIT_INTERRUPTED)

        # Not on the main thread (tests calling main() from a thread): no handler.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await run
        except _Stopped:
            if printer.task_id:
                home = f" --home {args.home}" if args.home else ""
                print(f"stopped; continue with: ax run --resume {printer.task_id}{home}",
                      file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())


async def _unless_stopped(printer: _Printer, work: Coroutine[Any, Any, T]) -> T:
    """``work``, unless Ctrl-C comes first (then :class:`_Stopped`). A race rather than
    cancelling the caller: a cancellation can be lost in ``asyncio.wait_for`` (3.11)."""
    if printer.stop.is_set():
        work.close()
        raise _Stopped
    job = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(printer.stop.wait())
    try:
        await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not job.done():
        job.cancel()
        with contextlib.suppress(BaseException):
            await job
        raise _Stopped
    return job.result()


async def _run(args: argparse.Namespace, printer: _Printer, dag: Any, task_input: Any,
               decide: dict[str, str], labels: dict[str, str]) -> int:
    config = config_of(args)
    async with LocalSession(config, concurrency=args.concurrency,
                            runner=args.runner) as session:
        session.engine.add_listener(printer)
        if args.resume:
            task_id = args.resume
            view = await session.engine.get_task(task_id)
            check_gates(view.dag, decide)
            printer.say(f"resuming task {task_id} ({view.dag.name}, {view.task.status.value}) "
                        f"from {redact_url(config.resolved_store_url)}")
        else:
            wanted = f"t-{secrets.token_hex(8)}"
            printer.task_id = wanted
            # The submit's own events (it may claim the first node) wait for the task
            # line, which waits for the submit: a refused submit names no task.
            with printer.holding():
                task_id = await session.submit(dag, task_input, labels=labels,
                                               task_id=wanted,
                                               idempotency_key=args.idempotency_key)
                printer.say(f"task {task_id}: running {dag.name} ({len(dag.nodes)} nodes) — "
                            f"state in {redact_url(config.resolved_store_url)}")
                if task_id != wanted:
                    printer.say(f"idempotency key {args.idempotency_key!r} names task "
                                f"{task_id}")
        printer.task_id = task_id
        on_gate = _prompt_gate if sys.stdin.isatty() and not args.json else None
        result = await _unless_stopped(printer, session.wait(
            task_id, decide=decide, decided_by=getpass.getuser(), on_gate=on_gate))
        view = await session.engine.get_task(task_id)
    return _summary(args, result, view, time.time() - printer.t0)


def _run_server(args: argparse.Namespace, remote: Remote, client: Client, dag: Any,
                task_input: Any, decide: dict[str, str], labels: dict[str, str]) -> int:
    """``--server``: the same run through an ``ax api`` server (the SDK client)."""
    t0 = time.time()
    printer = _Printer(quiet=args.quiet or args.json, t0=t0)

    shown: set[str] = set()  # each wait below replays the history: print it once

    def show(event: Event) -> None:
        if event.event_id in shown:
            return
        shown.add(event.event_id)
        if not printer.quiet and (event.kind != "progress" or len(event.detail) < 60):
            print(format_event(event, t0), flush=True)

    if args.resume:
        task_id = args.resume
        check_gates(client.task_view(task_id).dag, decide)
        printer.say(f"resuming task {task_id} on {remote.url}")
    else:
        sub = client.submit(dag, task_input, idempotency_key=args.idempotency_key,
                            labels=labels)
        task_id = sub.task_id
        printer.say(f"task {task_id}: running {dag.name} ({len(dag.nodes)} nodes) on "
                    f"{remote.url}" + ("" if sub.created else " (idempotent repeat)"))
    ask = sys.stdin.isatty() and not args.json
    try:
        while True:
            # --decide and the prompt: recorded by the token's principal.
            result = client.wait(task_id, decide=decide, on_event=show,
                                 comment="decided with ax run")
            if result.status != "PAUSED" or not ask:
                break
            view = client.task_view(task_id)
            answers = {gate: _ask_gate(view, gate) for gate in result.waiting}
            chosen = {gate: a for gate, a in answers.items() if a is not None}
            if not chosen:
                break
            decide = {**decide, **chosen}
    except KeyboardInterrupt:
        print(f"\nstopped following; the task goes on on the server: ax run --resume "
              f"{task_id}{remote.flags()}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    view = client.task_view(task_id)
    return _summary(args, result, view, time.time() - t0, remote)


class _Printer:
    def __init__(self, *, quiet: bool, t0: float) -> None:
        self.quiet = quiet
        self.t0 = t0
        self.task_id = ""
        #: Event lines kept while :meth:`holding`.
        self._held: list[str] | None = None
        #: Set by the first Ctrl-C.
        self.stop = asyncio.Event()

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Keep the events of the block to print when it ends (dropped if it fails)."""
        self._held = []
        try:
            yield
        except BaseException:
            self._held = None
            raise
        held, self._held = self._held, None
        for line in held:
            print(line, flush=True)

    def __call__(self, task: TaskRecord, events: Sequence[Event]) -> None:
        if self.quiet or (self.task_id and task.task_id != self.task_id):
            return
        for event in events:
            if event.kind != "progress" or len(event.detail) < 60:
                line = format_event(event, self.t0)
                if self._held is not None:
                    self._held.append(line)
                else:
                    print(line, flush=True)


#: Lines of a gate's input shown at the prompt (the rest: ``ax tasks show --json``).
PROMPT_INPUT_LINES = 30
#: Characters of one input line shown at the prompt.
PROMPT_LINE_CHARS = 160
_APPROVE = ("a", "approve", "y", "yes")
_REJECT = ("r", "reject", "n", "no")


def gate_text(view: TaskView, gate: str, *, now: float) -> str:
    """What the prompt shows of a waiting gate: description, input as indented JSON
    (truncated), and the deadline as a local time with the time left."""
    snap = view.snapshots[gate]
    params = snap.input if isinstance(snap.input, dict) else {}
    lines = [f"\n== gate {gate}: "
             f"{params.get('description') or view.dag.nodes[gate].description}"]
    if params.get("input") is not None:
        text = json.dumps(params["input"], indent=2, ensure_ascii=False, default=str)
        shown = text.splitlines()
        lines.append("   input:")
        for line in shown[:PROMPT_INPUT_LINES]:
            cut = line if len(line) <= PROMPT_LINE_CHARS else line[:PROMPT_LINE_CHARS] + "…"
            lines.append(f"     {cut}")
        if len(shown) > PROMPT_INPUT_LINES:
            lines.append(f"     … {len(shown) - PROMPT_INPUT_LINES} more lines (ax tasks "
                         f"show {view.task.task_id} --json)")
    if snap.gate_until:
        when = dt.datetime.fromtimestamp(snap.gate_until).astimezone()
        left = snap.gate_until - now
        lines.append(f"   deadline: {when.isoformat(timespec='seconds')} ("
                     + (f"in {duration_text(left)}" if left > 0 else "passed") + ")")
    return "\n".join(lines)


def parse_answer(answer: str) -> str | None:
    """``approve``, ``reject``, ``""`` (decide later) or None (not an answer: ask again)."""
    word = answer.strip().lower()
    if word in _APPROVE:
        return "approve"
    if word in _REJECT:
        return "reject"
    return "" if word == "" else None


def _ask_gate(view: TaskView, gate: str) -> str | None:
    """Ask on the terminal until the answer is approve, reject or empty (later: None)."""
    print(gate_text(view, gate, now=time.time()), flush=True)
    while True:
        try:
            answer = input("   approve or reject? [a/r, empty = decide later]: ")
        except EOFError:
            return None
        decision = parse_answer(answer)
        if decision is not None:
            return decision or None
        print(f"   {answer.strip()!r} is not an answer: type a (approve), r (reject), or "
              "press Enter to decide later", flush=True)


async def _prompt_gate(view: TaskView, gate: str) -> str | None:
    return await asyncio.to_thread(_ask_gate, view, gate)


def _summary(args: argparse.Namespace, result: RunResult, view: TaskView, elapsed: float,
             remote: Remote | None = None) -> int:
    if args.json:
        print(json.dumps(result_json(result), indent=2, default=str))
    else:
        print()
        print(node_table(view))
        print(f"\n{result.status} in {elapsed:.2f}s — task {result.task_id}")
        print("path: " + (display_path(result.path) or "(nothing committed)"))
    if result.status == "SUCCEEDED":
        return EXIT_OK
    where = remote.flags() if remote else (f" --home {args.home}" if args.home else "")
    if result.status == "PAUSED":
        for gate in result.waiting:
            print(f"waiting for a decision at gate {gate!r}: run\n"
                  f"  ax approve {result.task_id} {gate}{where}   (or: ax reject ...)\n"
                  f"  ax run --resume {result.task_id}{where}", file=sys.stderr)
        return EXIT_PAUSED
    for node, error in result.errors.items():
        if result.states.get(node) in ("FAILED", "DEAD"):
            print(f"{node}: {result.states[node]}: {error}", file=sys.stderr)
    if result.status in ("RUNNING",):
        print(f"stopped waiting; resume with: ax run --resume {result.task_id}{where}",
              file=sys.stderr)
    return EXIT_FAILED
