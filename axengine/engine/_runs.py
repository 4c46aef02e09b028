"""What an attempt runs: the :class:`ClaimResult` of a claim, built in one place.

A claim and a ``GetRun`` (a Kubernetes Job's container fetching the run its executor
claimed) answer the same thing — the :class:`~executors.contract.NodeRequest` of the
attempt that holds the node, with its timeout, lease and the task's facts — so both go
through :func:`claimed`, and the two answers cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from axengine.dag import Node
from axengine.records import Snapshot, TaskRecord
from axengine.timeouts import AdaptivePolicy, node_timeout_policy
from executors.contract import NodeRequest

__all__ = ["ClaimResult", "Completed", "claimed"]

#: Fields of a node that are not part of what its handler runs on: edges are the
#: engine's, the input template is replaced by the rendered input.
_NOT_CONFIG = frozenset({"next", "input", "map", "max_concurrency", "max_items",
                         "on_item_failure"})


@dataclass(frozen=True)
class ClaimResult:
    """Answer to a claim (and, with ``result == "claimed"``, to a ``GetRun``).

    Attributes:
        result: ``claimed``, ``not-claimable`` or ``dead``.
        request: What to run (when claimed), with the fence this attempt holds.
        timeout: Seconds this attempt may run.
        lease_until: Lease expiry granted by the claim (for a ``GetRun``: as stored).
        retry_after: When not claimable because of backoff or a live lease: seconds
            until it may be claimable.
        reason: Why it is not claimable (``backoff``, ``leased``, the node state).
        submitted_by: Who submitted the task (``local`` for the embedded engine).
        dag_hash: Content hash of the task's DAG (a Kubernetes Job is labelled with it).
    """

    result: str
    request: NodeRequest | None = None
    timeout: float = 0.0
    lease_until: float = 0.0
    retry_after: float = 0.0
    reason: str = ""
    submitted_by: str = ""
    dag_hash: str = ""
    timeout_grace: float = 0.0
    timeout_cap: float = 0.0


@dataclass(frozen=True)
class Completed:
    """Answer to a completion that may go on with a successor
    (:meth:`~axengine.engine.Engine.complete_and_claim`).

    Attributes:
        answer: ``committed``, ``stale`` or ``already-done``.
        snapshot: The node as this completion wrote it (None: it wrote nothing).
        next: The claim of a node the completion readied, made in the same transaction
            for the completing worker (None: nothing was claimed; readied nodes are in
            the queue).
        acked: The queue item of the claimed node the worker took (``claim_node``) was
            acknowledged with the push after the commit: the worker need not ack it.
    """

    answer: str
    snapshot: Snapshot | None = None
    next: ClaimResult | None = None
    acked: bool = False


def claimed(task: TaskRecord, node: Node, snap: Snapshot, params: Mapping[str, Any] | None
            ) -> ClaimResult:
    """The ``claimed`` answer for the attempt ``snap`` records (its fence and attempt).

    Args:
        task: The task record (labels, submitter, DAG hash).
        node: The node as the DAG declares it.
        snap: The node's snapshot, RUNNING under the attempt's fence.
        params: The rendered input as stored (``{"input": …, "prompt": …}``), blob
            already resolved; None when the node has none.
    """
    params = params or {}
    config = _config(node)
    if "prompt" in params:
        config["prompt"] = params["prompt"]
    request = NodeRequest(
        task_id=task.task_id, node_id=snap.node_id, node_type=node.type, attempt=snap.attempt,
        fence=snap.fence, config=config, input=params.get("input"),
        labels=dict(task.labels), input_revision=snap.input_revision,
        checkpoint=snap.checkpoint, resume=snap.resume,
    )
    # The attempt's timeout (its timeout_policy's, else the node's); a run resumed after
    # a pause has the rest of it (at least 1 s).
    timeout = snap.attempt_timeout or node.timeout
    if snap.run_seconds:
        timeout = max(timeout - snap.run_seconds, 1.0)
    # Progress moves the timeout by the policy's grace, up to its max (the node's timeout).
    grace = cap = 0.0
    if node.timeout_policy is not None:
        policy = node_timeout_policy(node.timeout_policy, node.timeout)
        if isinstance(policy, AdaptivePolicy) and policy.progress_grace > 0:
            grace = policy.progress_grace
            cap = max((policy.max or node.timeout) - snap.run_seconds, timeout)
    return ClaimResult("claimed", request=request, timeout=timeout,
                       lease_until=snap.lease_until, submitted_by=task.submitted_by,
                       dag_hash=task.dag_hash, timeout_grace=grace, timeout_cap=cap)


def _config(node: Node) -> dict[str, Any]:
    """The node's fields its handler runs on: its canonical form without the engine's
    fields, worked out once per node (a node is frozen; :attr:`Node.targets` is kept
    the same way) and copied for each claim."""
    config: dict[str, Any] | None = node.__dict__.get("_config")
    if config is None:
        config = {k: v for k, v in node.canonical().items() if k not in _NOT_CONFIG}
        object.__setattr__(node, "_config", config)
    return dict(config)
