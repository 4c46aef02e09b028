"""The engine: pure transition rules, the shell that commits them, the reconciler."""

from __future__ import annotations

from axengine.engine._budget import TXN_FIXED_OPS, fit_problem, txn_ops_bound
from axengine.engine._index import index_writes
from axengine.engine._reconciler import Reconciler, ReconcileReport, owner_is_dead
from axengine.engine._rules import Plan, RuleConfig
from axengine.engine._shell import ClaimResult, Engine, EngineConfig, SubmitResult, TaskView
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
    "TXN_FIXED_OPS",
    "BlobRef",
    "ClaimResult",
    "Engine",
    "EngineConfig",
    "Event",
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
    "fit_problem",
    "index_writes",
    "owner_is_dead",
    "txn_ops_bound",
]
