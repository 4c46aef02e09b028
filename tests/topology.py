"""The scaled-out topology without Docker: etcd + Redis + ``ax api`` + N ``ax executor``.

Everything runs from binaries and ``python -m axengine.cli`` on private loopback ports,
with its data in one temporary directory, and is stopped by PID. The cluster tests drive
it (kill an executor, restart the API, flush Redis, restart etcd, pause a worker), and
``scripts/dev-topology`` runs it for a person::

    scripts/dev-topology --executors 2        # prints URLs, tokens and PIDs as JSON

This module also holds what the fault tests check after a run (:func:`audit`): every
task SUCCEEDED, every node committed exactly once with monotonic fences, one email per
task.
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import email.policy
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.servers import ETCD_MAX_TXN_OPS, Server, start_etcd, start_redis

__all__ = [
    "REPO",
    "TOKEN_ROLES",
    "Audit",
    "Proc",
    "Topology",
    "audit",
    "batch_progress",
    "main",
    "submit_batch",
    "wait_until",
]

#: Repository root: the working directory of every ax process (relative PDF paths in
#: the example inputs resolve against it).
REPO = Path(__file__).resolve().parent.parent
#: The principals of the topology's tokens file and their roles. ``submitter`` and
#: ``approver`` are the untrusted/limited callers of the security tests.
TOKEN_ROLES: Mapping[str, tuple[str, ...]] = {
    "admin": ("submit", "approve", "admin"),
    "executor": ("executor",),
    "submitter": ("submit",),
    "submitter2": ("submit",),
    "approver": ("approve",),
}
#: Seconds to wait for a process to announce itself.
START_TIMEOUT = 30.0


def wait_until(condition: Callable[[], Any], timeout: float, *, interval: float = 0.05,
               what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises:
        TimeoutError: It stayed falsy for ``timeout`` seconds.
    """
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            raise TimeoutError(f"{what} not reached within {timeout:g}s")
        time.sleep(interval)


@dataclass
class Proc:
    """One ax process (API or executor) started by the topology; stopped by PID."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: How many times this process was started.
    starts: int = 0
    _offset: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, extra_env: Mapping[str, str] | None = None) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        env = {**self.env, **(extra_env or {})}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                start_new_session=True)
        self.starts += 1

    def output(self) -> str:
        """What this process wrote since its last start."""
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as fh:
            fh.seek(self._offset)
            return fh.read().decode("utf-8", "replace")

    def all_output(self) -> str:
        """Everything every start of this process wrote."""
        return self.log.read_text("utf-8", "replace") if self.log.exists() else ""

    def wait_for_line(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match[str]:
        """Wait for a line of the current run's output matching ``pattern``."""
        regex = re.compile(pattern, re.MULTILINE)

        def found() -> re.Match[str] | None:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.returncode}:\n"
                                   f"{self.output()[-3000:]}")
            return regex.search(self.output())

        try:
            match: re.Match[str] = wait_until(found, timeout, what=f"{self.name}: {pattern}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; output so far:\n{self.output()[-3000:]}") from None
        return match

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def send(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Stop by PID (SIGCONT first, in case it is paused; SIGKILL after ``timeout``)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.stop(signal.SIGKILL)


class Topology:
    """etcd + Redis + one ``ax api`` + N ``ax executor`` processes on private ports.

    Args:
        executors: Executor processes to start.
        root: Directory for data, logs, tokens and the mailbox (default: a new temp dir,
            removed by :meth:`stop`).
        concurrency: ``--concurrency`` of each executor.
        lease: ``--lease`` of each executor (seconds).
        grace: ``--grace`` of each executor (seconds).
        executor_settings: ``--settings`` of each executor (handler settings), merged
            over ``input_root`` = the repository's ``dags/inputs``.
        reconcile_interval: ``--reconcile-interval`` of the API.
        api_env: Extra environment of the API process (e.g. ``AX_FAULT_POINT``).
        api_args: Extra command-line arguments of ``ax api`` (quotas, policies...).
    """

    def __init__(
        self,
        *,
        executors: int = 2,
        root: Path | None = None,
        concurrency: int = 4,
        lease: float = 5.0,
        grace: float = 5.0,
        executor_settings: Mapping[str, Any] | None = None,
        reconcile_interval: float = 0.5,
        api_env: Mapping[str, str] | None = None,
        api_args: Sequence[str] = (),
        grpc_host: str = "127.0.0.1",
    ) -> None:
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="ax-topology-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self.n_executors = executors
        self.concurrency = concurrency
        self.lease = lease
        self.grace = grace
        # The example inputs are the only local files the executors (api trust) may read.
        self.executor_settings = {"input_root": str(REPO / "dags" / "inputs"),
                                  **(executor_settings or {})}
        self.reconcile_interval = reconcile_interval
        self.api_env = dict(api_env or {})
        self.api_args = list(api_args)
        # Where the API's gRPC listener binds: loopback, unless pods of a real cluster
        # must reach it (tests/k8s/test_financial_through_jobs.py).
        self.grpc_host = grpc_host
        self.etcd: Server | None = None
        self.redis: Server | None = None
        self.api: Proc | None = None
        self.executors: list[Proc] = []
        self.http_port = 0
        self.grpc_port = 0
        self.tokens: dict[str, str] = {}
        self.mail_dir = self.root / "mail"
        self.blob_dir = self.root / "blobs"
        self.logs = self.root / "logs"

    # ------------------------------------------------------------------ addresses

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def store_url(self) -> str:
        assert self.etcd is not None
        # Declare what the test etcd takes, so the API accepts DAGs up to it.
        return f"{self.etcd.url}?max_txn_ops={ETCD_MAX_TXN_OPS}"

    @property
    def queue_url(self) -> str:
        assert self.redis is not None
        return f"{self.redis.url}/0"

    @property
    def admin_token(self) -> str:
        return self.tokens["admin"]

    @property
    def executor_token(self) -> str:
        return self.tokens["executor"]

    def token(self, name: str) -> str:
        """The token of one of :data:`TOKEN_ROLES`'s principals (``submitter``...)."""
        return self.tokens[name]

    def describe(self) -> dict[str, Any]:
        """URLs, tokens, PIDs and paths, as ``scripts/dev-topology`` prints them."""
        return {
            "api": {"http": self.api_url, "grpc": self.grpc_target,
                    "pid": self.api.pid if self.api else 0},
            "etcd": {"url": self.store_url, "pid": self.etcd.proc.pid if self.etcd and
                     self.etcd.proc else 0, "data_dir": str(self.etcd.data_dir) if self.etcd
                     else ""},
            "redis": {"url": self.queue_url, "pid": self.redis.proc.pid if self.redis and
                      self.redis.proc else 0},
            "executors": [{"pid": e.pid, "worker_id": self.worker_id(i), "log": str(e.log)}
                          for i, e in enumerate(self.executors)],
            "tokens": dict(self.tokens),
            "tokens_file": str(self.root / "tokens.yaml"),
            "mail_dir": str(self.mail_dir),
            "root": str(self.root),
        }

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Topology:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Topology:
        """Start etcd, Redis, the API and the executors; return when all are ready."""
        self.logs.mkdir(exist_ok=True)
        self.mail_dir.mkdir(exist_ok=True)
        self.blob_dir.mkdir(exist_ok=True)
        self._write_tokens()
        self.etcd = start_etcd()
        self.redis = start_redis()
        # The API binds ports of its own choosing (0) and says which: a port found free
        # beforehand may be taken by another test before the API binds it. A restart
        # binds the same ones again (the executors are pointed at them).
        self.http_port = self.grpc_port = 0
        self.api = Proc("ax-api", self._api_argv(), self._env(), self.logs / "api.log")
        self.start_api()
        output = self.api.output()
        self.http_port = int(re.findall(r"^ax: http listening on \S+:(\d+)$", output, re.M)[-1])
        self.grpc_port = int(re.findall(r"^ax: grpc listening on \S+:(\d+)$", output, re.M)[-1])
        self.api.argv = self._api_argv()
        for _ in range(self.n_executors):
            self.add_executor(start=False)
        for i in range(self.n_executors):
            self.start_executor(i, wait=False)
        for i in range(self.n_executors):
            self._wait_executor(i)
        return self

    def stop(self) -> None:
        """Stop every process by PID (executors first), remove the temp dir we made."""
        for proc in self.executors:
            proc.stop()
        if self.api is not None:
            self.api.stop()
        for server in (self.redis, self.etcd):
            if server is not None:
                server.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("AX_") and k not in ("PYTEST_CURRENT_TEST",)}
        env.update({
            "AX_HOME": str(self.root / "home"),
            "AX_MAIL_DIR": str(self.mail_dir),
            "AX_BLOBS": str(self.blob_dir),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH", "")])),
        })
        return env

    def _write_tokens(self) -> None:
        self.tokens = {name: f"ax-{name}-" + secrets.token_hex(16) for name in TOKEN_ROLES}
        entries = [
            {"name": f"topology-{name}", "roles": list(roles),
             "token_sha256": hashlib.sha256(self.tokens[name].encode()).hexdigest()}
            for name, roles in TOKEN_ROLES.items()
        ]
        tokens_file = self.root / "tokens.yaml"
        tokens_file.write_text(json.dumps({"tokens": entries}, indent=2))
        tokens_file.chmod(0o600)
        token_file = self.root / "executor.token"
        token_file.write_text(self.tokens["executor"] + "\n")
        token_file.chmod(0o600)

    def _api_argv(self) -> list[str]:
        return [sys.executable, "-m", "axengine.cli", "api",
                "--store", self.store_url, "--queue", self.queue_url,
                "--tokens", str(self.root / "tokens.yaml"),
                "--http", f"127.0.0.1:{self.http_port}",
                "--grpc", f"{self.grpc_host}:{self.grpc_port}",
                "--blobs", str(self.blob_dir),
                "--reconcile-interval", str(self.reconcile_interval), *self.api_args]

    # ------------------------------------------------------------------ the API

    def start_api(self, env: Mapping[str, str] | None = None) -> None:
        """Start the API (``env`` adds variables, e.g. ``AX_FAULT_POINT``) and wait for
        ``ax: ready``."""
        assert self.api is not None
        self.api.start({**self.api_env, **(env or {})})
        self.api.wait_for_line(r"^ax: ready")

    def kill_api(self) -> None:
        assert self.api is not None
        self.api.kill()

    def restart_api(self, env: Mapping[str, str] | None = None) -> None:
        """Stop the API (SIGTERM; it may be dead already) and start it again."""
        assert self.api is not None
        self.api.stop()
        self.start_api(env)

    # ------------------------------------------------------------------ executors

    def add_executor(self, *, start: bool = True, worker_id: str | None = None,
                     lease: float | None = None, concurrency: int | None = None,
                     grace: float | None = None,
                     settings: Mapping[str, Any] | None = None) -> int:
        """Define (and by default start) one more executor; return its index."""
        index = len(self.executors)
        argv = [sys.executable, "-m", "axengine.cli", "executor",
                "--api", self.grpc_target, "--queue", self.queue_url,
                "--token-file", str(self.root / "executor.token"),
                "--concurrency", str(concurrency or self.concurrency),
                "--lease", str(lease or self.lease),
                "--grace", str(self.grace if grace is None else grace),
                "--settings", json.dumps({**self.executor_settings, **(settings or {})})]
        if worker_id:
            argv += ["--id", worker_id]
        self.executors.append(Proc(f"ax-executor-{index}", argv, self._env(),
                                   self.logs / f"executor-{index}.log"))
        if start:
            self.start_executor(index)
        return index

    def start_executor(self, index: int, *, wait: bool = True,
                       env: Mapping[str, str] | None = None) -> None:
        self.executors[index].start(env)
        if wait:
            self._wait_executor(index)

    def _wait_executor(self, index: int) -> str:
        return self.executors[index].wait_for_line(r"^ax executor: worker (\S+)").group(1)

    def worker_id(self, index: int) -> str:
        """Worker id the executor announced on its current start ("" if none yet)."""
        match = re.search(r"^ax executor: worker (\S+)", self.executors[index].output(),
                          re.MULTILINE)
        return match.group(1) if match else ""

    def kill_executor(self, index: int) -> None:
        """SIGKILL an executor (no graceful shutdown)."""
        self.executors[index].kill()

    def restart_executor(self, index: int) -> None:
        proc = self.executors[index]
        if proc.alive():
            proc.stop()
        self.start_executor(index)

    def pause_executor(self, index: int) -> None:
        """SIGSTOP: the process is alive but does nothing (no heartbeats)."""
        self.executors[index].send(signal.SIGSTOP)

    def resume_executor(self, index: int) -> None:
        self.executors[index].send(signal.SIGCONT)

    # ------------------------------------------------------------------ backends

    def flush_redis(self) -> None:
        """``FLUSHALL``: the queue loses every item, lane and processing list."""
        import redis

        assert self.redis is not None
        client = redis.Redis(host="127.0.0.1", port=self.redis.port, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()

    def queued(self) -> set[tuple[str, str]]:
        """Every ``(task_id, node_id)`` in a lane, the delayed set or a processing list."""
        import asyncio

        from axengine.queue.redis import RedisQueue

        async def read() -> set[tuple[str, str]]:
            queue = RedisQueue.from_url(self.queue_url)
            try:
                return await queue.queued()
            finally:
                await queue.close()

        return asyncio.run(read())

    def restart_etcd(self, down_for: float = 0.0) -> None:
        """Stop etcd and start it again on the same data dir and ports."""
        assert self.etcd is not None
        self.etcd.stop()
        if down_for:
            time.sleep(down_for)  # the outage itself is the point, not a synchronisation
        self.etcd.start()

    def client(self, **options: Any) -> Any:
        """An SDK client with the admin token."""
        from axengine.client import Client

        return Client(self.api_url, self.admin_token, **options)

    def emails(self) -> list[Mapping[str, str]]:
        """Headers of every message in the local mailbox."""
        parser = email.parser.BytesHeaderParser(policy=email.policy.default)
        out: list[Mapping[str, str]] = []
        for path in sorted(self.mail_dir.glob("*.eml")):
            with open(path, "rb") as fh:
                out.append({k: str(v) for k, v in parser.parse(fh).items()})
        return out


# ---------------------------------------------------------------------- checks


@dataclass
class Audit:
    """What a batch of tasks left behind.

    Attributes:
        statuses: Task status → number of tasks.
        commits: ``(task, node)`` → number of ``committed`` events.
        succeeded_nodes: ``(task, node)`` of every SUCCEEDED node.
        fence_violations: Nodes whose fences went down in commit order, or whose commit
            did not carry the node's last claimed fence.
        emails: Task → messages in the mailbox.
        claims: Total ``claimed`` events (attempts).
        lease_expiries: Total ``lease_expired`` events.
        handed_back: Total ``unavailable`` events (nodes handed back or kept waiting).
    """

    statuses: Counter[str] = field(default_factory=Counter)
    commits: Counter[tuple[str, str]] = field(default_factory=Counter)
    succeeded_nodes: set[tuple[str, str]] = field(default_factory=set)
    fence_violations: list[str] = field(default_factory=list)
    emails: Counter[str] = field(default_factory=Counter)
    claims: int = 0
    lease_expiries: int = 0
    handed_back: int = 0

    @property
    def total_commits(self) -> int:
        return sum(self.commits.values())

    def problems(self, task_ids: Sequence[str], *, email_nodes: Iterable[str] = ()) -> list[str]:
        """Every broken invariant, as readable lines (empty: all good)."""
        out = []
        bad = {s: n for s, n in self.statuses.items() if s != "SUCCEEDED"}
        if bad:
            out.append(f"tasks not SUCCEEDED: {bad}")
        if sum(self.statuses.values()) != len(task_ids):
            out.append(f"{sum(self.statuses.values())} tasks audited, {len(task_ids)} expected")
        for key in sorted(self.succeeded_nodes):
            if self.commits[key] != 1:
                out.append(f"{key[0]}/{key[1]} committed {self.commits[key]} times")
        for key, n in sorted(self.commits.items()):
            if key not in self.succeeded_nodes:
                out.append(f"{key[0]}/{key[1]} has {n} commits but is not SUCCEEDED")
        out.extend(self.fence_violations)
        if set(email_nodes):
            for task_id in task_ids:
                if self.emails[task_id] != 1:
                    out.append(f"task {task_id} sent {self.emails[task_id]} emails")
        return out


def audit(client: Any, task_ids: Sequence[str], topology: Topology | None = None,
          *, threads: int = 8) -> Audit:
    """Read every task's nodes and events through the API (and the mailbox)."""
    from concurrent.futures import ThreadPoolExecutor

    def fetch(task_id: str) -> tuple[str, dict[str, Any], list[Any]]:
        return task_id, client.get(task_id), client.events(task_id)

    result = Audit()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        fetched = list(pool.map(fetch, task_ids))
    for task_id, task, events in fetched:
        result.statuses[task["status"]] += 1
        for node_id, node in task["nodes"].items():
            if node["state"] == "SUCCEEDED":
                result.succeeded_nodes.add((task_id, node_id))
        last_claim: dict[str, int] = {}
        last_fence: dict[str, int] = {}
        for event in events:
            if not event.node_id:
                continue
            if event.fence < last_fence.get(event.node_id, 0):
                result.fence_violations.append(
                    f"{task_id}/{event.node_id}: fence {event.fence} after "
                    f"{last_fence[event.node_id]} ({event.kind})")
            last_fence[event.node_id] = max(event.fence, last_fence.get(event.node_id, 0))
            if event.kind == "claimed":
                result.claims += 1
                last_claim[event.node_id] = event.fence
            elif event.kind == "committed":
                result.commits[(task_id, event.node_id)] += 1
                claimed = last_claim.get(event.node_id)
                if claimed is not None and claimed != event.fence:
                    result.fence_violations.append(
                        f"{task_id}/{event.node_id}: committed with fence {event.fence}, "
                        f"last claim had {claimed}")
            elif event.kind == "lease_expired":
                result.lease_expiries += 1
            elif event.kind == "unavailable":
                result.handed_back += 1
    if topology is not None:
        wanted = set(task_ids)
        for headers in topology.emails():
            parts = headers.get("X-Ax-Idempotency-Key", "").split(":")
            if len(parts) >= 2 and parts[1] in wanted:
                result.emails[parts[1]] += 1
    return result


def submit_batch(client: Any, dag: Any, n: int, *, tag: str, first: int = 0,
                 input_of: Callable[[int], Any] | None = None) -> list[str]:
    """Submit ``n`` tasks labelled ``batch={tag}``, with distinct inputs (ACME's report
    by default) and idempotency keys ``{tag}-{i}`` for ``i`` from ``first`` (so a retried
    submission after an API crash names the same task)."""
    pdf = "dags/inputs/acme_annual_report.pdf"
    ids = []
    for i in range(first, first + n):
        task_input = input_of(i) if input_of else {"pdf_url": pdf, "batch": tag, "n": i}
        ids.append(client.submit(dag, task_input, idempotency_key=f"{tag}-{i}",
                                 labels={"batch": tag}).task_id)
    return ids


def batch_progress(client: Any, tag: str) -> tuple[int, int]:
    """``(final, submitted)`` tasks of batch ``tag`` (one list request)."""
    tasks = client.list_tasks(label=f"batch={tag}", limit=10_000)
    return sum(1 for t in tasks if t.status.final), len(tasks)


# ---------------------------------------------------------------------- script


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/dev-topology``: start the topology, print it as JSON, stop on signal."""
    parser = argparse.ArgumentParser(
        prog="dev-topology",
        description="Start etcd, Redis, ax api and N ax executors on private ports "
        "(no Docker); print URLs, tokens and PIDs as JSON; stop everything on "
        "SIGTERM/SIGINT.")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--dir", type=Path, default=None,
                        help="keep data, logs and tokens here (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    topology = Topology(executors=args.executors, root=args.dir,
                        concurrency=args.concurrency, lease=args.lease, grace=args.grace)
    stop = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        topology.start()
        print(json.dumps(topology.describe(), indent=2), flush=True)
        while not stop["signal"]:
            signal.pause()
    finally:
        topology.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
