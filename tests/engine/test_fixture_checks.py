"""A fixture file is checked field by field before anything is restored: a field of the
wrong type or range, or records that do not fit together, is one clear error naming the
file and the field — never a traceback from deep inside restore, replay or a worker."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from axengine.cli import main as ax_main
from axengine.cli.snapshot import timed_waits
from axengine.dag import Dag, load_dag_mapping
from axengine.engine import TaskView
from axengine.errors import DagError, InputError
from axengine.fixtures import (
    MAX_SECONDS,
    check_fixture,
    fixture_snapshots,
    fixture_task,
    load_fixture,
)
from axengine.records import Event, NodeState, Snapshot, TaskRecord

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
BASE = json.loads((FIXTURES / "financial_success.json").read_text())


def _edited(edit: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    edit(data)
    return data


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _refused(data: Any) -> str:
    with pytest.raises(InputError) as caught:
        check_fixture(data, "f.json")
    return str(caught.value)


def test_the_recorded_fixtures_pass() -> None:
    for path in sorted(FIXTURES.glob("*.json")):
        assert load_fixture(path)["task"]["task_id"]


# One value of the wrong kind for each declared type of a record field.
_WRONG = {"str": 7, "int": "7", "float": "7", "bool": 0, "NodeState": "NAPPING",
          "TaskStatus": "NAPPING"}


def _typed_fields(cls: type) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in dataclasses.fields(cls) if str(f.type) in _WRONG]


@pytest.mark.parametrize("name,kind", _typed_fields(TaskRecord))
def test_every_typed_task_field_is_checked(name: str, kind: str) -> None:
    message = _refused(_edited(lambda d: d["task"].__setitem__(name, _WRONG[kind])))
    assert message.startswith(f"f.json: task.{name} must be "), message


@pytest.mark.parametrize("name,kind", _typed_fields(Snapshot))
def test_every_typed_snapshot_field_is_checked(name: str, kind: str) -> None:
    message = _refused(_edited(lambda d: d["snapshots"][1].__setitem__(name, _WRONG[kind])))
    node = BASE["snapshots"][1]["node_id"]
    # (a node id that is not a string cannot name its node)
    at = "snapshots[1]" if name == "node_id" else f"snapshots[1] (node {node})"
    assert message.startswith(f"f.json: {at}.{name} must be "), message


@pytest.mark.parametrize("name,kind", _typed_fields(Event))
def test_every_typed_event_field_is_checked(name: str, kind: str) -> None:
    message = _refused(_edited(lambda d: d["events"][2].__setitem__(name, _WRONG[kind])))
    assert message.startswith(f"f.json: events[2].{name}"), message


@pytest.mark.parametrize("path,value,expected", [
    # Values a JSON file can spell that no record can hold.
    (("task", "priority"), 2**40, "task.priority must be an integer from -2147483648"),
    (("task", "deadline"), 1e300, f"task.deadline must be a number of seconds from 0 to "
                                  f"{MAX_SECONDS:.0f}"),
    (("task", "created_at"), -1, "task.created_at must be a number of seconds"),
    (("task", "created_at"), 10**400, "task.created_at must be a number of seconds from 0 "
                                      "to 253402300799 (the year 9999), not 1000000000"),
    # Past Python's digit limit repr itself refuses: named by its size.
    pytest.param(("task", "created_at"), 10**5000,
                 "task.created_at must be a number of seconds from 0 to 253402300799 (the "
                 "year 9999), not an integer of 16610 bits", id="created_at-past-digit-limit"),
    (("task", "counts"), {"SUCCEEDED": "2"}, "task.counts.SUCCEEDED must be an integer"),
    (("task", "labels"), {"team": 3}, "task.labels.team must be a string"),
    (("task", "labels"), [], "task.labels must be an object, not a list"),
    (("task", "input"), _nested(70), "task.input is nested deeper than 64 levels"),
    (("task", "input"), "\ud800", "not valid Unicode text"),
    (("task", "task_id"), "", "task.task_id must be printable text of 1 to 256"),
    (("task", "task_id"), "t\n1", "task.task_id must be printable text"),
    (("task", "dag_hash"), "0" * 64, "task.dag_hash is '000"),
    (("task", "input_ref"), {"uri": "/etc/passwd", "sha256": "0", "size": 1},
     "task.input_ref: a fixture holds values inline"),
    (("task", "surprise"), 1, "task: unknown field 'surprise'"),
    (("snapshots", 0, "fence"), 2**64, "fence must be an integer from 0 to 9223372036854775807"),
    (("snapshots", 0, "attempt"), -1, "attempt must be an integer from 0 to 2147483647"),
    (("snapshots", 0, "next_hops"), "x", "next_hops must be a list, not a string"),
    (("snapshots", 0, "next_hops"), [{"target_node_id": "a"}],
     "next_hops[0].is_taken is missing"),
    (("snapshots", 0, "activity"), {"seconds": 1.0}, "activity.cpu_seconds is missing"),
    (("snapshots", 0, "decision"), [], "decision must be an object, not a list"),
    (("snapshots", 1, "input"), "x", "input must be an object of the node's rendered "
                                     "parameters or null, not a string"),
    (("snapshots", 0, "output_ref"), {"uri": "x", "sha256": "0", "size": 1},
     "output_ref: a fixture holds values inline"),
    (("snapshots", 0, "task_id"), "t-other", "snapshots[0] (node parse_pdf).task_id is "
                                            "'t-other', not the task's id"),
    (("snapshots", 0, "node_id"), "no_such_node", "DAG financial_risk_assessment has no "
                                                  "node 'no_such_node'"),
    (("snapshots", 1, "node_id"), "parse_pdf", "node 'parse_pdf' has two snapshots"),
    (("snapshots", 1, "node_id"), "parse_pdf[0]",
     "parse_pdf is not a map node: it has no item 'parse_pdf[0]'"),
    (("snapshots", 1, "node_id"), "parse_pdf#2",
     "parse_pdf is in no loop: it has no kept visit 'parse_pdf#2'"),
    (("events", 0, "event_id"), "", "events[0].event_id: '' is empty"),
    (("events", 0, "task_id"), "t-other", "events[0].task_id is 't-other'"),
    (("events",), "x", "events must be a list, not a string"),
    (("snapshots",), {}, "snapshots must be a list, not an object"),
    (("snapshots",), [], "snapshots: no snapshot of node assess_risk, extract_metrics"),
    (("redacted",), [1], "redacted[0] must be a string, not an integer"),
    (("dag",), {"name": "x"}, "dag is not a DAG as ax stores it"),
    (("dag", "nodes"), [], "dag is not a DAG as ax stores it"),
])
def test_a_bad_field_is_named(path: tuple[Any, ...], value: Any, expected: str) -> None:
    def edit(data: Any) -> None:
        for part in path[:-1]:
            data = data[part]
        data[path[-1]] = value

    message = _refused(_edited(edit))
    assert message.startswith("f.json: "), message
    assert expected in message, message


@pytest.mark.parametrize("record,field", [("task", "status"), ("snapshots", "state")])
def test_a_state_is_required(record: str, field: str) -> None:
    def edit(data: Any) -> None:
        target = data[record] if record == "task" else data[record][0]
        del target[field]

    assert f"{field} is missing" in _refused(_edited(edit))


def test_duplicate_event_ids_are_refused() -> None:
    data = _edited(lambda d: d["events"].append(dict(d["events"][0])))
    assert "is not unique" in _refused(data)


def test_a_snapshot_missing_is_refused() -> None:
    data = _edited(lambda d: d["snapshots"].pop())
    assert "no snapshot of node" in _refused(data)


@pytest.mark.parametrize("content,expected", [
    (b"\xff\xfe", "is not UTF-8 text"),
    (b'{"version": 2, "x": 1e400}', "is not JSON (1e400 is out of range"),
    (b"[" * 100_000, "is not JSON"),
])
def test_an_unreadable_file_is_refused(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as caught:
        load_fixture(path)
    assert expected in str(caught.value)


def test_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError) as caught:
        load_fixture(fifo)
    assert str(caught.value) == f"cannot read fixture: {fifo} is not a regular file"


@pytest.mark.parametrize("command", [["replay"], ["snapshot", "import", "--home", "h"],
                                     ["test"]])
def test_the_commands_print_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch,
                                     command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    data = _edited(lambda d: d["task"].__setitem__("priority", "high"))
    path = tmp_path / "f.fixture.json"
    path.write_text(json.dumps(data))
    code = ax_main([*command, str(path)])
    out, err = capsys.readouterr()
    assert code == 1
    message = f"{path}: task.priority must be an integer, not a string"
    if command == ["test"]:  # a verdict per fixture
        assert out.splitlines()[0] == f"FAIL {message}"
    else:
        assert err == f"ax: error: {message}\n"


def _dag_edited(edit: Any) -> dict[str, Any]:
    """The base fixture with its DAG edited and every hash of it recomputed, as someone
    who knows the format would: only the DAG's own check can refuse it."""
    def edit_all(data: Any) -> None:
        edit(data["dag"])
        data["dag_hash"] = data["task"]["dag_hash"] = Dag.from_canonical(data["dag"]).hash

    return _edited(edit_all)


@pytest.mark.parametrize("edit,expected", [
    (lambda dag: dag["nodes"]["parse_pdf"]["next"].append({"target": "nowhere"}),
     "f.json: dag: node 'parse_pdf': next[2].target names 'nowhere', which is not a "
     "node of this DAG"),
    (lambda dag: dag.__setitem__("name", 1), "f.json: dag: name must be a string, not "),
    (lambda dag: dag.__setitem__("name", None), "f.json: dag: `name` is empty"),
    (lambda dag: dag["nodes"].__setitem__("a-b", {"type": "tool_call", "tool": "echo",
                                                  "next": []}),
     "f.json: dag: node id 'a-b' is not an identifier"),
])
def test_an_edited_dag_with_its_hash_recomputed_is_validated(edit: Any,
                                                             expected: str) -> None:
    message = _refused(_dag_edited(edit))
    assert message.startswith(expected), message
    assert message.endswith("export the task again"), message


def test_a_dag_stored_before_a_newer_rule_still_loads() -> None:
    # A prompt reading `input` on a node with `input:` was valid before
    # `ambiguous-input`; the engine keeps running it with its old meaning.
    def edit(dag: Any) -> None:
        dag["nodes"]["extract_metrics"]["prompt"] = "Extract the metrics of {{ .input }}"

    data = _dag_edited(edit)
    problems = [p.code for p in _problems(data["dag"])]
    assert problems == ["ambiguous-input"]
    check_fixture(data, "f.json")


def _problems(dag: Any) -> list[Any]:
    try:
        load_dag_mapping(dag)
    except DagError as exc:
        return exc.problems
    return []


def test_the_task_names_its_dag() -> None:
    data = _edited(lambda d: d["task"].__setitem__("dag_name", "other"))
    assert _refused(data) == ("f.json: task.dag_name is 'other', not the fixture's DAG "
                              "('financial_risk_assessment')")


def test_a_dag_that_is_not_unicode_is_named() -> None:
    data = _edited(lambda d: d["dag"].__setitem__("description", "a\udcff"))
    assert _refused(data).startswith(
        "f.json: dag: DAG 'financial_risk_assessment' is not valid Unicode text")


@pytest.mark.parametrize("hops,expected", [
    ([{"target_node_id": "log_completion", "is_taken": True}],
     "f.json: snapshots[0] (node parse_pdf).next_hops: parse_pdf has no edge to "
     "'log_completion'"),
    ([{"target_node_id": "extract_metrics", "is_taken": True},
      {"target_node_id": "extract_metrics", "is_taken": False}],
     "f.json: snapshots[0] (node parse_pdf).next_hops: the edge parse_pdf -> "
     "extract_metrics is decided twice"),
])
def test_decided_edges_are_edges_of_the_dag(hops: list[Any], expected: str) -> None:
    assert BASE["snapshots"][0]["node_id"] == "parse_pdf"
    data = _edited(lambda d: d["snapshots"][0].__setitem__("next_hops", hops))
    assert _refused(data) == expected


def test_an_unknown_part_is_refused() -> None:
    data = _edited(lambda d: d.__setitem__("notes", "mine"))
    assert _refused(data) == ("f.json: unknown field 'notes' (a fixture holds version, dag, "
                              "dag_hash, task, snapshots, events, redacted); export the task "
                              "again")


def test_a_redacted_path_must_be_text() -> None:
    data = _edited(lambda d: d.__setitem__("redacted", ["input.\udcff"]))
    assert _refused(data) == "f.json: redacted[0] holds a lone surrogate (not valid " \
        "Unicode text)"


def test_a_replay_says_what_it_waits_for_by_the_clock() -> None:
    # A fixture recorded while a node's handler paused it for a day: `ax replay` runs in
    # real time, so it waits that day. It says so first.
    data = copy.deepcopy(BASE)
    dag = Dag.from_canonical(data["dag"])
    snaps = fixture_snapshots(data)
    now = 1_800_000_000.0
    snaps["send_medium_risk_email"] = dataclasses.replace(
        snaps["send_medium_risk_email"], state=NodeState.PAUSED, gate_until=now + 86_400)
    snaps["log_completion"] = dataclasses.replace(
        snaps["log_completion"], state=NodeState.WAITING, not_before=now + 90)
    snaps["parse_pdf"] = dataclasses.replace(  # (a wait of a second: not worth a line)
        snaps["parse_pdf"], state=NodeState.WAITING, not_before=now + 1)
    view = TaskView(task=fixture_task(data), dag=dag, snapshots=snaps, revision=1)
    lines = timed_waits(view, now)
    assert [line.split(" at ")[0] for line in lines] == [
        "node send_medium_risk_email is paused by its handler", "node log_completion retries"]
    assert lines[0].endswith("(in 1d 0h 00m): the replay waits for it (Ctrl-C stops)")
    assert lines[1].endswith("(in 0h 01m): the replay waits for it (Ctrl-C stops)")
    # A gate waits for a person, not the clock: the replay stops there (PAUSED).
    snaps["send_medium_risk_email"] = dataclasses.replace(
        snaps["send_medium_risk_email"], state=NodeState.RUNNING)
    snaps["send_high_risk_email"] = dataclasses.replace(
        snaps["send_high_risk_email"], state=NodeState.PAUSED, gate_until=now + 86_400)
    assert [line.split(" at ")[0] for line in timed_waits(view, now)] == [
        "node log_completion retries"]
