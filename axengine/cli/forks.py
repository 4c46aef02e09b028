"""``ax fork TASK --from NODE [--set NODE.output=JSON]`` and ``ax tasks diff A B``.

A fork is a new task that shares the source's committed history before ``NODE`` and
runs from there (:func:`axengine.engine.fork_task`); ``diff`` compares two tasks node by
node — typically a task and its fork. Both work on the local store (``--home``) or, with
``--server URL``, through the REST API (the diff reads the tasks with the get-task
route, as ``ax tasks show`` does).
"""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from axengine.cli._common import EXIT_FAILED, EXIT_OK, add_home, fail
from axengine.cli._remote import add_remote, remote_of, with_client
from axengine.cli._runtime import with_engine
from axengine.engine import RERUN, Engine, NodeState, Snapshot, TaskView, fork_task
from axengine.errors import AxError, Conflict, InputError, NotFound

if TYPE_CHECKING:
    from axengine.client import Client

__all__ = ["add_diff", "add_fork", "diff_tasks"]

#: States of a node the task never ran (left out of its path).
_NOT_RUN = frozenset({NodeState.PENDING, NodeState.SKIPPED, NodeState.CANCELLED})


def add_fork(parent: Any) -> None:
    """Add ``fork`` to the sub-commands ``parent`` (``ax`` and ``ax tasks``)."""
    fp = parent.add_parser(
        "fork", help="new task from a finished one's history at a node (admin)",
        description="Create a task that shares TASK's committed history before NODE and "
        "runs from NODE; TASK is not changed. The fork carries the label "
        "ax.forked_from=TASK@NODE.")
    fp.add_argument("task", help="the source task id (finished)")
    fp.add_argument("--from", dest="from_node", required=True, metavar="NODE",
                    help="fork point: it and what follows it run in the fork")
    fp.add_argument("--set", dest="set_output", metavar="NODE.output=JSON",
                    help="commit NODE with this output (inline JSON or a file) instead of "
                    "running it; its edges are decided from it")
    fp.add_argument("--by", default=None,
                    help="who forks (default: your user name; with --server the token's "
                    "name is recorded)")
    add_home(fp)
    add_remote(fp)
    fp.set_defaults(func=cmd_fork)


def add_diff(tsub: Any) -> None:
    """Add ``diff`` to ``ax tasks``."""
    dp = tsub.add_parser("diff", help="compare two tasks node by node (a task and its fork)")
    dp.add_argument("a", help="a task id")
    dp.add_argument("b", help="another task id")
    dp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    add_home(dp)
    add_remote(dp)
    dp.set_defaults(func=cmd_diff)


# ---------------------------------------------------------------------------- fork


def _set_output(value: str | None, from_node: str) -> Any:
    """The output of ``--set NODE.output=JSON``, or RERUN without ``--set``."""
    # Imported when called: :mod:`axengine.cli.tasks` registers this module's parsers.
    from axengine.cli.tasks import json_input

    if value is None:
        return RERUN
    target, sep, document = value.partition("=")
    node, dot, field = target.rpartition(".")
    if not sep or not dot or field != "output":
        raise AxError(f"--set {value!r}: expected NODE.output=JSON, e.g. "
                      f"--set {from_node}.output='{{\"ok\": true}}'")
    if node != from_node:
        raise AxError(f"--set names node {node!r} but the fork is from {from_node!r}: only "
                      "the fork point's output can be set")
    return json_input(document, "--set")


def cmd_fork(args: argparse.Namespace) -> int:
    from axengine.cli.tasks import refuse_by

    try:
        remote = remote_of(args)
        if remote is not None:
            refuse_by(args)
        output = _set_output(args.set_output, args.from_node)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        if output is None:  # the client's None means "run it again"
            return fail("--set: a null output can be set on the local store only")

        def op(client: Client) -> int:
            fork = client.fork(args.task, args.from_node,
                               output=None if output is RERUN else output)
            _forked(args, fork, remote.flags())
            return EXIT_OK

        return with_client(remote, op)
    by = args.by or getpass.getuser()
    try:
        fork = with_engine(args, lambda e: fork_task(e, args.task, args.from_node,
                                                     output=output, by=by))
    except (NotFound, InputError, Conflict) as exc:
        return fail(str(exc), EXIT_FAILED)
    _forked(args, fork, f" --home {args.home}" if args.home else "")
    return EXIT_OK


def _forked(args: argparse.Namespace, fork: str, flags: str) -> None:
    print(f"task {args.task} forked at {args.from_node} as {fork}; continue with: "
          f"ax run --resume {fork}{flags}")


# ---------------------------------------------------------------------------- diff


def _node(snap: Snapshot | None) -> dict[str, Any]:
    if snap is None:
        return {"state": "-", "taken": [], "output": None}
    return {"state": snap.state.value,
            "taken": [h.target_node_id for h in snap.next_hops if h.is_taken],
            "output": snap.output}


def _path(view: TaskView, order: list[str]) -> list[str]:
    return [n for n in order if n in view.snapshots
            and view.snapshots[n].state not in _NOT_RUN]


def diff_tasks(a: TaskView, b: TaskView) -> dict[str, Any]:
    """Two tasks side by side: every node (in ``a``'s DAG order, then nodes only ``b``
    has) with its state, taken edges and whether it differs; each task's path (the
    nodes it ran, in DAG order) and the differing nodes."""
    order = [*a.dag.graph_order, *(n for n in b.dag.graph_order if n not in a.dag.nodes)]
    nodes = []
    for nid in order:
        left, right = _node(a.snapshots.get(nid)), _node(b.snapshots.get(nid))
        what = [k for k in ("state", "taken", "output") if left[k] != right[k]]
        nodes.append({"node": nid, "a": left, "b": right, "differs": what})
    return {
        "a": {"task_id": a.task.task_id, "status": a.task.status.value,
              "path": _path(a, order)},
        "b": {"task_id": b.task.task_id, "status": b.task.status.value,
              "path": _path(b, order)},
        "nodes": nodes,
        "differing": [n["node"] for n in nodes if n["differs"]],
    }


def _cell(node: Mapping[str, Any]) -> str:
    taken = ", ".join(node["taken"])
    return str(node["state"]) + (f" -> {taken}" if taken else "")


def _print_diff(args: argparse.Namespace, a: TaskView, b: TaskView) -> int:
    diff = diff_tasks(a, b)
    if args.json:
        print(json.dumps(diff, indent=2, default=str))
        return EXIT_OK
    width = max(len(n["node"]) for n in diff["nodes"]) + 2
    cells = [_cell(n["a"]) for n in diff["nodes"]]
    left = max([len(c) for c in cells] + [len(a.task.task_id) + 2]) + 2
    print(f"  {'NODE':<{width}} {'A ' + a.task.task_id:<{left}} B {b.task.task_id}")
    for node, cell in zip(diff["nodes"], cells, strict=True):
        mark = "*" if node["differs"] else " "
        what = node["differs"]
        note = f"   ({', '.join(what)} differ{'s' if len(what) == 1 else ''})" if what else ""
        print(f"{mark} {node['node']:<{width}} {cell:<{left}} {_cell(node['b'])}{note}")
    print()
    for side in ("a", "b"):
        task = diff[side]
        print(f"path {side.upper()} ({task['task_id']}, {task['status']}): "
              + " -> ".join(task["path"]))
    print("differing nodes: " + (", ".join(diff["differing"]) or "none"))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    try:
        remote = remote_of(args)
    except AxError as exc:
        return fail(str(exc))
    if remote is not None:
        return with_client(remote, lambda c: _print_diff(args, c.task_view(args.a),
                                                         c.task_view(args.b)))

    async def op(engine: Engine) -> tuple[TaskView, TaskView]:
        return await engine.get_task(args.a), await engine.get_task(args.b)

    try:
        a, b = with_engine(args, op)
    except NotFound as exc:
        return fail(str(exc), EXIT_FAILED)
    return _print_diff(args, a, b)
