"""Pairing a task's timeline into node runs (pure: events in, runs out), and the JSON
Lines round trip with its errors."""

from __future__ import annotations

import pytest

from axengine.engine import Event
from axengine.simulate import (
    HistoryError,
    NodeInfo,
    NodeRun,
    RunOutcome,
    parse_history,
    runs_from_events,
    runs_to_jsonl,
)


def ev(kind: str, at: float, node: str = "a", attempt: int = 0, detail: str = "") -> Event:
    return Event(task_id="t1", event_id=f"{at:017.3f}-{kind}", kind=kind, at=at, node_id=node,
                 attempt=attempt, detail=detail)


NODES = {"a": NodeInfo("llm_call", "sim-small", ""), "b": NodeInfo("tool_call", "", "sleep")}


def test_timeline_becomes_runs() -> None:
    events = [
        ev("submitted", 0.0, node=""),
        ev("ready", 0.0),
        ev("claimed", 1.0, attempt=1),
        ev("progress", 1.5, detail="llm:sim-small"),
        ev("retry", 3.0, attempt=1, detail="timed out after 2.0s (timeout 2s) (retry in 1.0s)"),
        ev("claimed", 4.0, attempt=2),
        ev("progress", 4.2),
        ev("progress", 4.4),
        ev("committed", 5.0, attempt=2, detail="-> b"),
        ev("claimed", 5.0, node="b", attempt=1),
        ev("lease_expired", 9.0, node="b", detail="no progress for 4s; owner w1 fenced out"),
        ev("claimed", 9.5, node="b", attempt=2),
        ev("claimed", 12.0, node="b", attempt=3),   # taken over with no event of its own
        ev("retry", 13.0, node="b", attempt=3, detail="boom (retry in 1.0s)"),
        ev("claimed", 14.0, node="b", attempt=4),
        ev("unavailable", 14.5, node="b", detail="vendor: down"),
        ev("claimed", 15.0, node="b", attempt=4),
        ev("cancelled", 16.0, node="b", detail="cancelled by alice"),
        ev("committed", 17.0, node="route", detail="label=x -> y"),   # inline: no run
        ev("claimed", 18.0, node="c", attempt=1),                     # still open: left out
    ]
    runs = runs_from_events("t1", "demo", NODES, events)
    assert [(r.node, r.attempt, r.started, r.ended, r.outcome) for r in runs] == [
        ("a", 1, 1.0, 3.0, RunOutcome.TIMED_OUT),
        ("a", 2, 4.0, 5.0, RunOutcome.SUCCEEDED),
        ("b", 1, 5.0, 9.0, RunOutcome.STALLED),
        ("b", 2, 9.5, 12.0, RunOutcome.STALE),
        ("b", 3, 12.0, 13.0, RunOutcome.FAILED),
        ("b", 4, 14.0, 14.5, RunOutcome.UNAVAILABLE),
        ("b", 4, 15.0, 16.0, RunOutcome.CANCELLED),
    ]
    assert runs[0].progress == (1.5,) and runs[1].progress == (4.2, 4.4)
    assert runs[1].marks() == pytest.approx((0.2, 0.4))
    assert (runs[0].node_type, runs[0].model) == ("llm_call", "sim-small")
    assert runs[2].tool == "sleep" and runs[0].dag == "demo"
    assert runs[1].finished and not runs[0].finished


def test_jsonl_round_trip() -> None:
    runs = [NodeRun(task_id="t1", dag="d", node="a", node_type="llm_call", model="m",
                    attempt=2, started=10.0, ended=12.5, progress=(11.0,),
                    outcome=RunOutcome.SUCCEEDED, detail="-> b", load=3.0),
            NodeRun(task_id="t2", dag="d", node="b", started=20.0, ended=21.0,
                    outcome=RunOutcome.TIMED_OUT)]
    lines = list(runs_to_jsonl(runs))
    assert '"duration": 2.5' in lines[0] and '"outcome": "timed_out"' in lines[1]
    assert parse_history(lines, "h.jsonl") == runs


def test_hand_written_lines_may_give_durations_only() -> None:
    [one] = parse_history(['{"task_id": "t", "dag": "d", "node": "n", "started": 5, '
                           '"duration": 2, "outcome": "succeeded"}'])
    assert one.ended == 7 and one.attempt == 1 and one.progress == ()


@pytest.mark.parametrize(("line", "message"), [
    ('{"task_id": "t", ', "h.jsonl:2: not valid JSON"),
    ("[1, 2]", "h.jsonl:2: a history line must be a JSON object, got list"),
    ('{"task_id": "t", "dag": "d", "node": "n", "duration": 1, "outcome": "succeeded"}',
     "h.jsonl:2: field 'started': required"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": 1, "outcome": "succeeded"}',
     "h.jsonl:2: field 'ended': required, or give 'duration'"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": 1, "duration": 1, '
     '"outcome": "done"}', "h.jsonl:2: field 'outcome': must be one of succeeded, failed"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": 1, "ended": 3, "duration": 1, '
     '"outcome": "failed"}', "h.jsonl:2: field 'duration': 1 does not match"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": "x", "duration": 1, '
     '"outcome": "failed"}', "h.jsonl:2: field 'started': must be a finite number, got 'x'"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": 1' + "0" * 400 + ', '
     '"duration": 1, "outcome": "failed"}',
     "h.jsonl:2: field 'started': must be a finite number, got 100000000000000000000000000"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": 1, "duration": 1, '
     '"outcome": ["failed"]}', "h.jsonl:2: field 'outcome': must be one of succeeded"),
    ('{"task_id": "t", "dag": "d", "node": "n", "started": 1, "duration": 1, '
     '"outcome": 3}', "h.jsonl:2: field 'outcome': must be one of succeeded"),
    ('{"dag": "d", "node": "n", "started": 1, "duration": 1, "outcome": "failed"}',
     "h.jsonl:2: field 'task_id': must be a non-empty string"),
])
def test_bad_history_lines_are_named(line: str, message: str) -> None:
    good = ('{"task_id": "t", "dag": "d", "node": "n", "started": 0, "duration": 1, '
            '"outcome": "succeeded"}')
    with pytest.raises(HistoryError) as info:
        parse_history([good, line], "h.jsonl")
    assert str(info.value).startswith(message), str(info.value)
