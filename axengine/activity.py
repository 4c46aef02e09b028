"""Resource activity of a running node: the third signal of blocking detection.

Seed 001 tells *blocked* from *slow* with three signals: the heartbeat (the process is
alive), progress (the handler says its work advanced) and the resources the run uses.
This module is the third one: cumulative counters of CPU time, storage I/O and network
traffic of whatever runs the node, sampled by the runner, and the difference between
two samples (:class:`Activity`) judged against :class:`ActivityThresholds`.

What each runner can see:

- a **process group** (the ``subprocess`` runner starts each node in its own session):
  CPU from ``/proc/<pid>/stat``, I/O from ``/proc/<pid>/io``, summed over the group's
  members; network only when the members have a network namespace of their own (the
  per-namespace counters of ``/proc/<pid>/net/dev`` are then theirs alone);
- a **thread** (the ``thread`` runner): its CPU clock only; a thread shares the
  process's I/O and network counters with every other thread, so those are unknown.

*Unknown is not zero.* A counter a sampler cannot read (not visible to this runner, a
permission error, a process that vanished mid-read) is ``None``, and every difference
involving it is ``None``: "could not check" is evidence neither of idleness nor of work.

Samples are read on the sampler's monotonic clock; only differences between samples of
the same sampler mean anything, so they never leave the host that took them — what
travels is the :class:`Activity` over an interval.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "Activity",
    "ActivityMeter",
    "ActivitySample",
    "ActivityThresholds",
    "delta",
    "describe_bytes",
    "group_members",
    "parse_net_dev",
    "parse_proc_io",
    "parse_proc_stat",
    "sample_process_group",
    "sample_process_tree",
    "sample_processes",
    "sample_thread",
    "tree_members",
]

#: Where the process samplers read; tests never change it, but a sampler of another
#: mount (a container's /proc seen from the host) would.
PROC = "/proc"
#: ``/proc/<pid>/io`` fields counting bytes that reached the storage layer (preferred:
#: pipes, sockets and page-cache hits do not inflate them).
STORAGE_IO = ("read_bytes", "write_bytes")
#: Fallback fields, every byte passed to read()/write()-like calls (pipes and sockets too).
CHAR_IO = ("rchar", "wchar")


@dataclass(frozen=True)
class ActivitySample:
    """Cumulative resource counters of one run at one instant.

    Attributes:
        at: The sampler's monotonic clock, seconds (only differences mean anything).
        cpu_seconds: User + system CPU time used so far, or None when not visible.
        io_bytes: Bytes read + written so far, or None when not visible.
        net_bytes: Bytes received + sent so far, or None when not visible.
        source: What was read, for the evidence and for :func:`delta` (I/O and network
            of samples from different sources are not comparable), e.g.
            ``"pgrp 812 (io read_bytes+write_bytes, net shared namespace)"``.
    """

    at: float
    cpu_seconds: float | None
    io_bytes: int | None
    net_bytes: int | None
    source: str


@dataclass(frozen=True)
class ActivityThresholds:
    """How much use over an interval counts as *work*, as rates per minute.

    Rates, so the judgement does not depend on the sampling interval; but an interval
    shorter than ``min_seconds`` is not judged at all, because ``/proc`` counts CPU in
    clock ticks (10 ms) and I/O in 4 KiB pages: over a few seconds one tick of
    housekeeping would read as a busy process.

    Attributes:
        cpu_per_minute: CPU seconds per minute. 0.05 s is five 10 ms ticks: well above
            a process blocked in a syscall (0) or one that only heartbeats once a
            second (a JSON line each, about 10 ms a minute), well below any computation.
        io_per_minute: Bytes per minute. 64 KiB is sixteen pages: a log line a second
            re-dirties about one page per writeback (8 KiB a minute); real reads and
            writes of data are far above.
        net_per_minute: Bytes per minute. 64 KiB: heartbeats over gRPC/TLS cost about
            0.5 KiB a round trip (30 KiB a minute at one a second), TCP keepalives far
            less; a streamed model answer or a download is far above.
        min_seconds: Shortest interval judged; shorter ones count as unknown.
    """

    cpu_per_minute: float = 0.05
    io_per_minute: int = 64 * 1024
    net_per_minute: int = 64 * 1024
    min_seconds: float = 10.0

    def __post_init__(self) -> None:
        if min(self.cpu_per_minute, self.io_per_minute, self.net_per_minute) <= 0:
            raise ValueError("activity thresholds must be positive")
        if self.min_seconds <= 0:
            raise ValueError("min_seconds must be positive")


#: The thresholds used unless a policy names others.
DEFAULT_THRESHOLDS = ActivityThresholds()


@dataclass(frozen=True)
class Activity:
    """Resources used between two samples; a field is None when either side did not
    know it (or its counter went back: a member left the group, a source changed).

    Attributes:
        seconds: Length of the interval.
        cpu_seconds: CPU seconds used in it.
        io_bytes: Storage (or, per ``source``, syscall) bytes read + written in it.
        net_bytes: Network bytes received + sent in it.
        source: The newer sample's source.
    """

    seconds: float
    cpu_seconds: float | None
    io_bytes: int | None
    net_bytes: int | None
    source: str = ""

    @property
    def known(self) -> bool:
        """At least one signal was visible."""
        return any(v is not None for v in (self.cpu_seconds, self.io_bytes, self.net_bytes))

    def shows_work(self, thresholds: ActivityThresholds = DEFAULT_THRESHOLDS) -> bool | None:
        """True when a visible signal reaches its threshold (``>=``); False when at least
        one signal is visible and none does; None when nothing can be judged (no signal
        visible, or the interval is shorter than ``thresholds.min_seconds``)."""
        if not self.known or self.seconds < thresholds.min_seconds:
            return None
        minutes = self.seconds / 60.0
        checks = (
            (self.cpu_seconds, thresholds.cpu_per_minute),
            (self.io_bytes, thresholds.io_per_minute),
            (self.net_bytes, thresholds.net_per_minute),
        )
        return any(used is not None and used >= rate * minutes for used, rate in checks)

    def describe(self) -> str:
        """One readable clause: ``cpu 0.00 s, io 0 B, net unknown over 60 s``."""
        cpu = "unknown" if self.cpu_seconds is None else f"{self.cpu_seconds:.2f} s"
        io = "unknown" if self.io_bytes is None else describe_bytes(self.io_bytes)
        net = "unknown" if self.net_bytes is None else describe_bytes(self.net_bytes)
        return f"cpu {cpu}, io {io}, net {net} over {self.seconds:.0f} s"


def describe_bytes(n: int) -> str:
    """``0 B``, ``640 KiB``, ``3.1 MiB``: binary units, as the thresholds are written."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def delta(older: ActivitySample, newer: ActivitySample) -> Activity:
    """The resources used from ``older`` to ``newer`` (samples of one sampler)."""
    same = older.source == newer.source

    def diff(a: float | None, b: float | None) -> float | None:
        if a is None or b is None or b < a:
            return None
        return b - a

    cpu = diff(older.cpu_seconds, newer.cpu_seconds)
    io = diff(older.io_bytes, newer.io_bytes) if same else None
    net = diff(older.net_bytes, newer.net_bytes) if same else None
    return Activity(
        seconds=max(0.0, newer.at - older.at),
        cpu_seconds=cpu,
        io_bytes=None if io is None else int(io),
        net_bytes=None if net is None else int(net),
        source=newer.source,
    )


class ActivityMeter:
    """Keeps recent samples of one sampler and answers the activity over a rolling span.

    The caller samples at its own pace (the worker's heartbeat, every lease/3 = 10 s by
    default); judging each short interval alone would be noisy (``/proc`` counts CPU in
    10 ms ticks), so :meth:`tick` answers the activity since the newest sample that is
    at least ``span`` seconds old — about one span once the run is that old, less
    before.

    Args:
        sampler: Takes one sample, e.g. ``lambda: sample_process_group(pgid)``.
        span: Seconds the answered activity should cover (60: the thresholds are per
            minute, and a minute smooths a run that works in bursts).
    """

    def __init__(self, sampler: Callable[[], ActivitySample], *, span: float = 60.0) -> None:
        self._sampler = sampler
        self._span = span
        self._samples: deque[ActivitySample] = deque()

    def tick(self) -> Activity | None:
        """Sample now; the activity over about the last ``span`` (None on the first)."""
        sample = self._sampler()
        self._samples.append(sample)
        while len(self._samples) > 2 and self._samples[1].at <= sample.at - self._span:
            self._samples.popleft()
        if len(self._samples) < 2:
            return None
        return delta(self._samples[0], sample)


# ------------------------------------------------------------------------------ threads


def sample_thread(thread: threading.Thread, *, now: float | None = None) -> ActivitySample:
    """CPU time of one live thread of this process (Linux ``pthread_getcpuclockid``).

    I/O and network are None: the kernel counts them per process, shared by every
    thread. A thread that is not alive (its id may already name another thread) gives
    an all-None sample rather than another thread's clock.
    """
    at = time.monotonic() if now is None else now
    source = f"thread {thread.name} (cpu clock; io, net not visible per thread)"
    ident = thread.ident
    getclock = getattr(time, "pthread_getcpuclockid", None)
    cpu: float | None = None
    if ident is not None and getclock is not None and thread.is_alive():
        try:
            cpu = time.clock_gettime(getclock(ident))
        except OSError:  # the thread ended between the check and the call
            cpu = None
    return ActivitySample(at=at, cpu_seconds=cpu, io_bytes=None, net_bytes=None,
                          source=source)


# ---------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class _Stat:
    pid: int
    ppid: int
    pgrp: int
    ticks: int  # utime + stime + cutime + cstime


def parse_proc_stat(text: str) -> tuple[int, int, int]:
    """``(ppid, pgrp, ticks)`` of a ``/proc/<pid>/stat`` line.

    ``ticks`` includes the CPU of children the process waited for (cutime, cstime), so
    a helper that ends does not make the group's total go back. The command name is
    parenthesised and may itself hold spaces and parentheses: fields are counted after
    the *last* ``)``.
    """
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5); field n is fields[n - 3].
    ppid, pgrp = int(fields[1]), int(fields[2])
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ppid, pgrp, ticks


def parse_proc_io(text: str) -> tuple[int | None, str]:
    """Bytes of a ``/proc/<pid>/io`` text and which fields they come from.

    ``read_bytes + write_bytes`` when present, else ``rchar + wchar``, else None.
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if value.strip().isdigit():
            values[name.strip()] = int(value)
    for kind in (STORAGE_IO, CHAR_IO):
        if all(k in values for k in kind):
            return sum(values[k] for k in kind), "+".join(kind)
    return None, "unreadable"


def parse_net_dev(text: str) -> int:
    """Received + sent bytes of every interface but loopback in a ``/proc/net/dev``
    text (loopback traffic of a namespace is its processes talking to themselves)."""
    total = 0
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or name.strip() == "lo" or len(fields) < 9:
            continue
        total += int(fields[0]) + int(fields[8])
    return total


def _read(path: str) -> str | None:
    """A /proc file, or None when the process vanished or may not be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:  # ENOENT/ESRCH while the process exits, EACCES for another user
        return None


def _scan(proc: str) -> list[_Stat]:
    stats: list[_Stat] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return stats
    for name in names:
        if not name.isdigit():
            continue
        text = _read(f"{proc}/{name}/stat")
        if text is None:
            continue
        try:
            ppid, pgrp, ticks = parse_proc_stat(text)
        except (ValueError, IndexError):
            continue
        stats.append(_Stat(int(name), ppid, pgrp, ticks))
    return stats


def group_members(pgid: int, *, proc: str = PROC) -> list[int]:
    """Pids whose process group is ``pgid``, sorted."""
    return sorted(s.pid for s in _scan(proc) if s.pgrp == pgid)


def tree_members(pid: int, *, proc: str = PROC) -> list[int]:
    """``pid`` and its descendants (by parent pid), sorted; empty when it is gone."""
    stats = _scan(proc)
    children: dict[int, list[int]] = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s.pid)
    if not any(s.pid == pid for s in stats):
        return []
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return sorted(found)


def sample_process_group(pgid: int, *, now: float | None = None,
                         proc: str = PROC) -> ActivitySample:
    """Counters summed over the members of process group ``pgid`` (the subprocess
    runner's node process and whatever it started). A group with no member left gives
    an all-None sample."""
    return sample_processes(group_members(pgid, proc=proc), label=f"pgrp {pgid}",
                            now=now, proc=proc)


def sample_process_tree(pid: int, *, now: float | None = None,
                        proc: str = PROC) -> ActivitySample:
    """Counters summed over ``pid`` and its descendants (for a process that does not
    lead a group of its own)."""
    return sample_processes(tree_members(pid, proc=proc), label=f"tree {pid}", now=now,
                            proc=proc)


def sample_processes(pids: Iterable[int], *, label: str, now: float | None = None,
                     proc: str = PROC) -> ActivitySample:
    """Counters summed over ``pids``.

    A member that vanishes while it is read is left out (its CPU usually moved to its
    parent's cutime); one whose I/O or namespace cannot be read makes that sum None,
    because a partial sum would under-report. Network is known only when no member
    shares this process's network namespace: the counters of a shared namespace belong
    to everyone in it.
    """
    at = time.monotonic() if now is None else now
    ticks = 0
    io: int | None = 0
    io_kinds: set[str] = set()
    namespaces: dict[str, int] = {}  # namespace -> a member in it
    net_known = True
    net_unknown_kind = "shared namespace"
    seen = 0
    own_ns = _readlink(f"{proc}/self/ns/net")
    for pid in sorted(set(pids)):
        stat = _read(f"{proc}/{pid}/stat")
        if stat is None:
            continue  # gone between the scan and now
        try:
            _, _, member_ticks = parse_proc_stat(stat)
        except (ValueError, IndexError):
            continue
        seen += 1
        ticks += member_ticks
        text = _read(f"{proc}/{pid}/io")
        member_io, kind = parse_proc_io(text) if text is not None else (None, "unreadable")
        io_kinds.add(kind)
        io = None if io is None or member_io is None else io + member_io
        ns = _readlink(f"{proc}/{pid}/ns/net")
        if ns is None or own_ns is None:
            net_known, net_unknown_kind = False, "unreadable"
        elif ns == own_ns:
            net_known = False
        else:
            namespaces.setdefault(ns, pid)
    if seen == 0:
        return ActivitySample(at=at, cpu_seconds=None, io_bytes=None, net_bytes=None,
                              source=f"{label} (no process)")
    if len(io_kinds) != 1:
        io, io_kind = None, "mixed"  # storage bytes and syscall bytes do not add up
    else:
        io_kind = io_kinds.pop()
    net: int | None = None
    net_kind = net_unknown_kind
    if net_known:
        net, net_kind = 0, "own namespace"
        for ns in sorted(namespaces):
            text = _read(f"{proc}/{namespaces[ns]}/net/dev")
            if text is None:
                net, net_kind = None, "unreadable"
                break
            net += parse_net_dev(text)
    return ActivitySample(
        at=at,
        cpu_seconds=ticks / _clock_ticks(),
        io_bytes=io,
        net_bytes=net,
        source=f"{label} (io {io_kind}, net {net_kind})",
    )


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")
