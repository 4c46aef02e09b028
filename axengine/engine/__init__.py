"""The engine: pure transition rules, the shell that commits them, the reconciler.

The engine is the only owner of the state store's keys, of the records' encoding and of
the blob store; every other layer asks an :class:`Engine` (``tests/engine/
test_engine_closed.py`` checks the imports).
"""

from __future__ import annotations

from axengine.blobs import check_digest
from axengine.engine._budget import TXN_FIXED_OPS, fit_problem, txn_ops_bound
from axengine.engine._fork import FORKED_FROM_LABEL, RERUN, Fork, fork_task, plan_fork
from axengine.engine._index import index_writes
from axengine.engine._reads import SNAPSHOT_BATCH, SNAPSHOT_BATCH_NODES, TaskView, Timeline
from axengine.engine._reconciler import Reconciler, ReconcileReport
from axengine.engine._rules import Plan, RuleConfig, holds
from axengine.engine._runs import ClaimResult, Completed
from axengine.engine._shell import Engine, EngineConfig, SubmitResult
from axengine.owners import LOCAL_PRINCIPAL, host_pid_owner, owner_is_dead
from axengine.records import (
    ACTIVE_STATES,
    FINAL_STATES,
    BlobRef,
    Event,
    NextHop,
    NodeState,
    Snapshot,
    TaskRecord,
    TaskStatus,
)

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "FORKED_FROM_LABEL",
    "LOCAL_PRINCIPAL",
    "RERUN",
    "SNAPSHOT_BATCH",
    "SNAPSHOT_BATCH_NODES",
    "TXN_FIXED_OPS",
    "BlobRef",
    "ClaimResult",
    "Completed",
    "Engine",
    "EngineConfig",
    "Event",
    "Fork",
    "NextHop",
    "NodeState",
    "Plan",
    "ReconcileReport",
    "Reconciler",
    "RuleConfig",
    "Snapshot",
    "SubmitResult",
    "TaskRecord",
    "TaskStatus",
    "TaskView",
    "Timeline",
    "check_digest",
    "fit_problem",
    "fork_task",
    "holds",
    "host_pid_owner",
    "index_writes",
    "owner_is_dead",
    "plan_fork",
    "txn_ops_bound",
]
