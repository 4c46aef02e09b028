"""One node attempt in a process of its own: ``python -m executors.run_node``.

The ``subprocess`` runner (:mod:`axengine.runners.subprocess`) starts this module for
every attempt, in a new process group, with a clean environment, resource limits and
(when the executor runs as root) another user. The node process never talks to the API
or the store: everything a handler asks of its :class:`~executors.contract.NodeContext`
is a request to the executor, which answers it under the attempt's fence.

The protocol is JSON, one object per line, over the process's original stdin (executor
→ node) and stdout (node → executor); stderr is free text the executor keeps the end of
for crash reports. Before the handler runs, fd 1 is pointed at stderr and fd 0 at
``/dev/null``, so a handler that prints cannot corrupt the channel.

====================================  ==================================================
executor → node                       meaning
====================================  ==================================================
``{"request", "settings", "handler"}``  the first line: what to run (see below)
``{"id", "value"}``                   the answer to call ``id``
``{"id", "error": {"type",            the call raised; ``type: FencedOut`` is raised
"message", "retryable"}}``            into the handler as :class:`FencedOut`
====================================  ==================================================

====================================  ==================================================
node → executor                       meaning
====================================  ==================================================
``{"id", "call": "heartbeat"}``       ``ctx.heartbeat()`` → bool
``{"id", "call": "progress",          ``ctx.progress(marker)`` → bool
"marker"}``
``{"id", "call": "effect_state" |     ``ctx.effect(key).state()`` / ``begin()`` /
"effect_begin" | "effect_result",     ``result()``
"key"}``
``{"id", "call": "effect_done",       ``ctx.effect(key).done(result)``
"key", "result"}``
``{"outcome", "out_of_memory"}``      the last line: the attempt's outcome
====================================  ==================================================

``ctx.cancelled`` is local: it turns true on SIGTERM (the executor stops the run: its
fence went stale, it was cancelled or handed back, or it timed out) or once a heartbeat
or progress call answered False. The executor follows SIGTERM with SIGKILL after its
grace period, so a handler that ignores cancellation is stopped all the same.

The handler is named by import path (``module:function``); the executor sends
``executors.handlers:handle`` unless its own configuration names another (tests do). A
DAG cannot name it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import site
import sys
import threading
from collections.abc import Callable, Mapping
from typing import IO, Any, NoReturn, cast

from executors.contract import (
    EffectState,
    Failure,
    Handler,
    NodeContext,
    NodeRequest,
    Outcome,
    Paused,
    Success,
    Unavailable,
)

__all__ = [
    "DEFAULT_HANDLER",
    "EXIT_OUT_OF_MEMORY",
    "EXIT_PROTOCOL",
    "ControlPlaneError",
    "FencedOut",
    "load_handler",
    "main",
    "outcome_from_json",
    "outcome_to_json",
    "request_from_json",
    "request_to_json",
]

#: The handler a node process runs unless the executor's configuration names another.
DEFAULT_HANDLER = "executors.handlers:handle"
#: Exit status when the executor's side of the protocol broke (no start line, closed
#: channel, unreadable message).
EXIT_PROTOCOL = 70
#: Exit status when the process ran out of memory outside the handler (its limit is
#: the executor's ``RLIMIT_AS``).
EXIT_OUT_OF_MEMORY = 71
#: Seconds a call waits for the executor's answer (as a handler thread does in-process).
CALL_TIMEOUT = 30.0
#: Seconds the process lingers after the executor closed the channel, for the handler
#: to notice ``ctx.cancelled``; then it exits.
ORPHAN_GRACE = 5.0


# ----------------------------------------------------------------------------- JSON forms


def request_to_json(request: NodeRequest) -> dict[str, Any]:
    """The JSON form of a :class:`NodeRequest` (every field, always)."""
    return {
        "task_id": request.task_id,
        "node_id": request.node_id,
        "node_type": request.node_type,
        "attempt": request.attempt,
        "fence": request.fence,
        "config": dict(request.config),
        "input": request.input,
        "labels": dict(request.labels),
        "input_revision": request.input_revision,
        "checkpoint": request.checkpoint,
        "resume": request.resume,
    }


def request_from_json(data: Mapping[str, Any]) -> NodeRequest:
    """The :class:`NodeRequest` of :func:`request_to_json`'s output."""
    return NodeRequest(
        task_id=str(data["task_id"]),
        node_id=str(data["node_id"]),
        node_type=str(data["node_type"]),
        attempt=int(data["attempt"]),
        fence=int(data["fence"]),
        config=dict(data.get("config") or {}),
        input=data.get("input"),
        labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        input_revision=str(data.get("input_revision") or ""),
        checkpoint=data.get("checkpoint"),
        resume=data.get("resume"),
    )


def outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    """The JSON form of an outcome: ``{"kind": "success" | "failure" | "unavailable", …}``."""
    if isinstance(outcome, Success):
        return {"kind": "success", "output": outcome.output}
    if isinstance(outcome, Failure):
        return {"kind": "failure", "message": outcome.message, "retryable": outcome.retryable,
                "details": dict(outcome.details)}
    if isinstance(outcome, Paused):
        return {"kind": "paused", "reason": outcome.reason, "seconds": outcome.seconds,
                "checkpoint": outcome.checkpoint}
    return {"kind": "unavailable", "dependency": outcome.dependency,
            "evidence": outcome.evidence, "retry_after": outcome.retry_after}


def outcome_from_json(data: Mapping[str, Any]) -> Outcome:
    """The outcome of :func:`outcome_to_json`'s output.

    Raises:
        ValueError: ``data`` is no outcome.
    """
    kind = data.get("kind")
    if kind == "success":
        return Success(data.get("output"))
    if kind == "failure":
        details = data.get("details")
        return Failure(str(data.get("message", "")), retryable=data.get("retryable") is not False,
                       details=dict(details) if isinstance(details, Mapping) else {})
    if kind == "unavailable":
        wait = data.get("retry_after")
        return Unavailable(dependency=str(data.get("dependency", "")),
                           evidence=str(data.get("evidence", "")),
                           retry_after=float(wait) if isinstance(wait, int | float) else None)
    if kind == "paused":
        seconds = data.get("seconds")
        return Paused(reason=str(data.get("reason", "")),
                      seconds=float(seconds) if isinstance(seconds, int | float) else None,
                      checkpoint=data.get("checkpoint"))
    raise ValueError(f"not an outcome: kind {kind!r}")


def load_handler(path: str) -> Handler:
    """The callable named ``module:function``.

    Raises:
        ValueError: ``path`` is not ``module:function``, or names nothing callable.
        ImportError: The module cannot be imported.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"handler {path!r}: use module:function")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise ValueError(f"handler {path!r} names nothing callable")
    return cast(Handler, target)


# ----------------------------------------------------------------------------- the channel


class FencedOut(Exception):
    """Raised into the handler by an outbox call the executor answered ``stale``: another
    worker owns the node, so this run must not perform (or record) the effect."""

    retryable = False


class ControlPlaneError(Exception):
    """A call the executor could not answer (the control plane failed, or the channel
    closed). ``retryable`` is what the executor said of the error."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class _Slot:
    def __init__(self) -> None:
        self.ready = threading.Event()
        self.answer: Mapping[str, Any] = {}


class _Channel:
    """The node's end: calls from any handler thread, one reader thread for answers."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        self._reader = reader
        self._writer = writer
        self._write_lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}
        self._slots_lock = threading.Lock()
        self._next = 0
        self.closed = False
        self.on_close: Callable[[], None] = lambda: None

    def send(self, message: Mapping[str, Any]) -> None:
        self.send_line(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def send_line(self, line: bytes) -> None:
        with self._write_lock:
            self._writer.write(line)
            self._writer.flush()

    def call(self, name: str, **fields: Any) -> Any:
        slot = _Slot()
        with self._slots_lock:
            if self.closed:
                raise ControlPlaneError("the executor closed the channel")
            self._next += 1
            ident = self._next
            self._slots[ident] = slot
        try:
            try:
                self.send({"id": ident, "call": name, **fields})
            except OSError as exc:
                raise ControlPlaneError(f"the executor closed the channel ({exc})") from exc
            if not slot.ready.wait(CALL_TIMEOUT):
                raise ControlPlaneError(f"no answer from the executor to {name} in "
                                        f"{CALL_TIMEOUT:g}s")
        finally:
            with self._slots_lock:
                self._slots.pop(ident, None)
        error = slot.answer.get("error")
        if isinstance(error, Mapping):
            message = str(error.get("message", ""))
            if error.get("type") == "FencedOut":
                raise FencedOut(message)
            raise ControlPlaneError(f"{error.get('type', 'Error')}: {message}",
                                    retryable=error.get("retryable") is not False)
        return slot.answer.get("value")

    def read_answers(self) -> None:
        """Reader thread: hand each answer to its caller until the channel closes."""
        try:
            for line in self._reader:
                answer = json.loads(line)
                with self._slots_lock:
                    slot = self._slots.get(answer.get("id"))
                if slot is not None:
                    slot.answer = answer
                    slot.ready.set()
        except (OSError, ValueError):
            pass  # a broken channel is a closed one
        with self._slots_lock:
            self.closed = True
            waiting = list(self._slots.values())
        for slot in waiting:
            slot.answer = {"error": {"type": "ControlPlaneError",
                                     "message": "the executor closed the channel"}}
            slot.ready.set()
        self.on_close()


class _Effect:
    def __init__(self, channel: _Channel, key: str) -> None:
        self._channel = channel
        self._key = key

    @property
    def key(self) -> str:
        return self._key

    def state(self) -> EffectState:
        return cast(EffectState, self._channel.call("effect_state", key=self._key))

    def begin(self) -> EffectState:
        return cast(EffectState, self._channel.call("effect_begin", key=self._key))

    def done(self, result: Mapping[str, Any]) -> None:
        self._channel.call("effect_done", key=self._key, result=dict(result))

    def result(self) -> Mapping[str, Any] | None:
        value = self._channel.call("effect_result", key=self._key)
        return dict(value) if isinstance(value, Mapping) else None


class _Context:
    """The :class:`NodeContext` of the node process."""

    def __init__(self, channel: _Channel, settings: Mapping[str, Any]) -> None:
        self._channel = channel
        self._settings = settings
        # A plain flag, not a threading.Event: the SIGTERM handler sets it, and a signal
        # handler must not take a lock the interrupted code may hold.
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def settings(self) -> Mapping[str, Any]:
        return self._settings

    def heartbeat(self) -> bool:
        if self._cancelled:
            return False
        if not self._channel.call("heartbeat"):
            self._cancelled = True
        return not self._cancelled

    def progress(self, marker: str) -> bool:
        if self._cancelled:
            return False
        if not self._channel.call("progress", marker=str(marker)):
            self._cancelled = True
        return not self._cancelled

    def checkpoint(self, state: Any) -> bool:
        # Allowed while cancelled: a run past its timeout saves its state in its grace.
        return bool(self._channel.call("checkpoint", state=state))

    def effect(self, key: str) -> _Effect:
        return _Effect(self._channel, key)


# ----------------------------------------------------------------------------- the process


def _run(handler: Handler, request: NodeRequest, ctx: NodeContext) -> tuple[Outcome, bool]:
    """The handler's outcome, and whether the process ran out of memory."""
    try:
        outcome = handler(request, ctx)
    except MemoryError as exc:
        said = f": {exc}" if str(exc) else ""
        return Failure(f"node {request.node_id!r} raised MemoryError{said}", retryable=True,
                       details={"exception": "MemoryError"}), True
    except Exception as exc:  # handlers should not raise; never let one lose the outcome
        return Failure(f"node {request.node_id!r} raised {type(exc).__name__}: {exc}",
                       retryable=getattr(exc, "retryable", True) is not False,
                       details={"exception": type(exc).__name__}), False
    if not isinstance(outcome, Success | Failure | Unavailable | Paused):
        return Failure(f"node {request.node_id!r}: handler returned {type(outcome).__name__}, "
                       "not an Outcome (Success, Failure, Unavailable or Paused)",
                       retryable=False), False
    out_of_memory = (isinstance(outcome, Failure)
                     and outcome.details.get("exception") == "MemoryError")
    return outcome, out_of_memory


def _encoded(outcome: Outcome, out_of_memory: bool, node_id: str) -> bytes:
    message = {"outcome": outcome_to_json(outcome), "out_of_memory": out_of_memory}
    try:
        # NaN and infinity pass (the executor refuses them with the same message as for
        # an in-process handler); anything else that is not JSON is refused here.
        text = json.dumps(message, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        failure = Failure(f"output of node {node_id!r} is not JSON: {exc}", retryable=False)
        text = json.dumps({"outcome": outcome_to_json(failure), "out_of_memory": False})
    return text.encode() + b"\n"


def _exit(code: int) -> NoReturn:
    sys.stderr.flush()
    # Threads the handler left behind (an abandoned HTTP call) must not keep the process.
    os._exit(code)


def _probe(handler_path: str) -> int:
    load_handler(handler_path)
    print(json.dumps({"python": ".".join(map(str, sys.version_info[:3])),
                      "executable": sys.executable}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one attempt with the protocol of the module docstring; ``--probe`` only checks
    that the handler imports and prints the Python version.

    Args:
        argv: ``[--site DIR]... [--probe --handler module:function]``. Each ``--site``
            directory is added after the standard library, as a site directory (its
            ``.pth`` files are read), so an interpreter other than the executor's can
            import the executor's packages without shadowing its own standard library.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    probe = False
    probe_handler = DEFAULT_HANDLER
    while args:
        flag = args.pop(0)
        if flag == "--site" and args:
            site.addsitedir(args.pop(0))
        elif flag == "--probe":
            probe = True
        elif flag == "--handler" and args:
            probe_handler = args.pop(0)
        else:
            print(f"run_node: unknown argument {flag!r}", file=sys.stderr)
            return EXIT_PROTOCOL
    if probe:
        return _probe(probe_handler)

    # The channel keeps the original stdin/stdout; the handler gets /dev/null and stderr.
    # os.dup makes non-inheritable descriptors: processes the handler starts do not hold
    # the channel open.
    channel_in = os.fdopen(os.dup(0), "rb")
    channel_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")

    start_line = channel_in.readline()
    if not start_line:
        print("run_node: the executor sent nothing", file=sys.stderr)
        return EXIT_PROTOCOL
    start = json.loads(start_line)
    request = request_from_json(start["request"])
    channel = _Channel(channel_in, channel_out)
    ctx = _Context(channel, dict(start.get("settings") or {}))
    signal.signal(signal.SIGTERM, lambda signum, frame: ctx.cancel())

    def orphaned() -> None:
        # The executor is gone: nobody can commit this result. Let the handler notice,
        # then leave.
        ctx.cancel()
        timer = threading.Timer(ORPHAN_GRACE, _exit, args=(EXIT_PROTOCOL,))
        timer.daemon = True
        timer.start()

    channel.on_close = orphaned
    threading.Thread(target=channel.read_answers, name="ax-node-channel", daemon=True).start()

    handler_path = str(start.get("handler") or DEFAULT_HANDLER)
    try:
        handler = load_handler(handler_path)
    except (ImportError, ValueError) as exc:
        outcome: Outcome = Failure(f"the node process cannot load its handler {handler_path!r}: "
                                   f"{type(exc).__name__}: {exc}", retryable=False)
        out_of_memory = False
    else:
        outcome, out_of_memory = _run(handler, request, ctx)
    channel.send_line(_encoded(outcome, out_of_memory, request.node_id))
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except MemoryError:
        code = EXIT_OUT_OF_MEMORY
    except BrokenPipeError:
        code = EXIT_PROTOCOL
    _exit(code)
