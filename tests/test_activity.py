"""Resource activity samplers on real processes and threads, and the pure parts.

Real children are awaited by polling samples until a condition holds, under a deadline;
the only wall-clock interval is the one a busy child needs to show its CPU, and idle
runs are judged over that same interval (never "sleep, then assert nothing moved").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from axengine.activity import (
    Activity,
    ActivityMeter,
    ActivitySample,
    ActivityThresholds,
    delta,
    describe_bytes,
    group_members,
    parse_net_dev,
    parse_proc_io,
    parse_proc_stat,
    sample_process_group,
    sample_process_tree,
    sample_processes,
    sample_thread,
)

BUSY = [sys.executable, "-c", "while True: pass"]
DEADLINE = 5.0


def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after the deadline."""
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not within {DEADLINE} s: {what}")
        time.sleep(0.01)


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start children each in a session of its own (as the subprocess runner does);
    kill their groups afterwards."""
    children: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        child: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            argv, start_new_session=True, **kwargs)
        children.append(child)
        return child

    yield start
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def cpu(sample: ActivitySample) -> float:
    assert sample.cpu_seconds is not None, sample
    return sample.cpu_seconds


# ------------------------------------------------------------------------ process groups


def test_busy_child_shows_cpu_growth_and_an_idle_one_does_not(spawn):
    busy = spawn(BUSY)
    idle = spawn(["sleep", "30"])
    busy0, idle0 = sample_process_group(busy.pid), sample_process_group(idle.pid)
    until(lambda: cpu(sample_process_group(busy.pid)) - cpu(busy0) >= 0.2,
          "the busy child used 0.2 s of CPU")
    idle1 = sample_process_group(idle.pid)
    activity = delta(idle0, idle1)
    assert activity.cpu_seconds is not None
    assert activity.cpu_seconds <= 0.02  # two clock ticks of slack, while busy used 0.2 s
    assert delta(busy0, sample_process_group(busy.pid)).shows_work(
        ActivityThresholds(min_seconds=0.01)) is True


def test_child_writing_a_file_shows_io_growth(spawn, tmp_path):
    # The child writes only when told, so the first sample is taken before any write.
    script = (
        "import os, sys\n"
        "sys.stdin.readline()\n"
        f"with open({str(tmp_path / 'out.bin')!r}, 'wb') as f:\n"
        "    f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno())\n"
        "print('done', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = spawn([sys.executable, "-c", script], stdin=subprocess.PIPE,
                  stdout=subprocess.PIPE)
    before = sample_process_group(child.pid)
    start = before.io_bytes
    assert start is not None
    assert "io read_bytes+write_bytes" in before.source
    child.stdin.write(b"go\n")
    child.stdin.flush()
    assert child.stdout.readline() == b"done\n"
    until(lambda: (sample_process_group(child.pid).io_bytes or 0) - start >= 1 << 20,
          "1 MiB written shows in the group's io")


def test_a_vanished_pid_gives_an_all_none_sample(spawn):
    gone = spawn(["true"])
    gone.wait()
    for sample in (sample_process_group(gone.pid), sample_process_tree(gone.pid),
                   sample_processes([gone.pid], label="pid")):
        assert (sample.cpu_seconds, sample.io_bytes, sample.net_bytes) == (None, None, None)
        assert "no process" in sample.source


def test_a_group_of_two_busy_members_sums_both(spawn):
    loop = f"{sys.executable} -c 'while True: pass'"
    leader = spawn(["sh", "-c", f"{loop} & {loop} & wait"])
    until(lambda: len(group_members(leader.pid)) == 3, "sh and its two children")
    members = [p for p in group_members(leader.pid) if p != leader.pid]
    until(lambda: all(cpu(sample_processes([p], label="one")) >= 0.1 for p in members),
          "each busy member used 0.1 s of CPU")
    # Counters only grow: the group's sum lies between the members' sums read before
    # and after it, which it could not if it missed a member.
    before = sum(cpu(sample_processes([p], label="one")) for p in [leader.pid, *members])
    group = cpu(sample_process_group(leader.pid))
    after = sum(cpu(sample_processes([p], label="one")) for p in [leader.pid, *members])
    assert before - 1e-9 <= group <= after + 1e-9  # float sums in another order
    assert group >= 0.2
    tree = sample_process_tree(leader.pid)
    assert cpu(tree) >= group


def test_a_child_sharing_our_network_namespace_has_unknown_network(spawn):
    child = spawn(["sleep", "30"])
    sample = sample_process_group(child.pid)
    assert sample.net_bytes is None
    assert "net shared namespace" in sample.source


# ---------------------------------------------------------------- a /proc of our making


def _fake_proc(root: Path, *, io: str | None, ns: str = "net:[2]") -> Path:
    """A /proc with this process (namespace net:[1]) and pid 100 (pgrp 100)."""
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "net").symlink_to("net:[1]")
    pid = root / "100"
    (pid / "ns").mkdir(parents=True)
    (pid / "ns" / "net").symlink_to(ns)
    (pid / "stat").write_text("100 (node (x) y) S 1 100 100 0 -1 0 0 0 0 0 "
                              "150 50 10 0 20 0 1 0 0 0 0\n")
    if io is None:
        (pid / "io").mkdir()  # reading it fails like a permission error would
    else:
        (pid / "io").write_text(io)
    (pid / "net").mkdir()
    (pid / "net" / "dev").write_text(
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes ...\n"
        "    lo:  999999   10    0    0    0     0          0         0 999999 10 0 0 0 0 0 0\n"
        "  eth0:    1000    5    0    0    0     0          0         0    500  5 0 0 0 0 0 0\n"
    )
    return root


def test_own_network_namespace_counts_its_non_loopback_bytes(tmp_path):
    proc = _fake_proc(tmp_path, io="rchar: 7\nwchar: 3\nread_bytes: 4096\nwrite_bytes: 8192\n")
    sample = sample_process_group(100, proc=str(proc), now=5.0)
    ticks = os.sysconf("SC_CLK_TCK")
    assert sample == ActivitySample(at=5.0, cpu_seconds=210 / ticks, io_bytes=12288,
                                    net_bytes=1500,
                                    source="pgrp 100 (io read_bytes+write_bytes, "
                                           "net own namespace)")


def test_io_falls_back_to_rchar_wchar_and_says_so(tmp_path):
    proc = _fake_proc(tmp_path, io="rchar: 7\nwchar: 3\nsyscr: 1\n", ns="net:[1]")
    sample = sample_process_group(100, proc=str(proc))
    assert (sample.io_bytes, sample.net_bytes) == (10, None)
    assert sample.source == "pgrp 100 (io rchar+wchar, net shared namespace)"


def test_unreadable_io_is_unknown_not_zero(tmp_path):
    proc = _fake_proc(tmp_path, io=None)
    sample = sample_process_group(100, proc=str(proc))
    assert sample.io_bytes is None
    assert sample.cpu_seconds is not None
    assert "io unreadable" in sample.source


def test_parsers():
    assert parse_proc_stat("7 (a) b) (c) R 1 7 7 0 -1 0 0 0 0 0 3 4 5 6 20") == (1, 7, 18)
    assert parse_proc_io("read_bytes: 1\nwrite_bytes: 2\nrchar: 9\nwchar: 9\n") == (
        3, "read_bytes+write_bytes")
    assert parse_proc_io("garbage\n") == (None, "unreadable")
    assert parse_net_dev("h\nh\n  lo: 5 0 0 0 0 0 0 0 5\n") == 0


# ------------------------------------------------------------------------------ threads


def test_busy_thread_cpu_grows_and_a_blocked_one_does_not():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    busy = threading.Thread(target=spin, name="busy")
    idle = threading.Thread(target=stop.wait, name="idle")
    busy.start()
    idle.start()
    try:
        busy0, idle0 = sample_thread(busy), sample_thread(idle)
        until(lambda: cpu(sample_thread(busy)) - cpu(busy0) >= 0.1,
              "the busy thread used 0.1 s of CPU")
        idle_activity = delta(idle0, sample_thread(idle))
        assert idle_activity.cpu_seconds is not None
        assert idle_activity.cpu_seconds < 0.01
        assert (idle_activity.io_bytes, idle_activity.net_bytes) == (None, None)
    finally:
        stop.set()
        busy.join()
        idle.join()
    ended = sample_thread(busy)
    assert ended.cpu_seconds is None  # never another thread's clock


def test_meter_answers_activity_over_a_rolling_span():
    samples = iter([ActivitySample(t, t / 10, int(t) * 100, None, "s")
                    for t in (0.0, 10.0, 20.0, 30.0, 40.0)])
    meter = ActivityMeter(lambda: next(samples), span=20.0)
    assert meter.tick() is None  # t=0: nothing to compare with
    assert meter.tick() == Activity(10.0, 1.0, 1000, None, "s")  # shorter than the span
    assert meter.tick() == Activity(20.0, 2.0, 2000, None, "s")
    assert meter.tick() == Activity(20.0, 2.0, 2000, None, "s")  # t=10 → t=30
    assert meter.tick() == Activity(20.0, 2.0, 2000, None, "s")  # t=20 → t=40


# ---------------------------------------------------------------- deltas and judgement


def test_delta_keeps_unknown_unknown_and_refuses_counters_going_back():
    a = ActivitySample(10.0, 2.0, 100, None, "s")
    assert delta(a, ActivitySample(70.0, 1.0, 50, 9, "s")) == Activity(60.0, None, None,
                                                                       None, "s")
    # Another source: I/O and network were measured differently; CPU stays comparable.
    assert delta(a, ActivitySample(70.0, 3.0, 900, None, "t")) == Activity(60.0, 1.0, None,
                                                                           None, "t")


@pytest.mark.parametrize(("activity", "work"), [
    (Activity(60, 0.05, None, None), True),       # cpu at the threshold
    (Activity(60, 0.0499, None, None), False),    # just below
    (Activity(30, None, 32 * 1024, None), True),  # io: 64 KiB/min over 30 s
    (Activity(30, None, 32 * 1024 - 1, None), False),
    (Activity(120, 0.0, 0, 128 * 1024), True),    # net at 64 KiB/min over 2 min
    (Activity(60, 0.0, 0, 0), False),
    (Activity(60, None, None, None), None),       # nothing visible: unknown, not idle
    (Activity(9.9, 5.0, None, None), None),       # too short to judge
])
def test_shows_work_at_the_boundaries(activity, work):
    assert activity.shows_work() is work


def test_describe():
    assert Activity(60, 4.2, 3_250_000, None).describe() == (
        "cpu 4.20 s, io 3.1 MiB, net unknown over 60 s")
    assert describe_bytes(0) == "0 B"
    assert describe_bytes(640 * 1024) == "640.0 KiB"
    with pytest.raises(ValueError):
        ActivityThresholds(cpu_per_minute=0)
