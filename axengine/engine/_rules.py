"""The pure transition rules of DESIGN §3.

Each ``plan_*`` function reads a :class:`View` and returns a :class:`Plan`: the
snapshots to write, the events to append, the nodes to enqueue after the commit, and the
answer for the caller. No I/O, no clock, no randomness: ``now`` and event ids come in as
arguments, and everything iterated in a decision is in document or sorted order, so the
same inputs always give the same writes.

The shell (``_shell.py``) applies a plan as one store transaction that compares the
mod_revision of every snapshot it writes — and of the task record whenever a node moves
between categories (ready/running, paused, final), which is what serialises the
decisions that depend on several nodes (joins, skip propagation, task status).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from axengine import template, timeouts
from axengine.activity import Activity
from axengine.blocking import BlockingPolicy, Verdict
from axengine.dag import SCOPE, Dag, Node, is_item, is_visit
from axengine.engine import _expand, _stall
from axengine.engine._ramp import Ramp, Waiter, dependency_of
from axengine.engine._refs import (
    expression_refs,
    guard_refs,
    literal_params,
    named,
    param_refs,
    passed_output,
)
from axengine.engine._view import Need, View
from axengine.errors import Conflict, Forbidden, InputError, TemplateError
from axengine.limits import (
    canonical_bytes,
    canonical_json,
    canonical_list,
    canonical_parts,
    json_text_bytes,
    kept_text,
    known_text,
    sha256_json,
)
from axengine.records import (
    COMPOSITE_OWNERS,
    FINAL_STATES,
    NO_EDITS,
    Event,
    NextHop,
    NodeState,
    Snapshot,
    TaskRecord,
    TaskStatus,
    replace,
)
from executors.contract import Failure, Outcome, Paused, Success, Unavailable

__all__ = [
    "DECIDED_STATES",
    "GATE_TIMEOUT_ACTOR",
    "NO_EDITS",
    "NextClaim",
    "Plan",
    "RuleConfig",
    "backoff_delay",
    "category",
    "derive_status",
    "four_eyes_violation",
    "holds",
    "plan_cancel",
    "plan_checkpoint",
    "plan_claim",
    "plan_complete",
    "plan_decide",
    "plan_expire",
    "plan_heartbeat",
    "plan_progress",
    "plan_resume",
    "plan_retry",
    "plan_submit",
    "sha256_json",
]

log = logging.getLogger(__name__)

#: States whose outgoing edges are decided (``next_hops`` is final).
DECIDED_STATES = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.SKIPPED})
#: ``by`` of the decision the reconciler applies when a gate's wait expires (``on_timeout``).
GATE_TIMEOUT_ACTOR = "ax:gate-timeout"
#: Node types the engine resolves itself, in the transaction that readies them (a
#: sub-DAG node by running its DAG), not by running a handler.
INLINE_TYPES = frozenset({"condition", "human_gateway", "dag"})

EventIds = Callable[[], str]


@dataclass(frozen=True)
class RuleConfig:
    """Tunables of the rules.

    Attributes:
        backoff_base: First retry delay in seconds (doubles per attempt).
        backoff_cap: Largest retry delay (jitter included).
        unavailable_delay: Delay before a node kept WAITING by an unavailable
            dependency is offered again, when the dependency named no time.
        retry_after_cap: Longest wait a dependency's ``Retry-After`` can impose; a
            larger (or absurd) value is cut to this.
        ramp_full: Admission limit at which a dependency's ramp after an outage ends
            (it starts at one and doubles on each success).
        ramp_poll: Seconds after which a node the ramp did not admit asks again.
        ramp_waiter_ttl: Seconds after which a waiter that stopped asking is forgotten.
        pause_cap: Longest time a handler's pause may name (a node paused with no time
            waits for a resume call however long).
    """

    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    unavailable_delay: float = 5.0
    retry_after_cap: float = 3600.0
    ramp_full: int = 16
    pause_cap: float = 30 * 86400.0
    ramp_poll: float = 1.0
    ramp_waiter_ttl: float = 15.0
    #: How a running node's silence is graded (:mod:`axengine.blocking`); its
    #: ``lease_seconds`` is ignored: the engine judges against each node's granted lease.
    blocking: BlockingPolicy = field(default_factory=BlockingPolicy)


@dataclass
class Plan:
    """What a transition decided.

    Attributes:
        result: The answer for the caller (``committed``, ``stale``, ``already-done``,
            ``claimed``, ``not-claimable``, ``ok``...).
        writes: Snapshots to write, by node id.
        events: Events to append.
        enqueue: ``(node_id, delay_seconds)`` to push to the queue after the commit.
        acks: ``(worker, node_id)``: queue items of nodes this plan claimed that the
            claiming worker holds (it took them from the queue), acknowledged with the
            push after the commit.
        task: Task record fields changed explicitly (status on cancel/retry).
        detail: Extra data for the caller (the claimed snapshot, a reason...).
    """

    result: str
    writes: dict[str, Snapshot] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    enqueue: list[tuple[str, float]] = field(default_factory=list)
    acks: list[tuple[str, str]] = field(default_factory=list)
    task: TaskRecord | None = None
    detail: Any = None
    #: Ramps to write by dependency (None: delete), under a compare on their revision.
    ramps: dict[str, Ramp | None] = field(default_factory=dict)
    #: Run durations to record by node id (written without a compare: a sample lost
    #: to a concurrent commit of the same DAG node is harmless).
    durations: dict[str, list[float]] = field(default_factory=dict)
    #: The canonical JSON text of values the plan hashed (:meth:`_Builder.digest`), by
    #: ``id(value)``, each with its value (which keeps the id from being reused) and,
    #: for an object, its members' texts (:func:`~axengine.limits.canonical_parts`):
    #: the write of a snapshot holding one as its output or input reuses them, so a
    #: node's output is encoded once, not once to hash and again to store. (A cache:
    #: not part of what the plan decided, so not compared.)
    encoded: dict[int, tuple[Any, str, dict[str, str] | None]] = field(
        default_factory=dict, compare=False, repr=False)


# --------------------------------------------------------------------------- helpers


#: How a rendered input that JSON cannot hold is named in the node's failure.
RENDERED_INPUT = "input template: the rendered input"


def backoff_delay(attempt: int, key: str, config: RuleConfig) -> float:
    """Exponential backoff with deterministic jitter (±20%, derived from ``key``), never
    longer than ``config.backoff_cap``."""
    base = min(config.backoff_cap, config.backoff_base * 2 ** max(attempt - 1, 0))
    frac = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    # The cap comes last: it is the largest delay, jitter included.
    return float(min(config.backoff_cap, base * (0.8 + 0.4 * frac)))


def category(node: Node, snap: Snapshot) -> str | None:
    """Bucket of a node for the task's counters: ACTIVE (waiting or running), PAUSED,
    FAILED_UNROUTED (failed with no ``on_failure``), COMPOSITE (a map or sub-DAG node
    whose instances run) or the state's own name; None for a loop's kept visit, which
    is history and not counted."""
    if is_visit(snap.node_id):
        return None
    if snap.state is NodeState.RUNNING and snap.owner in COMPOSITE_OWNERS:
        # A map or sub-DAG node: its items or its DAG's nodes say whether the task runs,
        # waits for a person or needs one.
        return "COMPOSITE"
    if snap.state in (NodeState.WAITING, NodeState.RUNNING):
        return "ACTIVE"
    if (snap.state is NodeState.FAILED and not node.on_failure
            and not is_item(snap.node_id) and SCOPE not in snap.node_id):
        # (A map's item or a sub-DAG's node that failed is decided by its map or sub-DAG
        # node, which counts.)
        return "FAILED_UNROUTED"
    return snap.state.value


def derive_status(counts: Mapping[str, int], cancelled: bool) -> TaskStatus:
    """Task status from node counters: running while anything is active, paused while
    only gates wait, then DEAD > FAILED > SUCCEEDED."""
    if cancelled:
        return TaskStatus.CANCELLED
    if counts.get("ACTIVE", 0) > 0:
        return TaskStatus.RUNNING
    if counts.get("PAUSED", 0) > 0:
        return TaskStatus.PAUSED
    if counts.get("DEAD", 0) > 0:
        return TaskStatus.DEAD
    if counts.get("FAILED_UNROUTED", 0) > 0:
        return TaskStatus.FAILED
    return TaskStatus.SUCCEEDED


class _Builder:
    """Accumulates a plan; reads see the plan's own writes first."""

    def __init__(self, view: View, now: float, ids: EventIds, actor: str) -> None:
        self.view = view
        self.now = now
        self.ids = ids
        self.actor = actor
        self.plan = Plan(result="committed")
        #: While nodes are readied (innermost last): each snapshot's write before the
        #: readying (None: none), to undo a readying that failed.
        self._undo: list[dict[str, Snapshot | None]] = []

    def snap(self, node_id: str) -> Snapshot:
        return self.plan.writes.get(node_id) or self.view.snap(node_id)

    def digest(self, value: Any, field: str = "value", *,
               scope: tuple[str, str] | None = None) -> str:
        """:func:`sha256_json` of ``value`` — with ``scope`` (task id, node id), of
        ``[*scope, value]``, a rendered input's revision — keeping the text for the
        write of the snapshot that holds ``value`` (:attr:`Plan.encoded`).

        Raises:
            InputError: As :func:`sha256_json`.
        """
        text, members = canonical_parts(value, field, self.plan.encoded)
        if scope is not None:  # canonical_json([*scope, value]), from the parts
            data = json_text_bytes(canonical_list(
                [canonical_json(scope[0]), canonical_json(scope[1]), text]), field)
        else:
            data = json_text_bytes(text, field)
        self.plan.encoded[id(value)] = (value, text, members)
        return hashlib.sha256(data).hexdigest()

    def same_text(self, copy: Any, source: Any) -> None:
        """``copy``, made equal to ``source``, has its canonical text when this plan
        made that text (:attr:`Plan.encoded`): a node's input that passes on the output
        committed in the same transaction is not encoded again to be hashed and stored."""
        known = known_text(source, self.plan.encoded)
        if known is not None and copy is not source:
            self.plan.encoded[id(copy)] = (copy, known[1], known[2])

    def write(self, snap: Snapshot) -> None:
        # A rule that made the snapshot with ``last_updated=b.now`` saves a copy here.
        if snap.last_updated != self.now:
            snap = replace(snap, last_updated=self.now)
        if self._undo:
            self._undo[-1].setdefault(snap.node_id, self.plan.writes.get(snap.node_id))
        self.plan.writes[snap.node_id] = snap

    def event(self, kind: str, snap: Snapshot | None = None, detail: str = "", *,
              actor: str = "") -> None:
        """Record an event of ``snap``'s node (None: of the task) by ``actor`` (default:
        who the transition is by)."""
        self.plan.events.append(
            Event(
                task_id=self.view.task.task_id,
                event_id=self.ids(),
                kind=kind,
                at=self.now,
                node_id=snap.node_id if snap else "",
                state=snap.state.value if snap else "",
                attempt=snap.attempt if snap else 0,
                fence=snap.fence if snap else 0,
                actor=actor or self.actor,
                detail=detail,
            )
        )

    def output_of(self, node_id: str) -> Any:
        written = self.plan.writes.get(node_id)
        if written is not None and written.output_ref is None:
            return written.output
        return self.view.output(node_id)

    # ------------------------------------------------------------- templates

    def context(self, refs: frozenset[str] | None, output: Any = template.MISSING, *,
                node: Node | None = None) -> dict[str, Any]:
        """The names templates of ``node`` read: the input, the outputs of the nodes in
        ``refs`` (None: every node), task facts, ``output`` for guards, and in a loop's
        body ``visit`` and ``previous``. A sub-DAG's node reads its sub-DAG: ``input``
        is its ``dag`` node's rendered input and ``nodes`` are its sub-DAG's."""
        scope = self.view.dag.scope_of(node.id) if node is not None else None
        names = self.scope_context(scope, refs, output)
        if node is not None:
            names.update(_expand.loop_names(self, node))
        return names

    def scope_context(self, scope: str | None, refs: frozenset[str] | None,
                      output: Any = template.MISSING) -> dict[str, Any]:
        """The names of a template in the task's DAG (``scope`` None) or in the DAG of
        sub-DAG node ``scope``: ``refs`` are node ids as that DAG names them."""
        dag = self.view.dag
        if scope is None:
            local = [n for n in dag.nodes if SCOPE not in n] if refs is None else sorted(refs)
            ids = {n: n for n in local}
            given = self.view.input()
        else:
            prefix = scope + SCOPE
            local = ([c[len(prefix):] for c in dag.children(scope)] if refs is None
                     else sorted(refs))
            ids = {n: prefix + n for n in local}
            params = self.input_of(scope)
            given = params.get("input") if isinstance(params, Mapping) else None
        self.view.require(ids.values())
        outputs = {}
        for name, nid in ids.items():
            if self.snap(nid).state is NodeState.SUCCEEDED:
                outputs[name] = self.output_of(nid)
            else:
                outputs[name] = None
        task = self.view.task
        return template.template_context(
            input=given,
            nodes=outputs,
            task={"id": task.task_id, "labels": dict(task.labels), "dag": task.dag_name},
            output=output,
        )

    def input_of(self, node_id: str) -> Any:
        """A node's rendered input, as this plan wrote it or as stored."""
        written = self.plan.writes.get(node_id)
        if written is not None and written.input_ref is None:
            return written.input
        return self.view.node_input(node_id)

    # ------------------------------------------------------------- edges

    def decide_edges(self, node: Node, output: Any,
                     label: str | None = None) -> tuple[NextHop, ...]:
        """Evaluate ``node``'s guards once; the result is cached in ``next_hops``."""
        taken: dict[str, bool] = {}
        ctx: dict[str, Any] | None = None
        for edge in node.next:
            if edge.when is not None:
                hit = label == edge.when
            elif edge.condition is not None:
                if ctx is None:
                    ctx = self.context(guard_refs(node), output, node=node)
                hit = template.evaluate_guard(edge.condition, ctx)
            else:
                hit = True
            taken[edge.target] = taken.get(edge.target, False) or hit
        if node.on_failure:
            taken.setdefault(node.on_failure, False)
        return tuple(NextHop(t, v) for t, v in taken.items())

    # ------------------------------------------------------------- propagation

    def settle(self, decided: Iterable[str] = (), roots: Iterable[str] = ()) -> None:
        """Propagate decisions through the graph.

        Each node in ``decided`` has just got its final ``next_hops``: it is counted off
        at every target (``preds_left -= 1``, ``reached |= edge taken``). A target whose
        predecessors are all decided is resolved: readied when an edge leads to it,
        skipped otherwise. ``roots`` (entry nodes, a retried node) are resolved directly.
        The cost is O(out-degree) per decision — a 1,000-wide join costs O(1) per
        arriving edge — and it runs as a worklist, so long skip chains need no recursion.
        """
        dag = self.view.dag
        work: list[tuple[bool, str]] = [(True, n) for n in decided]
        work += [(False, n) for n in roots]
        while work:
            is_decided, nid = work.pop(0)
            node = dag.nodes[nid]
            if is_decided:
                if node.loop_edge is not None and _expand.loop_again(self, node):
                    # The body was reset for its next visit: its first node runs again,
                    # and the loop's exits wait for the visit that leaves it.
                    work.append((False, node.loop_edge.target))
                    continue
                if SCOPE in nid and not node.targets:
                    # A last node of a sub-DAG: its dag node ends with the last of them.
                    work.extend((True, n) for n in _expand.child_ended(self, nid))
                hops = {h.target_node_id: h.is_taken for h in self.snap(nid).next_hops}
                # One load for every target: a 1,000-wide fan-out is one read, not 1,000.
                self.view.require(t for t in node.targets if t not in self.plan.writes)
                for target in node.targets:
                    ts = self.snap(target)
                    if ts.state is not NodeState.PENDING:
                        continue
                    ts = replace(ts, preds_left=max(ts.preds_left - 1, 0),
                                 reached=ts.reached or hops.get(target, False),
                                 last_updated=self.now)
                    self.write(ts)
                    if ts.preds_left == 0:
                        work.append((False, target))
                continue
            snap = self.snap(nid)
            if snap.state is not NodeState.PENDING or snap.preds_left > 0:
                continue
            # (A sub-DAG's first nodes start with their dag node, which marks them reached.)
            if snap.reached or (not dag.predecessors[nid] and SCOPE not in nid):
                work.extend((True, n) for n in self._ready_or_fail(node))
            else:
                skipped = replace(
                    snap, state=NodeState.SKIPPED, finished_at=self.now,
                    next_hops=tuple(NextHop(t, False) for t in node.targets),
                )
                self.write(skipped)
                self.event("skipped", skipped, "no taken edge leads here")
                work.append((True, nid))

    def _ready_or_fail(self, node: Node) -> list[str]:
        """:meth:`ready`, with a safety net. Every error of a DAG or its data is caught
        where it arises and fails its node; an error that escapes is a bug of ax. It
        fails the node too, with what the readying wrote undone, instead of the
        transition that readied it: that one would fail on every retry, until its own
        node was DEAD for what another node's readying did. A readying writes snapshots,
        events and queue entries (ramps and durations are the claim's and the
        completion's, outside it): those are undone."""
        plan = self.plan
        events, enqueue = len(plan.events), len(plan.enqueue)
        undo: dict[str, Snapshot | None] = {}
        self._undo.append(undo)
        try:
            decided = self.ready(node)
        except Need:
            raise  # (the rule is decided again once the view holds what it needs)
        except Exception as exc:
            for nid, before in undo.items():
                if before is None:
                    del plan.writes[nid]
                else:
                    plan.writes[nid] = before
            del plan.events[events:], plan.enqueue[enqueue:]
            undo.clear()
            log.exception("task %s: readying node %s failed (a bug of ax; the node fails)",
                          self.view.task.task_id, node.id)
            decided, why = [], (f"ax could not ready this node ({type(exc).__name__}: "
                                f"{exc}): a bug of ax, please report it")
        else:
            why = ""
        finally:
            self._undo.pop()
            if self._undo:  # an outer readying undoes this one's writes too
                for nid, before in undo.items():
                    self._undo[-1].setdefault(nid, before)
        if why:
            return self.failure(node, self.snap(node.id), why, retryable=False)
        return decided

    def ready(self, node: Node) -> list[str]:
        """Make ``node`` runnable. Returns the nodes decided on the spot (a condition
        evaluated inline, a node whose input failed to render and was routed)."""
        snap = self.snap(node.id)
        if node.type == "condition":
            return self._run_condition(node, snap)
        if node.map is not None:
            return _expand.ready_map(self, node, snap)
        if node.subdag is not None:
            return _expand.ready_subdag(self, node, snap)
        try:
            params = self.render_params(node)
            revision = self.digest(params, RENDERED_INPUT, scope=(snap.task_id, node.id))
        except (TemplateError, InputError) as exc:  # named: input, prompt, description
            return self.failure(node, snap, str(exc), retryable=False)
        snap = replace(
            snap, state=NodeState.WAITING, input=params, input_ref=None,
            input_revision=revision,
            ready_at=self.now, not_before=0.0, error="", evidence="", last_updated=self.now,
        )
        if node.type == "human_gateway":
            snap = replace(
                snap, state=NodeState.PAUSED, paused_at=self.now,
                gate_until=self.now + node.timeout,
            )
            self.write(snap)
            self.event("paused", snap, f"waiting for a decision until {utc(snap.gate_until)}")
            return []
        self.write(snap)
        self.event("ready", snap)
        self.plan.enqueue.append((node.id, 0.0))
        return []

    def render_params(self, node: Node, item: Mapping[str, Any] | None = None
                      ) -> dict[str, Any]:
        """The node's rendered input (and prompt, and a gate's description); ``item``:
        a map item's ``item`` and ``index``."""
        if literal_params(node):
            # Nothing to render: no context to build (a node with fixed input).
            params: dict[str, Any] = {"input": template.literal_value(node.input)}
            if node.prompt is not None:
                params["prompt"] = node.prompt
            if node.type == "human_gateway" and node.description:
                params["description"] = node.description
            return params
        refs = param_refs(node)
        ctx = self.context(refs, node=node)
        if item is not None:
            ctx.update(item)
        params = {"input": named("input template", template.render_value, node.input,
                                 ctx)}
        source = passed_output(node)
        if source is not None:  # the input is a copy of that output: the same text
            self.same_text(params["input"], ctx["nodes"][source]["output"])
        # `input` is the task input in every template; a prompt and a gate's description
        # also read the node's own rendered input as `node.input`.
        own = {**ctx, "node": {"id": node.id, "input": params["input"]}}
        if node.prompt is not None:
            prompt_ctx = own
            if node.input is not None and _legacy_prompt(node.prompt):
                # Stored before `node.input` existed, when such a prompt read `input` as
                # the node's input: it keeps that meaning (ax validate refuses the form
                # now, `ambiguous-input`), so a stored DAG never changes without a word.
                prompt_ctx = {**own, "input": params["input"]}
            params["prompt"] = named("prompt template", template.render, node.prompt,
                                     prompt_ctx)
        if node.type == "human_gateway" and node.description:
            params["description"] = named("description template", template.render,
                                           node.description, own)
        return params

    def _run_condition(self, node: Node, snap: Snapshot) -> list[str]:
        assert node.expression is not None
        preds = self.view.dag.predecessors[node.id]
        upstream = [p for p in preds if self.snap(p).state is NodeState.SUCCEEDED]
        try:
            output = self.output_of(upstream[0]) if upstream else None
            if node.input is not None:
                output = named("input template", template.render_value, node.input,
                                self.context(param_refs(node), node=node))
                canonical_bytes(output, RENDERED_INPUT)  # stored with the decision
            ctx = self.context(expression_refs(node), output, node=node)
            label = named("expression", template.evaluate_expression, node.expression, ctx)
        except (TemplateError, InputError) as exc:
            return self.failure(node, snap, str(exc), retryable=False)
        try:
            hops = self.decide_edges(node, label, label)
        except TemplateError as exc:  # worded as plan_complete words a guard error
            return self.failure(node, snap, f"guard on {node.id}: {exc}", retryable=False)
        done = replace(
            snap, state=NodeState.SUCCEEDED, attempt=snap.attempt + 1, fence=snap.fence + 1,
            input={"output": output}, output=label, output_ref=None,
            output_sha256=self.digest(label), next_hops=hops, ready_at=self.now,
            started_at=self.now, finished_at=self.now,
        )
        self.write(done)
        self.event("committed", done, f"label={label} -> {_taken(hops)}")
        return [node.id]

    def fail(self, node: Node, snap: Snapshot, message: str, *, retryable: bool,
             dead: bool = False) -> None:
        """A final failure found by a rule (complete, decide, claim, expire), recorded
        and settled: every way a node ends in failure routes and counts off alike."""
        self.settle(decided=self.failure(node, snap, message, retryable=retryable, dead=dead))

    def failure(self, node: Node, snap: Snapshot, message: str, *, retryable: bool,
                dead: bool = False) -> list[str]:
        """Record a final failure: route through ``on_failure`` when the node has one
        (FAILED); otherwise DEAD (``dead=True``: needs a person; successors wait) or
        FAILED (task fails; successors are skipped). Returns ``[node.id]`` when the
        node's edges are decided (FAILED), ``[]`` when they are not (DEAD), for the
        caller to settle: :meth:`ready` (inside :meth:`settle`) or :meth:`fail`."""
        ended = replace(snap, error=message, error_retryable=retryable,
                        finished_at=self.now, owner="", lease_until=0.0)
        if is_item(snap.node_id):
            # A map's item: FAILED for good, and its map node decides what that means.
            out = replace(ended, state=NodeState.FAILED)
            self.write(out)
            self.event("failed", out, message)
            return _expand.item_ended(self, node, out, error=message, dead=dead)
        if node.on_failure:
            hops = tuple(NextHop(t, t == node.on_failure) for t in node.targets)
            out = replace(ended, state=NodeState.FAILED, next_hops=hops)
            self.write(out)
            self.event("failed", out, f"{message}; routed to {node.on_failure}")
            return [node.id]
        state = NodeState.DEAD if dead else NodeState.FAILED
        out = replace(ended, state=state)
        if state is NodeState.FAILED:
            out = replace(out, next_hops=tuple(NextHop(t, False) for t in node.targets))
        self.write(out)
        self.event(state.value.lower(), out, message)
        return [node.id] if state is NodeState.FAILED else []


def _taken(hops: Iterable[NextHop]) -> str:
    hops = tuple(hops)
    names = [h.target_node_id for h in hops if h.is_taken]
    if not hops:
        return "(end)"
    return ", ".join(names) if names else "(no edge taken)"


def _builder(view: View, now: float, ids: EventIds, actor: str) -> _Builder:
    return _Builder(view, now, ids, actor)


def _stall_recorded(b: _Builder, snap: Snapshot, verdict: Verdict) -> Plan:
    """Record a verdict short of a fence when it is news (its action differs from the
    last one on this stall): the history on the snapshot and one event — ``stall_note``,
    ``stall_warning`` or ``stall_extended`` — with the evidence; so a node judged on
    every reconciler pass gives one event per change, not one per pass. An ``ok`` or a
    repeated verdict writes nothing."""
    kind = _stall.VERDICT_EVENTS.get(verdict.action)
    if kind is None or not verdict.news:
        return Plan("ok")
    out = _stall.recorded(snap, verdict)
    b.write(out)
    b.event(kind, out, verdict.evidence)
    return b.plan


# --------------------------------------------------------------------------- rules


def plan_submit(view: View, *, now: float, ids: EventIds, actor: str = "api",
                claim_next: NextClaim | None = None) -> Plan:
    """Initial snapshots (all PENDING) with the entry nodes readied. ``view.snaps``
    must hold a fresh PENDING snapshot for every node. ``claim_next``: claim for the
    submitting worker one readied entry node (:func:`_claim_next`; ``plan.detail``)."""
    b = _builder(view, now, ids, actor)
    for snap in view.snaps.values():
        b.write(snap)
    b.event("submitted", None, f"dag={view.task.dag_name} hash={view.task.dag_hash[:12]}")
    b.settle(roots=view.dag.entry_nodes)
    if claim_next is not None:
        _claim_next(b, claim_next)
    return b.plan


def plan_claim(view: View, node_id: str, *, worker: str, lease: float, now: float,
               ids: EventIds, config: RuleConfig = RuleConfig()) -> Plan:
    """WAITING (or RUNNING with an expired lease or stalled progress) → RUNNING with
    ``fence += 1`` and ``attempt += 1``; past the deadline, ``queue_timeout`` or attempt
    budget → ``dead`` (nothing to run): DEAD, or FAILED and routed by ``on_failure``."""
    b = _builder(view, now, ids, worker)
    node = view.dag.node(node_id)
    snap = view.snap(node_id)
    task = view.task
    if snap.owner in COMPOSITE_OWNERS:
        # A map's items or a sub-DAG's nodes run, not the node itself.
        return Plan("not-claimable", detail=(snap.owner, 0.0))
    if snap.state is NodeState.WAITING:
        if now < snap.not_before:
            return Plan("not-claimable", detail=("backoff", snap.not_before - now))
    elif snap.state is NodeState.RUNNING:
        # Stalled means what the reconciler would fence (_stall.stall_verdict): a node
        # extended because it works, or warned about, is not taken over early.
        if now < snap.lease_until and _stall.stall_verdict(
                node, snap, now, config.blocking).action != "fence":
            return Plan("not-claimable", detail=("leased", snap.lease_until - now))
        b.event("lease_expired", snap, f"owner {snap.owner} lost the node (fence {snap.fence})")
    else:
        return Plan("not-claimable", detail=(snap.state.value, 0.0))
    if task.deadline and now >= deadline_at(task, now):
        b.fail(node, snap, "task deadline passed", retryable=False, dead=True)
        b.plan.result = "dead"
        return b.plan
    queued = queued_since(snap)
    if (node.queue_timeout and snap.state is NodeState.WAITING
            and now - queued > node.queue_timeout):
        b.fail(node, snap, f"waited {now - queued:.0f}s for a worker "
               f"(queue_timeout {node.queue_timeout:g}s)", retryable=False, dead=True)
        b.plan.result = "dead"
        return b.plan
    if snap.attempt >= node.attempts:
        b.fail(node, snap, f"attempts exhausted ({snap.attempt}/{node.attempts})"
               + (f": {snap.error}" if snap.error else ""), retryable=False, dead=True)
        b.plan.result = "dead"
        return b.plan
    dependency = dependency_of(node)
    ramp = view.ramp(dependency) if dependency else None
    if dependency and ramp is not None:
        ramp, admitted = _admit(ramp, snap, node, task, now=now, lease=lease, config=config)
        if not admitted:
            # Not claimed: no lease to expire, no attempt spent; asks again shortly.
            return Plan("not-claimable", detail=("ramp", config.ramp_poll),
                        ramps={dependency: ramp})
        b.plan.ramps[dependency] = ramp
    b.plan.result = "claimed"
    b.plan.detail = _take(b, node, snap, worker=worker, lease=lease)
    return b.plan


def _take(b: _Builder, node: Node, snap: Snapshot, *, worker: str, lease: float) -> Snapshot:
    """Write the claim of an admitted node: RUNNING for ``worker`` under a new fence and
    attempt, with the lease and the attempt's timeout (the one place a claim is made)."""
    now = b.now
    timeout, why = _attempt_timeout(b.view, node, snap)
    claimed = replace(
        snap, state=NodeState.RUNNING, fence=snap.fence + 1, attempt=snap.attempt + 1,
        owner=worker, lease_until=_lease_until(b.view.task, now, lease), heartbeat_at=now,
        progress_at=now, progress_marker="", started_at=now, evidence="",
        attempt_timeout=timeout, last_updated=now,
    )
    b.write(claimed)
    # By the worker it is claimed for, whoever's transaction claims it (a submit's).
    b.event("claimed", claimed, why, actor=worker)
    return claimed


@dataclass(frozen=True)
class NextClaim:
    """A completion's offer to run one node it readies, claimed in the same transaction
    (the worker that committed the outcome goes on with its slot, skipping the queue).

    Attributes:
        worker: Who claims (the completing worker).
        lease: Lease the claim grants.
        lanes: Lanes the worker's slot may take now — its own, when the worker saw
            nothing waiting there, so the claim overtakes no queued work; a readied node
            in another lane goes through the queue.
        node_id: A node of the same task the worker took from the queue to run next
            (the item its slot would take anyway): that node is the one claimed, if it
            can be claimed at once (its item then in ``plan.acks``), and readied nodes
            go through the queue behind it.
    """

    worker: str
    lease: float
    lanes: frozenset[str]
    node_id: str = ""


def _claim_next(b: _Builder, ask: NextClaim) -> None:
    """Claim, in the plan being built, the node the worker takes next in its slot:
    ``ask.node_id`` when it names one (taken from the queue), else the first node the
    plan readies that is offered now (no delay) in one of ``ask.lanes``. Either only if
    it can be claimed at once (:func:`_claimable_now`). The claim is ``plan.detail`` (a
    readied node leaves the plan's enqueue list); nothing else changes, so a plan that
    claims nothing is the plain completion."""
    view = b.view
    if ask.node_id:
        node = view.dag.get_node(ask.node_id)
        if node is not None and _claimable_now(b, node, b.snap(ask.node_id)):
            b.plan.enqueue = [e for e in b.plan.enqueue if e[0] != ask.node_id]
            b.plan.detail = _take(b, node, b.snap(ask.node_id), worker=ask.worker,
                                  lease=ask.lease)
            b.plan.acks.append((ask.worker, ask.node_id))
        return
    for index, (nid, delay) in enumerate(b.plan.enqueue):
        node = view.dag.node(nid)
        if delay > 0 or node.lane not in ask.lanes:
            continue
        if _claimable_now(b, node, b.snap(nid)):
            del b.plan.enqueue[index]
            b.plan.detail = _take(b, node, b.snap(nid), worker=ask.worker, lease=ask.lease)
            return


def _claimable_now(b: _Builder, node: Node, snap: Snapshot) -> bool:
    """Whether a completion's transaction may claim ``node`` (:func:`_claim_next`):
    WAITING and offered now, within its attempts, its ``queue_timeout`` and the task
    deadline, its dependency not ramping up after an outage. Anything else is left to a
    plain claim (:func:`plan_claim`), which says why or ends the node."""
    now, task = b.now, b.view.task
    if (snap.state is not NodeState.WAITING or snap.owner in COMPOSITE_OWNERS
            or now < snap.not_before or snap.attempt >= node.attempts):
        return False
    if task.deadline and now >= deadline_at(task, now):
        return False
    if node.queue_timeout and now - queued_since(snap) > node.queue_timeout:
        return False
    dependency = dependency_of(node)
    return not (dependency and b.view.ramp(dependency) is not None)


#: Run durations a node's record keeps for its ``timeout_policy`` (the newest).
DURATIONS_KEPT = 200


def _attempt_timeout(view: View, node: Node, snap: Snapshot) -> tuple[float, str]:
    """The timeout the node's ``timeout_policy`` gives this attempt, and why (0, "":
    no policy — the node's ``timeout``). A run resumed after a pause keeps the one its
    attempt was given. Adaptive load: the depth of the node's lane now."""
    if node.timeout_policy is None:
        return 0.0, ""
    if snap.run_seconds and snap.attempt_timeout:
        return snap.attempt_timeout, f"timeout {timeouts.seconds(snap.attempt_timeout)} s " \
            "(the attempt's, resumed)"
    policy = timeouts.node_timeout_policy(node.timeout_policy, node.timeout)
    load = (float(view.depth(node.lane))
            if isinstance(policy, timeouts.AdaptivePolicy) and policy.load else 0.0)
    decision = timeouts.decide(policy, view.durations(node.id), load=load)
    why = decision.explanation
    if load:
        why += f" (load: {load:g} queued in lane {node.lane})"
    return decision.timeout, why


def _recorded(view: View, node: Node, snap: Snapshot, now: float) -> list[float] | None:
    """The node's durations with this successful run's added, when its
    ``timeout_policy`` reads them (None: not recorded)."""
    if node.timeout_policy is None:
        return None
    duration = max(now - snap.started_at, 0.0) + snap.run_seconds
    return [*view.durations(node.id), round(duration, 3)][-DURATIONS_KEPT:]


def _admit(ramp: Ramp, snap: Snapshot, node: Node, task: TaskRecord, *, now: float,
           lease: float, config: RuleConfig) -> tuple[Ramp, bool]:
    """Whether the ramp admits ``node`` now, and the ramp after asking: admitted when a
    slot is free and the node is among the waiters next in line (:func:`_ramp.order`);
    otherwise it is (still) a waiter."""
    key = f"{task.task_id}/{node.id}"
    ramp = ramp.pruned(now, config.ramp_waiter_ttl)
    bound = now + node.timeout + lease  # its slot counts at most this long
    if key in ramp.admitted:  # its own earlier slot (a lapsed lease claimed again)
        return replace(ramp, admitted={**ramp.admitted, key: bound}), True
    waiter = Waiter(queued=snap.ready_at, deadline=task.deadline,
                    budget=node.attempts - snap.attempt, seen=now)
    ramp = replace(ramp, waiting={**ramp.waiting, key: waiter})
    if key not in ramp.first(ramp.limit - len(ramp.admitted)):
        return ramp, False
    return replace(ramp, admitted={**ramp.admitted, key: bound},
                   waiting={k: w for k, w in ramp.waiting.items() if k != key}), True


def _ramp_after(view: View, node: Node, outcome: Outcome | None, now: float,
                config: RuleConfig) -> tuple[str, Ramp | None] | None:
    """The ramp of ``node``'s dependency after its attempt ended with ``outcome``
    (None: the attempt ended without one, its lease lapsed): an outage of that very
    dependency opens it (or sends it back to one); a success doubles it, up to
    ``ramp_full`` where it ends; anything else frees the node's slot. None: no change."""
    dependency = dependency_of(node)
    if dependency is None:
        return None
    ramp = view.ramp(dependency)
    key = f"{view.task.task_id}/{node.id}"
    if isinstance(outcome, Unavailable) and outcome.dependency == dependency:
        base = ramp or Ramp()
        return dependency, replace(base.released(key), limit=1, since=now)
    if ramp is None:
        return None
    ramp = ramp.released(key)
    if isinstance(outcome, Success):
        limit = ramp.limit * 2
        return dependency, (None if limit >= config.ramp_full else replace(ramp, limit=limit))
    return dependency, ramp


def queued_since(snap: Snapshot) -> float:
    """When a WAITING node's current wait for a worker began: its readiness, or the end
    of what held it back since (a retry's backoff, a dependency's outage, a pause), or
    the moment its last lease was given up. Run time and backoff are not queue time."""
    return max(snap.ready_at, snap.not_before)


def _legacy_prompt(prompt: str) -> bool:
    """Whether ``prompt`` reads ``input`` (the form ``ambiguous-input`` refuses)."""
    try:
        return "input" in template.names_read(prompt)
    except TemplateError:
        return False  # rendering it reports the error


def _lease_until(task: TaskRecord, now: float, lease: float) -> float:
    """A lease never outlives the task's deadline."""
    deadline = deadline_at(task, now)
    return min(now + lease, deadline) if deadline else now + lease


def holds(snap: Snapshot, fence: int, now: float) -> bool:
    """Whether ``fence`` is the node's current fence, RUNNING under a live lease."""
    return snap.state is NodeState.RUNNING and snap.fence == fence and now <= snap.lease_until


def plan_heartbeat(view: View, node_id: str, *, fence: int, lease: float, now: float,
                   ids: EventIds, activity: Activity | None = None) -> Plan:
    """Renew the lease only (never counts as progress). ``activity``, the resources the
    run used over the worker's last sampling interval, is kept with the time it came
    (a heartbeat without one keeps the last: a handler's own beats carry none)."""
    snap = view.snap(node_id)
    if not holds(snap, fence, now):
        return Plan("stale")
    b = _builder(view, now, ids, snap.owner)
    until = _lease_until(view.task, now, lease)
    out = replace(snap, lease_until=until, heartbeat_at=now)
    if activity is not None:
        out = replace(out, activity=activity, activity_at=now)
    b.write(out)
    b.plan.result = "ok"
    return b.plan


def plan_progress(view: View, node_id: str, *, fence: int, marker: str, lease: float,
                  now: float, ids: EventIds) -> Plan:
    """Record a business checkpoint (and renew the lease); a new stall starts, so the
    verdicts of the last one (a note, a warning, the one extension) are forgotten."""
    snap = view.snap(node_id)
    if not holds(snap, fence, now):
        return Plan("stale")
    b = _builder(view, now, ids, snap.owner)
    until = _lease_until(view.task, now, lease)
    out = replace(_stall.cleared(snap), lease_until=until, heartbeat_at=now,
                  progress_at=now, progress_marker=marker[:200])
    b.write(out)
    b.event("progress", out, marker[:200])
    b.plan.result = "ok"
    return b.plan


def plan_checkpoint(view: View, node_id: str, *, fence: int, state: Any, now: float,
                    ids: EventIds) -> Plan:
    """Save ``state`` for the node's next run, under the fence (``ok`` or ``stale``);
    the lease is not renewed: a checkpoint is not a heartbeat."""
    snap = view.snap(node_id)
    if not holds(snap, fence, now):
        return Plan("stale")
    b = _builder(view, now, ids, snap.owner)
    out = replace(snap, checkpoint=state)
    b.write(out)
    b.event("checkpoint", out, f"saved for the next run ({len(canonical_json(state))} bytes)")
    b.plan.result = "ok"
    return b.plan


def plan_complete(view: View, node_id: str, *, fence: int, outcome: Outcome, now: float,
                  ids: EventIds, config: RuleConfig, claim_next: NextClaim | None = None
                  ) -> Plan:
    """Commit an attempt's outcome: ``committed`` only with the current fence; a repeat
    of the committed result is ``already-done``; anything else is ``stale``.

    With ``claim_next``, a success also claims one node it readies for the same worker
    (:func:`_claim_next`): ``plan.detail`` is then that node's claimed snapshot."""
    snap = view.snap(node_id)
    node = view.dag.node(node_id)
    if snap.state is NodeState.SUCCEEDED and isinstance(outcome, Success):
        same = snap.fence == fence and snap.output_sha256 == sha256_json(outcome.output)
        return Plan("already-done" if same else "stale")
    if not holds(snap, fence, now):
        return Plan("stale")
    b = _builder(view, now, ids, snap.owner)
    if isinstance(outcome, Success):
        known = kept_text(outcome, outcome.output)
        if known is not None:  # (encoded by the runner's check: not encoded again)
            b.plan.encoded[id(outcome.output)] = known
    ramped = _ramp_after(view, node, outcome, now, config)
    if ramped is not None:
        b.plan.ramps[ramped[0]] = ramped[1]
    if isinstance(outcome, Success) and is_item(node_id):
        # A map's item: its map node decides the edges once every item ended.
        done = replace(
            snap, state=NodeState.SUCCEEDED, output=outcome.output, output_ref=None,
            output_sha256=b.digest(outcome.output), finished_at=now, lease_until=0.0,
            error="", evidence="",
        )
        b.write(done)
        b.event("committed", done)
        b.settle(decided=_expand.item_ended(b, node, done))
        if claim_next is not None:
            _claim_next(b, claim_next)
        return b.plan
    if isinstance(outcome, Success):
        try:
            hops = b.decide_edges(node, outcome.output)
        except TemplateError as exc:
            b.fail(node, snap, f"guard on {node_id}: {exc}", retryable=False)
            return b.plan
        recorded = _recorded(view, node, snap, now)
        if recorded is not None:
            b.plan.durations[node_id] = recorded
        done = replace(
            snap, state=NodeState.SUCCEEDED, output=outcome.output, output_ref=None,
            output_sha256=b.digest(outcome.output), next_hops=hops, finished_at=now,
            lease_until=0.0, error="", evidence="", last_updated=now,
        )
        b.write(done)
        b.event("committed", done, f"-> {_taken(hops)}")
        b.settle(decided=[node_id])
        if claim_next is not None:
            _claim_next(b, claim_next)
        return b.plan
    if isinstance(outcome, Paused):
        return _pause(b, node, snap, outcome, config)
    if isinstance(outcome, Unavailable):
        # The dependency is down: keep WAITING with the evidence, refund the attempt,
        # and offer the node again when the dependency said it would take work again.
        delay = unavailable_delay(outcome, config)
        back = replace(
            snap, state=NodeState.WAITING, attempt=snap.attempt - 1, owner="",
            lease_until=0.0, evidence=f"{outcome.dependency}: {outcome.evidence}"[:1000],
            not_before=now + delay, run_seconds=0.0,
        )
        b.write(back)
        b.event("unavailable", back, f"{back.evidence} (offered again in {delay:g}s)")
        b.plan.enqueue.append((node_id, delay))
        return b.plan
    assert isinstance(outcome, Failure)
    message = outcome.message[:2000]
    if outcome.retryable and snap.attempt < node.attempts:
        delay = backoff_delay(snap.attempt, f"{snap.task_id}/{node_id}/{snap.attempt}", config)
        back = replace(
            snap, state=NodeState.WAITING, owner="", lease_until=0.0, error=message,
            error_retryable=True, not_before=now + delay, run_seconds=0.0,
        )
        b.write(back)
        b.event("retry", back, f"{message} (retry in {delay:.1f}s)")
        b.plan.enqueue.append((node_id, delay))
        return b.plan
    exhausted = outcome.retryable
    reason = (f"attempts exhausted ({snap.attempt}/{node.attempts}): {message}"
              if exhausted else message)
    b.fail(node, snap, reason, retryable=outcome.retryable, dead=exhausted)
    return b.plan


def utc(at: float) -> str:
    """``at`` (epoch seconds) as an ISO 8601 UTC time, for people reading events."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def unavailable_delay(outcome: Unavailable, config: RuleConfig) -> float:
    """Seconds until a node kept WAITING by ``outcome`` is offered again: the
    dependency's own ``retry_after`` when it gave one (within ``[0, retry_after_cap]``;
    a non-finite value counts as the cap), else ``config.unavailable_delay``."""
    wait = outcome.retry_after
    if wait is None:
        return config.unavailable_delay
    if not math.isfinite(wait):
        return config.retry_after_cap
    return min(max(wait, 0.0), config.retry_after_cap)


def _pause(b: _Builder, node: Node, snap: Snapshot, outcome: Paused,
           config: RuleConfig) -> Plan:
    """RUNNING → PAUSED: the handler waits for something outside. The slot and lease go
    back, the attempt is refunded and the time it ran is kept (the resumed run gets the
    rest of the timeout); the node is resumed at ``until`` or by :func:`plan_resume`."""
    now = b.now
    until = 0.0
    if outcome.seconds is not None:
        wait = outcome.seconds if math.isfinite(outcome.seconds) else config.pause_cap
        until = now + min(max(wait, 0.0), config.pause_cap)
    reason = outcome.reason[:1000] or "paused by the handler"
    paused = replace(
        snap, state=NodeState.PAUSED, attempt=snap.attempt - 1, owner="", lease_until=0.0,
        paused_at=now, gate_until=until, evidence=reason, checkpoint=outcome.checkpoint,
        resume=None, run_seconds=snap.run_seconds + max(now - snap.started_at, 0.0),
    )
    b.write(paused)
    b.event("paused", paused, f"{reason} (" + (f"until {utc(until)}" if until else
                                               "until resumed") + ")")
    return b.plan


def plan_resume(view: View, node_id: str, *, data: Any, by: str, now: float, ids: EventIds,
                input_revision: str = "") -> Plan:
    """PAUSED (by its handler) → WAITING, offered at once with ``data`` for its next run;
    the time paused is added to ``paused_seconds`` and counts on no clock.

    Raises:
        InputError: No such node, or ``input_revision`` is not the node's (a callback
            for another input of it).
        Conflict: The node is not paused by its handler (a gate is decided, not
            resumed), or was already resumed with other data.
    """
    node = view.dag.nodes.get(node_id)
    if node is None:
        raise InputError(f"task has no node {node_id!r}")
    if node.type == "human_gateway":
        raise Conflict(f"node {node_id!r} is a human gate: approve or reject it")
    snap = view.snap(node_id)
    if input_revision and input_revision != snap.input_revision:
        raise InputError(f"node {node_id!r}: the callback names input revision "
                         f"{input_revision[:16]!r}, the node has {snap.input_revision[:16]!r}")
    if snap.state is not NodeState.PAUSED:
        if snap.resume is not None and snap.resume == data and snap.state in (
                NodeState.WAITING, NodeState.RUNNING, NodeState.SUCCEEDED):
            return Plan("already-done")
        raise Conflict(f"node {node_id!r} is {snap.state.value}, not paused")
    b = _builder(view, now, ids, by)
    _resumed(b, snap, data, f"resumed by {by}")
    return b.plan


def _resumed(b: _Builder, snap: Snapshot, data: Any, why: str) -> None:
    now = b.now
    back = replace(
        snap, state=NodeState.WAITING, paused_seconds=snap.paused_seconds + (now - snap.paused_at),
        paused_at=0.0, gate_until=0.0, not_before=now, resume=data, evidence="",
    )
    b.write(back)
    b.event("resumed", back, why)
    b.plan.enqueue.append((snap.node_id, 0.0))


def task_clock(before: TaskRecord, after: TaskRecord, now: float) -> TaskRecord:
    """The task's deadline does not run while it is PAUSED: entering PAUSED records
    when, leaving it moves the deadline by the time paused."""
    was, now_paused = before.status is TaskStatus.PAUSED, after.status is TaskStatus.PAUSED
    if now_paused and not was:
        return replace(after, paused_at=now)
    if was and not now_paused and before.paused_at:
        moved = after.deadline + (now - before.paused_at) if after.deadline else 0.0
        return replace(after, paused_at=0.0, deadline=moved)
    return after


def deadline_at(task: TaskRecord, now: float) -> float:
    """The task's deadline as of ``now`` (0: none): while it is PAUSED, it moves on."""
    if not task.deadline:
        return 0.0
    if task.paused_at:
        return task.deadline + max(now - task.paused_at, 0.0)
    return task.deadline


def four_eyes_violation(node: Node, task_submitted_by: str, by: str, *,
                        four_eyes: bool = False) -> str | None:
    """Why ``by`` may not decide ``node`` under the four-eyes rule, or None.

    The rule applies when the gate declares ``four_eyes: true`` or the deployment makes
    it the rule for every gate (``four_eyes``): the principal that submitted the task
    may not decide its gates. A task with no recorded submitter (stored before
    ``submitted_by`` existed) cannot be checked and is refused — "could not check" is
    never a pass.
    """
    if not (node.four_eyes or four_eyes) or by == GATE_TIMEOUT_ACTOR:
        return None
    if not task_submitted_by:
        return (f"four-eyes rule: gate {node.id!r} needs a decision by someone other than "
                "the submitter, and this task has no recorded submitter")
    if by == task_submitted_by:
        return (f"four-eyes rule: {by!r} submitted this task and may not decide its gate "
                f"{node.id!r}; another principal with the approve role must decide")
    return None


def plan_decide(view: View, node_id: str, *, decision: str, by: str, comment: str,
                now: float, ids: EventIds, four_eyes: bool = False,
                data: Any = NO_EDITS) -> Plan:
    """Record a human decision on a paused gate and route on it.

    The gate's output is the decision record (``decision``, ``by``, ``at``, ``comment``)
    and ``data``: what the approver reviewed (the gate's rendered ``input``), or, for an
    approval with edits, the data the approver corrected — what the next nodes read as
    ``nodes.<gate>.output.data``. The record says ``edited: true`` then, and the
    ``decided`` event names the edit.

    Raises:
        Forbidden: The four-eyes rule applies and ``by`` submitted the task
            (:func:`four_eyes_violation`); checked here, where the decision is
            committed, so every path (REST, gRPC, CLI, SDK) is held to it.
    """
    if decision not in ("approve", "reject"):
        raise InputError(f"decision must be 'approve' or 'reject', not {decision!r}")
    edited = data is not NO_EDITS
    if edited and decision != "approve":
        raise InputError("edits go with an approval: a rejection passes no data on")
    node = view.dag.nodes.get(node_id)
    if node is None:
        raise InputError(f"task has no node {node_id!r}")
    if node.type != "human_gateway":
        raise InputError(f"node {node_id!r} is a {node.type}, not a human_gateway")
    refused = four_eyes_violation(node, view.task.submitted_by, by, four_eyes=four_eyes)
    if refused is not None:
        raise Forbidden(refused)
    snap = view.snap(node_id)
    if snap.decision is not None:
        if snap.decision.get("decision") == decision:
            return Plan("already-done")
        raise Conflict(
            f"gate {node_id!r} was already decided: {snap.decision.get('decision')} by "
            f"{snap.decision.get('by')}"
        )
    if snap.state is not NodeState.PAUSED:
        raise Conflict(f"gate {node_id!r} is {snap.state.value}, not waiting for a decision")
    rendered = view.node_input(node_id)  # {"input": ..., "description": ...}
    reviewed = rendered.get("input") if isinstance(rendered, Mapping) else None
    b = _builder(view, now, ids, by)
    record: dict[str, Any] = {"decision": decision, "by": by, "at": now,
                              "comment": comment[:2000]}
    if edited:
        record["edited"] = True
    output = {**record, "data": data if edited else reviewed}
    try:
        hops = b.decide_edges(node, output, decision)
    except TemplateError as exc:
        b.fail(node, snap, f"guard on {node_id}: {exc}", retryable=False)
        return b.plan
    done = replace(
        snap, state=NodeState.SUCCEEDED, decision=record, output=output, output_ref=None,
        output_sha256=b.digest(output), next_hops=hops, finished_at=now,
        paused_seconds=snap.paused_seconds + (now - snap.paused_at), paused_at=0.0,
        attempt=max(snap.attempt, 1),
    )
    b.write(done)
    what = "approve with edits" if edited else decision
    b.event("decided", done, f"{what} by {by}" + (f": {comment}" if comment else ""))
    b.settle(decided=[node_id])
    return b.plan


def plan_expire(view: View, node_id: str, *, now: float, ids: EventIds,
                owner_dead: bool = False, config: RuleConfig = RuleConfig()) -> Plan:
    """Reconciler: apply the task deadline, expire leases and stalls (fence bump, so the
    old owner's writes become stale; on the last attempt: DEAD, or routed by
    ``on_failure``), and time out gates with their default route.
    ``owner_dead``: the owner process is known to be gone, its lease is void."""
    b = _builder(view, now, ids, "reconciler")
    node = view.dag.node(node_id)
    snap = view.snap(node_id)
    task = view.task
    if snap.state in FINAL_STATES or snap.state is NodeState.PENDING:
        return Plan("ok")
    if task.deadline and now >= deadline_at(task, now):
        if _expand.is_map_parent(snap):
            b.settle(decided=_expand.fail_map(b, node, snap, "task deadline passed",
                                              dead=True))
        else:
            b.fail(node, replace(snap, owner=""), "task deadline passed", retryable=False,
                   dead=True)
        return b.plan
    if snap.owner in COMPOSITE_OWNERS:
        return Plan("ok")  # its items or its sub-DAG's nodes hold the leases
    if (snap.state is NodeState.PAUSED and node.type != "human_gateway" and snap.gate_until
            and now >= snap.gate_until):
        _resumed(b, snap, None, f"resumed: its pause until {utc(snap.gate_until)} is over")
        return b.plan
    if snap.state is NodeState.PAUSED and node.type == "human_gateway" and now >= snap.gate_until:
        decision = node.on_timeout or "reject"
        return plan_decide(view, node_id, decision=decision, by=GATE_TIMEOUT_ACTOR,
                           comment=f"no decision within {node.timeout:g}s", now=now, ids=ids)
    if snap.state is NodeState.RUNNING:
        expired = now > snap.lease_until or owner_dead
        if expired:
            why = "owner process is gone" if owner_dead else "lease expired"
        else:
            verdict = _stall.stall_verdict(node, snap, now, config.blocking)
            if verdict.action != "fence":
                return _stall_recorded(b, snap, verdict)
            why = verdict.evidence
        ramped = _ramp_after(view, node, None, now, config)
        if ramped is not None:
            b.plan.ramps[ramped[0]] = ramped[1]
        ended = _stall.cleared(snap, activity=True)
        if snap.attempt >= node.attempts:
            b.fail(node, ended, f"{why} on the last attempt ({snap.attempt}/{node.attempts})",
                   retryable=True, dead=True)
            return b.plan
        # not_before = now: claimable at once, and its queue wait starts now.
        back = replace(ended, state=NodeState.WAITING, fence=snap.fence + 1, owner="",
                       lease_until=0.0, error=why, error_retryable=True, not_before=now,
                       run_seconds=0.0)
        b.write(back)
        b.event("lease_expired", back, f"{why}; owner {snap.owner} fenced out")
        b.plan.enqueue.append((node_id, 0.0))
        return b.plan
    return Plan("ok")


def plan_cancel(view: View, *, now: float, ids: EventIds, by: str) -> Plan:
    """Cancel every unfinished node; running workers find their fence stale."""
    view.require(view.dag.nodes)
    b = _builder(view, now, ids, by)
    if view.task.status.final:
        return Plan("already-done")
    for nid in view.dag.nodes:
        snap = view.snap(nid)
        instances = _expand.started_items(b, snap) if _expand.is_map_parent(snap) else []
        for iid in [nid, *instances]:
            snap = view.snap(iid)
            if snap.state not in FINAL_STATES:
                out = replace(snap, state=NodeState.CANCELLED, owner="", lease_until=0.0,
                              finished_at=now, fence=snap.fence + 1)
                b.write(out)
                b.event("cancelled", out, f"cancelled by {by}")
    b.plan.task = replace(view.task, status=TaskStatus.CANCELLED)
    return b.plan


def plan_retry(view: View, from_node: str, *, input_override: Any, now: float,
               ids: EventIds, by: str) -> Plan:
    """Admin retry: re-run ``from_node`` and everything after it; committed nodes that
    are not descendants of it stay untouched.

    A retry of a cancelled task lifts the cancel: every CANCELLED node is re-opened
    (reset, then readied or left PENDING by its predecessors' decisions). The task is
    RUNNING again and its status ignores CANCELLED nodes, so one left behind would be
    work that never runs — a join below it would wait while the task said SUCCEEDED.
    """
    dag = view.dag
    if from_node not in dag.nodes:
        raise InputError(f"task has no node {from_node!r}")
    if SCOPE in from_node:
        outer = from_node.split(SCOPE, 1)[0]
        raise Conflict(f"node {from_node!r} runs inside sub-DAG node {outer!r}: retry from "
                       f"{outer!r}, which runs its DAG again")
    view.require(dag.nodes)
    snap = view.snap(from_node)
    if snap.state in (NodeState.WAITING, NodeState.RUNNING, NodeState.PAUSED):
        raise Conflict(f"node {from_node!r} is {snap.state.value}; nothing to retry")
    if snap.state is NodeState.PENDING:
        raise Conflict(f"node {from_node!r} has not been reached yet")
    if snap.state is NodeState.CANCELLED and any(
            view.snap(p).state not in DECIDED_STATES for p in dag.predecessors[from_node]):
        # Cancelled while PENDING: running it now would pre-empt its predecessors' edges.
        raise Conflict(f"node {from_node!r} had not been reached when the task was "
                       "cancelled; retry from a node that had")
    b = _builder(view, now, ids, by)
    descendants = _descendants(dag, from_node)
    cancelled = [n for n in dag.nodes if view.snap(n).state is NodeState.CANCELLED]
    # A sub-DAG node that runs again runs its whole DAG again.
    reopening = {from_node, *cancelled}
    reopening |= {c for n in list(reopening) for c in _inside(dag, n)}
    reset = sorted(reopening | {n for n in descendants
                                if view.snap(n).state is not NodeState.PENDING})
    for nid in reset:
        b.write(_reset(view.snap(nid)))
    for body in dag.loops.values():
        if from_node not in body:
            # Run again from before the loop: its visits count from the first again
            # (the snapshots kept of earlier visits are overwritten as it goes round).
            for nid in body:
                if nid in b.plan.writes:
                    b.write(replace(b.snap(nid), visit=0))
    # Recount the join bookkeeping of every reset node from its predecessors' decisions.
    for nid in sorted(reopening | descendants):
        left, reached = 0, False
        for pid in dag.predecessors[nid]:
            pred = b.snap(pid)
            if pred.state in DECIDED_STATES:
                reached = reached or any(h.target_node_id == nid and h.is_taken
                                         for h in pred.next_hops)
            else:
                left += 1
        b.write(replace(b.snap(nid), preds_left=left, reached=reached))
    reopened = [n for n in cancelled if n != from_node]
    b.event("retried", b.snap(from_node), f"retry from {from_node} by {by}" + (
        f"; re-opened {len(reopened)} cancelled node(s)" if reopened else ""))
    if input_override is not None:
        node = dag.nodes[from_node]
        if node.type in INLINE_TYPES:
            raise InputError("--input applies to tool_call and llm_call nodes only")
        if node.map is not None:
            raise InputError(f"--input does not apply to map node {from_node!r}: its items "
                             "are rendered from the map's list; retry it without --input")
        params = {"input": input_override}
        s = replace(b.snap(from_node), input=params,
                    input_revision=b.digest(params, scope=(snap.task_id, from_node)),
                    state=NodeState.WAITING, ready_at=now)
        b.write(s)
        b.event("ready", s, "input overridden")
        b.plan.enqueue.append((from_node, 0.0))
    else:
        # Retrying a node means running it: resolve it as if an edge led to it.
        b.write(replace(b.snap(from_node), reached=True))
        reopened.insert(0, from_node)
    # Re-opened nodes with nothing left to wait for (all predecessors decided) run now.
    b.settle(roots=reopened)
    b.plan.task = replace(view.task, status=TaskStatus.RUNNING, finished_at=0.0)
    return b.plan


def _reset(snap: Snapshot) -> Snapshot:
    # The fence only ever grows, so a worker of the old run can never commit. The
    # checkpoint stays: a retried node resumes from what its last run saved.
    return Snapshot(task_id=snap.task_id, node_id=snap.node_id, fence=snap.fence + 1,
                    checkpoint=snap.checkpoint, visit=snap.visit)


def _descendants(dag: Dag, start: str) -> set[str]:
    """The nodes after ``start``: along its edges, and inside every sub-DAG node met."""
    seen: set[str] = set()
    work = [*dag.nodes[start].targets, *_inside(dag, start)]
    while work:
        nid = work.pop()
        if nid not in seen:
            seen.add(nid)
            work.extend(dag.nodes[nid].targets)
            work.extend(_inside(dag, nid))
    return seen


def _inside(dag: Dag, node_id: str) -> list[str]:
    """Every node a sub-DAG node runs, its own sub-DAGs' included (none for others)."""
    if dag.nodes[node_id].subdag is None:
        return []
    prefix = node_id + SCOPE
    return [n for n in dag.nodes if n.startswith(prefix)]
