"""Orchestrates one benchmark run: servers, the plan of workloads, one fresh process per
workload, progress lines, and the results files.

Order of the sections: floor → ax embedded and the peers (LangGraph, DBOS), shape by
shape → the SDK as users call it → ax on etcd + Redis (engine in process) → reconciler
pass cost → scaling (ax and the peers size by size) → large values (``ax.open`` and
LangGraph) → validation → profile → ax through API + executors. The private etcd and
Redis of the first sections are stopped before the API's own topology starts, so no idle
server competes for the two cores.

The machine's speed drifts by a third within minutes, so a workload measured once lets
one slow burst decide a ratio. Every workload that a target compares runs
``Sizes.rounds`` times, in rounds that take turns (:meth:`Runner._in_rounds`): round 1
of ax, LangGraph and DBOS, then round 2 of each, and so on (the large values' section:
ax and LangGraph); the etcd + Redis and API sections measure their floor at the start of
every round. Each workload keeps every round's result and shows its median round;
``bench.report`` pairs round i of one side with round i of the other and judges the
median of those ratios. The floor section, the reconciler, validation and the profile
run once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import RESULTS_SCHEMA, report
from bench.child import MARKER
from bench.common import Progress, load, median_round

__all__ = ["FULL", "QUICK", "Runner", "Sizes", "Turn", "keep_median"]

#: Repository root (children run there so ``tests.servers`` and ``bench`` import).
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sizes:
    """How much of each workload to run. The full sizes fit in about ten minutes on two
    cores, three rounds included; the figures in the README come from them. The counts
    are per round."""

    #: Rounds of every workload a target compares (taken in turns, see
    #: :meth:`Runner._in_rounds`); a ratio is the median of the rounds' ratios.
    rounds: int = 3
    #: Seconds per primitive of the floor section.
    floor_seconds: float = 2.0
    #: Seconds per primitive of the etcd + Redis floor measured again at the start of
    #: every round of the etcd + Redis and API sections: shorter, as it runs once per
    #: round and is held against that round's workloads only.
    section_floor_seconds: float = 1.0
    #: ax embedded and LangGraph: financial tasks (sequential and concurrent).
    fin_tasks: int = 400
    fin_inflight: int = 50
    #: The main chain and fan-out: their size is part of the comparison, so it stays at
    #: 1,000 nodes however many rounds run.
    chain: int = 1000
    fanout: int = 1000
    #: DBOS's financial tasks (one at a time; in flight): fewer than the others', to stay
    #: in the time budget (each takes a few ms more per node, and more under load).
    dbos_fin_tasks: int = 200
    dbos_fin_conc: int = 200
    #: The SDK: one-shot ``ax.run`` calls (and LangGraph's one-shot counterpart), runs
    #: of the financial shape and of the chain (``chain`` nodes) on one ``ax.open``.
    sdk_oneshot_runs: int = 50
    sdk_reuse_runs: int = 150
    sdk_reuse_chain_runs: int = 2
    #: Reconciler pass cost: finished tasks in the store (ascending), unfinished ones,
    #: timed passes per size.
    reconciler_finished: tuple[int, ...] = (10, 10_000)
    reconciler_unfinished: int = 5
    reconciler_passes: int = 21
    #: ax on etcd + Redis, engine in process. A waiting pop wakes for an item in any
    #: lane (the queue's wake-up list), so both lanes run the same counts.
    etcd_chain_default: int = 500
    etcd_chain_fast: int = 500
    etcd_fin_seq_default: int = 100
    etcd_fin_seq_fast: int = 100
    etcd_fin_conc: int = 250
    etcd_fanout: int = 300
    #: Through ax api + 2 ax executor processes.
    api_chain_default: int = 150
    api_chain_fast: int = 150
    api_fin_seq_default: int = 60
    api_fin_seq_fast: int = 60
    api_fin_conc: int = 150
    api_fanout: int = 200
    api_executors: int = 2
    #: Scaling.
    scale_chain: tuple[int, ...] = (10, 100, 1000, 10_000)
    scale_concurrency: tuple[int, ...] = (1, 10, 100)
    scale_tasks: int = 300
    #: Large values: a chain of ``payload_nodes`` passing ``payload_records`` records
    #: (1,000: about 60 KB of JSON) node to node, median of ``payload_runs`` per round.
    payload_nodes: int = 60
    payload_records: int = 1000
    payload_runs: int = 3
    #: Validation and profile.
    validation_nodes: int = 10_000
    profile_chain: int = 1000
    #: Worker slots of the in-process worker and of each executor.
    worker_concurrency: int = 8
    #: Tasks whose timelines are read for per-node latencies and event kinds.
    latency_tasks: int = 1000
    #: Seconds a single workload may take before it is killed.
    timeout: float = 300.0


FULL = Sizes()
QUICK = Sizes(
    rounds=2, floor_seconds=0.2, section_floor_seconds=0.2, fin_tasks=10, fin_inflight=5,
    chain=20, fanout=10,
    dbos_fin_tasks=10, dbos_fin_conc=10,
    sdk_oneshot_runs=3, sdk_reuse_runs=5, sdk_reuse_chain_runs=1,
    reconciler_finished=(10, 50), reconciler_passes=3,
    etcd_chain_default=3, etcd_chain_fast=10, etcd_fin_seq_default=1, etcd_fin_seq_fast=3,
    etcd_fin_conc=10, etcd_fanout=5,
    api_chain_default=3, api_chain_fast=5, api_fin_seq_default=1, api_fin_seq_fast=2,
    api_fin_conc=6, api_fanout=5,
    scale_chain=(10, 30), scale_concurrency=(1, 5), scale_tasks=10,
    payload_nodes=10, payload_records=200, payload_runs=1,
    validation_nodes=200, profile_chain=20, latency_tasks=10, timeout=120.0,
)


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) \
        else "unknown"


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for name, argv in (("etcd", ["etcd", "--version"]),
                       ("redis", ["redis-server", "--version"])):
        versions[name] = _version(argv) if shutil.which(argv[0]) else "not installed"
    from importlib.metadata import PackageNotFoundError, version

    for name in ("langgraph", "langgraph-checkpoint-sqlite", "dbos"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


#: What the embedded section runs on.
EMBEDDED_BACKEND = "SQLite (WAL, synchronous=FULL) + in-process queue"

#: The figure a workload's median round is chosen by: wall time per node for the engines
#: and the peers, wall time per call for the SDK's financial loops, the sequential etcd +
#: Redis floor for a section's floor.
WALL_PER_NODE = ("wall_per_node_ms",)
WALL_PER_CALL = ("run_wall", "p50_ms")
SEQUENTIAL_FLOOR = ("floor", "etcd_redis_sequential", "nodes_per_s")

Result = dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """One child of every round (see :meth:`Runner._in_rounds`).

    Attributes:
        label: Its progress label; the round is appended.
        run: Runs the child under the label it is given and returns its result.
        keep: Stores the results of every round, in order, once the rounds are done.
    """

    label: str
    run: Callable[[str], Result]
    keep: Callable[[list[Result]], None]


def keep_median(out: dict[str, Any], key: str,
                figure: tuple[str, ...] = WALL_PER_NODE) -> Callable[[list[Result]], None]:
    """A :attr:`Turn.keep` that stores, as ``out[key]``, the workload's median round by
    ``figure`` (what the tables show and every existing reader takes) with every round
    under ``"rounds"`` (what the report's paired ratios read)."""

    def keep(rounds: list[Result]) -> None:
        out[key] = {**median_round(rounds, figure), "rounds": rounds}

    return keep


class Runner:
    """Runs the plan and collects ``results``.

    Args:
        sizes: Workload sizes (:data:`FULL` or :data:`QUICK`).
        progress: Where progress lines go.
        sections: Sections to run (default: all).
        shapes: The workloads to run, by the engines' shape names
            (:attr:`ENGINE_SHAPES`; default: all), in every section that runs them:
            embedded, peer, sdk, etcd_redis and api (each lane of a shape is that
            shape), and scaling. The SDK's financial runs (one-shot and reusable)
            count as ``financial_sequential``, its reusable chain as ``chain``;
            scaling's chain series as ``chain``, its series by tasks in flight as
            ``financial_concurrent``.
    """

    SECTIONS = ("floor", "embedded", "peer", "sdk", "etcd_redis", "reconciler", "scaling",
                "payload", "validation", "profile", "api")

    def __init__(self, sizes: Sizes, progress: Progress,
                 sections: tuple[str, ...] | None = None,
                 shapes: tuple[str, ...] | None = None) -> None:
        self.sizes = sizes
        self.progress = progress
        self.sections = sections or self.SECTIONS
        self.shapes = tuple(s for s in self.ENGINE_SHAPES if s in (shapes or self.ENGINE_SHAPES))
        self.results: dict[str, Any] = {}
        self._servers: dict[str, Any] = {}

    # ------------------------------------------------------------------ children

    def child(self, label: str, spec: dict[str, Any],
              describe: Callable[[dict[str, Any]], str] | None = None) -> dict[str, Any]:
        """Run ``spec`` in a fresh ``python -m bench.child``; return its result, or
        ``{"error": ...}`` when it failed or timed out."""
        self.progress(f"{label} ...")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
        start = self.progress.elapsed
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.child"], input=json.dumps(spec),
                capture_output=True, text=True, cwd=ROOT, env=env,
                timeout=self.sizes.timeout, check=False)
        except subprocess.TimeoutExpired:
            self.progress(f"  {label}: killed after {self.sizes.timeout:g}s")
            return {"error": f"timed out after {self.sizes.timeout:g}s"}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
            self.progress(f"  {label}: FAILED (exit {proc.returncode}): "
                          f"{tail[-1] if tail else ''}")
            return {"error": f"exit {proc.returncode}", "stderr_tail": tail}
        result: dict[str, Any] = json.loads(lines[-1][len(MARKER):])
        took = self.progress.elapsed - start
        self.progress(f"  {label}: {describe(result) if describe else 'done'} "
                      f"({took:.1f}s)")
        return result

    @staticmethod
    def _engine_line(r: dict[str, Any]) -> str:
        lat = r.get("node_latency", {}).get("ready_to_committed", {})
        bad = report.not_succeeded(r)
        return (f"{r['nodes_per_s']:.0f} nodes/s, {r['wall_per_node_ms']:.2f} ms/node, "
                f"ready->committed p50 {lat.get('p50_ms', float('nan')):.2f} ms"
                + (f", NOT SUCCEEDED: {bad}" if bad else ""))

    @staticmethod
    def _peer_line(r: dict[str, Any]) -> str:
        return f"{r['nodes_per_s']:.0f} nodes/s, {r['wall_per_node_ms']:.2f} ms/node"

    @staticmethod
    def _run_line(r: dict[str, Any]) -> str:
        return (f"per run wall p50 {r['run_wall']['p50_ms']:.1f} ms, CPU p50 "
                f"{r['run_cpu']['p50_ms']:.1f} ms, wall/CPU {r['wall_over_cpu']}")

    def _ax(self, label: str, **spec: Any) -> dict[str, Any]:
        spec = {"part": "axrun", "worker_concurrency": self.sizes.worker_concurrency,
                "latency_tasks": self.sizes.latency_tasks, **spec}
        return self.child(label, spec, self._engine_line)

    # ------------------------------------------------------------------ rounds

    def _in_rounds(self, turns: Sequence[Turn]) -> None:
        """Run ``turns`` in order, ``sizes.rounds`` times over, then hand each turn its
        results.

        The rounds take turns (round 1 of every turn, then round 2 of every turn, ...)
        rather than repeating one workload: the two sides of a ratio in one round are
        taken seconds apart, and the report judges the median of the rounds' ratios, so
        a slow burst of the machine weighs on both sides of one round and is outvoted
        by the others.
        """
        rounds = self.sizes.rounds
        results: list[list[Result]] = [[] for _ in turns]
        for i in range(rounds):
            suffix = f" (round {i + 1}/{rounds})" if rounds > 1 else ""
            for turn, got in zip(turns, results, strict=True):
                got.append(turn.run(turn.label + suffix))
        for turn, got in zip(turns, results, strict=True):
            turn.keep(got)

    def _child_turn(self, out: dict[str, Any], key: str, label: str, spec: dict[str, Any],
                    describe: Callable[[Result], str],
                    figure: tuple[str, ...] = WALL_PER_NODE) -> Turn:
        """A turn that runs ``spec`` in a fresh child and keeps its rounds as
        ``out[key]``."""
        return Turn(label, lambda lbl: self.child(lbl, spec, describe),
                    keep_median(out, key, figure))

    def _ax_turn(self, out: dict[str, Any], key: str, label: str, **spec: Any) -> Turn:
        """A turn of the ax engine harness (:mod:`bench.axrun`), kept as ``out[key]``."""
        return Turn(label, lambda lbl: self._ax(lbl, **spec), keep_median(out, key))

    # ------------------------------------------------------------------ servers

    @contextmanager
    def _section(self, name: str) -> Iterator[dict[str, Any]]:
        out: dict[str, Any] = {"load_before": load()}
        self.results[name] = out
        self.progress(f"== {name} (load {out['load_before']})")
        try:
            yield out
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc().splitlines()[-8:]
            self.progress(f"  {name}: section failed: {out['error']}")
        out["load_after"] = load()

    def _start_servers(self) -> None:
        from tests.servers import start_etcd, start_redis

        if not self._servers:
            self._servers["etcd"] = start_etcd()
            self._servers["redis"] = start_redis()

    def _stop_servers(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()

    @property
    def _etcd(self) -> Any:
        return self._servers["etcd"]

    @property
    def _etcd_store_url(self) -> str:
        """The etcd store URL declaring the server's ``--max-txn-ops``: the engine
        refuses DAGs whose transactions would not fit etcd's default (128 operations)."""
        from tests.servers import ETCD_MAX_TXN_OPS

        return f"{self._etcd.url}?max_txn_ops={ETCD_MAX_TXN_OPS}"

    @property
    def _redis(self) -> Any:
        return self._servers["redis"]

    # ------------------------------------------------------------------ sections

    def run(self) -> dict[str, Any]:
        started = dt.datetime.now(dt.UTC)
        self.results["meta"] = {
            "schema": RESULTS_SCHEMA, "started_at": started.isoformat(timespec="seconds"),
            "sizes": asdict(self.sizes), "quick": self.sizes == QUICK,
            "sections": list(self.sections), "shapes": list(self.shapes),
            "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                     "load_start": load()},
            "versions": _versions(),
        }
        try:
            for name in self.SECTIONS:
                if name in self.sections:
                    getattr(self, f"_run_{name}")()
        finally:
            self._stop_servers()
        meta = self.results["meta"]
        meta["duration_s"] = round(self.progress.elapsed, 1)
        meta["host"]["load_end"] = load()
        self.results["summary"] = report.summarize(self.results)
        return self.results

    def _run_floor(self) -> None:
        with self._section("floor") as out:
            spec: dict[str, Any] = {"part": "floor", "seconds": self.sizes.floor_seconds}
            try:
                self._start_servers()
                spec.update(etcd_url=self._etcd.url, redis_url=f"{self._redis.url}/0")
            except Exception as exc:
                out["servers_error"] = f"{type(exc).__name__}: {exc}"
            out.update(self.child("floor: etcd, Redis, SQLite primitives", spec,
                                  lambda r: json.dumps({k: v["nodes_per_s"] for k, v in
                                                        r["floor"].items()})
                                  + " floor nodes/s"))

    def _section_floor(self, out: dict[str, Any], name: str, etcd_url: str,
                       redis_url: str) -> Turn:
        """The etcd + Redis floor measured again at the start of each round of a section,
        on its servers: the machine's speed drifts over a run (the same code measured 140
        and 310 nodes/s through the API in two runs an hour apart), so each round of a
        section's workloads is held against the floor measured next to it. Kept as
        ``out["floors"]`` (every round) and ``out["floor"]`` (the median round)."""

        def keep(rounds: list[Result]) -> None:
            out["floor"] = median_round(rounds, SEQUENTIAL_FLOOR)
            out["floors"] = rounds

        spec = {"part": "floor", "seconds": self.sizes.section_floor_seconds, "section": True,
                "etcd_url": etcd_url, "redis_url": redis_url}
        return Turn(
            f"{name}: etcd + Redis floor for this section",
            lambda lbl: self.child(
                lbl, spec, lambda r: json.dumps({k: v["nodes_per_s"]
                                                 for k, v in r["floor"].items()})
                + " floor nodes/s"),
            keep)

    def _run_embedded(self) -> None:
        if "peer" in self.sections:
            self._run_engines()  # embedded and the peers, shape by shape
            return
        with self._section("embedded") as out:
            out["backend"] = EMBEDDED_BACKEND
            for shape in self.shapes:
                self._in_rounds([self._embedded_turn(out, shape)])

    def _run_peer(self) -> None:
        if "embedded" in self.sections:
            return  # run with the embedded section (_run_engines)
        with self._section("peer") as out:
            for shape in self.shapes:
                self._in_rounds(self._peer_turns(out, shape))
            self._no_celery(out)

    def _run_engines(self) -> None:
        """ax embedded, LangGraph and DBOS shape by shape, each shape's rounds taking
        turns (round 1 of ax, LangGraph, DBOS, then round 2 ...): the machine's speed
        drifts over minutes, and a ratio should compare figures taken next to each
        other."""
        with self._section("embedded") as emb, self._section("peer") as peer:
            emb["backend"] = EMBEDDED_BACKEND
            for shape in self.shapes:
                self._in_rounds([self._embedded_turn(emb, shape),
                                 *self._peer_turns(peer, shape)])
            self._no_celery(peer)

    #: The workloads of the embedded and peer sections, in the order they run.
    ENGINE_SHAPES = ("financial_sequential", "financial_concurrent", "chain", "fanout")

    def _engine_run(self, name: str, fin_tasks: int, conc_tasks: int
                    ) -> tuple[str, int, int, int]:
        """Workload ``name`` of the engines section: shape, size, tasks, in flight."""
        s = self.sizes
        return {
            "financial_sequential": ("financial", 0, fin_tasks, 1),
            "financial_concurrent": ("financial", 0, conc_tasks, s.fin_inflight),
            "chain": ("chain", s.chain, 1, 1),
            "fanout": ("fanout", s.fanout, 1, 1),
        }[name]

    def _embedded_turn(self, out: dict[str, Any], name: str) -> Turn:
        """The embedded engine's workload ``name``, kept in ``out["workloads"]``."""
        s = self.sizes
        kind, size, tasks, inflight = self._engine_run(name, s.fin_tasks, s.fin_tasks)
        label = {
            "financial_sequential": f"financial x {tasks}, one at a time",
            "financial_concurrent": f"financial x {tasks}, {inflight} in flight",
            "chain": f"chain of {size}",
            "fanout": f"fan-out/fan-in of {size}",
        }[name]
        # The one-at-a-time workloads are replayed on the store alone afterwards (outside
        # the timed window): what the engine adds to the store, shown next to the peers.
        return self._ax_turn(out.setdefault("workloads", {}), name, f"embedded: {label}",
                             shape=kind, size=size, tasks=tasks, inflight=inflight,
                             replay=inflight == 1)

    def _peer_turns(self, out: dict[str, Any], name: str) -> list[Turn]:
        """The workload ``name`` of every peer, kept in ``out[peer]``."""
        s = self.sizes
        turns = []
        for peer, part, fin_tasks, conc_tasks in (
                ("langgraph", "peer", s.fin_tasks, s.fin_tasks),
                ("dbos", "dbos", s.dbos_fin_tasks, s.dbos_fin_conc)):
            kind, size, tasks, inflight = self._engine_run(name, fin_tasks, conc_tasks)
            turns.append(self._child_turn(
                out.setdefault(peer, {}), name,
                f"{peer}: {name} ({kind}{' ' + str(size) if size else ''} x {tasks}"
                f"{f', {inflight} in flight' if inflight > 1 else ''})",
                {"part": part, "shape": kind, "size": size, "tasks": tasks,
                 "inflight": inflight}, self._peer_line))
        return turns

    @staticmethod
    def _no_celery(out: dict[str, Any]) -> None:
        out["celery"] = {
            "status": "skipped",
            "reason": "not run: a Celery worker process and result backend on the "
            "private Redis would not fit the ten-minute budget next to the ax/API "
            "runs; LangGraph and DBOS are the peers measured",
        }

    def _run_sdk(self) -> None:
        s = self.sizes
        with self._section("sdk") as out:
            base = {"part": "sdk", "latency_tasks": s.latency_tasks}
            # The reusable engine is held against the peers' runs of the same shape
            # taken in turns with it (the machine's speed drifts over a run).
            peers = out.setdefault("peers", {})
            with_peers = "peer" in self.sections
            if "financial_sequential" in self.shapes:
                self._in_rounds([
                    self._child_turn(
                        out, "ax_oneshot",
                        f"sdk: ax.run x {s.sdk_oneshot_runs} (financial, one shot each)",
                        {**base, "mode": "oneshot", "shape": "financial",
                         "runs": s.sdk_oneshot_runs}, self._run_line, WALL_PER_CALL),
                    self._child_turn(
                        out, "langgraph_oneshot",
                        f"sdk: langgraph open + build + compile + invoke x "
                        f"{s.sdk_oneshot_runs} (financial)",
                        {"part": "peer", "mode": "oneshot", "runs": s.sdk_oneshot_runs},
                        self._run_line, WALL_PER_CALL),
                ])
                self._in_rounds([
                    self._child_turn(
                        out, "ax_reuse_financial",
                        f"sdk: ax.open, engine.run x {s.sdk_reuse_runs} (financial)",
                        {**base, "mode": "reuse", "shape": "financial",
                         "runs": s.sdk_reuse_runs}, self._run_line, WALL_PER_CALL),
                    *(self._peer_turns(peers, "financial_sequential") if with_peers else []),
                ])
            if "chain" in self.shapes:
                self._in_rounds([
                    self._child_turn(
                        out, "ax_reuse_chain",
                        f"sdk: ax.open, engine.run x {s.sdk_reuse_chain_runs} "
                        f"(chain of {s.chain})",
                        {**base, "mode": "reuse", "shape": "chain", "size": s.chain,
                         "runs": s.sdk_reuse_chain_runs, "warmup": 1}, self._run_line),
                    *(self._peer_turns(peers, "chain") if with_peers else []),
                ])

    def _run_reconciler(self) -> None:
        s = self.sizes
        with self._section("reconciler") as out:
            spec = {"part": "reconciler", "finished": list(s.reconciler_finished),
                    "unfinished": s.reconciler_unfinished, "passes": s.reconciler_passes}

            def line(r: dict[str, Any]) -> str:
                return ", ".join(f"{n} finished: pass {p['pass_median_ms']:.2f} ms, "
                                 f"{p['reads_per_pass']:g} reads"
                                 for n, p in r["points"].items())

            out["sqlite"] = self.child("reconciler: pass cost, SQLite store", spec, line)
            try:
                self._start_servers()
            except Exception as exc:
                out["etcd"] = {"error": f"etcd did not start: {type(exc).__name__}: {exc}"}
                return
            out["etcd"] = self.child("reconciler: pass cost, etcd store",
                                     {**spec, "store_url": self._etcd_store_url}, line)

    def _run_etcd_redis(self) -> None:
        s = self.sizes
        with self._section("etcd_redis") as out:
            self._start_servers()
            out["backend"] = "etcd (1 member, private port) + Redis; engine, worker and " \
                "reconciler in this process"
            floor = self._section_floor(out, "etcd+redis", self._etcd.url,
                                        f"{self._redis.url}/0")
            pids = {"etcd": self._etcd.proc.pid, "redis": self._redis.proc.pid}
            w = out.setdefault("workloads", {})
            runs = (
                ("chain_default_lane", "chain", s.etcd_chain_default, 1, 1, None),
                ("chain_fast_lane", "chain", s.etcd_chain_fast, 1, 1, "fast"),
                ("financial_sequential_default_lane", "financial", 0,
                 s.etcd_fin_seq_default, 1, None),
                ("financial_sequential_fast_lane", "financial", 0, s.etcd_fin_seq_fast, 1,
                 "fast"),
                ("financial_concurrent", "financial", 0, s.etcd_fin_conc, s.fin_inflight,
                 None),
                ("financial_concurrent_fast_lane", "financial", 0, s.etcd_fin_conc,
                 s.fin_inflight, "fast"),
                ("fanout", "fanout", s.etcd_fanout, 1, 1, None),
            )
            self._in_rounds([floor, *(
                self._ax_turn(
                    w, name,
                    f"etcd+redis: {name} ({kind}{' ' + str(size) if size else ''} x {tasks})",
                    shape=kind, size=size, tasks=tasks, inflight=inflight, lane=lane,
                    store_url=self._etcd_store_url,
                    queue_url=f"{self._redis.url}/0?prefix=bench{i}", server_pids=pids)
                for i, (name, kind, size, tasks, inflight, lane) in enumerate(runs)
                if name.startswith(self.shapes))])

    def _run_scaling(self) -> None:
        """The embedded chain at each length next to LangGraph's and DBOS's (up to the
        main chain's length: their checkpoints grow with the graph, 10,000 would blow
        the time budget), size by size, each size's rounds taking turns; then the
        financial shape by tasks in flight. The main chain reuses the engines' rounds;
        the longer chains and the concurrency series run once (their growth is read
        within the series, not against a peer)."""
        s = self.sizes
        with self._section("scaling") as out:
            chain: dict[str, Any] = out.setdefault("chain", {})
            peers = {"langgraph": out.setdefault("langgraph_chain", {}),
                     "dbos": out.setdefault("dbos_chain", {})}
            for n in s.scale_chain if "chain" in self.shapes else ():
                # A chain shorter than the main one runs as many times as it takes to make
                # the main chain's count of nodes, one task after another (ten samples of
                # a DAG's first run would be mostly its warm-up).
                tasks = max(1, s.chain // n)
                turns: list[Turn] = []
                reuse = self._main_chain_run("embedded", "workloads", n)
                if reuse:
                    chain[str(n)] = reuse
                    self.progress(f"scaling: chain of {n}: reusing the embedded chain run")
                elif n > s.chain:
                    chain[str(n)] = self._ax(f"scaling: embedded chain of {n} x {tasks}",
                                             shape="chain", size=n, tasks=tasks,
                                             latency_tasks=tasks)
                else:
                    turns.append(self._ax_turn(
                        chain, str(n), f"scaling: embedded chain of {n} x {tasks}",
                        shape="chain", size=n, tasks=tasks, latency_tasks=tasks))
                for peer, part in (("langgraph", "peer"), ("dbos", "dbos")):
                    if n > s.chain:
                        continue
                    reuse = self._main_chain_run("peer", peer, n)
                    if reuse:
                        peers[peer][str(n)] = reuse
                    else:
                        turns.append(self._child_turn(
                            peers[peer], str(n), f"scaling: {peer} chain of {n} x {tasks}",
                            {"part": part, "shape": "chain", "size": n, "tasks": tasks,
                             "inflight": 1}, self._peer_line))
                self._in_rounds(turns)
            conc: dict[str, Any] = out.setdefault("concurrency", {})
            for c in s.scale_concurrency if "financial_concurrent" in self.shapes else ():
                conc[str(c)] = self._ax(
                    f"scaling: embedded financial x {s.scale_tasks}, {c} in flight",
                    shape="financial", tasks=s.scale_tasks, inflight=c)

    def _main_chain_run(self, section: str, engine: str, n: int) -> Result | None:
        """The engines section's chain (with its rounds) when ``n`` is the main chain's
        length and that run succeeded, for the scaling series to reuse."""
        if n != self.sizes.chain:
            return None
        run = self.results.get(section, {}).get(engine, {}).get("chain")
        return run if run and "error" not in run else None

    def _run_payload(self) -> None:
        """A chain passing a large value node to node (:mod:`bench.payload`): ``ax.open``
        and LangGraph, their rounds taking turns."""
        s = self.sizes
        with self._section("payload") as out:
            spec = {"part": "payload", "nodes": s.payload_nodes,
                    "records": s.payload_records, "runs": s.payload_runs}
            self._in_rounds([
                self._child_turn(out, side, f"payload: {label}, chain of {s.payload_nodes} "
                                 f"passing {s.payload_records:,} records",
                                 {**spec, "side": side},
                                 lambda r: f"{r['wall_per_node_ms']} ms per node "
                                 f"({r['bytes']:,} bytes)")
                for side, label in (("ax_open", "ax.open"), ("langgraph", "LangGraph"))])

    def _run_validation(self) -> None:
        with self._section("validation") as out:
            out.update(self.child(
                f"validation: load_dag_mapping of a {self.sizes.validation_nodes}-node chain",
                {"part": "validation", "nodes": self.sizes.validation_nodes, "repeat": 3},
                lambda r: f"literal {r['literal']['min_s']:.2f}s, one template per node "
                f"{r['template_per_node']['min_s']:.2f}s"))

    def _run_profile(self) -> None:
        with self._section("profile") as out:
            r = self._ax(f"profile: embedded chain of {self.sizes.profile_chain} under cProfile",
                         shape="chain", size=self.sizes.profile_chain, profile=True,
                         profile_top=30)
            out["workload"] = f"embedded chain of {self.sizes.profile_chain}"
            out.update(r.get("profile", {"error": r.get("error", "no profile")}))

    def _run_api(self) -> None:
        s = self.sizes
        with self._section("api") as out:
            self._stop_servers()
            missing = [p for p in ("tests/topology.py", "axengine/api/_server.py",
                                   "axengine/client") if not (ROOT / p).exists()]
            if missing:
                out.update(status="not measured yet", reason=f"missing: {', '.join(missing)}")
                self.progress(f"  api: not measured yet ({out['reason']})")
                return
            try:
                from tests.topology import Topology

                topology = Topology(executors=s.api_executors,
                                    concurrency=s.worker_concurrency, lease=30.0, grace=5.0)
                self.progress(f"api: starting etcd, Redis, ax api, {s.api_executors} "
                              "executors ...")
                topology.start()
            except Exception as exc:
                out.update(status="not measured yet",
                           reason=f"topology did not start: {type(exc).__name__}: "
                           f"{str(exc)[:500]}")
                self.progress(f"  api: not measured yet ({out['reason'][:200]})")
                return
            try:
                out["status"] = "measured"
                out["backend"] = (f"ax api (REST+gRPC) + {s.api_executors} ax executor "
                                  f"processes (concurrency {s.worker_concurrency} each), "
                                  "etcd + Redis")
                assert topology.api is not None and topology.etcd is not None \
                    and topology.redis is not None and topology.etcd.proc is not None \
                    and topology.redis.proc is not None
                pids = {"api": topology.api.pid, "etcd": topology.etcd.proc.pid,
                        "redis": topology.redis.proc.pid}
                floor = self._section_floor(out, "api", topology.etcd.url,
                                            topology.queue_url)
                pids.update({f"executor{i}": e.pid for i, e in enumerate(topology.executors)})
                base = {"part": "api", "api_url": topology.api_url,
                        "token": topology.admin_token, "etcd_url": topology.store_url,
                        "pids": pids, "latency_tasks": s.latency_tasks}
                runs = (
                    ("chain_default_lane", "chain", s.api_chain_default, 1, 1, None),
                    ("chain_fast_lane", "chain", s.api_chain_fast, 1, 1, "fast"),
                    ("financial_sequential_default_lane", "financial", 0,
                     s.api_fin_seq_default, 1, None),
                    ("financial_sequential_fast_lane", "financial", 0, s.api_fin_seq_fast,
                     1, "fast"),
                    ("financial_concurrent", "financial", 0, s.api_fin_conc, s.fin_inflight,
                     None),
                    ("fanout", "fanout", s.api_fanout, 1, 1, None),
                )
                w = out.setdefault("workloads", {})
                self._in_rounds([floor, *(
                    Turn(f"api: {name} ({kind}{' ' + str(size) if size else ''} x {tasks})",
                         self._api_run(topology, {**base, "shape": kind, "size": size,
                                                  "tasks": tasks, "inflight": inflight,
                                                  "lane": lane}),
                         keep_median(w, name))
                    for name, kind, size, tasks, inflight, lane in runs
                    if name.startswith(self.shapes))])
            finally:
                topology.stop()

    def _api_run(self, topology: Any, spec: dict[str, Any]) -> Callable[[str], Result]:
        """Runs one API workload and adds the warnings and errors the API and executor
        processes logged while it ran."""

        def run(label: str) -> Result:
            before = _log_problems(topology)
            result = self.child(label, spec, self._engine_line)
            after = _log_problems(topology)
            new_lines = {p: lines[len(before.get(p, [])):] for p, lines in after.items()}
            result["log_problems"] = {p: {"count": len(lines), "last": lines[-3:]}
                                      for p, lines in new_lines.items() if lines}
            return result

        return run


def _log_problems(topology: Any) -> dict[str, list[str]]:
    """Warning, error and traceback lines each API/executor process logged so far."""
    out: dict[str, list[str]] = {}
    for proc in [topology.api, *topology.executors]:
        if proc is not None:
            out[proc.name] = [ln for ln in proc.all_output().splitlines()
                              if " ERROR " in ln or " WARNING " in ln or "Traceback" in ln]
    return out


def write(results: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``results.json`` and ``results.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    raw, md = out_dir / "results.json", out_dir / "results.md"
    raw.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    md.write_text(report.markdown(results))
    return raw, md
