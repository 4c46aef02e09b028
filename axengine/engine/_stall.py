"""Blocked or slow, as the engine decides it: :func:`axengine.blocking.judge` over a
snapshot.

The verdict function is pure over values; this module builds those values from what the
engine keeps — the snapshot's heartbeat, progress and marker, the activity the last
heartbeat carried, and the verdicts already recorded on the current stall — so the
claim (may another worker take this node over?), the reconciler (is it worth a
transaction?) and :func:`~axengine.engine._rules.plan_expire` (what to write) decide
with one function and cannot disagree. No clock, no I/O: ``now`` comes in.

The lease the judgement checks the heartbeat against is the one the last heartbeat
granted (``lease_until - heartbeat_at``), not a global setting: a worker that asks for
100 s leases is not "lost" after 30 s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from axengine.blocking import (
    Action,
    BlockingPolicy,
    ExpectedWindow,
    PriorVerdicts,
    Signals,
    Verdict,
    judge,
    step_of,
    window_for,
)
from axengine.dag import Node
from axengine.records import Snapshot

__all__ = [
    "ACTIVITY_FRESH_BEATS",
    "VERDICT_EVENTS",
    "cleared",
    "recorded",
    "stall_verdict",
    "window_of",
]

#: An activity older than this many heartbeat intervals is not evidence any more (the
#: worker that sent it may be gone, or its sampler stopped): the verdict treats it as
#: unknown. Two, so one heartbeat lost on the way does not turn a busy run "unknown".
ACTIVITY_FRESH_BEATS: Final = 2
#: Heartbeats per lease: workers heartbeat every third of the lease they ask for
#: (``axengine.worker.Worker``, the Job entry point), so the engine can tell the
#: heartbeat interval from the lease a heartbeat was granted.
_BEATS_PER_LEASE: Final = 3

#: Event kind of each verdict that is recorded without fencing (a ``fence`` is the
#: ``lease_expired`` event of the fence bump, with the evidence as its reason).
VERDICT_EVENTS: Final = {"note": "stall_note", "warn": "stall_warning",
                         "extend": "stall_extended"}


#: The actions a snapshot's history may hold, by their stored name.
_RECORDED: Final[dict[str, Action]] = {"note": "note", "warn": "warn", "extend": "extend"}


def window_of(node: Node, snap: Snapshot) -> ExpectedWindow:
    """The expected wait window of the node's current step: its ``stall_windows`` entry
    for the step the marker names, else its ``stall_timeout``, else its ``timeout``."""
    return window_for(step_of(snap.progress_marker), node.stall_windows or {},
                      node.stall_timeout or node.timeout)


def _granted_lease(snap: Snapshot) -> float:
    return max(snap.lease_until - snap.heartbeat_at, 1e-9)


def stall_verdict(node: Node, snap: Snapshot, now: float,
                  policy: BlockingPolicy | None = None) -> Verdict:
    """Judge a RUNNING node at ``now`` from its snapshot alone (see the module docstring).

    The activity counts only while fresh (at most :data:`ACTIVITY_FRESH_BEATS` heartbeat
    intervals old) and only when this attempt sent it (after its claim); otherwise the
    resources are unknown, which never extends. The history counts only when it is about
    this stall (:attr:`Snapshot.stall_progress_at` is the current ``progress_at``).
    """
    policy = policy or BlockingPolicy()
    lease = _granted_lease(snap)
    fresh = ACTIVITY_FRESH_BEATS * lease / _BEATS_PER_LEASE
    activity = snap.activity
    if activity is not None and (now - snap.activity_at > fresh
                                 or snap.activity_at < snap.started_at):
        activity = None
    signals = Signals(now=now, heartbeat_at=snap.heartbeat_at, progress_at=snap.progress_at,
                      marker=snap.progress_marker, activity=activity)
    history = PriorVerdicts()
    last = _RECORDED.get(snap.stall_verdict)
    if last is not None and snap.stall_progress_at == snap.progress_at:
        history = PriorVerdicts(progress_at=snap.stall_progress_at, last_action=last,
                                extended_until=snap.stall_extended_until or None)
    return judge(signals, window_of(node, snap), replace(policy, lease_seconds=lease),
                 history)


def recorded(snap: Snapshot, verdict: Verdict) -> Snapshot:
    """``snap`` with ``verdict`` folded into its history (a note, warning or extension)."""
    return replace(snap, stall_verdict=verdict.action, stall_progress_at=verdict.progress_at,
                   stall_extended_until=verdict.extended_until or 0.0)


def cleared(snap: Snapshot, *, activity: bool = False) -> Snapshot:
    """``snap`` with no verdict history (a new stall: progress was made, or the attempt
    ended), and with no activity either when ``activity`` (the attempt ended)."""
    out = replace(snap, stall_verdict="", stall_progress_at=0.0, stall_extended_until=0.0)
    return replace(out, activity=None, activity_at=0.0) if activity else out
