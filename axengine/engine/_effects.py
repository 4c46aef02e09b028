"""The side-effect outbox rules (DESIGN §3, "Side effects"), pure.

An effect (an email, a payment, a vendor job) is recorded under a stable key before it
is performed and marked done after, so a retried attempt either skips it (``DONE``) or
reports it ``UNKNOWN`` for a person — never repeats it silently. Only the attempt that
holds the node may touch the record: its fence must be the node's current one, under a
live lease (:func:`~axengine.engine._rules.holds`). A fenced-out worker that still
believes it owns the node gets ``stale`` and must not send.

The functions here decide from the node's snapshot and the record as read; the shell
(:meth:`Engine.effect_begin <axengine.engine.Engine.effect_begin>`) writes the answer's
record in one transaction that compares the mod_revision of both keys, so the fence
that was checked is the fence under which the record is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from axengine.codec import EffectRecord
from axengine.engine._rules import holds
from axengine.errors import NotFound
from axengine.records import Snapshot

__all__ = ["STALE", "decide_begin", "decide_done"]

#: The answer to a caller whose fence does not hold the node: nothing was written.
STALE = "stale"


def decide_begin(record: EffectRecord | None, holder: Snapshot | None, *, key: str,
                 task_id: str, node_id: str, fence: int,
                 now: float) -> tuple[str, EffectRecord | None]:
    """``effect_begin``: NEW → SENDING; an earlier SENDING becomes UNKNOWN (an attempt
    died mid-effect: a person decides).

    Args:
        record: The outbox record as stored (None: never begun).
        holder: The snapshot of the node the caller claims to run (None: no such node).

    Returns:
        The answer — the state before the call (``NEW``, ``SENDING``, ``DONE``,
        ``UNKNOWN``) or ``stale`` — and the record to write (None: nothing changes).
    """
    if holder is None or not holds(holder, fence, now):
        return STALE, None
    if record is None:
        return "NEW", EffectRecord(key=key, state="SENDING", result=None, task_id=task_id,
                                   node_id=node_id, updated_at=now)
    if record.state == "SENDING":
        return "SENDING", replace(record, state="UNKNOWN", updated_at=now)
    return record.state, None


def decide_done(record: EffectRecord | None, holder: Snapshot | None, *, key: str,
                fence: int, result: Mapping[str, Any],
                now: float) -> tuple[str, EffectRecord | None]:
    """``effect_done``: SENDING (or UNKNOWN, once the handler verified the delivery) →
    DONE with ``result``.

    Returns:
        ``ok`` and the DONE record, or ``stale`` and None.

    Raises:
        NotFound: The caller holds the node but the effect was never begun.
    """
    if holder is None or not holds(holder, fence, now):
        return STALE, None
    if record is None:
        raise NotFound(f"effect {key!r} was never begun")
    return "ok", replace(record, state="DONE", result=dict(result), updated_at=now)
