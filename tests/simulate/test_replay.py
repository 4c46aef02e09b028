"""Replaying a synthetic history whose answers are computed by hand.

The history: ten runs of one node, one after the other (run ``i`` starts at ``100 i``
and takes ``i + 1`` seconds, so each run sees every earlier duration), all succeeded but
the last, which timed out in the history after 10 s. Every expected number below is
written out from that, in the comment beside it.
"""

from __future__ import annotations

import random

import pytest

from axengine.simulate import NodeRun, RunOutcome, replay
from axengine.timeouts import (
    AdaptivePolicy,
    FixedPolicy,
    LoadStep,
    PercentilePolicy,
    decide,
)


def run(i: int, duration: float, outcome: RunOutcome = RunOutcome.SUCCEEDED, *,
        start: float | None = None, marks: tuple[float, ...] = (),
        load: float | None = None, node: str = "n") -> NodeRun:
    started = 100.0 * i if start is None else start
    return NodeRun(task_id=f"t{i}", dag="d", node=node, started=started,
                   ended=started + duration, outcome=outcome,
                   progress=tuple(started + m for m in marks), load=load)


def history() -> list[NodeRun]:
    runs = [run(i, i + 1.0) for i in range(9)]
    return [*runs, run(9, 10.0, RunOutcome.TIMED_OUT)]


def test_fixed_policy_counts() -> None:
    result = replay(history(), FixedPolicy(name="fixed-5s", timeout=5))
    # Durations 6, 7, 8, 9 (succeeded) and 10 (timed out) are over 5 s; 5 s itself is not.
    assert result.runs == 10
    assert result.timeouts == 5 and result.stall_kills == 0
    assert result.false_kills == 4                    # the timed-out run is no false kill
    assert result.wasted_seconds == 20                # 4 false kills x 5 s
    assert result.busy_seconds == 70                  # 1..5 + 4 x 5 + (6+7+8+9) + 5
    # Completions: 1 2 3 4 5, then 5+6 5+7 5+8 5+9; the timed-out run has none.
    assert result.completions == (1, 2, 3, 4, 5, 11, 12, 13, 14)
    assert result.completion_percentile(50) == 5      # rank ceil(4.5) = 5
    assert result.completion_percentile(99) == 14     # rank ceil(8.91) = 9
    assert result.unresolved == 0
    lenient = replay(history(), FixedPolicy(name="fixed-20s", timeout=20))
    assert (lenient.timeouts, lenient.false_kills, lenient.wasted_seconds) == (0, 0, 0)
    assert lenient.unresolved == 1                    # cut short at 10 s in the history
    assert lenient.busy_seconds == 55


def test_percentile_policy_counts_and_never_peeks() -> None:
    policy = PercentilePolicy(name="p50x1.5", percentile=50, factor=1.5, min_samples=3,
                              fallback=4.5)
    result = replay(history(), policy)
    # Runs 0-2 use the fallback (0, 1, 2 samples < 3) and finish within 4.5 s.
    # Then the timeout is 1.5 x p50 of the earlier durations:
    #   run 3: p50(1,2,3)=2 -> 3     run 4: p50(1..4)=2 -> 3     run 5: p50(1..5)=3 -> 4.5
    #   run 6: p50(1..6)=3 -> 4.5    run 7: p50(1..7)=4 -> 6     run 8: p50(1..8)=4 -> 6
    #   run 9: p50(1..9)=5 -> 7.5 (the timed-out run: a timeout, not a false kill)
    timeouts = [v.decision.timeout for v in result.verdicts]
    assert timeouts == [4.5, 4.5, 4.5, 3, 3, 4.5, 4.5, 6, 6, 7.5]
    first = result.verdicts[0].decision
    assert first.used_fallback and "fallback 4.5 s (0 samples < 3)" in first.explanation
    assert [v.samples for v in result.verdicts] == list(range(10))
    assert result.timeouts == 7 and result.false_kills == 6
    assert result.wasted_seconds == 27                # 3 + 3 + 4.5 + 4.5 + 6 + 6
    assert result.busy_seconds == 79.5                # 1+2+3 + (3+4)+(3+5)+...+(6+9) + 7.5
    assert result.completions == (1, 2, 3, 7, 8, 10.5, 11.5, 14, 15)
    assert result.completion_percentile(50) == 8
    assert result.completion_percentile(99) == 15


def test_durations_of_runs_still_in_flight_are_not_seen() -> None:
    policy = PercentilePolicy(name="p", percentile=50, min_samples=1, fallback=50)
    runs = [run(0, 100.0, start=0.0),             # ends at 100
            run(1, 1.0, start=10.0),              # starts while run 0 is in flight
            run(2, 1.0, start=200.0)]             # starts after both ended
    verdicts = replay(runs, policy).verdicts
    assert verdicts[1].decision.used_fallback and verdicts[1].samples == 0
    assert verdicts[1].load == 1                  # run 0 was in flight
    assert verdicts[2].samples == 2 and verdicts[2].load == 0
    # The replay order is the start order, whatever order the history was given in.
    assert [v.run.task_id for v in replay(runs[::-1], policy).verdicts] == ["t0", "t1", "t2"]


def test_durations_are_pooled_per_node_and_from_succeeded_runs_only() -> None:
    policy = PercentilePolicy(name="p", percentile=100, min_samples=1, fallback=50)
    runs = [run(0, 3.0, node="a"), run(1, 7.0, RunOutcome.FAILED, node="b"),
            run(2, 2.0, node="b"), run(3, 1.0, node="b")]
    verdicts = replay(runs, policy).verdicts
    assert verdicts[2].decision.used_fallback     # node a's 3 s and b's failure not used
    assert verdicts[3].decision.timeout == 2


def test_adaptive_policy_counts() -> None:
    runs = history()
    runs[5] = run(5, 6.0, load=2.0)                       # busy when it started: x 1.5
    runs[7] = run(7, 8.0, marks=(1, 2, 3, 4, 5, 6, 7))    # reports progress every second
    runs[8] = run(8, 9.0, marks=(1,))                     # goes quiet after 1 s
    policy = AdaptivePolicy(name="adaptive", percentile=50, min_samples=3, fallback=4,
                            load=(LoadStep(at=0, factor=1), LoadStep(at=2, factor=1.5)),
                            progress_grace=2, min=1, max=9)
    result = replay(runs, policy)
    # run 3: p50 2 -> killed at 2       run 4: p50 2 -> 2      run 5: p50 3 x 1.5 -> 4.5
    # run 6: p50 3 -> 3                 run 7: p50 4, progress in (2,4] and (4,6]: 8 = D, ok
    # run 8: p50 4, no progress in (2,4] -> killed at 4      run 9: p50 5 -> 5 (timed out)
    assert [v.killed_at for v in result.verdicts] == [None, None, None, 2, 2, 4.5, 3, None,
                                                      4, 5]
    assert result.verdicts[7].decision.grace == 4
    assert result.verdicts[5].decision.explanation.endswith("load 1.5")
    assert result.timeouts == 6 and result.false_kills == 5
    assert result.wasted_seconds == 15.5              # 2 + 2 + 4.5 + 3 + 4
    assert result.busy_seconds == 65.5
    assert result.completions == (1, 2, 3, 6, 7, 8, 10, 10.5, 13)
    assert result.completion_percentile(50) == 7
    assert result.completion_percentile(99) == 13


def test_stall_window_kills() -> None:
    runs = [run(0, 10.0, marks=(2, 4, 6, 8)),                        # never silent > 2 s
            run(1, 10.0, marks=(2, 6)),                              # silent 2 -> 6
            run(2, 3.0),                                             # no progress at all
            run(3, 2.5),                                             # exactly the window
            run(4, 10.0, RunOutcome.STALLED, marks=(1,))]            # hung in the history
    result = replay(runs, FixedPolicy(name="stall", timeout=100, stall_window=2.5))
    assert [v.killed_at for v in result.verdicts] == [None, 4.5, 2.5, None, 3.5]
    assert [v.cause for v in result.verdicts] == [None, "stall", "stall", None, "stall"]
    assert result.stall_kills == 3 and result.timeouts == 0
    assert result.false_kills == 2 and result.wasted_seconds == 7       # 4.5 + 2.5
    # A timeout and a stall at the same moment count as a timeout.
    tie = replay([run(0, 3.0)], FixedPolicy(name="t", timeout=2.5, stall_window=2.5))
    assert tie.timeouts == 1 and tie.stall_kills == 0


def test_select_keeps_the_load_of_every_run() -> None:
    runs = [run(0, 100.0, start=0.0, node="a"), run(1, 1.0, start=10.0, node="b")]
    only_b = replay(runs, FixedPolicy(name="f", timeout=50)).select(lambda r: r.node == "b")
    assert only_b.runs == 1 and only_b.verdicts[0].load == 1
    assert only_b.timeouts == 0 and pytest.approx(only_b.busy_seconds) == 1


def test_the_replay_decides_as_a_reference_that_sorts_for_every_run() -> None:
    """The replay keeps each node's durations in order instead of sorting them for
    every run (200,000 runs took 97 s, now 5 s): every decision is still the one made
    from the durations of the runs that ended before the run started, sorted."""
    rng = random.Random(7)
    runs = []
    for i in range(500):
        start = rng.uniform(0.0, 1000.0)
        runs.append(run(i, rng.lognormvariate(0.0, 1.0), rng.choice(
            [RunOutcome.SUCCEEDED] * 9 + [RunOutcome.TIMED_OUT]), start=start,
            node=rng.choice("abc")))
    for policy in (PercentilePolicy(name="p", percentile=90, factor=1.5, fallback=2.0,
                                    min_samples=3),
                   AdaptivePolicy(name="a", percentile=75, factor=1.2, fallback=2.0,
                                  min_samples=5, load=(LoadStep(at=0, factor=1.0),
                                                             LoadStep(at=4, factor=2.0)))):
        result = replay(runs, policy)
        assert len(result.verdicts) == 500
        for verdict in result.verdicts:
            r = verdict.run
            known = sorted(o.duration for o in runs if o.key == r.key and
                           o.outcome is RunOutcome.SUCCEEDED and o.ended <= r.started)
            assert verdict.decision == decide(policy, known, load=verdict.load,
                                              progress=r.marks(), elapsed=r.duration)
        assert sum(v.decision.used_fallback for v in result.verdicts) < 50
