"""Helpers shared by the CLI commands: options, runtime, printing."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from axengine.config import AxConfig
from axengine.engine import Event, TaskView
from axengine.errors import AxError, InputError
from axengine.limits import (
    MAX_JSON_BYTES,
    FileTooLarge,
    NotRegularFile,
    parse_json_text,
    read_regular,
)

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PAUSED",
    "EXIT_USAGE",
    "add_home",
    "config_of",
    "fail",
    "flags_of",
    "format_event",
    "key_value_pairs",
    "node_table",
    "parse_json_arg",
    "positive_int",
    "read_text_file",
]

EXIT_OK = 0
#: The task ended FAILED, DEAD or CANCELLED.
EXIT_FAILED = 1
#: Bad arguments or input (also: a DAG that does not validate).
EXIT_USAGE = 2
#: The task waits at a human gate; the message names the gate and the command.
EXIT_PAUSED = 3


def add_home(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", default=None,
                        help="directory of the embedded store (default: $AX_HOME or .ax)")


#: Options that set a setting of the configuration layer, when a command has them.
_SETTING_FLAGS = ("home", "store", "queue", "blobs", "prefix", "server")


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as options of this command (``--home``, ``--store``, ...)."""
    return {name: value for name in _SETTING_FLAGS
            if (value := getattr(args, name, None)) is not None}


def config_of(args: argparse.Namespace) -> AxConfig:
    """The configuration of this run: the command's options over the settings layer
    (``AX_*`` environment > ax.toml > defaults)."""
    flags = flags_of(args)
    return AxConfig.from_env(
        home=flags.get("home"), store_url=flags.get("store"), queue_url=flags.get("queue"),
        blob_dir=flags.get("blobs"), prefix=flags.get("prefix"), server=flags.get("server"))


def fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"ax: error: {message}", file=sys.stderr)
    return code


def positive_int(value: str) -> int:
    """An argparse ``type`` for counts such as ``--limit N`` or ``--concurrency N``: a
    whole number ≥ 1 (``--concurrency 0`` submitted a task no slot would ever run)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def key_value_pairs(values: Sequence[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments (``--label``, ``--decide``) as a mapping.

    Raises:
        AxError: One has no ``=`` or no key.
    """
    out = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise AxError(f"{what} must look like KEY=VALUE, not {value!r}")
        out[key] = val
    return out


def read_text_file(path: str | Path, what: str, *, max_bytes: int = MAX_JSON_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``, named by option ``what``: read by
    :func:`axengine.limits.read_regular` (a FIFO or a device is refused, at most
    ``max_bytes`` + 1 bytes are read).

    Raises:
        InputError: The file cannot be opened, is not a regular file, is larger than
            ``max_bytes`` or is not UTF-8 text; the message names ``what`` and ``path``.
    """
    try:
        data = read_regular(path, max_bytes)
    except OSError as exc:
        raise InputError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except NotRegularFile:
        raise InputError(f"{what}: {path} is not a regular file") from None
    except FileTooLarge:
        raise InputError(f"{what}: {path} is larger than the limit of {max_bytes} bytes"
                         ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{what}: {path} is not UTF-8 text") from None


def is_directory(path: Path) -> bool:
    """``path.is_dir()``, but False for a path the system refuses outright (a name too
    long, say): reading it then says what is wrong, where ``is_dir`` would raise."""
    try:
        return path.is_dir()
    except OSError:
        return False


def parse_json_arg(value: str | None, what: str) -> Any:
    """A JSON document given inline or as a path to a file holding it.

    Parsed strictly (:func:`axengine.limits.parse_json_text`: no ``NaN`` or infinities,
    bounded depth and size); a file is read by :func:`read_text_file`.

    Raises:
        InputError: The file cannot be read or the text is not acceptable JSON; the
            message names ``what`` and the file (or "the argument").
    """
    if value is None:
        return None
    if value.lstrip().startswith(("{", "[", '"')) or not os.path.exists(value):
        return parse_json_text(value, f"{what}: the argument")
    return parse_json_text(read_text_file(value, what), f"{what}: {value}")


def _item_of(node_id: str) -> tuple[str, int] | None:
    """``(map node, index)`` of a map item's id."""
    base, bracket, rest = node_id.partition("[")
    return (base, int(rest[:-1])) if bracket and rest[:-1].isdigit() else None


def display_path(path: Sequence[str]) -> str:
    """A task's path for people: a map's items as one step, where the first one
    committed (``summarise[9 items]``), the rest in commit order."""
    counts = Counter(item[0] for n in path if (item := _item_of(n)) is not None)
    shown: list[str] = []
    maps: set[str] = set()
    for nid in path:
        item = _item_of(nid)
        if item is None or counts[item[0]] <= 3:
            shown.append(nid)
        elif item[0] not in maps:
            maps.add(item[0])
            shown.append(f"{item[0]}[{counts[item[0]]} items]")
    return " -> ".join(shown)


def duration_text(seconds: float) -> str:
    """A wait as a person reads it: ``1d 2h 05m``, ``0h 03m``, ``42s``."""
    if seconds < 60:
        return f"{max(int(seconds), 0)}s"
    minutes = int(seconds // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return (f"{days}d " if days else "") + f"{hours}h {mins:02d}m"


def format_event(event: Event, t0: float) -> str:
    detail = f"  {event.detail}" if event.detail else ""
    attempt = f" #{event.attempt}" if event.kind == "claimed" else ""
    who = event.node_id or "task"
    return f"  +{event.at - t0:7.2f}s  {who:<24} {event.kind}{attempt}{detail}"


#: A map's items shown one row each up to this many; the rest as one summary row.
ITEM_ROWS = 8


def node_table(view: TaskView, *, every_item: bool = False) -> str:
    """The task's nodes, one row each — a map's items after its node: all of them up to
    ``ITEM_ROWS + 2``, else the first :data:`ITEM_ROWS` and a row counting the others
    by state (``every_item``: all of them)."""
    rows = [("NODE", "TYPE", "STATE", "ATTEMPT", "FENCE", "NEXT / ERROR")]
    rest: dict[str, list[str]] = {}  # map node -> states of the items not shown

    def flush() -> None:
        for parent, states in rest.items():
            tally = ", ".join(f"{n} {s}" for s, n in sorted(Counter(states).items()))
            first = ITEM_ROWS
            rows.append((f"{parent}[{first}..{first + len(states) - 1}]",
                         view.dag.node(parent).type, "", "", "",
                         f"{len(states)} more items: {tally} "
                         f"(ax tasks show {view.task.task_id} --all)"))
        rest.clear()

    for nid, snap in view.snapshots.items():
        node = view.dag.node(nid)
        item = _item_of(nid)
        if item is None or item[0] not in rest:
            flush()
        if item is not None and not every_item and item[1] >= ITEM_ROWS:
            parent = view.snapshots.get(item[0])
            if parent is not None and parent.items_started > ITEM_ROWS + 2:
                rest.setdefault(item[0], []).append(snap.state.value)
                continue
        taken = ", ".join(h.target_node_id for h in snap.next_hops if h.is_taken)
        note = snap.error or snap.evidence or (f"-> {taken}" if taken else "")
        rows.append((nid, node.type, snap.state.value, str(snap.attempt), str(snap.fence),
                     note[:70]))
    flush()
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
        for r in rows)


def print_timeline(events: Sequence[Event]) -> None:
    if not events:
        return
    t0 = events[0].at
    for event in events:
        print(format_event(event, t0))
