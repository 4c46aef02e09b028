"""The typed, validated DAG model produced by the loader.

A :class:`Dag` is immutable and identified by the sha256 of its canonical JSON form
(``Dag.hash``): the same graph written with keys in another order, other comments or
other quoting has the same hash. Running tasks keep the DAG version they started with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from axengine.limits import canonical_json

__all__ = [
    "DEFAULT_RETRY",
    "DEFAULT_TIMEOUT",
    "NODE_TYPES",
    "Dag",
    "Edge",
    "Fallback",
    "Node",
    "NodeType",
]

NodeType = Literal["tool_call", "llm_call", "condition", "human_gateway"]
#: Node types of the DAG language.
NODE_TYPES: tuple[str, ...] = ("tool_call", "llm_call", "condition", "human_gateway")

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
    line: int = field(default=0, compare=False)

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target}
        if self.condition is not None:
            out["condition"] = self.condition
        if self.when is not None:
            out["when"] = self.when
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
    line: int = field(default=0, compare=False)

    @property
    def attempts(self) -> int:
        """Total attempts allowed (first try plus retries)."""
        return self.retry + 1

    @property
    def targets(self) -> tuple[str, ...]:
        """Every node this node may lead to (edges, then ``on_failure``), deduplicated."""
        seen: dict[str, None] = {}
        for edge in self.next:
            seen.setdefault(edge.target, None)
        if self.on_failure:
            seen.setdefault(self.on_failure, None)
        return tuple(seen)

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
            timeout=float(data["timeout"]),
            retry=int(data["retry"]),
            next=tuple(
                Edge(e["target"], e.get("condition"), e.get("when")) for e in data["next"]
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
        source: File the DAG was loaded from (``"<string>"`` for inline documents).
    """

    name: str
    nodes: Mapping[str, Node]
    description: str | None = None
    deadline: float | None = None
    input_schema: Mapping[str, Any] | None = None
    source: str = field(default="<string>", compare=False)

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
        out["nodes"] = {node_id: node.canonical() for node_id, node in self.nodes.items()}
        return out

    def canonical_json(self) -> bytes:
        """Canonical JSON bytes: sorted keys, no whitespace, UTF-8."""
        return canonical_json(self.canonical(), f"DAG {self.name!r}").encode()

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
            nodes={nid: Node.from_canonical(nid, nd) for nid, nd in data["nodes"].items()},
            source=source,
        )

    @property
    def predecessors(self) -> Mapping[str, tuple[str, ...]]:
        """For each node, the nodes with an edge (or ``on_failure``) to it, sorted."""
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
    def entry_nodes(self) -> tuple[str, ...]:
        """Nodes without predecessors, in document order."""
        preds = self.predecessors
        return tuple(nid for nid in self.nodes if not preds[nid])
