"""Handlers for the runner tests, run *inside* node processes.

The subprocess runner imports them by path (``SubprocessSettings(handler=
"tests.runners.handlers:loop_forever")``): a test-only setting of the runner, never
something a DAG can name. They depend on the handler contract only, like real handlers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success

__all__ = ["loop_forever", "misbehave", "resumable", "snoop"]


def loop_forever(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Report its pid and a grandchild's pid (one that ignores SIGTERM), then loop,
    heartbeating, ignoring ``ctx.cancelled`` and every answer: only SIGKILL stops it."""
    helper = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 1000"])
    ctx.progress(f"pids {os.getpid()} {helper.pid}")
    while True:
        ctx.heartbeat()
        time.sleep(0.05)


def misbehave(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Do what ``input.do`` says: ``allocate`` ``input.mib`` MiB, ``signal`` itself with
    ``input.signal``, or ``exit`` with ``input.code`` without reporting anything."""
    what: dict[str, Any] = request.input
    if what["do"] == "allocate":
        block = bytearray(int(what["mib"]) << 20)
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        return Success({"allocated_mib": len(block) >> 20})
    if what["do"] == "signal":
        os.kill(os.getpid(), int(what["signal"]))
        time.sleep(10)
    if what["do"] == "exit":
        print("about to leave without a word", flush=True)  # goes to stderr, not the channel
        os._exit(int(what["code"]))
    return Failure(f"unknown action {what['do']!r}", retryable=False)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return "read: " + fh.read(4096).decode(errors="replace")
    except OSError as exc:
        return f"refused: {type(exc).__name__}"


def snoop(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Report what the node process can see of the executor: its own environment, the
    token file named in the input, the executor's ``/proc/<pid>/environ``."""
    return Success({
        "env": dict(os.environ),
        "uid": os.getuid(),
        "groups": sorted(os.getgroups()),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "token_file": _read(request.input["token_file"]),
        "executor_environ": _read(f"/proc/{os.getppid()}/environ"),
        "sigterm_handled": signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None),
    })


def resumable(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Counts pages until its timeout tells it to stop (SIGTERM: ``ctx.cancelled``), then
    saves how far it got in its grace; a run that gets a checkpoint finishes at once."""
    if request.checkpoint is not None:
        return Success({"resumed_from": request.checkpoint})
    pages = 0
    while not ctx.cancelled:
        pages += 1
        time.sleep(0.01)
    ctx.checkpoint({"pages": pages})
    return Failure("stopped at its timeout", retryable=True)
