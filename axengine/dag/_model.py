"""The typed, validated DAG model produced by the loader.

A :class:`Dag` is immutable and identified by the sha256 of its canonical JSON form
(``Dag.hash``): the same graph written with keys in another order, other comments or
other quoting has the same hash. Running tasks keep the DAG version they started with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from axengine.limits import canonical_bytes

__all__ = [
    "DEFAULT_RETRY",
    "DEFAULT_TIMEOUT",
    "ITEM_FAILURE_POLICIES",
    "MAX_MAP_ITEMS",
    "MAX_MAP_ITEMS_LIMIT",
    "NODE_TYPES",
    "SCOPE",
    "Dag",
    "Edge",
    "Fallback",
    "Node",
    "NodeType",
    "base_id",
    "is_item",
    "is_visit",
    "item_id",
    "visit_id",
]


def item_id(node_id: str, index: int) -> str:
    """The id of item ``index`` of map node ``node_id``: ``node[index]``."""
    return f"{node_id}[{index}]"


def visit_id(node_id: str, visit: int) -> str:
    """The id under which visit ``visit`` of a loop's node is kept once the loop went
    round again: ``node#visit``."""
    return f"{node_id}#{visit}"


def is_item(node_id: str) -> bool:
    """Whether ``node_id`` names a map's item (``node[3]``)."""
    return "[" in node_id


def is_visit(node_id: str) -> bool:
    """Whether ``node_id`` names a loop's kept visit (``node#2``): history, not work."""
    return "#" in node_id


def base_id(instance: str) -> str:
    """The DAG node of a node id, a map item id (``node[3]``) or a visit (``node#2``)."""
    cut = len(instance)
    for mark in "[#":
        at = instance.find(mark)
        if at != -1:
            cut = min(cut, at)
    return instance[:cut]

#: Items one map expansion may have when its node sets no ``max_items``.
MAX_MAP_ITEMS = 1_000
#: Highest ``max_items`` a DAG may set: the expansion is kept in the node's snapshot.
MAX_MAP_ITEMS_LIMIT = 100_000
#: How a map's failing item is handled (``on_item_failure``).
ITEM_FAILURE_POLICIES: tuple[str, ...] = ("fail", "collect")

NodeType = Literal["tool_call", "llm_call", "condition", "human_gateway", "dag"]
#: Node types of the DAG language.
NODE_TYPES: tuple[str, ...] = ("tool_call", "llm_call", "condition", "human_gateway", "dag")
#: Separates a sub-DAG node's id from the ids of the nodes it runs (``review/approve``).
SCOPE = "/"

#: Per-attempt timeout in seconds by node type when the DAG does not set ``timeout``
#: (for ``human_gateway`` it is the bounded wait for a decision).
DEFAULT_TIMEOUT: Mapping[str, float] = {
    "tool_call": 300.0,
    "llm_call": 120.0,
    "condition": 10.0,
    "human_gateway": 86400.0,
}
#: Extra attempts by node type when the DAG does not set ``retry``.
DEFAULT_RETRY: Mapping[str, int] = {
    "tool_call": 2,
    "llm_call": 2,
    "condition": 0,
    "human_gateway": 0,
}


@dataclass(frozen=True)
class Edge:
    """An outgoing edge. Unguarded when both ``condition`` and ``when`` are None.

    Attributes:
        target: Successor node id.
        condition: Guard template that must render truthy (evaluated on ``output``).
        when: Label that the (condition) node's result must equal.
        line: Source line, for messages.
    """

    target: str
    condition: str | None = None
    when: str | None = None
    #: A back edge of a bounded loop: the most visits its target may have (the first
    #: included); None for a forward edge.
    max_visits: int | None = None
    line: int = field(default=0, compare=False)

    @property
    def loops(self) -> bool:
        """Whether this is the back edge of a bounded loop."""
        return self.max_visits is not None

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target}
        if self.condition is not None:
            out["condition"] = self.condition
        if self.when is not None:
            out["when"] = self.when
        if self.max_visits is not None:
            out["max_visits"] = self.max_visits
        return out


@dataclass(frozen=True)
class Fallback:
    """Fallback model of an ``llm_call``: used while the primary's success rate is below
    ``threshold``."""

    model: str
    threshold: float = 0.8


@dataclass(frozen=True)
class Node:
    """One node of a DAG, with defaults applied.

    Attributes:
        id: Node id (the key under ``nodes:``).
        type: One of :data:`NODE_TYPES`.
        description: Free text (shown to approvers for ``human_gateway``).
        input: Template (string) or structure of templates rendered into the node's
            input when it becomes ready. None means "no input".
        timeout: Seconds per attempt (for a gate: bounded wait for a decision).
        retry: Extra attempts after the first (so ``retry + 1`` attempts in all).
        next: Outgoing edges, in document order.
        tool: ``tool_call``: registry name of the tool.
        model: ``llm_call``: model name.
        prompt: ``llm_call``: prompt template.
        temperature: ``llm_call``: sampling temperature.
        max_tokens: ``llm_call``: completion bound.
        fallback: ``llm_call``: fallback model.
        expression: ``condition``: the ``if/elif/else`` expression (or a single template).
        on_failure: Node taken when this node fails for good (otherwise the node is DEAD
            and the task needs a person).
        on_timeout: ``human_gateway``: decision applied when the wait expires
            (``reject`` unless set; a gate never approves by default).
        stall_timeout: Seconds without progress after which a running node is treated
            as blocked even if it heartbeats (defaults to ``timeout``).
        stall_windows: ``llm_call``/``tool_call``: seconds without progress that are
            normal per step (the first word of the progress marker), keyed by step name
            or ``fnmatch`` glob (:func:`axengine.blocking.window_for`); a step no key
            matches uses ``stall_timeout``. None when not set.
        queue_timeout: Seconds a ready node may wait for a worker before it is DEAD
            (None: no bound besides the task deadline).
        lane: Queue lane (``default`` or ``fast``).
        simulate: ``llm_call``/``tool_call``: behaviour of the simulated model or tool
            (latency, failures, outputs) used when no real provider is configured.
        four_eyes: ``human_gateway``: a decision by the principal that submitted the task
            is refused (approver ≠ submitter).
        runner: ``llm_call``/``tool_call``: the runner the node needs (``thread``,
            ``subprocess`` or ``kubernetes``); None when any runner will do.
        timeout_policy: ``llm_call``/``tool_call``: a percentile or adaptive policy
            (:func:`axengine.timeouts.node_timeout_policy`) deciding each run's timeout
            from the node's recorded durations; None: ``timeout`` for every run.
        resources: ``llm_call``/``tool_call``: Kubernetes-shaped ``{requests: {cpu,
            memory}, limits: {cpu, memory}}`` with quantity strings (only the sections
            and names the DAG sets); None when unset.
        map: ``llm_call``/``tool_call``: a template rendering the list the node runs
            over, once per item (None: a plain node). The items are committed when the
            node is readied; each runs as the instance ``{id}[{index}]``.
        max_concurrency: Map: items running at once (None: all of them).
        max_items: Map: the most items one expansion may have (None: the engine's
            bound, :data:`MAX_MAP_ITEMS`).
        on_item_failure: Map: ``fail`` (the node fails at the first item that fails
            for good) or ``collect`` (every item runs; the output records each item's
            result or error).
        subdag: ``dag``: the DAG the node runs (validated with the parent; part of the
            parent's hash). Its nodes are in the parent's :attr:`Dag.nodes` as
            ``{id}/{child id}``.
        subdag_file: ``dag``: the file the DAG named for it, as written (for messages;
            not part of the hash: the content is).
        line: Source line of the node, for messages.
    """

    id: str
    type: str
    description: str | None = None
    input: Any = None
    timeout: float = 300.0
    retry: int = 0
    next: tuple[Edge, ...] = ()
    tool: str | None = None
    model: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    fallback: Fallback | None = None
    expression: str | None = None
    on_failure: str | None = None
    on_timeout: str | None = None
    stall_timeout: float | None = None
    stall_windows: Mapping[str, float] | None = None
    queue_timeout: float | None = None
    lane: str = "default"
    simulate: Mapping[str, Any] | None = None
    four_eyes: bool = False
    runner: str | None = None
    resources: Mapping[str, Mapping[str, str]] | None = None
    timeout_policy: Mapping[str, Any] | None = None
    map: str | None = None
    max_concurrency: int | None = None
    max_items: int | None = None
    on_item_failure: str = "fail"
    subdag: Dag | None = None
    subdag_file: str | None = field(default=None, compare=False)
    line: int = field(default=0, compare=False)

    @property
    def attempts(self) -> int:
        """Total attempts allowed (first try plus retries)."""
        return self.retry + 1

    @property
    def targets(self) -> tuple[str, ...]:
        """Every node this node may lead to forward (edges, then ``on_failure``),
        deduplicated; a loop's back edge is not among them (:attr:`loop_edge`)."""
        cached = self.__dict__.get("_targets")
        if cached is None:  # (read on every decision: computed once per node)
            seen: dict[str, None] = {}
            for edge in self.next:
                if not edge.loops:
                    seen.setdefault(edge.target, None)
            if self.on_failure:
                seen.setdefault(self.on_failure, None)
            cached = tuple(seen)
            object.__setattr__(self, "_targets", cached)
        return cached

    @property
    def loop_edge(self) -> Edge | None:
        """The back edge of a bounded loop this node closes, if any."""
        if "_loop_edge" not in self.__dict__:
            object.__setattr__(self, "_loop_edge",
                               next((edge for edge in self.next if edge.loops), None))
        edge: Edge | None = self.__dict__["_loop_edge"]
        return edge

    @property
    def item_bound(self) -> int:
        """Map: the most items one expansion may have."""
        return self.max_items if self.max_items is not None else MAX_MAP_ITEMS

    def canonical(self) -> dict[str, Any]:
        """JSON-able form with defaults applied; the input of :attr:`Dag.hash`."""
        out: dict[str, Any] = {"type": self.type}
        for name in (
            "description", "input", "tool", "model", "prompt", "temperature", "max_tokens",
            "expression", "on_failure", "on_timeout", "stall_timeout", "queue_timeout",
            "simulate",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.type != "dag":  # (a dag node runs no handler: its DAG's nodes have these)
            out["timeout"] = self.timeout
            out["retry"] = self.retry
            out["lane"] = self.lane
        if self.four_eyes:
            # Only when set: DAGs without it keep the content hash they always had.
            out["four_eyes"] = True
        # Also only when set, for the same reason.
        if self.stall_windows is not None:
            out["stall_windows"] = dict(self.stall_windows)
        if self.runner is not None:
            out["runner"] = self.runner
        if self.resources is not None:
            out["resources"] = {section: dict(values)
                                for section, values in self.resources.items()}
        if self.timeout_policy is not None:
            out["timeout_policy"] = dict(self.timeout_policy)
        if self.map is not None:
            out["map"] = self.map
            out["on_item_failure"] = self.on_item_failure
            if self.max_concurrency is not None:
                out["max_concurrency"] = self.max_concurrency
            if self.max_items is not None:
                out["max_items"] = self.max_items
        if self.subdag is not None:
            out["dag"] = self.subdag.canonical()
        if self.fallback is not None:
            out["fallback"] = {"model": self.fallback.model, "threshold": self.fallback.threshold}
        out["next"] = [edge.canonical() for edge in self.next]
        return out

    @classmethod
    def from_canonical(cls, node_id: str, data: Mapping[str, Any]) -> Node:
        fallback = data.get("fallback")
        return cls(
            id=node_id,
            type=data["type"],
            description=data.get("description"),
            input=data.get("input"),
            timeout=float(data.get("timeout", 300.0)),
            retry=int(data.get("retry", 0)),
            next=tuple(
                Edge(e["target"], e.get("condition"), e.get("when"), e.get("max_visits"))
                for e in data["next"]
            ),
            tool=data.get("tool"),
            model=data.get("model"),
            prompt=data.get("prompt"),
            temperature=data.get("temperature"),
            max_tokens=data.get("max_tokens"),
            fallback=Fallback(fallback["model"], fallback["threshold"]) if fallback else None,
            expression=data.get("expression"),
            on_failure=data.get("on_failure"),
            on_timeout=data.get("on_timeout"),
            stall_timeout=data.get("stall_timeout"),
            stall_windows=data.get("stall_windows"),
            queue_timeout=data.get("queue_timeout"),
            lane=data.get("lane", "default"),
            simulate=data.get("simulate"),
            four_eyes=bool(data.get("four_eyes", False)),
            runner=data.get("runner"),
            resources=data.get("resources"),
            timeout_policy=data.get("timeout_policy"),
            map=data.get("map"),
            max_concurrency=data.get("max_concurrency"),
            max_items=data.get("max_items"),
            on_item_failure=data.get("on_item_failure", "fail"),
            subdag=Dag.from_canonical(data["dag"]) if "dag" in data else None,
        )


@dataclass(frozen=True)
class Dag:
    """A validated DAG.

    Attributes:
        name: DAG name.
        nodes: Nodes by id, in document order.
        description: Free text.
        deadline: Default task deadline in seconds from submission (None: none).
        input_schema: JSON Schema the task input must match at submit (None: any input).
        output: When the DAG runs as a sub-DAG: a template of what its ``dag`` node
            outputs, read in the sub-DAG (None: the outputs of its last nodes).
        source: File the DAG was loaded from (``"<string>"`` for inline documents).

    The nodes of every sub-DAG are in :attr:`nodes` too, after their ``dag`` node, as
    ``{dag node}/{child id}`` with their edges renamed alike: the engine runs them as
    nodes of the task. :meth:`canonical` holds each sub-DAG once, inside its node.
    """

    name: str
    nodes: Mapping[str, Node]
    description: str | None = None
    deadline: float | None = None
    input_schema: Mapping[str, Any] | None = None
    output: str | None = None
    source: str = field(default="<string>", compare=False)

    def __post_init__(self) -> None:
        if any(node.subdag is not None for node in self.nodes.values()):
            object.__setattr__(self, "nodes", _flattened(self.nodes))

    def canonical(self) -> dict[str, Any]:
        """The JSON-able form that is hashed and stored under ``/ax/dags/{hash}``."""
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        if self.deadline is not None:
            out["deadline"] = self.deadline
        if self.input_schema is not None:
            # Only when set: DAGs without it keep the content hash they always had.
            out["input_schema"] = self.input_schema
        if self.output is not None:
            out["output"] = self.output
        out["nodes"] = {node_id: node.canonical() for node_id, node in self.nodes.items()
                        if SCOPE not in node_id}
        return out

    def canonical_json(self) -> bytes:
        """Canonical JSON bytes: sorted keys, no whitespace, UTF-8."""
        return canonical_bytes(self.canonical(), f"DAG {self.name!r}")

    def storage_json(self) -> bytes:
        """Canonical form in document order (node order is kept for display and for the
        order in which entry nodes are readied); the hash ignores that order."""
        return json.dumps(self.canonical(), separators=(",", ":"), ensure_ascii=False).encode()

    @property
    def hash(self) -> str:
        """sha256 hex of :meth:`canonical_json`."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hashlib.sha256(self.canonical_json()).hexdigest()
            object.__setattr__(self, "_hash", cached)
        return str(cached)

    @classmethod
    def from_canonical(cls, data: Mapping[str, Any], *, source: str = "<store>") -> Dag:
        """Rebuild a DAG stored by :meth:`canonical_json` (already validated)."""
        return cls(
            name=data["name"],
            description=data.get("description"),
            deadline=data.get("deadline"),
            input_schema=data.get("input_schema"),
            output=data.get("output"),
            nodes={nid: Node.from_canonical(nid, nd) for nid, nd in data["nodes"].items()},
            source=source,
        )

    def node(self, node_id: str) -> Node:
        """The node of ``node_id``, a map item (``node[3]``) or a kept visit
        (``node#2``) included.

        Raises:
            KeyError: The DAG has no such node.
        """
        return self.nodes[base_id(node_id)]

    def in_order(self, node_ids: Iterable[str]) -> list[str]:
        """``node_ids`` (nodes, map items, kept visits) in display order: document order
        of their nodes, each node followed by its kept visits and its items, by number.
        Ids of nodes the DAG does not have are left out."""
        index = {nid: i for i, nid in enumerate(self.nodes)}

        def key(instance: str) -> tuple[int, int, int]:
            base = base_id(instance)
            rest = instance[len(base):]
            kind = 0 if not rest else (1 if rest.startswith("#") else 2)
            number = int(rest.strip("#[]")) if rest.strip("#[]").isdigit() else 0
            return index[base], kind, number

        return sorted((n for n in node_ids if base_id(n) in index), key=key)

    def get_node(self, node_id: str) -> Node | None:
        """:meth:`node`, or None when the DAG has no such node."""
        return self.nodes.get(base_id(node_id))

    @property
    def loops(self) -> Mapping[str, tuple[str, ...]]:
        """For each node closing a bounded loop (its back edge), the loop's body: the
        nodes on forward paths from the back edge's target to it, in document order
        (target first, the closing node last)."""
        cached = self.__dict__.get("_loops")
        if cached is None:
            cached = {}
            for node in self.nodes.values():
                edge = node.loop_edge
                if edge is None or edge.target not in self.nodes:
                    continue
                after = self._reach(edge.target, lambda n: self.nodes[n].targets)
                before = self._reach(node.id, lambda n: self.predecessors[n])
                body = after & before
                cached[node.id] = tuple(n for n in self.nodes if n in body)
            object.__setattr__(self, "_loops", cached)
        return cached

    def loop_of(self, node_id: str) -> str | None:
        """The node closing the bounded loop whose body holds ``node_id``, if any."""
        for closer, body in self.loops.items():
            if node_id in body:
                return closer
        return None

    def _reach(self, start: str, step: Any) -> set[str]:
        seen = {start}
        work = [start]
        while work:
            for nxt in step(work.pop()):
                if nxt in self.nodes and nxt not in seen:
                    seen.add(nxt)
                    work.append(nxt)
        return seen

    @property
    def predecessors(self) -> Mapping[str, tuple[str, ...]]:
        """For each node, the nodes with a forward edge (or ``on_failure``) to it,
        sorted; a loop's back edge is not counted."""
        cached = self.__dict__.get("_preds")
        if cached is None:
            preds: dict[str, set[str]] = {nid: set() for nid in self.nodes}
            for node in self.nodes.values():
                for target in node.targets:
                    if target in preds:
                        preds[target].add(node.id)
            cached = {nid: tuple(sorted(p)) for nid, p in preds.items()}
            object.__setattr__(self, "_preds", cached)
        return cached

    @property
    def graph_order(self) -> tuple[str, ...]:
        """The nodes in graph order: each after its predecessors, ties in document
        order (deterministic)."""
        cached = self.__dict__.get("_graph_order")
        if cached is None:
            position = {nid: i for i, nid in enumerate(self.nodes)}
            left = {nid: len(preds) for nid, preds in self.predecessors.items()}
            ready = [nid for nid in self.nodes if not left[nid]]
            out: list[str] = []
            while ready:
                nid = ready.pop(0)
                out.append(nid)
                for target in self.nodes[nid].targets:
                    left[target] -= 1
                    if not left[target]:
                        ready.append(target)
                ready.sort(key=position.__getitem__)
            cached = tuple(out)
            object.__setattr__(self, "_graph_order", cached)
        return cached

    @property
    def entry_nodes(self) -> tuple[str, ...]:
        """Nodes without predecessors, in document order (a sub-DAG's own entry nodes
        start with its ``dag`` node, not with the task)."""
        preds = self.predecessors
        return tuple(nid for nid in self.nodes if not preds[nid] and SCOPE not in nid)

    def children(self, node_id: str) -> tuple[str, ...]:
        """The nodes sub-DAG node ``node_id`` runs (its own, not those of a sub-DAG
        inside it), in document order; empty for any other node."""
        prefix = node_id + SCOPE
        return tuple(n for n in self.nodes
                     if n.startswith(prefix) and SCOPE not in n[len(prefix):])

    def scope_of(self, node_id: str) -> str | None:
        """The sub-DAG node whose DAG holds ``node_id`` (None: the task's own DAG)."""
        base = base_id(node_id)
        return base.rsplit(SCOPE, 1)[0] if SCOPE in base else None


def _flattened(nodes: Mapping[str, Node]) -> dict[str, Node]:
    """``nodes`` with the nodes of every sub-DAG after its ``dag`` node, renamed
    ``{dag node}/{child id}`` (edges and ``on_failure`` alike; a sub-DAG's own sub-DAGs
    are already in its nodes, so names nest: ``a/b/c``)."""
    out: dict[str, Node] = {}
    for nid, node in nodes.items():
        if SCOPE in nid:
            continue  # a flattened child of a sub-DAG: placed after its dag node below
        out[nid] = node
        if node.subdag is None:
            continue
        prefix = nid + SCOPE
        for cid, child in node.subdag.nodes.items():
            out[prefix + cid] = replace(
                child, id=prefix + cid,
                next=tuple(replace(e, target=prefix + e.target) for e in child.next),
                on_failure=prefix + child.on_failure if child.on_failure else None)
    return out
