"""Maps over runtime lists, bounded loops and sub-DAGs: the rules that give a node
instances.

A **map** node renders its ``map`` template to a list when it is readied, and that list
— the expansion — is committed in the same transaction, in the node's own snapshot
(its ``input`` holds the items, ``items`` counts them). The node then stays RUNNING
under :data:`~axengine.records.MAP_OWNER` while its items run: each item is the
snapshot ``{node}[{index}]``, an ordinary node to the queue, the claim and the fence,
with its own attempts, rendered from the node's templates with ``item`` and ``index``.
At most ``max_concurrency`` items run at once; each item that ends counts off on the
node (``items_done``) in the transaction that ends it, and starts the next one. When
the last ends, the node succeeds with the items' outputs in item order and its edges
are decided as any node's. A resumed task reads the committed expansion: it never
renders the list again.

A **bounded loop** is a back edge with ``max_visits`` (validated: the body between its
target and the node it leaves from is entered only at its first node and left only from
its last). When the last node is decided with the back edge taken, the transaction that
commits it keeps every body node's snapshot of that visit as ``{node}#{visit}`` and
resets the body for the next visit — ``visit`` counts up, the first node is readied —
instead of counting the last node off at its forward targets. At the bound the back edge
is recorded as not taken and the loop is left like any node's edges lead.

A **sub-DAG** node (``type: dag``) runs another DAG whose nodes are in the task's DAG
already, as ``{node}/{child}`` (:class:`~axengine.dag.Dag` flattens them; the child is
part of the parent's hash). When the node is readied, its input is rendered and it stays
RUNNING under :data:`~axengine.records.SUBDAG_OWNER` while the sub-DAG's first nodes are
readied in the same transaction; each of the sub-DAG's last nodes (those without a
forward edge) counts off on it when decided, and the last one ends it: its output is the
sub-DAG's ``output`` template (or the outputs of its last nodes), and it fails when a
node of the sub-DAG failed with no route. The sub-DAG's templates read ``input`` as the
node's rendered input and ``nodes`` as the sub-DAG's own. Cancel, retry and gates reach
its nodes because they are the task's.

These are rules, so they are pure like the rest of :mod:`~axengine.engine._rules`: they
read the view through the plan builder and write through it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from axengine import template
from axengine.dag import SCOPE, Node, item_id, visit_id
from axengine.engine._refs import map_refs, named, template_refs
from axengine.errors import InputError, TemplateError
from axengine.records import (
    FINAL_STATES,
    MAP_OWNER,
    SUBDAG_OWNER,
    NextHop,
    NodeState,
    Snapshot,
    replace,
)

if TYPE_CHECKING:
    from axengine.engine._rules import _Builder

__all__ = [
    "DEFAULT_MAP_CONCURRENCY",
    "child_ended",
    "concurrency",
    "fail_map",
    "is_map_parent",
    "item_ended",
    "loop_again",
    "loop_names",
    "parent_of",
    "ready_map",
    "ready_subdag",
]

#: Items a map runs at once when its node sets no ``max_concurrency``: the transaction
#: that expands the map starts them all, so the default stays well inside etcd's
#: default ``--max-txn-ops`` of 128.
DEFAULT_MAP_CONCURRENCY = 16

_ITEM = re.compile(r"(.+)\[(\d+)\]\Z")


def parent_of(node_id: str) -> tuple[str, int] | None:
    """``(map node, index)`` of an item id (``summarise[3]``), or None."""
    match = _ITEM.match(node_id)
    return None if match is None else (match[1], int(match[2]))


def is_map_parent(snap: Snapshot) -> bool:
    """Whether ``snap`` is a map node whose items are running (no worker holds it)."""
    return snap.state is NodeState.RUNNING and snap.owner == MAP_OWNER


def concurrency(node: Node) -> int:
    """Items of ``node`` that run at once."""
    return node.max_concurrency or DEFAULT_MAP_CONCURRENCY


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            dict: "a mapping"}.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- maps


def ready_map(b: _Builder, node: Node, snap: Snapshot) -> list[str]:
    """Expand map ``node`` (its predecessors are decided): render the list, commit it in
    the node's snapshot and start the first items. Returns ``[node.id]`` when the node
    is decided on the spot (an empty list, or a map that could not expand)."""
    assert node.map is not None
    try:
        items = named("map template", template.render, node.map,
                      b.context(map_refs(node), node=node))
    except TemplateError as exc:
        return b.failure(node, snap, str(exc), retryable=False)
    if not isinstance(items, list):
        return b.failure(node, snap, f"map template rendered {_kind(items)}, not a list",
                         retryable=False)
    if len(items) > node.item_bound:
        return b.failure(node, snap, f"map template rendered {len(items):,} items; the "
                         f"bound is {node.item_bound:,} (max_items)", retryable=False)
    try:
        revision = b.digest(items, "map template: the rendered list",
                            scope=(snap.task_id, node.id))
    except InputError as exc:
        return b.failure(node, snap, str(exc), retryable=False)
    parent = replace(
        snap, state=NodeState.RUNNING, owner=MAP_OWNER, lease_until=0.0,
        input={"items": items}, input_ref=None,
        input_revision=revision,
        attempt=snap.attempt + 1, fence=snap.fence + 1, ready_at=b.now, started_at=b.now,
        not_before=0.0, error="", evidence="",
        items=len(items), items_started=0, items_done=0,
    )
    at_once = min(concurrency(node), len(items))
    b.event("expanded", parent, f"{len(items)} item(s)" + (
        f", {at_once} at a time" if at_once < len(items) else ""))
    return _advance(b, node, parent)


def item_ended(b: _Builder, node: Node, item: Snapshot, *, error: str | None = None,
               dead: bool = False) -> list[str]:
    """Count ``item`` (just written as ended: succeeded, or failed for good with
    ``error``) off on its map node: start the next item, or decide the node when this
    was the last (or, under ``on_item_failure: fail``, the first to fail). Returns the
    nodes decided, for the caller to settle."""
    found = parent_of(item.node_id)
    assert found is not None
    parent = b.snap(found[0])
    if not is_map_parent(parent):
        return []  # the map already ended (failed, cancelled): the item is only recorded
    parent = replace(parent, items_done=parent.items_done + 1)
    if error is not None and node.on_item_failure == "fail":
        return fail_map(b, node, parent, f"item {found[1]} failed: {error}", dead=dead)
    return _advance(b, node, parent)


def _advance(b: _Builder, node: Node, parent: Snapshot) -> list[str]:
    """Start items while fewer than the node's concurrency run; decide the node when
    every item ended. Writes ``parent``."""
    items = _items(b, parent)
    limit = concurrency(node)
    while (parent.items_started < parent.items
           and parent.items_started - parent.items_done < limit):
        index = parent.items_started
        parent = replace(parent, items_started=index + 1)
        error = _start_item(b, node, parent, index, items[index])
        if error is not None:
            parent = replace(parent, items_done=parent.items_done + 1)
            if node.on_item_failure == "fail":
                return fail_map(b, node, parent, f"item {index} failed: {error}")
    if parent.items_done >= parent.items:
        return _finish(b, node, parent)
    b.write(parent)
    return []


def _items(b: _Builder, parent: Snapshot) -> list[Any]:
    # A large expansion lives in the blob store.
    stored = (parent.input if parent.input_ref is None
              else b.view.node_input(parent.node_id))
    assert isinstance(stored, Mapping)
    return list(stored["items"])


def _start_item(b: _Builder, node: Node, parent: Snapshot, index: int,
                item: Any) -> str | None:
    """Ready item ``index`` (a fresh snapshot under a fence above any earlier run of
    it). Returns the error when its templates do not render (the item is then FAILED)."""
    from axengine.engine._rules import RENDERED_INPUT

    iid = item_id(node.id, index)
    old = b.snap(iid)  # a fresh PENDING snapshot when the item never ran
    base = Snapshot(task_id=parent.task_id, node_id=iid, fence=old.fence + 1,
                    checkpoint=old.checkpoint, ready_at=b.now)
    try:
        params = b.render_params(node, {"item": item, "index": index})
        revision = b.digest(params, RENDERED_INPUT, scope=(parent.task_id, iid))
    except (TemplateError, InputError) as exc:
        failed = replace(base, state=NodeState.FAILED, error=str(exc), finished_at=b.now)
        b.write(failed)
        b.event("failed", failed, str(exc))
        return str(exc)
    ready = replace(base, state=NodeState.WAITING, input=params, input_revision=revision)
    b.write(ready)
    b.event("ready", ready, f"item {index} of {parent.items}")
    b.plan.enqueue.append((iid, 0.0))
    return None


def _finish(b: _Builder, node: Node, parent: Snapshot) -> list[str]:
    """Every item ended: the node's output is their outputs in item order (under
    ``collect``, ``{"ok", "output"}`` or ``{"ok", "error"}`` per item); decide its
    edges."""
    from axengine.engine._rules import _taken

    ids = [item_id(node.id, i) for i in range(parent.items)]
    b.view.require(i for i in ids if i not in b.plan.writes)
    results: list[Any] = []
    for iid in ids:
        snap = b.snap(iid)
        ok = snap.state is NodeState.SUCCEEDED
        if node.on_item_failure == "collect":
            results.append({"ok": True, "output": b.output_of(iid)} if ok
                           else {"ok": False, "error": snap.error})
        else:
            results.append(b.output_of(iid))
    try:
        hops = b.decide_edges(node, results)
    except TemplateError as exc:
        return b.failure(node, parent, f"guard on {node.id}: {exc}", retryable=False)
    failed = sum(1 for r in results if isinstance(r, dict) and r.get("ok") is False) \
        if node.on_item_failure == "collect" else 0
    done = replace(
        parent, state=NodeState.SUCCEEDED, owner="", output=results, output_ref=None,
        output_sha256=b.digest(results), next_hops=hops, finished_at=b.now, error="",
    )
    b.write(done)
    b.event("committed", done, f"{parent.items} item(s)"
            + (f", {failed} failed" if failed else "") + f" -> {_taken(hops)}")
    return [node.id]


def fail_map(b: _Builder, node: Node, parent: Snapshot, message: str, *,
             dead: bool = False) -> list[str]:
    """The map fails: its started items that have not ended are cancelled (their
    workers find their fence stale) and the node fails as any node does (routed by
    ``on_failure``, else FAILED or, with ``dead``, DEAD)."""
    for index in range(parent.items_started):
        iid = item_id(node.id, index)
        snap = b.snap(iid)
        if snap.state not in FINAL_STATES:
            out = replace(snap, state=NodeState.CANCELLED, owner="", lease_until=0.0,
                          finished_at=b.now, fence=snap.fence + 1)
            b.write(out)
            b.event("cancelled", out, f"{node.id} failed: {message}"[:500])
    return b.failure(node, replace(parent, owner=""), message, retryable=False, dead=dead)


def started_items(b: _Builder, parent: Snapshot) -> list[str]:
    """Ids of the items of ``parent`` started so far (loaded into the view)."""
    ids = [item_id(parent.node_id, i) for i in range(parent.items_started)]
    b.view.require(i for i in ids if i not in b.plan.writes)
    return ids


# --------------------------------------------------------------------------- loops


def loop_names(b: _Builder, node: Node) -> dict[str, Any]:
    """The names a loop body's templates read: ``visit`` (1 for the first) and
    ``previous`` (each body node's output in the previous visit; null on the first, or
    for a node that did not succeed then). Empty outside a loop."""
    dag = b.view.dag
    closer = dag.loop_of(node.id)
    if closer is None:
        return {}
    body = dag.loops[closer]
    visit = max(b.snap(node.id).visit, 1)
    scope = dag.scope_of(node.id)
    cut = len(scope) + len(SCOPE) if scope is not None else 0  # the sub-DAG's own names
    previous: dict[str, Any] = {nid[cut:]: None for nid in body}
    if visit > 1:
        kept = [visit_id(n, visit - 1) for n in body]
        b.view.require(k for k in kept if k not in b.plan.writes)
        for nid, key in zip(body, kept, strict=True):
            if b.snap(key).state is NodeState.SUCCEEDED:
                previous[nid[cut:]] = b.output_of(key)
    return {"visit": visit, "previous": previous}


def loop_again(b: _Builder, closer: Node) -> bool:
    """``closer`` was just decided: when it took its loop's back edge and the loop's
    first node has visits left, keep this visit's snapshots and reset the body for the
    next one (True: the caller readies the first node instead of counting ``closer``
    off at its forward targets). At the bound the back edge is recorded as not taken
    (False, as when it was not taken)."""
    edge = closer.loop_edge
    assert edge is not None and edge.max_visits is not None
    snap = b.snap(closer.id)
    if not any(h.target_node_id == edge.target and h.is_taken for h in snap.next_hops):
        return False
    dag = b.view.dag
    body = dag.loops[closer.id]
    visit = max(b.snap(edge.target).visit, 1)
    if visit >= edge.max_visits:
        ended = replace(snap, next_hops=tuple(
            NextHop(h.target_node_id, h.is_taken and h.target_node_id != edge.target)
            for h in snap.next_hops))
        b.write(ended)
        b.event("loop_ended", ended, f"{edge.target} had {visit} visit(s), its bound "
                f"(max_visits {edge.max_visits}): the loop is left")
        return False
    b.view.require(n for n in body if n not in b.plan.writes)
    kept = {n: visit_id(n, max(b.snap(n).visit, 1)) for n in body}
    b.view.require(k for k in kept.values() if k not in b.plan.writes)
    for nid in body:
        current = b.snap(nid)
        b.write(replace(current, node_id=kept[nid]))
        first = nid == edge.target
        b.write(Snapshot(
            task_id=current.task_id, node_id=nid, fence=current.fence + 1, visit=visit + 1,
            preds_left=0 if first else len(dag.predecessors[nid]), reached=first,
        ))
    b.event("looped", b.snap(kept[closer.id]),
            f"{closer.id} -> {edge.target}: visit {visit + 1} of at most {edge.max_visits}")
    return True


# --------------------------------------------------------------------------- sub-DAGs


def ready_subdag(b: _Builder, node: Node, snap: Snapshot) -> list[str]:
    """Start sub-DAG node ``node``: render its input, hold it RUNNING while its DAG
    runs and ready that DAG's first nodes. Returns ``[node.id]`` when it is decided on
    the spot (its input did not render)."""
    from axengine.engine._rules import RENDERED_INPUT

    assert node.subdag is not None
    try:
        params = b.render_params(node)
        revision = b.digest(params, RENDERED_INPUT, scope=(snap.task_id, node.id))
    except (TemplateError, InputError) as exc:
        return b.failure(node, snap, str(exc), retryable=False)
    dag = b.view.dag
    children = dag.children(node.id)
    last = [c for c in children if not dag.nodes[c].targets]
    started = replace(
        snap, state=NodeState.RUNNING, owner=SUBDAG_OWNER, lease_until=0.0, input=params,
        input_ref=None, input_revision=revision,
        attempt=snap.attempt + 1, fence=snap.fence + 1, ready_at=b.now, started_at=b.now,
        not_before=0.0, error="", evidence="", items=len(last), items_done=0,
    )
    b.write(started)
    b.event("started", started, f"sub-DAG {node.subdag.name} ({len(children)} nodes, "
            f"hash {node.subdag.hash[:12]})")
    first = [c for c in children if not dag.predecessors[c]]
    b.view.require(c for c in first if c not in b.plan.writes)
    for nid in first:
        b.write(replace(b.snap(nid), reached=True))
    b.settle(roots=first)
    return []


def child_ended(b: _Builder, node_id: str) -> list[str]:
    """``node_id``, one of a sub-DAG's last nodes, was just decided: count it off on the
    sub-DAG node, and end that node when it was the last. Returns the nodes decided."""
    dag = b.view.dag
    scope = dag.scope_of(node_id)
    assert scope is not None
    parent = b.snap(scope)
    if parent.state is not NodeState.RUNNING or parent.owner != SUBDAG_OWNER:
        return []  # the sub-DAG node ended already (cancelled, failed on the deadline)
    parent = replace(parent, items_done=parent.items_done + 1)
    if parent.items_done < parent.items:
        b.write(parent)
        return []
    return _finish_subdag(b, dag.nodes[scope], parent)


def _finish_subdag(b: _Builder, node: Node, parent: Snapshot) -> list[str]:
    """Every last node of the sub-DAG is decided: the node fails when one of the
    sub-DAG's nodes failed with no route; else its output is the sub-DAG's ``output``
    template (or ``{last node: output}`` of its last nodes that succeeded)."""
    from axengine.engine._rules import _taken

    assert node.subdag is not None
    dag = b.view.dag
    children = dag.children(node.id)
    b.view.require(c for c in children if c not in b.plan.writes)
    prefix = node.id + SCOPE
    held = replace(parent, owner="")
    for nid in children:
        snap = b.snap(nid)
        if snap.state is NodeState.FAILED and not dag.nodes[nid].on_failure:
            return b.failure(node, held, f"sub-DAG node {nid[len(prefix):]} failed: "
                             f"{snap.error}", retryable=False)
    try:
        if node.subdag.output is not None:
            refs = template_refs(node.subdag.output)
            output = named("sub-DAG output template", template.render_value,
                           node.subdag.output, b.scope_context(node.id, refs))
        else:
            output = {nid[len(prefix):]: b.output_of(nid) for nid in children
                      if not dag.nodes[nid].targets
                      and b.snap(nid).state is NodeState.SUCCEEDED}
        digest = b.digest(output, "sub-DAG output template: the rendered output")
        hops = b.decide_edges(node, output)
    except (TemplateError, InputError) as exc:
        return b.failure(node, held, str(exc), retryable=False)
    done = replace(
        held, state=NodeState.SUCCEEDED, output=output, output_ref=None,
        output_sha256=digest, next_hops=hops, finished_at=b.now, error="",
    )
    b.write(done)
    b.event("committed", done, f"sub-DAG {node.subdag.name} -> {_taken(hops)}")
    return [node.id]
