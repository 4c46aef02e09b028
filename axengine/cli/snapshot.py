"""``ax snapshot export|import`` and ``ax replay``: record a task, restore it, resume it."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from axengine.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    add_home,
    config_of,
    duration_text,
    fail,
    key_value_pairs,
)
from axengine.cli._remote import add_remote, remote_of, with_client
from axengine.cli._runtime import with_engine
from axengine.cli.tasks import pipe_safe
from axengine.config import AxConfig
from axengine.credentials import redact_url
from axengine.errors import AxError
from axengine.fixtures import build_fixture, export_task, load_fixture, redact_fixture, restore_task
from axengine.local import LocalSession
from axengine.records import NodeState
from axengine.wire import resumes_by_itself

if TYPE_CHECKING:
    from axengine.client import Client
    from axengine.engine import TaskView


def register(sub: Any) -> None:
    p = sub.add_parser("snapshot", help="export or import a task snapshot fixture")
    ssub = p.add_subparsers(dest="snapshot_command", metavar="ACTION", required=True)
    ep = ssub.add_parser("export", help="write a task (DAG, snapshots, timeline) as JSON")
    ep.add_argument("task", help="the task id")
    ep.add_argument("-o", "--output", help="file to write (default: stdout)")
    ep.add_argument("--redact", action="append", default=[], metavar="PATH",
                    help="replace this field with [redacted] (repeatable): input.ssn, "
                         "nodes.parse_pdf.output.text, nodes.*.input.to (docs/testing.md)")
    add_home(ep)
    add_remote(ep)
    ep.set_defaults(func=pipe_safe(cmd_export))
    ip = ssub.add_parser("import", help="restore a fixture into the store (resume it with "
                         "ax run --resume)")
    ip.add_argument("fixture", help="the JSON file ax snapshot export wrote")
    add_home(ip)
    ip.set_defaults(func=cmd_import)

    rp = sub.add_parser("replay", help="restore a fixture into a fresh store and resume it")
    rp.add_argument("fixture", help="the JSON file ax snapshot export wrote")
    rp.add_argument("--decide", action="append", default=[], metavar="NODE=approve|reject",
                    help="decide a gate when it is reached (repeatable)")
    rp.set_defaults(func=cmd_replay)


def _remote_fixture(client: Client, task_id: str, redact: list[str]) -> dict[str, Any]:
    """The fixture of a task read through the REST API: what :func:`export_task` writes,
    from the task's JSON (snapshot fields the API does not show keep their defaults)."""
    view = client.task_view(task_id)
    data = build_fixture(dag=view.dag.canonical(), dag_hash=view.dag.hash, task=view.task,
                         snapshots=view.snapshots.values(), events=client.events(task_id))
    return redact_fixture(data, redact) if redact else data


def _write(args: argparse.Namespace, data: Any) -> int:
    text = json.dumps(data, indent=2, sort_keys=True)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    try:
        remote = remote_of(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        return with_client(remote, lambda c: _write(
            args, _remote_fixture(c, args.task, args.redact)))
    try:
        data = with_engine(args, lambda e: export_task(e, args.task, redact=args.redact))
    except AxError as exc:
        return fail(str(exc), EXIT_FAILED)
    return _write(args, data)


def cmd_import(args: argparse.Namespace) -> int:
    try:
        fixture = load_fixture(args.fixture)
        task_id = with_engine(args, lambda e: restore_task(e, fixture))
    except (AxError, OSError, ValueError) as exc:
        return fail(str(exc), EXIT_FAILED)
    print(f"restored task {task_id} into {redact_url(config_of(args).resolved_store_url)}")
    return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        decide = key_value_pairs(args.decide, "--decide")
    except AxError as exc:
        return fail(str(exc))
    try:
        fixture = load_fixture(args.fixture)
    except AxError as exc:
        return fail(str(exc), EXIT_FAILED)

    async def main(home: str) -> int:
        async with LocalSession(AxConfig.from_env(home=home)) as session:
            task_id = await restore_task(session.engine, fixture)
            await session.process.reconcile_once()
            view = await session.engine.get_task(task_id, resolve_blobs=False)
            for line in timed_waits(view, session.engine.clock()):
                print(f"ax: replay: {line}", file=sys.stderr, flush=True)
            result = await session.wait(task_id, decide=decide, decided_by="replay")
        print(f"{result.status}: " + " -> ".join(result.path))
        return EXIT_OK if result.status == "SUCCEEDED" else EXIT_FAILED

    with tempfile.TemporaryDirectory(prefix="ax-replay-") as home:
        return asyncio.run(main(home))


#: A wait shorter than this is not worth a line.
_WAIT_WORTH_SAYING = 5.0


def timed_waits(view: TaskView, now: float) -> list[str]:
    """What a restored task waits for by the clock before it can go on, one line per
    node: a pause its handler asked for, a retry's backoff. A replay runs in real time,
    so a fixture recorded during a day-long pause waits a day: say so, not nothing."""
    lines = []
    for nid, snap in view.snapshots.items():
        if resumes_by_itself(snap, view.dag.node(nid).type):
            until, what = snap.gate_until, "is paused by its handler"
        elif snap.state is NodeState.WAITING:
            until, what = snap.not_before, "retries"
        else:
            continue
        if until - now >= _WAIT_WORTH_SAYING:
            when = dt.datetime.fromtimestamp(until).astimezone()
            lines.append(f"node {nid} {what} at {when:%Y-%m-%d %H:%M:%S %Z} (in "
                         f"{duration_text(until - now)}): the replay waits for it "
                         "(Ctrl-C stops)")
    return lines
