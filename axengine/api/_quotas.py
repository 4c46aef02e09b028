"""What one submitter may ask for: deployment quotas checked before a submit stores
anything.

A submitter is untrusted (DESIGN §4). Without bounds one of them can hold every worker
slot for ever (``timeout: 1e15``), jump every queue (``lane: fast``, ``priority:
2147483647``) or flood the store with unfinished tasks. :class:`Quotas` holds the
deployment's bounds (``ax api``/``ax server`` flags); :func:`check_dag` and
:func:`check_submit` are pure, and :func:`active_refusal` counts the principal's
unfinished tasks from the active-by-principal index (never by scanning tasks).

The active-task count is read before the submit transaction, not compared inside it:
two submits of one principal racing each other may both pass, so the limit can be
overshot by the number of that principal's submits in flight at once. Making it exact
would need a per-principal counter compared in every submit *and* every final
transition, serialising all of one principal's tasks on one key; the bound is a
brake on floods, not an accounting invariant.
"""

from __future__ import annotations

from dataclasses import dataclass

from axengine.api._auth import RULES, Principal, Role
from axengine.dag import Dag
from axengine.engine import Engine
from axengine.errors import Forbidden, InputError, QuotaExceeded

__all__ = [
    "DEFAULT_MAX_ACTIVE_TASKS",
    "DEFAULT_MAX_DEADLINE",
    "DEFAULT_MAX_NODE_TIMEOUT",
    "UNLIMITED",
    "Quotas",
    "active_refusal",
    "check_dag",
    "check_submit",
]

#: Largest ``timeout``/``stall_timeout``/``queue_timeout`` of a node, in seconds (one
#: day; a gate's ``timeout`` is its wait for a decision, so this bounds it too).
DEFAULT_MAX_NODE_TIMEOUT = 86_400.0
#: Largest task deadline, in seconds from submission (30 days).
DEFAULT_MAX_DEADLINE = 30 * 86_400.0
#: Unfinished tasks one principal may have (0 = unlimited).
DEFAULT_MAX_ACTIVE_TASKS = 1000

_NODE_TIMEOUTS = ("timeout", "stall_timeout", "queue_timeout")


@dataclass(frozen=True)
class Quotas:
    """Bounds on what a submitter may ask for (0 disables a bound).

    Attributes:
        max_node_timeout: Largest node ``timeout``, ``stall_timeout`` and
            ``queue_timeout`` (seconds).
        max_deadline: Largest task deadline (seconds from submission), whether it comes
            from the request or the DAG's ``deadline``.
        max_active_tasks: Unfinished tasks one principal may have.
    """

    max_node_timeout: float = DEFAULT_MAX_NODE_TIMEOUT
    max_deadline: float = DEFAULT_MAX_DEADLINE
    max_active_tasks: int = DEFAULT_MAX_ACTIVE_TASKS


#: No bounds at all (embedded use, tests of other things).
UNLIMITED = Quotas(max_node_timeout=0, max_deadline=0, max_active_tasks=0)


def check_dag(dag: Dag, quotas: Quotas) -> None:
    """Refuse a DAG whose node timeouts exceed the deployment's bound.

    Raises:
        InputError: Names the node, the field, its value and the limit.
    """
    limit = quotas.max_node_timeout
    if not limit:
        return
    for nid, node in dag.nodes.items():
        for name in _NODE_TIMEOUTS:
            value = getattr(node, name)
            # `not value <= limit` also refuses NaN.
            if value is not None and not value <= limit:
                raise InputError(f"node {nid!r}: {name} {value:g}s exceeds this server's "
                                 f"limit of {limit:g}s (--max-node-timeout)")


def check_submit(dag: Dag, principal: Principal, quotas: Quotas, *, priority: int,
                 deadline_seconds: float | None) -> None:
    """Everything about a submit that needs no I/O: node timeouts, the deadline, and
    the privileges ``lane: fast`` and a priority above 0 require.

    Raises:
        InputError: A timeout or the deadline exceeds its bound (HTTP 400).
        Forbidden: The principal lacks the ``expedite`` role (HTTP 403).
    """
    check_dag(dag, quotas)
    deadline = deadline_seconds if deadline_seconds is not None else dag.deadline
    # (A deadline that is no positive number is the engine's to refuse, on every path.)
    if quotas.max_deadline and deadline is not None and deadline > quotas.max_deadline:
        source = "deadline_seconds" if deadline_seconds is not None else "the DAG's deadline"
        raise InputError(f"{source} {deadline:g}s exceeds this server's limit of "
                         f"{quotas.max_deadline:g}s (--max-task-deadline)")
    if principal.roles & RULES["expedite"]:
        return
    fast = sorted(nid for nid, node in dag.nodes.items() if node.lane == "fast")
    if fast:
        raise Forbidden(f"{principal.name!r} may not use lane 'fast' (node {fast[0]!r}): "
                        f"it needs role {Role.EXPEDITE.value} or admin")
    if priority > 0:
        raise Forbidden(f"{principal.name!r} may not submit with priority {priority} "
                        f"(above the default 0): it needs role {Role.EXPEDITE.value} "
                        "or admin")


async def active_refusal(engine: Engine, principal: Principal,
                         quotas: Quotas) -> QuotaExceeded | None:
    """The refusal of a submit when the principal already has ``max_active_tasks``
    unfinished tasks (HTTP 429, with the count and the limit), or None. Returned, not
    raised: the caller reads this beside the idempotency key and drops it for a repeat
    (see the module docstring for the race this leaves)."""
    limit = quotas.max_active_tasks
    if not limit:
        return None
    count = await engine.count_active(principal.name)
    if count < limit:
        return None
    return QuotaExceeded(f"{principal.name!r} has {count} unfinished tasks; the limit "
                         f"is {limit} (--max-active-tasks-per-principal): wait for some "
                         "to finish")
