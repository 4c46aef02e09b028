"""Snapshot fixtures: export a task to JSON, restore it into another store.

``ax snapshot export TASK > f.json`` records a task — its DAG, task record, every node
snapshot (outputs inlined from the blob store) and its timeline. Restoring writes the
same keys into another (typically fresh, embedded) store; nodes that were RUNNING are
turned back to WAITING with their fence bumped, exactly as if the process that ran them
had crashed, so resuming continues from the recorded point without re-running anything
committed. Secrets of the deployment never appear: the store holds none (credentials
live in handler settings, not in tasks).

What a task *carries* may still be private (an account number in the input, a parsed
document in an output). :func:`redact_fixture` replaces chosen fields with
:data:`REDACTED` at export (``ax snapshot export TASK --redact input.ssn``), scrubs
every copy of their text from the rest of the record, and lists the paths in the
fixture's ``redacted`` field so a replay can say why a decision that read one of them
no longer holds.

Every fixture carries its format ``version``. :func:`check_fixture` reads every version
in :data:`READABLE_VERSIONS` and refuses any other with a message that says what to do.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, is_dataclass, replace
from enum import Enum
from typing import Any

from axengine.dag import Dag, load_dag_mapping
from axengine.engine import Engine, Event, NodeState, Snapshot, TaskRecord, TaskStatus
from axengine.errors import DagError, InputError
from axengine.limits import (
    FileTooLarge,
    NotRegularFile,
    check_json_value,
    finite_float,
    finite_number,
    is_utf8,
    read_regular,
    sha256_json,
    short_repr,
)
from axengine.records import BlobRef, NextHop

__all__ = [
    "FIXTURE_VERSION",
    "READABLE_VERSIONS",
    "REDACTED",
    "build_fixture",
    "check_fixture",
    "committed_nodes",
    "export_task",
    "fixture_events",
    "fixture_snapshots",
    "fixture_task",
    "load_fixture",
    "redact_fixture",
    "restore_task",
]

#: Format version written into every fixture. 2 added ``redacted`` (the paths replaced
#: at export); a version-1 fixture is a version-2 fixture with nothing redacted.
FIXTURE_VERSION = 2
#: Format versions this ax restores.
READABLE_VERSIONS = (1, 2)
#: What a redacted value reads as in a fixture.
REDACTED = "[redacted]"
#: Shorter strings are replaced only where their path points, never scrubbed from the
#: rest of the record: "no" or "42" would otherwise be blanked everywhere.
MIN_SCRUBBED_CHARS = 4

#: Fields that name records rather than carry data: never scrubbed (a node id that
#: happens to equal a redacted text must still name its node).
_STRUCTURE = frozenset({"task_id", "node_id", "target_node_id", "event_id", "dag_hash",
                        "dag_name", "state", "status", "kind"})
#: Node states whose recorded outputs and decisions are final.
_DONE_STATES = ("SUCCEEDED", "FAILED", "SKIPPED", "DEAD", "CANCELLED")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, NodeState | TaskStatus):
        return value.value
    return value


def build_fixture(*, dag: Mapping[str, Any], dag_hash: str, task: TaskRecord,
                  snapshots: Iterable[Snapshot], events: Iterable[Event]) -> dict[str, Any]:
    """The fixture of a task from its records (inputs and outputs already inlined): what
    :func:`export_task` and ``ax snapshot export --server`` write."""
    return {
        "version": FIXTURE_VERSION,
        "dag": dict(dag),
        "dag_hash": dag_hash,
        "task": _plain(asdict(replace(task, input_ref=None))),
        "snapshots": [_plain(asdict(replace(s, input_ref=None, output_ref=None)))
                      for s in snapshots],
        "events": [_plain(asdict(e)) for e in events],
        "redacted": [],
    }


async def export_task(engine: Engine, task_id: str, *,
                      redact: Sequence[str] = ()) -> dict[str, Any]:
    """A JSON-able record of a task (outputs and inputs inlined), with the fields named
    by ``redact`` replaced (see :func:`redact_fixture`)."""
    view = await engine.get_task(task_id)
    snaps = []
    for snap in view.snapshots.values():
        if snap.input_ref is not None:
            snap = replace(snap, input=await engine.blob_json(snap.input_ref))
        snaps.append(snap)
    data = build_fixture(dag=view.dag.canonical(), dag_hash=view.dag.hash, task=view.task,
                         snapshots=snaps, events=await engine.events(task_id))
    return redact_fixture(data, redact) if redact else data


# ------------------------------------------------------------------ versions and loading


def check_fixture(data: Any, source: str = "fixture") -> None:
    """Refuse anything this ax cannot restore, saying what to do about it.

    Raises:
        InputError: Not a fixture, a format version this ax does not read, a record
            missing one of its parts or holding a field of the wrong type or range, a
            DAG that does not match its hash, or records that do not fit together
            (see :func:`_check_records`); the message names ``source`` and the field.
    """
    if not isinstance(data, Mapping) or "version" not in data:
        raise InputError(f"{source} is not an ax snapshot fixture (it has no format "
                         "version): record one with `ax snapshot export TASK -o FILE`")
    version = data["version"]
    newest = READABLE_VERSIONS[-1]
    readable = f"{READABLE_VERSIONS[0]} to {newest}"
    if isinstance(version, int) and not isinstance(version, bool) and version > newest:
        raise InputError(
            f"{source} is fixture format version {version}, newer than this ax reads "
            f"({readable}): upgrade axengine, or export the task again with this version "
            "(`ax snapshot export TASK -o FILE`)")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise InputError(
            f"{source} has fixture format version {version!r}, which no ax reads (this one "
            f"reads {readable}): export the task again (`ax snapshot export TASK -o FILE`)")
    missing = [k for k in ("dag", "dag_hash", "task", "snapshots") if k not in data]
    if missing:
        raise InputError(f"{source}: a version-{version} fixture needs "
                         f"{', '.join(missing)}; export the task again")
    _check_records(data, source)


def load_fixture(fixture: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A fixture from a file (or an already parsed mapping), checked by
    :func:`check_fixture`.

    Raises:
        InputError: Unreadable, not JSON, or not a fixture this ax reads.
    """
    if isinstance(fixture, Mapping):
        check_fixture(fixture)
        return dict(fixture)
    source = os.fspath(fixture)
    try:
        text = read_regular(source, MAX_FIXTURE_BYTES).decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read fixture {source}: {exc.strerror or exc}") from None
    except (NotRegularFile, FileTooLarge) as exc:
        raise InputError(f"cannot read fixture: {exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{source} is not UTF-8 text: a fixture is what "
                         "`ax snapshot export TASK -o FILE` writes") from None
    try:
        data = json.loads(text, parse_float=finite_float)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{source} is not JSON ({_short(exc)}): a fixture is what "
                         "`ax snapshot export TASK -o FILE` writes") from None
    check_fixture(data, source)
    return dict(data)


#: Largest fixture file read: outputs are inlined, so a fixture can be far larger than
#: any one value, but a file past this is not a recording.
MAX_FIXTURE_BYTES = 256 * 1024 * 1024
#: Latest time (and longest duration) a record may hold, in seconds: the end of the
#: year 9999, the last instant a timestamp can show. Far past it, a restored task
#: made a worker's timer overflow.
MAX_SECONDS = 253_402_300_799.0
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
#: Integer fields stored as 64-bit numbers; every other one is 32-bit.
_INT64_FIELDS = frozenset({"fence", "seq", "size", "io_bytes", "net_bytes", "counts"})
#: Integer fields that may be negative.
_SIGNED_FIELDS = frozenset({"priority"})
#: A node instance: a DAG node's id, then its map item (``[3]``) or kept visit (``#2``)
#: suffixes.
_INSTANCE = re.compile(r"(.+?)((?:\[\d+\]|#\d+)+)")
#: Fields a record has a default for that a fixture must hold all the same (every
#: fixture ax wrote does): a node without its state, a task without its status, would
#: be restored as new.
_REQUIRED = frozenset({"state", "status"})
#: Longest task id a fixture may name (ids ax makes are 18 characters).
MAX_TASK_ID = 256


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _kind(value: Any) -> str:
    """How a JSON value reads in a message: ``a string``, ``null``, ``a list``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return {str: "a string", int: "an integer", float: "a number", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _check_records(data: Mapping[str, Any], source: str) -> None:
    """Check the records of a fixture field by field against the record types (what
    restore builds from them), then that they fit together: one task, whose id the
    snapshots and events repeat; a snapshot for every node of the recorded DAG, and
    beyond those only for node instances (map items, kept visits); a DAG that matches
    its hash. Values are inlined in a fixture, so a blob reference is refused too
    (restoring one would point at another store).

    Raises:
        InputError: The first problem, named by its place in the fixture
            (``snapshots[3] (node parse_pdf).state``).
    """
    def where(path: str) -> str:
        return f"{source}: {path}"

    for name, expected in (("dag", dict), ("dag_hash", str), ("task", dict),
                           ("snapshots", list), ("events", list), ("redacted", list)):
        if name in data and not isinstance(data[name], expected):
            raise InputError(f"{where(name)} must be {_kind(expected())}, not "
                             f"{_kind(data[name])}; export the task again")
    unknown = sorted(str(k) for k in data if k not in _PARTS)
    if unknown:
        raise InputError(f"{source}: unknown field {unknown[0]!r} (a fixture holds "
                         f"{', '.join(_PARTS)}); export the task again")
    for i, path in enumerate(data.get("redacted", ())):
        if not isinstance(path, str):
            raise InputError(f"{where(f'redacted[{i}]')} must be a string, not {_kind(path)}")
        if not is_utf8(path):
            raise InputError(f"{where(f'redacted[{i}]')} holds a lone surrogate (not valid "
                             "Unicode text)")
    task = data["task"]
    _check_record(TaskRecord, task, where("task"))
    task_id = task["task_id"]
    if not task_id or len(task_id) > MAX_TASK_ID or not task_id.isprintable():
        raise InputError(f"{where('task.task_id')} must be printable text of 1 to "
                         f"{MAX_TASK_ID} characters, not {task_id!r}")
    try:
        dag = Dag.from_canonical(data["dag"])
        dag_hash = dag.hash
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError,
            OverflowError) as exc:
        raise InputError(f"{where('dag')} is not a DAG as ax stores it ({_short(exc)}); "
                         "export the task again") from None
    except InputError as exc:  # (text that is not Unicode: it has no hash)
        raise InputError(f"{where('dag')}: {exc}") from None
    if dag_hash != data["dag_hash"]:
        raise InputError(f"{source}: the fixture's DAG does not match its recorded hash "
                         "(was the fixture edited by hand? export the task again)")
    if task["dag_hash"] != dag_hash:
        raise InputError(f"{where('task.dag_hash')} is {task['dag_hash']!r}, not the "
                         f"fixture's DAG ({dag_hash})")
    _check_dag(data["dag"], where("dag"))
    if task["dag_name"] != dag.name:
        raise InputError(f"{where('task.dag_name')} is {task['dag_name']!r}, not the "
                         f"fixture's DAG ({dag.name!r})")
    seen: set[str] = set()
    for i, raw in enumerate(data["snapshots"]):
        node = raw.get("node_id") if isinstance(raw, dict) else None
        at = f"snapshots[{i}]" + (f" (node {node})" if isinstance(node, str) else "")
        _check_record(Snapshot, raw, where(at))
        node = raw["node_id"]
        if not isinstance(raw.get("input"), dict | None):
            # (what ax stores is the node's rendered parameters: {"input": ..., ...})
            raise InputError(f"{where(at + '.input')} must be an object of the node's "
                             f"rendered parameters or null, not {_kind(raw['input'])}")
        if raw["task_id"] != task_id:
            raise InputError(f"{where(at + '.task_id')} is {raw['task_id']!r}, not the "
                             f"task's id {task_id!r}")
        problem = _instance_problem(dag, node, raw["state"])
        if problem:
            raise InputError(f"{where(at + '.node_id')}: {problem}")
        if node in seen:
            raise InputError(f"{where(at + '.node_id')}: node {node!r} has two snapshots")
        seen.add(node)
        problem = _hops_problem(dag, node, raw.get("next_hops", ()))
        if problem:
            raise InputError(f"{where(at + '.next_hops')}: {problem}")
        for ref in ("input_ref", "output_ref"):
            if raw.get(ref) is not None:
                raise InputError(f"{where(f'{at}.{ref}')}: a fixture holds values inline, "
                                 "not blob references; export the task again")
    absent = [n for n in dag.nodes if n not in seen]
    if absent:
        raise InputError(f"{where('snapshots')}: no snapshot of node "
                         f"{', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''} "
                         f"(a task has one for every node of its DAG); export the task again")
    if task.get("input_ref") is not None:
        raise InputError(f"{where('task.input_ref')}: a fixture holds values inline, not "
                         "blob references; export the task again")
    event_ids: set[str] = set()
    for i, raw in enumerate(data.get("events", ())):
        at = f"events[{i}]"
        _check_record(Event, raw, where(at))
        if raw["task_id"] != task_id:
            raise InputError(f"{where(at + '.task_id')} is {raw['task_id']!r}, not the "
                             f"task's id {task_id!r}")
        if not raw["event_id"] or raw["event_id"] in event_ids:
            raise InputError(f"{where(at + '.event_id')}: {raw['event_id']!r} is "
                             f"{'empty' if not raw['event_id'] else 'not unique'}")
        event_ids.add(raw["event_id"])


#: What a fixture holds (what :func:`build_fixture` writes).
_PARTS = ("version", "dag", "dag_hash", "task", "snapshots", "events", "redacted")
#: Validation rules a DAG stored by an earlier ax may break: it was valid when stored,
#: and the engine keeps running it as it ran then (see ``_rules._legacy_prompt``).
_STORED_FORMS = frozenset({"ambiguous-input"})


def _check_dag(raw: Mapping[str, Any], at: str) -> None:
    """The fixture's DAG must be one ax would accept, as it was stored: its hash
    matching proves only that whoever edited it also recomputed the hash.

    Raises:
        InputError: The first problem ``ax validate`` finds in it, named by node and
            field (``ax.fixture.json: dag: node 'a': edge target 'b' ...``).
    """
    try:
        load_dag_mapping(raw, file=at)
    except DagError as exc:
        new = [p for p in exc.problems if p.code not in _STORED_FORMS]
        if new:
            more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
            raise InputError(f"{new[0].format()}{more}; export the task again") from None


def _hops_problem(dag: Dag, node_id: str, hops: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a snapshot's decided edges are not edges of its node (None: they are): each
    names one of the node's targets, once."""
    node = dag.node(node_id)
    targets = {edge.target for edge in node.next} | {node.on_failure} - {None}
    seen: set[str] = set()
    for hop in hops:
        target = hop["target_node_id"]
        if target not in targets:
            return f"{node_id} has no edge to {target!r}"
        if target in seen:
            return f"the edge {node_id} -> {target} is decided twice"
        seen.add(target)
    return None


def _instance_problem(dag: Dag, node_id: str, state: str) -> str | None:
    """Why ``node_id`` names no node instance of ``dag`` in ``state`` (None: it does).
    Beside the DAG's nodes, a task holds the items of its map nodes (``node[3]``) and
    the kept visits of the nodes in its loops (``node#2``), never PENDING."""
    if node_id in dag.nodes:
        return None
    found = _INSTANCE.fullmatch(node_id)
    base = found.group(1) if found else node_id
    if base not in dag.nodes:
        return f"DAG {dag.name} has no node {base!r}"
    suffix = found.group(2) if found else ""
    if "[" in suffix and dag.nodes[base].map is None:
        return f"{base} is not a map node: it has no item {node_id!r}"
    if "#" in suffix and not any(base in body for body in dag.loops.values()):
        return f"{base} is in no loop: it has no kept visit {node_id!r}"
    if state == NodeState.PENDING.value:
        return f"{node_id!r} is PENDING, which a map's item or a loop's kept visit never is"
    return None


def _check_record(cls: type, raw: Any, at: str) -> None:
    """``raw`` must be an object holding the fields of dataclass ``cls`` (those without
    a default, and a state or status, at least), each of its declared type."""
    if not isinstance(raw, dict):
        raise InputError(f"{at} must be an object, not {_kind(raw)}")
    hints, declared = _fields_of(cls)
    unknown = sorted(set(raw) - declared.keys())
    if unknown:
        raise InputError(f"{at}: unknown field {unknown[0]!r} (a {cls.__name__} has "
                         f"{', '.join(declared)})")
    for name, f in declared.items():
        if name not in raw:
            if (f.default is MISSING and f.default_factory is MISSING) or name in _REQUIRED:
                raise InputError(f"{at}.{name} is missing")
            continue
        _check_value(raw[name], hints[name], f"{at}.{name}", name)


@functools.cache
def _fields_of(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """The resolved type hints and the fields of dataclass ``cls``."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _check_value(value: Any, hint: Any, at: str, name: str) -> None:
    """One field's value against its declared type (see :func:`_check_record`)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        check_json_value(value, at)  # (lone surrogates included)
    elif origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return
        (inner,) = (a for a in args if a is not type(None))
        _check_value(value, inner, at, name)
    elif isinstance(hint, type) and issubclass(hint, Enum):
        allowed = [m.value for m in hint]
        if value not in allowed or not isinstance(value, str):
            raise InputError(f"{at} must be one of {', '.join(allowed)}, not {value!r}")
    elif hint is str:
        if not isinstance(value, str):
            raise InputError(f"{at} must be a string, not {_kind(value)}")
        if not is_utf8(value):
            raise InputError(f"{at} holds a lone surrogate (not valid Unicode text)")
    elif hint is bool:
        if not isinstance(value, bool):
            raise InputError(f"{at} must be true or false, not {_kind(value)}")
    elif hint is int:
        _check_int(value, at, name)
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"{at} must be a number, not {_kind(value)}")
        number = finite_number(value)  # (an integer past a float: None, not an error)
        if number is None or not 0 <= number <= MAX_SECONDS:
            raise InputError(f"{at} must be a number of seconds from 0 to {MAX_SECONDS:.0f} "
                             f"(the year 9999), not {short_repr(value)}")
    elif origin is tuple:
        if not isinstance(value, list):
            raise InputError(f"{at} must be a list, not {_kind(value)}")
        for i, item in enumerate(value):
            _check_value(item, args[0], f"{at}[{i}]", name)
    elif origin is Mapping:
        if not isinstance(value, dict):
            raise InputError(f"{at} must be an object, not {_kind(value)}")
        for key, item in value.items():
            _check_value(key, str, f"{at} key {key!r}", name)
            _check_value(item, args[1], f"{at}.{key}", name)
    elif is_dataclass(hint):
        _check_record(hint, value, at)  # type: ignore[arg-type]
    else:  # a record type this check does not know: a bug here, not in the fixture
        raise AssertionError(f"{at}: no check for {hint!r}")


def _check_int(value: Any, at: str, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{at} must be an integer, not {_kind(value)}")
    top = _INT64 if name in _INT64_FIELDS else _INT32
    low = -top - 1 if name in _SIGNED_FIELDS else 0
    if not low <= value <= top:
        raise InputError(f"{at} must be an integer from {low} to {top}, not "
                         f"{short_repr(value)}")


def fixture_snapshots(fixture: Mapping[str, Any]) -> dict[str, Snapshot]:
    """The recorded node snapshots of a fixture, by node id (in recorded order)."""
    return {raw["node_id"]: _snapshot(raw) for raw in fixture["snapshots"]}


def fixture_task(fixture: Mapping[str, Any]) -> TaskRecord:
    """The recorded task record of a fixture."""
    return _task(fixture["task"])


def fixture_events(fixture: Mapping[str, Any]) -> list[Event]:
    """The recorded timeline of a fixture."""
    return [Event(**raw) for raw in fixture.get("events", ())]


def _snapshot(data: Mapping[str, Any]) -> Snapshot:
    fields = dict(data)
    fields["state"] = NodeState(fields["state"])
    fields["next_hops"] = tuple(NextHop(**h) for h in fields.get("next_hops", ()))
    for ref in ("input_ref", "output_ref"):
        if fields.get(ref):
            fields[ref] = BlobRef(**fields[ref])
    return Snapshot(**fields)


def _task(data: Mapping[str, Any]) -> TaskRecord:
    fields = dict(data)
    fields["status"] = TaskStatus(fields["status"])
    if fields.get("input_ref"):
        fields["input_ref"] = BlobRef(**fields["input_ref"])
    return TaskRecord(**fields)


async def restore_task(engine: Engine, fixture: Mapping[str, Any]) -> str:
    """Write a fixture's task into ``engine``'s store (the task id must be free) and
    return the task id. RUNNING nodes come back WAITING with a bumped fence (see
    :meth:`Engine.restore_task <axengine.engine.Engine.restore_task>`).

    Raises:
        InputError: Not a fixture this ax reads, or its DAG does not match its hash.
        Conflict: The task already exists in this store.
    """
    check_fixture(fixture)
    dag = Dag.from_canonical(fixture["dag"])
    events = [Event(**{k: v for k, v in raw.items() if k != "seq"})
              for raw in fixture.get("events", ())]
    return await engine.restore_task(dag, _task(fixture["task"]),
                                     [_snapshot(raw) for raw in fixture["snapshots"]], events)


def committed_nodes(fixture: Mapping[str, Any]) -> list[str]:
    """Nodes whose outcome the fixture holds for good (a resume never runs them)."""
    return [s["node_id"] for s in fixture["snapshots"] if s["state"] in _DONE_STATES]


# ------------------------------------------------------------------ redaction


def redact_fixture(fixture: Mapping[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """A copy of ``fixture`` with the fields at ``paths`` replaced by :data:`REDACTED`.

    A path is dotted: ``input.ssn`` (a field of the task input; ``input`` alone is all
    of it), ``nodes.<id>.output.<field>`` (a node's output; ``nodes.<id>.output`` is all
    of it) or ``nodes.<id>.input.<field>`` (the node's rendered input). ``*`` stands for
    every node id, key or list item at its place, and a number indexes a list:
    ``nodes.*.output.items.*.iban``.

    Every text (of at least :data:`MIN_SCRUBBED_CHARS` characters) found at a path is
    also scrubbed wherever else the task's record repeats it — a rendered prompt, an
    email body, an event's detail — so a copy does not leak it; numbers and booleans
    are replaced at their path only. The hashes computed from a redacted input or
    output are recomputed from what remains (a hash of a short secret can be reversed
    by trying every value). The DAG is code, not data, and is never touched.

    Raises:
        InputError: A path that is malformed or matches nothing in this task (a typo
            would otherwise export the secret).
    """
    data = copy.deepcopy(dict(fixture))
    found: list[str] = []
    for path in paths:
        if _apply_path(data, path, found) == 0:
            raise InputError(
                f"--redact {path}: nothing in task {data['task'].get('task_id')} is at this "
                f"path ({_miss(data, path.split('.'))}); see docs/testing.md#redaction")
    secrets = sorted({s for s in found if len(s) >= MIN_SCRUBBED_CHARS}, key=len, reverse=True)
    if secrets:
        for part in ("task", "snapshots", "events"):
            data[part] = _scrub(data.get(part), secrets)
    _rehash(data, fixture)
    data["version"] = FIXTURE_VERSION
    data["redacted"] = sorted({*data.get("redacted", ()), *paths})
    return data


def _apply_path(data: dict[str, Any], path: str, found: list[str]) -> int:
    parts = path.split(".")
    if parts[0] == "input":
        return _replace(data["task"], ["input", *parts[1:]], found)
    if parts[0] == "nodes" and len(parts) >= 3 and parts[2] in ("input", "output"):
        hits = 0
        for snap in data["snapshots"]:
            if parts[1] not in ("*", snap["node_id"]):
                continue
            # The stored input of a node holds its rendered `input` beside its prompt or
            # description; `nodes.<id>.input` means the rendered input.
            where = ["output"] if parts[2] == "output" else ["input", "input"]
            hits += _replace(snap, [*where, *parts[3:]], found)
        return hits
    raise InputError(f"--redact {path}: a path starts with input. or nodes.<id>.output / "
                     "nodes.<id>.input (e.g. input.ssn, nodes.parse_pdf.output.text)")


def _miss(data: Mapping[str, Any], parts: Sequence[str]) -> str:
    """Where a path that matched nothing leaves the record, for the error message."""
    if parts[0] == "input":
        value, where, rest = data["task"].get("input"), "input", parts[1:]
    else:
        nodes = [s["node_id"] for s in data["snapshots"]]
        if parts[1] not in ("*", *nodes):
            close = difflib.get_close_matches(parts[1], nodes, n=1)
            return (f"no node {parts[1]!r}" + (f"; did you mean {close[0]!r}?" if close else
                                               f"; nodes: {', '.join(nodes)}"))
        snaps = [s for s in data["snapshots"] if parts[1] in ("*", s["node_id"])]
        value = snaps[0]["output"] if parts[2] == "output" else (
            (snaps[0].get("input") or {}).get("input"))
        where, rest = ".".join(parts[:3]), parts[3:]
    for part in rest:
        if isinstance(value, dict) and part in value:
            value, where = value[part], f"{where}.{part}"
        elif isinstance(value, dict):
            return f"{where} has no {part!r}; it has {', '.join(map(str, value)) or 'nothing'}"
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value, where = value[int(part)], f"{where}.{part}"
        else:
            what = {str: "a text", list: "a list", bool: "a boolean", int: "a number",
                    float: "a number"}.get(type(value), "empty")
            return f"{where} is {what}, with no {part!r} in it"
    return f"{where} is empty"


def _replace(container: Any, parts: Sequence[str], found: list[str]) -> int:
    """Replace what ``parts`` names under ``container``; the number of values replaced."""
    head, rest = parts[0], parts[1:]
    keys: list[Any]
    if isinstance(container, dict):
        keys = list(container) if head == "*" else [head] if head in container else []
    elif isinstance(container, list):
        if head == "*":
            keys = list(range(len(container)))
        elif head.isdigit() and int(head) < len(container):
            keys = [int(head)]
        else:
            keys = []
    else:
        return 0
    hits = 0
    for key in keys:
        if rest:
            hits += _replace(container[key], rest, found)
            continue
        hits += 1
        if container[key] is not None and container[key] != REDACTED:
            found.extend(_texts(container[key]))
            container[key] = REDACTED
    return hits


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: v if k in _STRUCTURE else _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    return value


def _rehash(data: dict[str, Any], original: Mapping[str, Any]) -> None:
    """Recompute the hashes of what redaction changed."""
    task = data["task"]
    if task.get("input") != original["task"].get("input"):
        # The payload hash (idempotency) covers the whole input; a restored task is never
        # submitted again under its key, so no hash beats a reversible one.
        task["payload_sha256"] = ""
    before = {s["node_id"]: s for s in original["snapshots"]}
    for snap in data["snapshots"]:
        was = before[snap["node_id"]]
        if snap.get("output_sha256") and snap.get("output") != was.get("output"):
            snap["output_sha256"] = sha256_json(snap.get("output"))
        if snap.get("input_revision") and snap.get("input") != was.get("input"):
            snap["input_revision"] = sha256_json([snap["task_id"], snap["node_id"],
                                                   snap.get("input")])
