"""What a transition rule may read: one task, its DAG, and the snapshots it asked for.

Rules are pure, so they cannot fetch; when a rule needs a snapshot or a blob the shell
has not loaded yet it raises :class:`Need`, the shell loads exactly that and calls the
rule again. A transition therefore reads only the keys its decision depends on, which
keeps the per-node cost flat in the size of the DAG.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from axengine.dag import Dag
from axengine.engine._ramp import Ramp
from axengine.records import Snapshot, TaskRecord

__all__ = ["Need", "View"]


class Need(Exception):
    """Raised by a rule: load these snapshots (node ids), blob outputs and/or ramps
    (dependencies, :mod:`axengine.engine._ramp`), then retry."""

    def __init__(self, *, nodes: Iterable[str] = (), outputs: Iterable[str] = (),
                 task_input: bool = False, ramps: Iterable[str] = (),
                 durations: Iterable[str] = (), depths: Iterable[str] = (),
                 inputs: Iterable[str] = ()) -> None:
        super().__init__("need more state")
        self.nodes = frozenset(nodes)
        self.outputs = frozenset(outputs)
        #: Nodes whose rendered input lives in the blob store and is needed.
        self.inputs = frozenset(inputs)
        self.task_input = task_input
        self.ramps = frozenset(ramps)
        #: Nodes whose recorded run durations are needed (``timeout_policy``).
        self.durations = frozenset(durations)
        #: Lanes whose queue depth is needed (an adaptive policy's load).
        self.depths = frozenset(depths)


@dataclass
class View:
    """The state a rule reads. ``revs`` holds each loaded snapshot's ``mod_revision``
    (0 for a snapshot that does not exist yet)."""

    dag: Dag
    task: TaskRecord
    task_rev: int
    snaps: dict[str, Snapshot] = field(default_factory=dict)
    revs: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    task_input: Any = None
    task_input_loaded: bool = False
    #: Loaded ramps by dependency (None: no ramp) and their ``mod_revision`` (0: none).
    ramps: dict[str, Ramp | None] = field(default_factory=dict)
    ramp_revs: dict[str, int] = field(default_factory=dict)
    #: Recorded run durations by node id, oldest first.
    run_durations: dict[str, list[float]] = field(default_factory=dict)
    #: Queue depth by lane, as read for this decision.
    queue_depths: dict[str, int] = field(default_factory=dict)
    #: Whether snapshots may come from the engine's cache of what it last read or wrote
    #: (:mod:`~axengine.engine._cache`); those it took are in ``cached``, and
    #: ``task_cached`` says the task record came from it.
    use_cache: bool = False
    cached: set[str] = field(default_factory=set)
    task_cached: bool = False
    #: Dependencies whose ramp (or its absence) came from the cache.
    cached_ramps: set[str] = field(default_factory=set)

    @property
    def from_cache(self) -> bool:
        """Whether any record of this view came from the cache."""
        return self.task_cached or bool(self.cached) or bool(self.cached_ramps)

    def absent(self, node_id: str) -> None:
        """Hold a fresh PENDING snapshot for ``node_id``, one the store does not have
        (revision 0): a map's item not started yet, a loop's visit not kept yet."""
        self.snaps[node_id] = Snapshot(task_id=self.task.task_id, node_id=node_id)
        self.revs[node_id] = 0

    def snap(self, node_id: str) -> Snapshot:
        try:
            return self.snaps[node_id]
        except KeyError:
            raise Need(nodes=(node_id,)) from None

    def require(self, node_ids: Iterable[str]) -> None:
        missing = [n for n in node_ids if n not in self.snaps]
        if missing:
            raise Need(nodes=missing)

    def output(self, node_id: str) -> Any:
        """The output of a node, loading it from the blob store when it lives there."""
        snap = self.snap(node_id)
        if snap.output_ref is None:
            return snap.output
        if node_id not in self.outputs:
            raise Need(outputs=(node_id,))
        return self.outputs[node_id]

    def node_input(self, node_id: str) -> Any:
        """The rendered input of a node, loading it from the blob store when it lives
        there."""
        snap = self.snap(node_id)
        if snap.input_ref is None:
            return snap.input
        if node_id not in self.inputs:
            raise Need(inputs=(node_id,))
        return self.inputs[node_id]

    def ramp(self, dependency: str) -> Ramp | None:
        """The dependency's ramp, or None when it has none (no recent outage)."""
        if dependency not in self.ramps:
            raise Need(ramps=(dependency,))
        return self.ramps[dependency]

    def durations(self, node_id: str) -> list[float]:
        """The recorded durations of successful runs of this DAG node, oldest first."""
        if node_id not in self.run_durations:
            raise Need(durations=(node_id,))
        return self.run_durations[node_id]

    def depth(self, lane: str) -> int:
        """Items waiting in ``lane`` now."""
        if lane not in self.queue_depths:
            raise Need(depths=(lane,))
        return self.queue_depths[lane]

    def input(self) -> Any:
        """The task input (from the blob store when large)."""
        if self.task.input_ref is None:
            return self.task.input
        if not self.task_input_loaded:
            raise Need(task_input=True)
        return self.task_input
