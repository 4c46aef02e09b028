"""Blocked or slow: the verdict from three signals, with its evidence.

A node that heartbeats but reports no progress may be slow (a vendor renders a video, a
model streams a long answer) or blocked (a lock never released, a socket that will never
answer, a loop that never ends). Seed 001 tells them apart with three signals and graded
actions; seed 002 adds per-step expected wait windows ("waiting for the vendor may take
ten minutes without progress"). :func:`judge` is that decision as a pure function over
values — no clock, no store, no I/O — so the worker, the reconciler and the simulator
would decide alike and a test states every case by hand.

The signals (:class:`Signals`): the last heartbeat (the process is alive), the last
progress mark and its marker (the work advanced; the marker's first word names the
*step*), and the resource :class:`~axengine.activity.Activity` of the run over the last
sampling interval (None, or None fields, where the runner cannot see it).

The window (:class:`ExpectedWindow`): seconds without progress that are normal for the
current step, from the node's per-step windows (``{"vendor:*": 600, "llm:*": 120}``,
glob patterns) else its stall window (:func:`window_for`).

The grades, by silence ``s`` (seconds since the last progress) against the window ``W``:

============  ===============================================================
``ok``        ``s <= W/2`` (``note_at`` of the policy)
``note``      ``W/2 < s <= W``: record only
``extend``    ``s > W``, the resources show work and this stall was never
              extended: the deadline moves to ``now + extension * W``, once
``warn``      ``s > W`` while an extension runs, or while nothing about the
              resources is known and ``s <= W * (1 + unknown_grace)``:
              an event and a metric, no action
``fence``     ``s > W`` and the visible resources show no work; past the
              extension (busy or not: the one extension was the benefit of
              the doubt, and a busy loop is busy too); past the unknown grace;
              or no heartbeat for longer than the lease
============  ===============================================================

Missing evidence never extends: a run whose resources cannot be seen is warned about
and then fenced, and its evidence says "resource activity unknown".

Each :class:`Verdict` carries one line a person can read, e.g.
``no progress for 182 s in step llm:gpt-4o (window 120 s); cpu 0.00 s, io 0 B, net
unknown over 60 s: no work → fence out``. A caller records a verdict (an event with
that line) when :attr:`Verdict.news` is true, i.e. its action differs from the previous
verdict on the same stall, and folds it into the history with :meth:`PriorVerdicts.after`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from axengine.activity import DEFAULT_THRESHOLDS, Activity, ActivityThresholds

__all__ = [
    "Action",
    "BlockingPolicy",
    "ExpectedWindow",
    "PriorVerdicts",
    "Signals",
    "Verdict",
    "judge",
    "step_of",
    "window_for",
]

#: What to do about a running node, from least to most drastic.
Action = Literal["ok", "note", "warn", "extend", "fence"]


def step_of(marker: str) -> str:
    """The step a progress marker names: its first word (``llm:gpt-4o usage …`` →
    ``llm:gpt-4o``, ``vendor:rendering 40%`` → ``vendor:rendering``); ``""`` when the
    node reported no progress yet."""
    words = marker.split(maxsplit=1)
    return words[0] if words else ""


@dataclass(frozen=True)
class Signals:
    """What is known about one running node at ``now`` (seconds on one clock: the
    engine's wall clock for its snapshot times).

    Attributes:
        now: The time of the judgement.
        heartbeat_at: Last heartbeat: the process could still talk.
        progress_at: Last progress mark (the claim's time before any).
        marker: The last progress marker; its first word is the step.
        activity: Resources used over the last sampling interval, or None when the
            runner took no sample.
    """

    now: float
    heartbeat_at: float
    progress_at: float
    marker: str = ""
    activity: Activity | None = None

    @property
    def step(self) -> str:
        """The current step (:func:`step_of` the marker)."""
        return step_of(self.marker)


@dataclass(frozen=True)
class ExpectedWindow:
    """Seconds without progress that are normal for a step.

    Attributes:
        seconds: The window.
        source: Where it comes from, for the evidence: ``step window 'llm:*'`` or
            ``stall window``.
    """

    seconds: float
    source: str = "stall window"

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise ValueError(f"an expected window must be positive, got {self.seconds!r}")


def window_for(step: str, windows: Mapping[str, float], stall: float) -> ExpectedWindow:
    """The window of ``step`` among per-step ``windows`` (keys are exact step names or
    ``fnmatch`` globs), else the node's ``stall`` window.

    An exact key wins; among matching globs the longest (the most specific) wins, ties
    broken by the pattern's text, so the answer never depends on the mapping's order.
    """
    if step in windows:
        return ExpectedWindow(float(windows[step]), f"step window {step!r}")
    matches = sorted((p for p in windows if fnmatch.fnmatchcase(step, p)),
                     key=lambda p: (-len(p), p))
    if step and matches:
        return ExpectedWindow(float(windows[matches[0]]), f"step window {matches[0]!r}")
    return ExpectedWindow(float(stall), "stall window")


@dataclass(frozen=True)
class BlockingPolicy:
    """The grading knobs (fractions are of the step's window).

    Attributes:
        note_at: Silence past this fraction of the window is noted (0.5: halfway is
            early enough for a person to look, late enough not to note every pause).
        extension: The one extension granted when the resources show work, measured
            from the verdict (0.5: a run that really works gets half its window again;
            more would let a busy loop hold its slot much longer).
        unknown_grace: How long past the window a run whose resources cannot be seen
            is warned about before it is fenced (0.25: a person gets a warning before
            the fence, and an unobservable run is not kept longer than a busy one).
        lease_seconds: A heartbeat older than this means the owner is lost (the
            engine's lease, 30 s by default).
        thresholds: What counts as work (:class:`~axengine.activity.ActivityThresholds`).
    """

    note_at: float = 0.5
    extension: float = 0.5
    unknown_grace: float = 0.25
    lease_seconds: float = 30.0
    thresholds: ActivityThresholds = field(default_factory=lambda: DEFAULT_THRESHOLDS)

    def __post_init__(self) -> None:
        if not 0 < self.note_at < 1:
            raise ValueError(f"note_at must be between 0 and 1, got {self.note_at!r}")
        if self.extension <= 0 or self.unknown_grace < 0 or self.lease_seconds <= 0:
            raise ValueError("extension and lease_seconds must be positive, "
                             "unknown_grace not negative")


@dataclass(frozen=True)
class PriorVerdicts:
    """What earlier verdicts decided about the current stall (the time of the last
    progress they judged): only an extension and the last action matter. A history of
    another stall (progress moved since) is ignored by :func:`judge`.

    Attributes:
        progress_at: The stall these verdicts were about; None for no history.
        last_action: The previous verdict's action.
        extended_until: The deadline the one extension set, if granted.
    """

    progress_at: float | None = None
    last_action: Action = "ok"
    extended_until: float | None = None

    def after(self, verdict: Verdict) -> PriorVerdicts:
        """The history once ``verdict`` is taken."""
        return PriorVerdicts(progress_at=verdict.progress_at, last_action=verdict.action,
                             extended_until=verdict.extended_until)


@dataclass(frozen=True)
class Verdict:
    """A judgement and why.

    Attributes:
        action: What to do.
        evidence: One line a person can read: silence, step, window, resources, action.
        step: The step judged.
        progress_at: The stall judged (for :meth:`PriorVerdicts.after`).
        silent_for: Seconds since the last progress.
        window: The step's window, seconds.
        extended_until: The stall's deadline after the one extension, once granted.
        work: What the resources said: True work, False no work, None unknown.
        news: The action differs from the previous verdict on this stall: record it.
    """

    action: Action
    evidence: str
    step: str
    progress_at: float
    silent_for: float
    window: float
    extended_until: float | None
    work: bool | None
    news: bool


def judge(signals: Signals, window: ExpectedWindow, policy: BlockingPolicy | None = None,
          history: PriorVerdicts | None = None) -> Verdict:
    """Grade one running node (see the module docstring for the table)."""
    policy = policy or BlockingPolicy()
    prior = history or PriorVerdicts()
    if prior.progress_at != signals.progress_at:
        prior = PriorVerdicts()  # progress moved: a new stall, a fresh extension
    now, w = signals.now, window.seconds
    silent = max(0.0, now - signals.progress_at)
    step = signals.step or "(none yet)"
    activity = signals.activity
    work = activity.shows_work(policy.thresholds) if activity is not None else None
    if activity is None:
        resources = "resource activity unknown (no sample)"
    elif not activity.known:
        resources = f"resource activity unknown ({activity.describe()})"
    elif work is None:
        resources = f"{activity.describe()}, too short to judge"
    else:
        resources = activity.describe()
    head = f"no progress for {silent:.0f} s in step {step} ({_window(window)})"
    extended_until = prior.extended_until

    def verdict(action: Action, tail: str, *, until: float | None = extended_until) -> Verdict:
        return Verdict(
            action=action, evidence=f"{head}; {tail}", step=signals.step,
            progress_at=signals.progress_at, silent_for=silent, window=w,
            extended_until=until, work=work, news=action != prior.last_action)

    lost = now - signals.heartbeat_at
    if lost > policy.lease_seconds:
        return verdict("fence", f"no heartbeat for {lost:.0f} s (lease "
                                f"{policy.lease_seconds:g} s): owner lost → fence out")
    if extended_until is not None:
        limit = extended_until - signals.progress_at
        if now <= extended_until:
            return verdict("warn", f"{resources}; extended once, until {limit:.0f} s "
                                   "without progress → warn")
        if work:
            busy = (": still busy, yet no progress (a busy loop looks like this; raise the "
                    "step's window if it is normal)")
        else:
            busy = ": no work" if work is False else ""
        return verdict("fence", f"{resources}{busy}; past the extension ({limit:.0f} s) "
                                "→ fence out")
    if silent <= w * policy.note_at:
        return verdict("ok", f"{resources} → ok")
    if silent <= w:
        return verdict("note", f"{resources}; past {policy.note_at:.0%} of the window "
                               "→ note")
    if work:
        by = w * policy.extension
        return verdict("extend", f"{resources}: working → extend once by {by:.0f} s",
                       until=now + by)
    if work is False:
        return verdict("fence", f"{resources}: no work → fence out")
    grace = w * (1 + policy.unknown_grace)
    if silent <= grace:
        return verdict("warn", f"{resources}; never extended on missing evidence → warn, "
                               f"fence out after {grace:.0f} s")
    return verdict("fence", f"{resources}; past the window and its "
                            f"{policy.unknown_grace:.0%} grace → fence out")


def _window(window: ExpectedWindow) -> str:
    if window.source == "stall window":
        return f"window {window.seconds:g} s"
    return f"window {window.seconds:g} s, {window.source}"
