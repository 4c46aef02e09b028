"""The ``subprocess`` runner: every node attempt in a fresh process of its own.

The worker claims and commits as for any runner; :class:`SubprocessRunner` starts
``python -m executors.run_node`` for the attempt and relays what its handler asks of the
context (heartbeats, progress, the outbox) to the attempt's
:class:`~axengine.worker.RunContext`, so the node process never talks to the API or the
store, and every call it makes carries the claim's fence. The protocol (JSON lines over
the process's stdin and stdout) is described in :mod:`executors.run_node`.

What the process gets:

- **a clean environment**: only the variables of ``env_allowlist`` (``PATH``, ``LANG``,
  ``LC_ALL``, ``TZ``, and the model provider's ``OPENAI_BASE_URL``/``OPENAI_API_KEY``,
  which LLM nodes call with), ``HOME`` set to a fresh directory removed after the run, and
  ``PYTHONPATH`` naming the directories of the packages it imports (``executors``, and
  the handler's own package when that is not installed). Never the executor's tokens,
  ``AX_*`` settings or credentials.
- **its own process group** (a new session), so the whole group can be signalled.
- **resource limits**, set in the child before ``exec``: ``RLIMIT_AS`` (the node's
  ``resources.limits.memory``, else ``memory_bytes``), ``RLIMIT_CPU`` (the node's
  ``resources.limits.cpu`` times its timeout, else ``cpu_seconds``, else one core for its
  timeout) and ``RLIMIT_NOFILE``.
- **another user** when the executor runs as root (``run_as_user``, default
  ``nobody``): the node cannot read the executor's token file or its
  ``/proc/<pid>/environ``. An executor that is not root runs nodes as its own user.

**The kill.** When ``ctx.wait_stopped()`` fires (fenced out, cancelled, handed back) or
the timeout passes, the runner sends SIGTERM to the process group, waits
``grace_seconds`` of ``ctx.clock``, then sends SIGKILL; the returned ``Failure`` says
what was sent and why, and the kill is logged. After every run, whatever is left of the
group is SIGKILLed. A process that crashes — out of memory, killed by a signal, a
non-zero exit — is a retryable ``Failure`` naming the cause and the end of its stderr.

**The interpreter.** Nodes run under this executor's Python when the node user can
execute it. A root executor whose Python sits where ``nobody`` cannot read (a pyenv
under ``/root``) falls back to a ``python3.X`` of the same version in ``/usr/local/bin``,
``/usr/bin`` or ``/bin``, with this environment's site-packages added after its own
standard library. The first run probes the candidates as the node user and keeps the
first that imports the handler.

**Resource activity.** :meth:`SubprocessRunner.activity` sums the ``/proc`` counters
(CPU, storage I/O; network only in a namespace of its own, which nodes do not get
today) of the node's process group — the node process leads it, so its pid is the
group id — for the worker to send with its heartbeats (docs/blocking.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from axengine.activity import ActivitySample, sample_process_group
from axengine.clock import Clock
from axengine.errors import AxError, InputError
from axengine.runners._confinement import (
    DEFAULT_ENV_ALLOWLIST,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_OPEN_FILES,
    NodeLimits,
    SubprocessSettings,
    apply_limits,
    format_size,
    node_limits,
    node_user,
    package_roots,
    site_dirs,
    unreachable,
)
from axengine.worker import Reported, RunContext
from axengine.worker._context import FencedOut
from axengine.worker._runner import checked_outcome, stopped, timed_out, wait_run
from executors.contract import Failure, NodeRequest, Outcome
from executors.run_node import (
    EXIT_OUT_OF_MEMORY,
    EXIT_PROTOCOL,
    outcome_from_json,
    request_to_json,
)

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_OPEN_FILES",
    "SUBPROCESS",
    "NodeLimits",
    "SubprocessRunner",
    "SubprocessSettings",
    "node_limits",
]

log = logging.getLogger("axengine.runners.subprocess")

#: Name of this runner (the ``runner:`` of a node, ``--runner subprocess``).
SUBPROCESS = "subprocess"
#: Longest protocol line (a message; the outcome carries the node's output).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Bytes of a node's stderr kept for its crash report.
STDERR_TAIL_BYTES = 16 * 1024
#: Lines of stderr quoted in a crash report.
STDERR_LINES = 12
#: Seconds a probe of an interpreter may take (it imports the handler).
PROBE_TIMEOUT = 60.0
#: Seconds (real time) to wait for a SIGKILLed group's pipes to close.
REAP_TIMEOUT = 5.0
#: Handler settings naming directories node processes write to; a root executor gives
#: them to the node user (see :meth:`SubprocessRunner.prepare_directories`).
WRITABLE_SETTINGS: tuple[str, ...] = ("mail_dir", "llm_cache_dir")
#: Where an interpreter of this Python version is looked for when the node user cannot
#: run the executor's own.
FALLBACK_PYTHON_DIRS: tuple[str, ...] = ("/usr/local/bin", "/usr/bin", "/bin")

@dataclass(frozen=True)
class _Report:
    """What the node process said on its channel."""

    outcome: Outcome | None = None
    out_of_memory: bool = False
    error: str | None = None


class _NodeProcess:
    """One node process: its group, its exit, the end of its stderr."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._stderr = bytearray()
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pidfd: int | None = None
        self._watch_exit()

    def _watch_exit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.exited.set_result(None)
            return
        except (AttributeError, OSError):
            # No pidfd here: the exit is seen when every pipe closed.
            waiter = asyncio.ensure_future(self.proc.wait())
            waiter.add_done_callback(lambda _: _resolve(self.exited))
            return
        loop.add_reader(self._pidfd, self._release_pidfd)

    def _release_pidfd(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        _resolve(self.exited)

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the node's process group; False when nothing is left of it."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            log.error("cannot signal the process group %d of a node process", self.pid)
            return False
        return True

    async def send(self, message: Mapping[str, Any]) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(message, separators=(",", ":"), default=str).encode()
                        + b"\n")
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the process is gone; its exit tells the rest

    async def collect_stderr(self) -> None:
        stderr = self.proc.stderr
        assert stderr is not None
        while chunk := await stderr.read(65536):
            self._stderr += chunk
            del self._stderr[:-STDERR_TAIL_BYTES]

    def stderr_tail(self) -> str:
        lines = self._stderr.decode(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in lines[-STDERR_LINES:] if line.strip())

    async def close(self) -> int | None:
        """Close the channel and wait (boundedly) for the pipes; the exit status."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), REAP_TIMEOUT)
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        return self.proc.returncode


def _report_of(relay: asyncio.Task[_Report]) -> _Report:
    """What the relay learnt; nothing while it runs."""
    if not relay.done() or relay.cancelled():
        return _Report()
    error = relay.exception()
    if error is not None:
        log.error("relaying a node process's calls failed", exc_info=error)
        return _Report(error=f"the executor's relay failed: {error!r}")
    return relay.result()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _all_within(clock: Clock, seconds: float, *futures: asyncio.Future[Any]) -> bool:
    """Wait until every future is done or ``seconds`` of ``clock`` pass; True when done."""
    timer = clock.timer(seconds)
    try:
        pending = {f for f in futures if not f.done()}
        while pending and not timer.done():
            _, pending = await asyncio.wait(pending | {timer},
                                            return_when=asyncio.FIRST_COMPLETED)
            pending.discard(timer)
    finally:
        timer.cancel()
    return all(f.done() for f in futures)


class SubprocessRunner:
    """Runs each node attempt in a new process (see the module docstring).

    Args:
        settings: Limits, user, interpreter and handler of the node processes.
        environ: Where the allow-listed variables are read from, once (default: this
            process's environment).

    Raises:
        InputError: The settings name a user that does not exist or that this process
            cannot switch to, or a handler whose package cannot be found.
    """

    name = SUBPROCESS
    detached = False

    def __init__(self, settings: SubprocessSettings | None = None, *,
                 environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings or SubprocessSettings()
        self.user = node_user(self.settings.run_as_user)
        source = os.environ if environ is None else environ
        self._env = {k: source[k] for k in self.settings.env_allowlist if k in source}
        self._env.setdefault("PATH", os.defpath)
        self._sites = site_dirs()
        handler_module = self.settings.handler.partition(":")[0]
        self._pythonpath = package_roots(["executors", handler_module], self._sites)
        self._python: str | None = None
        self._probing = asyncio.Lock()
        self._live: set[_NodeProcess] = set()
        self._by_run: dict[RunContext, _NodeProcess] = {}
        self._prepared: set[str] = set()

    def activity(self, ctx: RunContext) -> ActivitySample | None:
        """The counters of the run's process group, or None when it has no live node
        process (not started yet, or ended)."""
        node = self._by_run.get(ctx)
        return None if node is None else sample_process_group(node.pid)

    # ------------------------------------------------------------------ the run

    async def run(self, request: NodeRequest, ctx: RunContext, *,
                  timeout: float) -> Outcome | Reported:
        try:
            limits = node_limits(request, timeout, self.settings)
        except InputError as exc:
            return Failure(str(exc), retryable=False)
        python = await self.interpreter()
        if isinstance(python, Failure):
            return python
        self.prepare_directories(ctx.settings)
        home = tempfile.mkdtemp(prefix="ax-node-")
        try:
            try:
                proc = await self._spawn(self._argv(python), home, limits)
            except (OSError, subprocess.SubprocessError) as exc:
                return Failure(f"node {request.node_id!r}: could not start its process: "
                               f"{exc}", retryable=True)
            node = _NodeProcess(proc)
            self._live.add(node)
            self._by_run[ctx] = node
            try:
                return await self._supervise(node, request, ctx, timeout=timeout,
                                             limits=limits)
            except asyncio.CancelledError:
                node.signal(signal.SIGKILL)
                log.warning("node %s/%s fence=%d: the run was cancelled; killed the node "
                            "process group %d (SIGKILL)", request.task_id, request.node_id,
                            request.fence, node.pid)
                raise
            finally:
                # First: a pid that is reaped may be reused by another group.
                self._by_run.pop(ctx, None)
                # Whatever the node started and left behind goes with it.
                node.signal(signal.SIGKILL)
                self._live.discard(node)
                await node.close()
        finally:
            shutil.rmtree(home, ignore_errors=True)

    async def _supervise(self, node: _NodeProcess, request: NodeRequest, ctx: RunContext, *,
                         timeout: float, limits: NodeLimits) -> Outcome:
        start = {"request": request_to_json(request), "settings": dict(ctx.settings),
                 "handler": self.settings.handler}
        relay = asyncio.create_task(self._relay(node, ctx, start))
        errors = asyncio.create_task(node.collect_stderr())
        try:
            started = ctx.clock.monotonic()
            passed = await wait_run(ctx, (relay, node.exited), timeout, started)
            if relay.done() or node.exited.done():
                return await self._finished(node, relay, errors, request, ctx, limits)
            moved = passed - timeout if passed is not None else 0.0
            return await self._stop(node, relay, request, ctx,
                                    elapsed=ctx.clock.monotonic() - started, timeout=timeout,
                                    moved=moved)
        finally:
            relay.cancel()
            errors.cancel()

    async def _finished(self, node: _NodeProcess, relay: asyncio.Task[_Report],
                        errors: asyncio.Task[None], request: NodeRequest, ctx: RunContext,
                        limits: NodeLimits) -> Outcome:
        """The node exited or reported: collect the report, the exit and the stderr."""
        lingered = not await _all_within(ctx.clock, self.settings.grace_seconds,
                                         relay, node.exited)
        node.signal(signal.SIGKILL)
        await asyncio.wait({relay, errors}, timeout=REAP_TIMEOUT)
        report = _report_of(relay)
        if lingered:
            log.warning("node %s/%s fence=%d: its process did not exit within %gs of "
                        "reporting; killed its group (SIGKILL)", request.task_id,
                        request.node_id, request.fence, self.settings.grace_seconds)
        if report.error is not None:
            return Failure(f"node {request.node_id!r}: its process broke the protocol "
                           f"({report.error}); killed it", retryable=False)
        if report.outcome is not None:
            outcome = report.outcome
            if report.out_of_memory and isinstance(outcome, Failure):
                outcome = Failure(f"node process ran out of memory (limit "
                                  f"{format_size(limits.memory_bytes)}): {outcome.message}",
                                  retryable=True,
                                  details={**outcome.details, "out_of_memory": True})
            return checked_outcome(outcome, request.node_id)
        returncode = await node.close()
        reason = _crash_reason(returncode, node.stderr_tail(), limits)
        log.warning("node %s/%s fence=%d attempt=%d (pid %d): %s", request.task_id,
                    request.node_id, request.fence, request.attempt, node.pid, reason)
        return Failure(reason, retryable=True, details={"exit": returncode})

    async def _stop(self, node: _NodeProcess, relay: asyncio.Task[_Report],
                    request: NodeRequest, ctx: RunContext, *, elapsed: float,
                    timeout: float, moved: float = 0.0) -> Outcome:
        """Stopped from outside or timed out: SIGTERM, the grace, SIGKILL. A node past its
        timeout may save a checkpoint in the grace (its handler sees ``ctx.cancelled``)."""
        timing_out = not ctx.cancelled
        if timing_out:
            ctx.cancel()  # the node's late calls answer "stop" (a checkpoint still goes)
        grace = self.settings.grace_seconds
        node.signal(signal.SIGTERM)
        if await _all_within(ctx.clock, grace, node.exited):
            kill = (f"killed the node process group (SIGTERM; the node exited within the "
                    f"{grace:g}s grace, then SIGKILL to the rest of its group)")
        else:
            kill = f"killed the node process group (SIGTERM, then SIGKILL after {grace:g}s grace)"
        node.signal(signal.SIGKILL)
        await asyncio.wait({relay}, timeout=REAP_TIMEOUT)
        resumable = timing_out and ctx.checkpointed and not ctx.stale
        why = (timed_out(elapsed, timeout, resumable=resumable, grace=moved) if timing_out
               else stopped(ctx))
        message = f"{why.message}; {kill}"
        late = _report_of(relay).outcome
        if isinstance(late, Failure):
            message += f"; the node's own last words: {late.message[:500]}"
        log.warning("node %s/%s fence=%d attempt=%d (pid %d): %s", request.task_id,
                    request.node_id, request.fence, request.attempt, node.pid, message)
        return Failure(message, retryable=True,
                       details={"killed": True, "pid": node.pid, "resumable": resumable})

    async def _relay(self, node: _NodeProcess, ctx: RunContext,
                     start: Mapping[str, Any]) -> _Report:
        """Send the start line, then answer the node's calls until its outcome."""
        await node.send(start)
        stdout = node.proc.stdout
        assert stdout is not None
        while True:
            try:
                line = await stdout.readline()
            except ValueError:
                return _Report(error=f"a message longer than {format_size(MAX_MESSAGE_BYTES)}")
            if not line.endswith(b"\n"):
                return _Report()  # the channel closed (or was cut by an exit): no outcome
            try:
                message = json.loads(line)
            except ValueError:
                return _Report(error=f"a line that is not JSON: {line[:120]!r}")
            if not isinstance(message, dict):
                return _Report(error=f"a message that is not an object: {line[:120]!r}")
            if "outcome" in message:
                try:
                    outcome = outcome_from_json(message["outcome"])
                except (ValueError, TypeError, AttributeError) as exc:
                    return _Report(error=f"an unreadable outcome: {exc}")
                return _Report(outcome=outcome,
                               out_of_memory=message.get("out_of_memory") is True)
            if "call" not in message:
                return _Report(error=f"a message that is neither a call nor an outcome: "
                               f"{line[:120]!r}")
            await node.send(await _answer(message, ctx))

    # ------------------------------------------------------------------ processes

    def _argv(self, python: str) -> list[str]:
        argv = [python, "-P", "-m", "executors.run_node"]
        for directory in self._sites:
            argv += ["--site", directory]
        return argv

    async def _spawn(self, argv: list[str], home: str,
                     limits: NodeLimits) -> asyncio.subprocess.Process:
        if self.user.switch:
            os.chown(home, self.user.uid, self.user.gid)
        env = {**self._env, "HOME": home}
        if self._pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(self._pythonpath)
        options: dict[str, Any] = {}
        if self.user.switch:
            options.update(user=self.user.uid, group=self.user.gid, extra_groups=[])
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=os.getcwd(),
            start_new_session=True, close_fds=True, limit=MAX_MESSAGE_BYTES,
            preexec_fn=functools.partial(apply_limits, limits.rlimits()), **options)

    async def interpreter(self) -> str | Failure:
        """The Python node processes run under, probed once as the node user; a
        non-retryable Failure naming what was tried when none works."""
        if self._python is not None:
            return self._python
        async with self._probing:
            if self._python is not None:
                return self._python
            tried = []
            for python, exact in self._candidates():
                problem = await self._probe(python, exact)
                if problem is None:
                    self._python = python
                    if python != sys.executable:
                        log.info("node user %s cannot run %s; node processes use %s with "
                                 "this environment's site-packages", self.user.name,
                                 sys.executable, python)
                    return python
                tried.append(f"{python}: {problem}")
            message = (f"the subprocess runner cannot start a node process as user "
                       f"{self.user.name!r}: tried {'; '.join(tried)}. Install Python "
                       f"{sys.version_info[0]}.{sys.version_info[1]} where that user can "
                       "run it, or name another interpreter or user in the runner's "
                       "settings")
            log.error("%s", message)
            return Failure(message, retryable=False)

    def _candidates(self) -> list[tuple[str, bool]]:
        if self.settings.python is not None:
            return [(self.settings.python, False)]
        found = [(sys.executable, True)]
        seen = {os.path.realpath(sys.executable)}
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        for directory in FALLBACK_PYTHON_DIRS:
            path = os.path.join(directory, version)
            if os.path.exists(path) and os.path.realpath(path) not in seen:
                seen.add(os.path.realpath(path))
                found.append((path, True))
        return found

    async def _probe(self, python: str, exact: bool) -> str | None:
        """None when ``python`` imports the handler as the node user; else why not."""
        limits = NodeLimits(memory_bytes=self.settings.memory_bytes, cpu_seconds=None,
                            open_files=self.settings.open_files)
        argv = [*self._argv(python), "--probe", "--handler", self.settings.handler]
        home = tempfile.mkdtemp(prefix="ax-probe-")
        try:
            try:
                proc = await self._spawn(argv, home, limits)
            except (OSError, subprocess.SubprocessError) as exc:
                return str(exc)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                return f"no answer in {PROBE_TIMEOUT:g}s"
        finally:
            shutil.rmtree(home, ignore_errors=True)
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else f"exit code {proc.returncode}"
        try:
            version = str(json.loads(out.decode().strip().splitlines()[-1])["python"])
        except (ValueError, KeyError, IndexError):
            return "it did not say its version"
        wanted = f"{sys.version_info[0]}.{sys.version_info[1]}."
        if exact and not version.startswith(wanted):
            return f"Python {version}, not {wanted}x"
        return None

    def prepare_directories(self, settings: Mapping[str, Any]) -> None:
        """Give the node user the directories handlers write to (``mail_dir`` — the
        local mailbox when no ``smtp_url`` is set — and ``llm_cache_dir``), when it is
        not this process's user: each is created and, if this process owns it, handed to
        the node user (the directory itself, not its parents or files). Once per path."""
        if not self.user.switch:
            return
        from executors.tools.send_email import DEFAULT_MAIL_DIR

        paths = [settings.get("llm_cache_dir")]
        if not settings.get("smtp_url"):
            paths.append(settings.get("mail_dir", DEFAULT_MAIL_DIR))
        for raw in paths:
            if not raw:
                continue
            path = os.path.abspath(str(raw))
            if path in self._prepared:
                continue
            self._prepared.add(path)
            try:
                Path(path).mkdir(parents=True, exist_ok=True)
                info = os.lstat(path)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid == self.user.uid:
                    continue
                if info.st_uid != os.geteuid():
                    log.warning("%s belongs to uid %d; node processes (user %s) may not "
                                "write there", path, info.st_uid, self.user.name)
                    continue
                os.chown(path, self.user.uid, self.user.gid)
                log.info("gave %s to the node user %s: node processes write there", path,
                         self.user.name)
            except OSError as exc:
                log.warning("cannot prepare %s for node processes: %s", path, exc)
            blocked = unreachable(path, self.user)
            if blocked is not None:
                log.warning("node processes (user %s) cannot reach %s: %s; nodes writing "
                            "there will fail — choose a home (--home, handlers.mail_dir, "
                            "handlers.llm_cache_dir) that user can reach, or "
                            "subprocess.run_as_user", self.user.name, path, blocked)

    async def close(self) -> None:
        """Kill what still runs (the runner stays usable: a worker loop restarted after
        a queue error shares it)."""
        for node in sorted(self._live, key=lambda n: n.pid):
            if node.signal(signal.SIGKILL):
                log.warning("runner closed: killed the node process group %d (SIGKILL)",
                            node.pid)


async def _answer(message: Mapping[str, Any], ctx: RunContext) -> dict[str, Any]:
    """Answer one call of a node process by awaiting the attempt's context."""
    ident = message.get("id")
    call = message.get("call")
    key = message.get("key")
    try:
        if call == "heartbeat":
            value: Any = await ctx.beat()
        elif call == "progress":
            value = await ctx.report_progress(str(message.get("marker", "")))
        elif call == "checkpoint":
            value = await ctx.save_checkpoint(message.get("state"))
        elif not isinstance(key, str) or call not in _EFFECT_CALLS:
            return {"id": ident, "error": {"type": "InputError", "retryable": False,
                                           "message": f"unknown call {call!r}"}}
        elif call == "effect_state":
            value = await ctx.effect_state(key)
        elif call == "effect_begin":
            value = await ctx.effect_begin(key)
        elif call == "effect_done":
            result = message.get("result")
            if not isinstance(result, Mapping):
                raise InputError("effect_done needs a result object")
            await ctx.effect_done(key, result)
            value = None
        else:
            record = await ctx.effect_result(key)
            value = None if record is None else dict(record)
    except FencedOut as exc:
        return {"id": ident, "error": {"type": "FencedOut", "message": str(exc),
                                       "retryable": False}}
    except AxError as exc:
        return {"id": ident, "error": {"type": type(exc).__name__, "message": str(exc),
                                       "retryable": exc.retryable}}
    except Exception as exc:  # the control plane's failure is the node's, not the executor's
        log.exception("answering %s of a node process", call)
        return {"id": ident, "error": {"type": type(exc).__name__, "message": str(exc),
                                       "retryable": True}}
    return {"id": ident, "value": value}


_EFFECT_CALLS = frozenset({"effect_state", "effect_begin", "effect_done", "effect_result"})


def _crash_reason(returncode: int | None, stderr: str, limits: NodeLimits) -> str:
    """Why a node process ended without an outcome, in words."""
    if returncode == EXIT_OUT_OF_MEMORY or "MemoryError" in stderr:
        reason = f"node process ran out of memory (limit {format_size(limits.memory_bytes)})"
    elif returncode is None:
        reason = "node process ended without reporting an outcome"
    elif returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGXCPU":
            reason = (f"node process used up its CPU time limit ({limits.cpu_seconds}s): "
                      "killed by SIGXCPU")
        elif name == "SIGKILL":
            cpu = f", its CPU time limit ({limits.cpu_seconds}s)" if limits.cpu_seconds else ""
            reason = (f"node process was killed by SIGKILL (not by ax: the kernel's OOM "
                      f"killer{cpu} or another process)")
        else:
            reason = f"node process was killed by {name}"
    elif returncode == EXIT_PROTOCOL:
        reason = "node process lost its channel to the executor (exit 70)"
    else:
        reason = f"node process exited with code {returncode} without reporting an outcome"
    return f"{reason}; last stderr: {stderr}" if stderr else reason
