"""What one transaction of a DAG can cost, against what the store can commit.

Every transition is one store transaction (DESIGN §3), so a DAG whose largest possible
transition does not fit the store can be submitted but never finished: etcd refuses the
transaction ("too many operations in txn request") and the task is stuck or DEAD for a
reason that has nothing to do with its work. The bound is worked out from the rules
(:mod:`axengine.engine._rules`); per transition, for a DAG of ``N`` nodes:

- **submit** puts all ``N`` snapshots, the task record, its index entries, the DAG record
  and the idempotency key; its events are ``submitted``, at most one per node (an entry
  node readied, paused or failed to render; a condition evaluated inline; a node skipped
  because a failure or a guard left it unreachable — a whole chain can be skipped in
  the submit transaction), the task's status event, and the ``claimed`` event of an
  entry node an embedded worker claims in the same transaction: ``2N + 5`` plus the
  indexes;
- **complete** (and a gate's decision or timeout) writes the node and, through skip
  propagation and inline conditions, possibly every other node, one event each, plus
  the task record and its status event, and the ``claimed`` event of a successor the
  completing worker claims in the same transaction: ``2N + 3`` plus the index moves. A
  non-retryable failure of the first node of a 10,000-node chain skips the other 9,999
  at once;
- **cancel** writes every unfinished node and one event each: ``2N + 2``;
- **retry** resets the node and its descendants, and re-opens every cancelled node of a
  cancelled task (``retried`` plus at most one event per node): ``2N + 3``.

A map node adds the items it runs at once (``max_concurrency``): the transaction that
expands it starts that many (a snapshot and a ``ready`` event each), and one that fails
or cancels it cancels as many (an event more each): ``3C + 1`` per map. A bounded loop
adds its body once: the transaction that goes round keeps every body node's visit
(a snapshot each, beside the reset it is counted for) and writes a ``looped`` event.

Claims, heartbeats and progress touch one node. Compares (one per snapshot written or
read from the engine's cache, the task record, the ramps read and the idempotency key)
stay within ``N`` plus a few, and etcd limits each of compares, success and failure
separately, so the largest count is the puts:
:func:`txn_ops_bound` = ``2N`` + :data:`TXN_FIXED_OPS` + one per label index entry.

Bytes are estimated too (:func:`txn_bytes_estimate`), for the error message and the
docs: etcd also caps a request's size (``--max-request-bytes``), but the rendered inputs
a transition carries depend on the task input, so only ops are refused up front.
"""

from __future__ import annotations

from axengine.dag import Dag
from axengine.engine._expand import concurrency
from axengine.errors import DagError, DagProblem

__all__ = ["TXN_FIXED_OPS", "fit_problem", "require_fit", "txn_bytes_estimate", "txn_ops_bound"]

#: Operations of the largest transition that do not scale with the DAG: the task record,
#: its status event, the ``submitted`` event, the idempotency key, the DAG record, and the
#: task's index entries (by creation, status — a delete and a put when it changes — and
#: DAG name); the rest is headroom for an index added later.
TXN_FIXED_OPS = 16
#: Rough bytes per written snapshot and per event (key + protobuf without payloads).
_SNAPSHOT_BYTES = 400
_EVENT_BYTES = 250


def txn_ops_bound(dag: Dag, *, labels: int = 0) -> int:
    """Most operations (puts/deletes) any single transaction of ``dag`` can need.

    Args:
        dag: The DAG.
        labels: Labels of the task (one index entry each; 0 when validating a DAG).
    """
    maps = sum(3 * concurrency(node) + 1 for node in dag.nodes.values()
               if node.map is not None)
    loops = sum(len(body) + 1 for body in dag.loops.values())
    return 2 * len(dag.nodes) + maps + loops + TXN_FIXED_OPS + labels


def txn_bytes_estimate(dag: Dag) -> int:
    """Rough request size of the largest transaction, without rendered payloads (each
    readied node may add up to the blob threshold of rendered input)."""
    nodes = len(dag.nodes)
    return nodes * (_SNAPSHOT_BYTES + _EVENT_BYTES) + len(dag.storage_json())


def fit_problem(dag: Dag, max_txn_ops: int | None, *, file: str = "<dag>",
                labels: int = 0) -> DagProblem | None:
    """The problem of a DAG too large for the store, or None when it fits (or the store
    has no limit)."""
    if max_txn_ops is None:
        return None
    needed = txn_ops_bound(dag, labels=labels)
    if needed <= max_txn_ops:
        return None
    most = max((max_txn_ops - TXN_FIXED_OPS - labels) // 2, 0)
    maps = [n.id for n in dag.nodes.values() if n.map is not None]
    dynamic = (f" (with the items of map {', '.join(maps)} that run at once; lower "
               "max_concurrency to need fewer)" if maps else "")
    return DagProblem(
        f"{len(dag.nodes)} nodes{dynamic} need up to {needed} operations in one store "
        f"transaction (about {txn_bytes_estimate(dag) // 1024} KiB); the store takes {max_txn_ops} "
        f"(at most {most} nodes fit)",
        file, 0, code="too-large",
        hint=f"raise etcd's --max-txn-ops to at least {needed} and pass the same value "
             f"as ?max_txn_ops={needed} in the store URL, or split the DAG")


def require_fit(dag: Dag, max_txn_ops: int | None, *, file: str = "<dag>",
                labels: int = 0) -> None:
    """Raise :class:`DagError` when a transaction of ``dag`` may not fit the store."""
    problem = fit_problem(dag, max_txn_ops, file=file, labels=labels)
    if problem is not None:
        raise DagError([problem])
