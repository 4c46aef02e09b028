"""Secondary task indexes: which keys a task has, what a change writes, which to read.

Listing must cost what a page costs, not what the store holds, so every task is also
entered under a few index prefixes (layouts in :mod:`axengine.keys`): by creation time,
by status, by DAG name, by each label ``k=v`` (all newest first), and — while it is
unfinished — under the principal that submitted it (the per-principal quota counts
those). The functions here are pure: the shell adds :func:`index_writes` to the
transaction that writes the task record, so an index entry exists exactly when the
committed record says it should.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection, Mapping

from axengine.errors import InputError
from axengine.keys import StoreKeys
from axengine.records import TaskRecord, TaskStatus
from axengine.store import Delete, Op, Put

__all__ = ["choose_index", "decode_cursor", "encode_cursor", "index_keys", "index_writes"]

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,400}")
#: What follows an index prefix: the inverted creation time, then the task id.
_SUFFIX = re.compile(r"[0-9]{17}/[^/\x00]{1,512}")


def index_keys(keys: StoreKeys, task: TaskRecord) -> frozenset[str]:
    """Every index key ``task`` has in its current state."""
    entry = keys.index_entry
    out = {
        entry(keys.by_created(), task.created_at, task.task_id),
        entry(keys.by_status(task.status.value), task.created_at, task.task_id),
        entry(keys.by_dag(task.dag_name), task.created_at, task.task_id),
    }
    out.update(entry(keys.by_label(k, v), task.created_at, task.task_id)
               for k, v in task.labels.items())
    # Tasks stored before ``submitted_by`` existed belong to no principal's quota.
    if task.submitted_by and not task.status.final:
        out.add(keys.active_by(task.submitted_by) + task.task_id)
    return frozenset(out)


def index_writes(keys: StoreKeys, old: TaskRecord | None, new: TaskRecord) -> list[Op]:
    """The puts and deletes that move ``old``'s index entries to ``new``'s (all of them
    when ``old`` is None: a submit). Sorted, so the same change gives the same ops."""
    if old is not None and _indexed(old) == _indexed(new):
        return []  # most commits: the status and what else is indexed did not change
    before = index_keys(keys, old) if old is not None else frozenset()
    after = index_keys(keys, new)
    value = new.task_id.encode()
    ops: list[Op] = [Delete(k) for k in sorted(before - after)]
    ops += [Put(k, value) for k in sorted(after - before)]
    return ops


def _indexed(task: TaskRecord) -> tuple[object, ...]:
    """What :func:`index_keys` reads of ``task``."""
    return (task.task_id, task.created_at, task.status, task.dag_name, task.labels,
            task.submitted_by)


def choose_index(keys: StoreKeys, *, statuses: Collection[TaskStatus] = (),
                 dag_name: str = "", labels: Mapping[str, str] | None = None) -> str:
    """The index prefix a query reads: the most selective of its equality filters.

    Without statistics the order is a fixed guess — a label ``k=v`` (the first in sorted
    order), then the DAG name, then a single status, then every task by creation time.
    Whatever the choice, the caller re-checks every filter on the task records.
    """
    if labels:
        key = sorted(labels)[0]
        return keys.by_label(key, labels[key])
    if dag_name:
        return keys.by_dag(dag_name)
    if len(statuses) == 1:
        return keys.by_status(next(iter(statuses)).value)
    return keys.by_created()


def encode_cursor(index: str, key: str) -> str:
    """An opaque page token: the last index key read, relative to its index."""
    suffix = key[len(index):] if key.startswith(index) else key
    return base64.urlsafe_b64encode(suffix.encode()).decode().rstrip("=")


def decode_cursor(index: str, token: str) -> str:
    """The index key a page token resumes after.

    Raises:
        InputError: The token was not made by :func:`encode_cursor`.
    """
    # b64decode silently drops characters outside the alphabet; a token is refused
    # unless it is exactly what encode_cursor makes: base64url of "<time>/<task id>".
    refused = InputError("page_token is not a token this server returned")
    if not _TOKEN.fullmatch(token):
        raise refused
    try:
        suffix = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise refused from None
    if not _SUFFIX.fullmatch(suffix):
        raise refused
    return index + suffix
