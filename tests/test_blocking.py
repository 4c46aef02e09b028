"""The blocked-or-slow verdict, case by case, on values (no clock, no I/O).

Unless a case says otherwise: the step's window is 120 s, so with the default policy a
stall is noted past 60 s, past the window at 120 s, given an extension of 60 s, and,
when nothing about the resources is known, fenced past 150 s; the lease is 30 s; the
last progress was at t=1000 and the last heartbeat a second before ``now``.
"""

from __future__ import annotations

import pytest

from axengine.activity import Activity
from axengine.blocking import (
    BlockingPolicy,
    ExpectedWindow,
    PriorVerdicts,
    Signals,
    Verdict,
    judge,
    step_of,
    window_for,
)

T0 = 1000.0
WINDOW = ExpectedWindow(120.0, "step window 'llm:*'")
BUSY = Activity(60, 4.2, 3_250_000, None)
IDLE = Activity(60, 0.0, 0, None)
UNKNOWN = Activity(60, None, None, None)


def at(silent: float, activity: Activity | None = IDLE, *, marker: str = "llm:gpt-4o usage x=1",
       heartbeat_age: float = 1.0) -> Signals:
    now = T0 + silent
    return Signals(now=now, heartbeat_at=now - heartbeat_age, progress_at=T0,
                   marker=marker, activity=activity)


def verdict(silent: float, activity: Activity | None = IDLE,
            history: PriorVerdicts | None = None, *, marker: str = "llm:gpt-4o usage x=1",
            heartbeat_age: float = 1.0) -> Verdict:
    return judge(at(silent, activity, marker=marker, heartbeat_age=heartbeat_age), WINDOW,
                 BlockingPolicy(), history)


@pytest.mark.parametrize(("silent", "activity", "action"), [
    (0.0, IDLE, "ok"),
    (60.0, IDLE, "ok"),            # exactly half the window: not yet past it
    (60.001, IDLE, "note"),
    (120.0, IDLE, "note"),         # exactly the window: not past it (the engine's > too)
    (120.001, IDLE, "fence"),      # past the window, visible resources idle
    (120.001, BUSY, "extend"),     # past the window, working
    (120.001, UNKNOWN, "warn"),    # nothing visible: never extended, warned first
    (120.001, None, "warn"),       # no sample at all: the same
    (150.0, UNKNOWN, "warn"),      # the end of the 25 % grace
    (150.001, UNKNOWN, "fence"),
    (150.001, None, "fence"),
    (130.0, Activity(9, 4.2, None, None), "warn"),      # too short an interval to judge
    (130.0, Activity(60, 0.05, None, None), "extend"),  # cpu exactly at 0.05 s/min
    (130.0, Activity(60, 0.0499, None, None), "fence"),
    (130.0, Activity(60, None, None, 64 * 1024), "extend"),  # net exactly at 64 KiB/min
    (500.0, BUSY, "extend"),       # first seen late: still one extension
])
def test_grades(silent, activity, action):
    assert verdict(silent, activity).action == action


def test_evidence_lines_read_as_a_sentence():
    assert verdict(182, IDLE).evidence == (
        "no progress for 182 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "cpu 0.00 s, io 0 B, net unknown over 60 s: no work → fence out")
    assert verdict(121, BUSY).evidence == (
        "no progress for 121 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "cpu 4.20 s, io 3.1 MiB, net unknown over 60 s: working → extend once by 60 s")
    assert verdict(130, None).evidence == (
        "no progress for 130 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "resource activity unknown (no sample); never extended on missing evidence → warn, "
        "fence out after 150 s")
    assert verdict(160, UNKNOWN).evidence == (
        "no progress for 160 s in step llm:gpt-4o (window 120 s, step window 'llm:*'); "
        "resource activity unknown (cpu unknown, io unknown, net unknown over 60 s); "
        "past the window and its 25% grace → fence out")
    assert verdict(70, IDLE).evidence.endswith("past 50% of the window → note")
    assert "too short to judge" in verdict(130, Activity(9, 4.2, None, None)).evidence


def test_extension_sets_the_new_deadline_from_the_verdict():
    v = verdict(130, BUSY)
    assert (v.action, v.extended_until, v.work, v.news) == ("extend", T0 + 130 + 60, True, True)


def test_once_extended_warn_until_the_deadline_then_fence_busy_or_not():
    extended = PriorVerdicts(progress_at=T0, last_action="extend", extended_until=T0 + 190)
    within = verdict(190, IDLE, extended)  # the deadline itself is still inside
    assert (within.action, within.extended_until) == ("warn", T0 + 190)
    assert within.evidence.endswith("extended once, until 190 s without progress → warn")
    busy = verdict(190.5, BUSY, extended)
    assert busy.action == "fence"
    assert "still busy, yet no progress (a busy loop looks like this" in busy.evidence
    assert busy.evidence.endswith("past the extension (190 s) → fence out")
    idle = verdict(190.5, IDLE, extended)
    assert idle.action == "fence"
    assert ": no work; past the extension (190 s) → fence out" in idle.evidence
    unknown = verdict(190.5, UNKNOWN, extended)
    assert unknown.evidence.endswith("over 60 s); past the extension (190 s) → fence out")


def test_history_of_an_earlier_stall_is_ignored():
    # Progress moved since that extension: this is a new stall with its own extension.
    old = PriorVerdicts(progress_at=T0 - 500, last_action="extend", extended_until=T0 - 300)
    v = verdict(130, BUSY, old)
    assert (v.action, v.news) == ("extend", True)


def test_heartbeat_lost_beyond_the_lease_fences_whatever_the_progress():
    assert verdict(5, BUSY, heartbeat_age=30.0).action == "ok"  # the lease itself: alive
    lost = verdict(5, BUSY, heartbeat_age=30.5)
    assert lost.action == "fence"
    assert lost.evidence.endswith("no heartbeat for 30 s (lease 30 s): owner lost → fence out")


def test_news_only_when_the_action_changes_and_history_folds_verdicts():
    history = PriorVerdicts()
    actions = []
    for silent, activity in [(30, IDLE), (70, IDLE), (90, IDLE), (121, BUSY), (150, BUSY),
                             (170, BUSY), (182, BUSY)]:
        v = verdict(silent, activity, history)
        actions.append((v.action, v.news))
        history = history.after(v)
    assert actions == [("ok", False), ("note", True), ("note", False), ("extend", True),
                       ("warn", True), ("warn", False), ("fence", True)]


def test_no_step_yet_and_step_names():
    v = verdict(130, IDLE, marker="")
    assert "in step (none yet)" in v.evidence
    assert v.step == ""
    assert step_of("vendor:rendering 40%") == "vendor:rendering"
    assert step_of("  llm:gpt-4o  usage x=1") == "llm:gpt-4o"


@pytest.mark.parametrize(("step", "window"), [
    ("vendor:wait", ExpectedWindow(600, "step window 'vendor:wait'")),        # exact
    ("vendor:rendering", ExpectedWindow(300, "step window 'vendor:*'")),      # glob
    ("llm:gpt-4o", ExpectedWindow(90, "step window 'llm:gpt-*'")),            # longest glob
    ("llm:claude", ExpectedWindow(120, "step window 'llm:*'")),
    ("page", ExpectedWindow(45, "stall window")),                             # no match
    ("", ExpectedWindow(45, "stall window")),                                 # no step yet
])
def test_window_for(step, window):
    windows = {"vendor:wait": 600, "vendor:*": 300, "llm:*": 120, "llm:gpt-*": 90}
    assert window_for(step, windows, 45) == window


def test_a_catch_all_glob_matches_any_named_step():
    assert window_for("page", {"*": 30}, 45) == ExpectedWindow(30, "step window '*'")


def test_stall_window_evidence_names_no_source():
    v = judge(at(130), ExpectedWindow(120), BlockingPolicy())
    assert "(window 120 s);" in v.evidence


@pytest.mark.parametrize("bad", [
    {"note_at": 0}, {"note_at": 1}, {"extension": 0}, {"unknown_grace": -0.1},
    {"lease_seconds": 0},
])
def test_policy_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        BlockingPolicy(**bad)
    with pytest.raises(ValueError):
        ExpectedWindow(0)


def test_policy_knobs_move_the_boundaries():
    policy = BlockingPolicy(note_at=0.25, extension=1.0, unknown_grace=0.0)
    assert judge(at(31), WINDOW, policy).action == "note"
    assert judge(at(121, BUSY), WINDOW, policy).extended_until == T0 + 121 + 120
    assert judge(at(120.5, UNKNOWN), WINDOW, policy).action == "fence"
