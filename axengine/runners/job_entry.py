"""The entry point of a Kubernetes Job's container: run one claimed node and commit it.

::

    python -m axengine.runners.job_entry

An executor with the ``kubernetes`` runner claims a node and creates a Job for that
claim (:func:`axengine.runners.job.build_job`); the Job's container runs this module.
It holds nothing but the claim's identity — the node's input, config and labels stay in
the control plane — so it fetches the run with ``GetRun`` under the claim's fence and
then behaves like any worker: the handler (:func:`executors.handlers.handle`) runs in a
thread with a :class:`~axengine.worker.RunContext` over the gRPC client, the lease is
renewed by heartbeats on a timer, progress and the side-effect outbox carry the fence,
the attempt's timeout holds, and the outcome is committed with ``Complete`` under the
fence. It is literally the worker's code path: a :class:`~axengine.worker.Worker`
processes the one item, with "claim" answered by ``GetRun`` (:class:`JobEngineClient`).

Environment (set by ``build_job``; the token is never read from the environment):

=====================  ========================================================
``AX_TASK_ID``         task id
``AX_NODE_ID``         node id
``AX_FENCE``           the fence of the executor's claim (the only authority)
``AX_ATTEMPT``         the claim's attempt (reported; the fence decides)
``AX_SNAPSHOT_KEY``    the node's snapshot key (reported, for people reading logs)
``AX_API``             ``host:port`` of the API's gRPC listener
``AX_TOKEN_FILE``      file holding a token with the ``executor`` role (a Secret
                       volume); first non-empty line that is not a ``#`` comment
``AX_SETTINGS_FILE``   optional: JSON object of handler settings (see
                       ``docs/executors.md``), merged over those of the
                       environment (``AX_MAIL_DIR``, ``AX_SMTP_URL``); mount it
                       from a ConfigMap
``AX_LEASE_SECONDS``   optional: lease asked for on each heartbeat (default 30)
=====================  ========================================================

Output: one JSON line on stdout, the last line the process writes there, e.g.
``{"answer": "committed", "attempt": 1, "fence": 3, "node_id": "parse_pdf",
"outcome": "Success", "task_id": "t-…"}`` — the kubernetes runner reads it from the
pod log (:func:`result_of_log`). Logs go to stderr.

Exit codes: :data:`EXIT_COMMITTED` (0) when the engine answered ``committed`` or
``already-done``; :data:`EXIT_CRASH` (1) when the run could not be finished (the API
stayed unreachable, a bug); :data:`EXIT_USAGE` (2) for a missing or malformed variable
or an unreadable token file; :data:`EXIT_STALE` (3) when the fence is not current — at
start (``GetRun`` answered STALE: another attempt holds the node, it finished, or the
task was cancelled), during the run (a heartbeat answered stale; the handler was
stopped and nothing was committed) or at the commit. SIGTERM (the Job was deleted)
ends the process at once without committing anything: whoever deleted the Job owns
what happens next.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from axengine.config import AxConfig
from axengine.credentials import read_token_file
from axengine.engine import ClaimResult
from axengine.errors import AxError, NotFound
from axengine.queue import WorkItem
from axengine.queue.inprocess import InProcessQueue
from axengine.worker import THREAD, Worker
from axengine.worker.grpc_client import GrpcEngineClient
from executors.contract import Outcome
from executors.handlers import handle

__all__ = [
    "EXIT_COMMITTED",
    "EXIT_CRASH",
    "EXIT_STALE",
    "EXIT_USAGE",
    "JobEngineClient",
    "JobEnv",
    "main",
    "result_of_log",
    "run_job",
]

log = logging.getLogger("axengine.runners.job_entry")

#: The engine answered ``committed`` or ``already-done``.
EXIT_COMMITTED = 0
#: The run could not be finished: the API stayed unreachable, or a bug.
EXIT_CRASH = 1
#: A variable is missing or malformed, or the token file cannot be read.
EXIT_USAGE = 2
#: The fence is not current: nothing was (or will be) committed by this container.
EXIT_STALE = 3
#: Lease asked for on every heartbeat when ``AX_LEASE_SECONDS`` is not set (the API's
#: default lease; heartbeats go out every third of it).
DEFAULT_LEASE_SECONDS = 30.0


class _Usage(AxError):
    """The container was started without what it needs (exit :data:`EXIT_USAGE`)."""


@dataclass(frozen=True)
class JobEnv:
    """The container's ``AX_*`` environment, checked (see the module docstring)."""

    task_id: str
    node_id: str
    fence: int
    attempt: int
    api: str
    token_file: Path
    snapshot_key: str = ""
    settings_file: Path | None = None
    lease_seconds: float = DEFAULT_LEASE_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobEnv:
        """Read and check the variables.

        Raises:
            AxError: A required variable is missing or malformed (exit 2).
        """
        missing = [name for name in ("AX_TASK_ID", "AX_NODE_ID", "AX_FENCE", "AX_API",
                                     "AX_TOKEN_FILE") if not env.get(name)]
        if missing:
            raise _Usage(f"missing environment variable(s) {', '.join(missing)}; this "
                         "container is started by the kubernetes runner's Job")
        try:
            fence = int(env["AX_FENCE"])
            attempt = int(env.get("AX_ATTEMPT") or 0)
            lease = float(env.get("AX_LEASE_SECONDS") or DEFAULT_LEASE_SECONDS)
        except ValueError as exc:
            raise _Usage(f"AX_FENCE, AX_ATTEMPT and AX_LEASE_SECONDS must be numbers: "
                         f"{exc}") from None
        if fence <= 0 or lease <= 0:
            raise _Usage("AX_FENCE and AX_LEASE_SECONDS must be positive")
        settings = env.get("AX_SETTINGS_FILE")
        return cls(task_id=env["AX_TASK_ID"], node_id=env["AX_NODE_ID"], fence=fence,
                   attempt=attempt, api=env["AX_API"], token_file=Path(env["AX_TOKEN_FILE"]),
                   snapshot_key=env.get("AX_SNAPSHOT_KEY", ""),
                   settings_file=Path(settings) if settings else None, lease_seconds=lease)

    def token(self) -> str:
        """The first non-empty, non-comment line of the token file.

        Raises:
            AxError: The file cannot be read or holds no token (exit 2).
        """
        try:
            return read_token_file(self.token_file, "AX_TOKEN_FILE")
        except ValueError as exc:
            raise _Usage(str(exc)) from None

    def settings(self, env: Mapping[str, str]) -> dict[str, Any]:
        """Handler settings: the environment's, then the settings file's.

        Raises:
            AxError: The settings file cannot be read or is not a JSON object (exit 2).
        """
        settings = dict(AxConfig.from_env(env).handler_settings)
        if self.settings_file is None:
            return settings
        try:
            extra = json.loads(self.settings_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _Usage(f"AX_SETTINGS_FILE {self.settings_file}: {exc}") from None
        if not isinstance(extra, dict):
            raise _Usage(f"AX_SETTINGS_FILE {self.settings_file} must hold a JSON object")
        return {**settings, **extra}


class JobEngineClient(GrpcEngineClient):
    """The gRPC client as the Job's worker sees it: its "claim" of the node is the run
    the executor claimed, fetched with ``GetRun`` under ``fence``. Every other call is
    the plain client's, carrying that fence. The last outcome sent to ``Complete`` is
    kept (:attr:`outcome`) for the result line."""

    def __init__(self, target: str, *, fence: int, **options: Any) -> None:
        super().__init__(target, **options)
        self.fence = fence
        self.outcome: Outcome | None = None
        self._run: ClaimResult | None = None

    async def claim(self, task_id: str, node_id: str, *, worker: str,
                    lease_seconds: float | None = None) -> ClaimResult:
        if self._run is None:
            try:
                run = await self.get_run(task_id, node_id, fence=self.fence)
            except NotFound:
                run = None
            self._run = run or ClaimResult("not-claimable", reason="stale")
        return self._run

    async def complete(self, task_id: str, node_id: str, *, fence: int,
                       outcome: Outcome) -> str:
        self.outcome = outcome
        return await super().complete(task_id, node_id, fence=fence, outcome=outcome)


async def run_job(job: JobEnv, *, token: str, settings: Mapping[str, Any],
                  worker_id: str = "") -> dict[str, Any]:
    """Fetch, run and commit the node of ``job``; return the result line's fields.

    ``answer`` is the engine's (``committed``, ``already-done``, ``stale``), or
    ``stale`` when the fence was not current at start or went stale during the run.
    """
    result: dict[str, Any] = {"task_id": job.task_id, "node_id": job.node_id,
                              "fence": job.fence, "attempt": job.attempt}
    client = JobEngineClient(job.api, token=token, fence=job.fence)
    worker = Worker(engine=client, queue=InProcessQueue(), handler=handle,
                    worker_id=worker_id or f"job:{os.uname().nodename}", concurrency=1,
                    lease_seconds=job.lease_seconds, settings=settings)
    try:
        answer = await _process(worker, client, job)
    finally:
        for runner in worker.runners.values():
            await runner.close()
        await client.close()
    result["answer"] = "stale" if answer in ("not-claimable", "stale") else answer
    if client.outcome is not None:
        result["outcome"] = type(client.outcome).__name__
    return result


async def _process(worker: Worker, client: JobEngineClient, job: JobEnv) -> str:
    run = await client.claim(job.task_id, job.node_id, worker=worker.worker_id)
    if run.result != "claimed":
        return "stale"
    assert run.request is not None
    # The node came here because it named this Job's runner; inside the Job it runs in
    # this process's threads, whatever that name is.
    named = str(run.request.config.get("runner") or THREAD)
    worker.runners.setdefault(named, worker.runners[THREAD])
    return await worker.process(WorkItem(job.task_id, job.node_id))


def result_of_log(text: str) -> dict[str, Any] | None:
    """The result line in a container's log (its last JSON object with an ``answer``),
    or None when the container never wrote one (it crashed, or the log is gone)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("answer"), str):
            return value
    return None


def main(env: Mapping[str, str] | None = None) -> int:
    """Run the Job's node; print the result line; return the exit code."""
    env = os.environ if env is None else env
    try:
        job = JobEnv.from_env(env)
        token = job.token()
        settings = job.settings(env)
    except AxError as exc:
        print(f"ax job: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = asyncio.run(run_job(job, token=token, settings=settings,
                                     worker_id=f"job:{env.get('HOSTNAME', '')}"
                                     if env.get("HOSTNAME") else ""))
    except Exception as exc:  # the result line must say what happened, whatever it was
        log.exception("ax job %s/%s fence %d crashed", job.task_id, job.node_id, job.fence)
        result = {"task_id": job.task_id, "node_id": job.node_id, "fence": job.fence,
                  "attempt": job.attempt, "answer": "error",
                  "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result, sort_keys=True), flush=True)
        return EXIT_CRASH
    if result["answer"] == "stale":
        print(f"ax job: fence {job.fence} of {job.task_id}/{job.node_id} is not current "
              "(another attempt holds the node, it finished, or the task was cancelled); "
              "nothing was committed by this container", file=sys.stderr, flush=True)
    print(json.dumps(result, sort_keys=True), flush=True)
    return EXIT_COMMITTED if result["answer"] in ("committed", "already-done") else EXIT_STALE


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A handler thread that ignores a stale fence must not keep the container alive
    # (the interpreter would join it at exit); everything worth keeping is written.
    os._exit(code)
