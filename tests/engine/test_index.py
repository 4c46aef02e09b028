"""Pure tests of the secondary task indexes and the four-eyes rule (no I/O)."""

from __future__ import annotations

import pytest

from axengine.dag import load_dag_text
from axengine.engine._index import (
    choose_index,
    decode_cursor,
    encode_cursor,
    index_keys,
    index_writes,
)
from axengine.engine._rules import four_eyes_violation
from axengine.errors import InputError
from axengine.keys import StoreKeys, inverted_time
from axengine.records import TaskRecord, TaskStatus
from axengine.store import Delete, Put

KEYS = StoreKeys("/ax")


def task(status: TaskStatus = TaskStatus.RUNNING, **extra: object) -> TaskRecord:
    base: dict[str, object] = {"task_id": "t-1", "dag_hash": "h", "dag_name": "risk/a",
                               "status": status, "labels": {"team": "a=b", "env": "dev"},
                               "created_at": 1_700_000_000.25, "submitted_by": "alice"}
    base.update(extra)
    return TaskRecord(**base)  # type: ignore[arg-type]


def test_inverted_time_sorts_newest_first_at_fixed_width() -> None:
    older, newer = inverted_time(1_700_000_000.0), inverted_time(1_700_000_000.000001)
    assert len(older) == len(newer) == 17 and newer < older
    assert inverted_time(-5) == "9" * 17


def test_index_keys_escape_user_parts_and_track_activity() -> None:
    keys = index_keys(KEYS, task())
    inv = inverted_time(1_700_000_000.25)
    assert f"/ax/index/created/{inv}/t-1" in keys
    assert f"/ax/index/status/RUNNING/{inv}/t-1" in keys
    assert f"/ax/index/dag/risk%2Fa/{inv}/t-1" in keys
    assert f"/ax/index/label/team=a%3Db/{inv}/t-1" in keys
    assert "/ax/index/active/alice/t-1" in keys
    assert not any("/active/" in k for k in index_keys(KEYS, task(TaskStatus.SUCCEEDED)))
    assert not any("/active/" in k for k in index_keys(KEYS, task(submitted_by="")))


def test_index_writes_move_only_what_changed() -> None:
    inv = inverted_time(1_700_000_000.25)
    assert all(isinstance(op, Put) for op in index_writes(KEYS, None, task()))
    ops = index_writes(KEYS, task(), task(TaskStatus.SUCCEEDED))
    assert ops == [Delete("/ax/index/active/alice/t-1"),
                   Delete(f"/ax/index/status/RUNNING/{inv}/t-1"),
                   Put(f"/ax/index/status/SUCCEEDED/{inv}/t-1", b"t-1")]
    assert index_writes(KEYS, task(), task(updated_at=5.0)) == []
    relabelled = index_writes(KEYS, task(), task(labels={"team": "a=b", "env": "prod"}))
    assert [type(op).__name__ for op in relabelled] == ["Delete", "Put"]


def test_choose_index_prefers_labels_then_dag_then_one_status() -> None:
    assert choose_index(KEYS, labels={"b": "1", "a": "2"}, dag_name="d") == \
        "/ax/index/label/a=2/"
    assert choose_index(KEYS, dag_name="d", statuses={TaskStatus.RUNNING}) == \
        "/ax/index/dag/d/"
    assert choose_index(KEYS, statuses={TaskStatus.PAUSED}) == "/ax/index/status/PAUSED/"
    assert choose_index(KEYS, statuses={TaskStatus.PAUSED, TaskStatus.RUNNING}) == \
        "/ax/index/created/"


def test_cursor_round_trips_and_refuses_garbage() -> None:
    index = "/ax/index/created/"
    key = index + "99999999999999998/t-9"
    token = encode_cursor(index, key)
    assert "/" not in token and decode_cursor(index, token) == key
    # Garbage, characters b64decode would silently drop, and well-formed base64 of
    # something that is not "<time>/<task id>" are all refused.
    for bad in ("%%%", "%%%" + token, encode_cursor(index, index + "0001/t-9"), "YWJj"):
        with pytest.raises(InputError):
            decode_cursor(index, bad)


GATES = load_dag_text("""\
name: gates
nodes:
  plain:
    type: human_gateway
    next: strict
  strict:
    type: human_gateway
    four_eyes: true
""")


def test_four_eyes_refuses_the_submitter_only_where_asked() -> None:
    plain, strict = GATES.nodes["plain"], GATES.nodes["strict"]
    assert four_eyes_violation(plain, "alice", "alice") is None
    refused = four_eyes_violation(strict, "alice", "alice")
    assert refused is not None and refused.startswith("four-eyes rule:")
    assert four_eyes_violation(strict, "alice", "bob") is None
    # The deployment flag makes it the rule for every gate.
    assert four_eyes_violation(plain, "alice", "alice", four_eyes=True) is not None
    # The reconciler's timeout decision is not a person's.
    assert four_eyes_violation(strict, "alice", "ax:gate-timeout") is None
    # No recorded submitter: cannot be checked, so refused.
    assert four_eyes_violation(strict, "", "bob") is not None


def test_four_eyes_is_part_of_the_dag_hash_only_when_set() -> None:
    assert "four_eyes" not in GATES.nodes["plain"].canonical()
    assert GATES.nodes["strict"].canonical()["four_eyes"] is True
