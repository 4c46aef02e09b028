"""The benchmark harness runs in ``--quick`` mode and writes well-formed results.

Each test runs a few sections (and the engines' shapes) of ``bench --quick`` in its own
process, so no test takes long; together they run every section and every shape
(``test_the_runs_cover_every_section``).

No speed is asserted: the quick counts are far too small to mean anything, and other
work on the machine moves every figure. What is pinned is the shape of the output
(every section present, every workload run to completion, the comparisons computed)
and the facts that do not depend on speed (each task SUCCEEDED, node counts, at least
one committed write per executed node).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from bench.runner import QUICK, Runner

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _check_engine(name: str, r: Mapping[str, Any]) -> None:
    assert "error" not in r, f"{name}: {r.get('error')} {r.get('stderr_tail')}"
    assert r["statuses"] == {"SUCCEEDED": r["tasks"]}, name
    assert r["nodes"] == r["nodes_per_task"] * r["tasks"] > 0, name
    assert r["nodes_per_s"] > 0 and r["wall_per_node_ms"] > 0, name
    assert r["node_latency"]["ready_to_committed"]["n"] > 0, name
    # A node that runs is claimed and completed. In a chain that is at least one write
    # per executed node; siblings that complete at once may share a transaction (a
    # group commit), but every task writes at least once.
    assert r["write_txns_per_node"] * r["nodes"] >= r["tasks"], name
    if "chain" in name:
        assert r["write_txns_per_node"] >= 1.0, name
    assert r["process"]["peak_rss_mib"] > 0, name
    assert isinstance(r["anomalies"], dict) and r["event_kinds"]["committed"] > 0, name


def _peer_missing(r: Mapping[str, Any]) -> bool:
    """True when a peer's workload failed because the bench extra is not installed (the
    only acceptable failure); any other error fails the test."""
    if "error" not in r:
        return False
    assert "scripts/bootstrap bench" in "\n".join(r.get("stderr_tail", [])), r
    return True


class Run(NamedTuple):
    results: dict[str, Any]
    markdown: str
    log: str


def _bench(out: Path, sections: tuple[str, ...], shapes: tuple[str, ...] = ()) -> Run:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    argv = [sys.executable, "-m", "bench", "--quick", "--out", str(out),
            *(f"--section={s}" for s in sections), *(f"--shape={s}" for s in shapes)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["quick"] is True
    assert results["meta"]["sections"] == list(sections)
    assert results["meta"]["shapes"] == list(shapes or Runner.ENGINE_SHAPES)
    for section in sections:
        assert "error" not in results[section], results[section].get("traceback")
    # Progress lines carry the elapsed time.
    assert "s] == " in proc.stderr and "s] wrote " in proc.stderr
    return Run(results, (out / "results.md").read_text(), proc.stderr)


#: The sections the first test runs; each other test runs one section (or the engines
#: with their peers), the shape-by-shape ones once per shape.
FLOOR_AND_SMALL = ("floor", "reconciler", "validation", "profile")


def test_the_runs_cover_every_section() -> None:
    covered = {*FLOOR_AND_SMALL, "embedded", "peer", "sdk", "scaling", "etcd_redis", "api",
               "payload"}
    assert covered == set(Runner.SECTIONS)


def _started(log: str) -> list[tuple[str, int]]:
    """Every child started in rounds, in the order it started: (label, round)."""
    return [(label, int(r)) for label, r in re.findall(
        r"\] (.+?) \(round (\d+)/\d+\) \.\.\.$", log, re.MULTILINE)]


def _take_turns(log: str, turns: tuple[str, ...]) -> None:
    """From the first line of ``turns[0]`` on: round 1 of each turn, then round 2 of
    each, and so on."""
    started = _started(log)
    rounds = QUICK.rounds
    first = next(i for i, (label, _) in enumerate(started) if label.startswith(turns[0]))
    got = [(next((t for t in turns if label.startswith(t)), label), r)
           for label, r in started[first:first + len(turns) * rounds]]
    assert got == [(t, r) for r in range(1, rounds + 1) for t in turns], got


def _keeps_every_round(name: str, r: Mapping[str, Any]) -> None:
    assert len(r["rounds"]) == QUICK.rounds > 1, name
    # The result shown is one of its rounds, and a round holds no rounds of its own.
    assert {k: v for k, v in r.items() if k != "rounds"} in r["rounds"], name
    assert all("rounds" not in each for each in r["rounds"]), name


def _shapes_of(workloads: Mapping[str, Any]) -> set[str]:
    """The shapes of a section's workloads, named ``<shape>[_default_lane|_fast_lane]``."""
    return {name.removesuffix("_fast_lane").removesuffix("_default_lane")
            for name in workloads}


def _judged_on_rounds(results: Mapping[str, Any], prefixes: tuple[str, ...]) -> None:
    """Every ratio with two sides was judged on its rounds (a peer whose package is not
    installed here has no side to pair with)."""
    peers = results.get("peer", {})
    missing = [f"/ {label}" for label, key in (("LangGraph", "langgraph"), ("DBOS", "dbos"))
               if any(_peer_missing(r) for r in peers.get(key, {}).values())]
    judged = [c for c in results["summary"]["comparisons"]
              if c["name"].startswith(prefixes) and not any(m in c["name"] for m in missing)]
    assert judged or len(missing) == 2, results["summary"]["comparisons"]
    assert all(len(c["rounds"]) == QUICK.rounds for c in judged), judged


def test_floor_reconciler_validation_and_profile(tmp_path: Path) -> None:
    results, markdown, _ = _bench(tmp_path, FLOOR_AND_SMALL)
    assert len(results["meta"]["host"]["load_start"]) == 3
    for heading in ("## Targets", "## Floor", "## Reconciler pass cost",
                    "## Validation of a large DAG", "## Profile"):
        assert heading in markdown
    floor = results["floor"]
    for key in ("sqlite_inprocess", "etcd_redis_sequential", "etcd_redis_concurrent_8"):
        assert floor["floor"][key]["nodes_per_s"] > 0, key
    for key in ("etcd", "etcd_raw_aetcd", "redis_queue", "redis_raw"):
        for mode in ("sequential", "concurrent_8"):
            assert floor[key][mode]["ops"] > 0 and floor[key][mode]["latency"]["p99_ms"] > 0

    validation = results["validation"]
    for variant in ("literal", "template_per_node"):
        assert validation[variant]["min_s"] > 0
    assert results["profile"]["by_tottime"] and results["profile"]["total_s"] > 0

    sizes = results["meta"]["sizes"]
    rec = results["reconciler"]
    assert "error" not in rec["sqlite"], rec["sqlite"]
    for backend in ("sqlite", "etcd"):
        r = rec[backend]
        if backend == "etcd" and "error" in r:
            continue  # etcd did not start: reported, not made up
        assert set(r["points"]) == {str(n) for n in sizes["reconciler_finished"]}, backend
        for p in r["points"].values():
            # Every unfinished task is looked at; a pass reads the store.
            assert p["tasks_seen"] == p["unfinished"] == sizes["reconciler_unfinished"]
            assert p["reads_per_pass"] > 0 and p["pass"]["n"] == sizes["reconciler_passes"]
        assert r["growth"] is not None and r["growth"] > 0
    names = [c["name"] for c in results["summary"]["comparisons"]]
    assert any(n.startswith("reconciler pass (sqlite)") for n in names)
    for c in results["summary"]["comparisons"]:
        assert set(c) >= {"name", "value", "target", "met", "detail"}


@pytest.mark.parametrize("shape", Runner.ENGINE_SHAPES)
def test_ax_and_the_peers_take_turns_shape_by_shape(tmp_path: Path, shape: str) -> None:
    # The machine's speed drifts over minutes: a ratio compares figures taken next to
    # each other, not sections apart, and its rounds take turns.
    results, markdown, log = _bench(tmp_path, ("embedded", "peer"), (shape,))
    assert "## Engines, same shapes" in markdown
    workloads = results["embedded"]["workloads"]
    assert set(workloads) == {shape}
    for name, r in workloads.items():
        _check_engine(f"embedded/{name}", r)
        _keeps_every_round(f"embedded/{name}", r)
        if r["inflight"] == 1:
            # Replayed on the store alone: every write transaction of the timed window.
            alone = r["store_replay"]
            assert alone["txns"] == r["store"]["write_txns"] > 0, name
            assert alone["wall_per_node_ms"] > 0 and alone["puts_per_txn"] >= 1, name
            section = markdown.partition("### The store alone")[2].partition("\n## ")[0]
            assert f"\n| {name} | " in section, section
        else:
            assert "store_replay" not in r, name
    for peer in ("langgraph", "dbos"):
        runs = results["peer"][peer]
        assert set(runs) == {shape}, peer
        for name, r in runs.items():
            _keeps_every_round(f"{peer}/{name}", r)
            if _peer_missing(r):
                continue
            assert r["nodes"] == r["nodes_per_task"] * r["tasks"] and r["nodes_per_s"] > 0
            if peer == "dbos":
                # Every step's output is in the system database, on a durable SQLite.
                assert r["recorded_steps"] == r["nodes"], r
                assert r["sqlite"] == {"journal_mode": "wal", "synchronous": 2}, r
    assert results["peer"]["celery"]["status"] == "skipped"
    labels = {"financial_sequential": f"embedded: financial x {QUICK.fin_tasks}, one at",
              "financial_concurrent": f"embedded: financial x {QUICK.fin_tasks}, "
                                      f"{QUICK.fin_inflight} in flight",
              "chain": "embedded: chain of", "fanout": "embedded: fan-out/fan-in of"}
    _take_turns(log, (labels[shape], f"langgraph: {shape} (", f"dbos: {shape} ("))
    _judged_on_rounds(results, ("embedded / ",))


def test_sdk_as_users_call_it(tmp_path: Path) -> None:
    results, markdown, log = _bench(tmp_path, ("sdk",))
    assert "## The SDK as users call it" in markdown
    sizes = results["meta"]["sizes"]
    sdk = results["sdk"]
    assert set(sdk) >= {"ax_oneshot", "ax_reuse_financial", "ax_reuse_chain",
                        "langgraph_oneshot"}
    for name in ("ax_oneshot", "ax_reuse_financial", "ax_reuse_chain"):
        r = sdk[name]
        assert "error" not in r, f"sdk/{name}: {r.get('error')} {r.get('stderr_tail')}"
        assert r["statuses"] == {"SUCCEEDED": r["runs"]}, name
        assert r["run_wall"]["n"] == r["run_cpu"]["n"] == r["runs"] > 0, name
        assert r["wall_over_cpu"] > 0 and r["nodes"] == r["nodes_per_task"] * r["runs"], name
        assert r["node_latency"]["ready_to_committed"]["n"] > 0, name
        _keeps_every_round(f"sdk/{name}", r)
    assert sdk["ax_reuse_chain"]["size"] == sizes["chain"]
    assert sdk["ax_reuse_financial"]["open_s"] > 0
    _keeps_every_round("sdk/langgraph_oneshot", sdk["langgraph_oneshot"])
    if not _peer_missing(sdk["langgraph_oneshot"]):
        assert sdk["langgraph_oneshot"]["run_wall"]["n"] == sizes["sdk_oneshot_runs"]
    _take_turns(log, ("sdk: ax.run x", "sdk: langgraph open"))
    assert any(c["name"].startswith("one-shot ax.run wall / CPU")
               for c in results["summary"]["comparisons"])
    if not _peer_missing(sdk["langgraph_oneshot"]):
        _judged_on_rounds(results, ("one-shot",))
    # Without the peer section, the reusable engine runs alone.
    assert sdk["peers"] == {}


def test_the_reusable_engine_takes_turns_with_the_peers(tmp_path: Path) -> None:
    results, _, log = _bench(tmp_path, ("peer", "sdk"), ("chain",))
    sdk = results["sdk"]
    assert "ax_reuse_chain" in sdk and "ax_reuse_financial" not in sdk
    _keeps_every_round("sdk/ax_reuse_chain", sdk["ax_reuse_chain"])
    for peer in ("langgraph", "dbos"):
        r = sdk["peers"][peer]["chain"]
        _keeps_every_round(f"sdk/{peer}/chain", r)
        if not _peer_missing(r):
            assert r["nodes"] > 0 and r["wall_per_node_ms"] > 0, peer
    _take_turns(log, ("sdk: ax.open, engine.run x 1 (chain", "langgraph: chain (",
                      "dbos: chain ("))
    names = [c["name"] for c in results["summary"]["comparisons"]]
    assert any(n.startswith("reusable engine / ") for n in names) or any(
        _peer_missing(r) for r in results["peer"]["langgraph"].values())


def test_large_values_take_turns_with_langgraph(tmp_path: Path) -> None:
    results, markdown, log = _bench(tmp_path, ("payload",))
    _take_turns(log, ("payload: ax.open", "payload: LangGraph"))
    payload = results["payload"]
    _keeps_every_round("payload/ax_open", payload["ax_open"])
    ax = payload["ax_open"]
    assert (ax["nodes"], ax["records"]) == (QUICK.payload_nodes, QUICK.payload_records)
    assert ax["bytes"] > QUICK.payload_records * 50  # (the records' JSON, not a stub)
    assert ax["cpu_s"] > 0 and ax["wall_per_node_ms"] > 0
    if _peer_missing(payload["langgraph"]):
        return
    assert payload["langgraph"]["bytes"] == ax["bytes"]
    row = next(c for c in results["summary"]["comparisons"]
               if c["name"].startswith("ax.open / LangGraph, chain of"))
    assert row["target"] == "(no target)" and row["value"] > 0
    assert len(row["rounds"]) == QUICK.rounds
    assert row["name"] in markdown


def test_scaling_by_tasks_in_flight(tmp_path: Path) -> None:
    results, markdown, _ = _bench(tmp_path, ("scaling",), ("financial_concurrent",))
    assert "## Scaling" in markdown
    conc = results["scaling"]["concurrency"]
    assert set(conc) == {str(c) for c in QUICK.scale_concurrency}
    for name, r in conc.items():
        _check_engine(f"scaling/concurrency/{name}", r)
        assert r["tasks"] == QUICK.scale_tasks
    assert results["scaling"]["chain"] == {}
    growth = results["summary"]["scaling"]["concurrency"]["cpu_per_node_ms"]["growth"]
    assert growth is not None and growth > 0


def test_scaling_takes_turns_size_by_size(tmp_path: Path) -> None:
    results, markdown, log = _bench(tmp_path, ("scaling",), ("chain",))
    assert "## Scaling" in markdown
    scaling = results["scaling"]
    assert set(scaling["chain"]) == {str(n) for n in QUICK.scale_chain}
    assert scaling["concurrency"] == {}
    for name, r in scaling["chain"].items():
        _check_engine(f"scaling/chain/{name}", r)
    chain = results["meta"]["sizes"]["chain"]
    # A chain longer than the main one runs once, without the peers.
    longer = [n for n in QUICK.scale_chain if n > chain]
    assert longer and all("rounds" not in scaling["chain"][str(n)] for n in longer)
    assert not {str(n) for n in longer} & {*scaling["langgraph_chain"], *scaling["dbos_chain"]}
    for key in ("chain", "langgraph_chain", "dbos_chain"):
        if key != "chain":
            assert set(scaling[key]) <= set(scaling["chain"]), key
        for n, r in scaling[key].items():
            if int(n) <= chain:
                _keeps_every_round(f"scaling/{key}/{n}", r)
    _take_turns(log, ("scaling: embedded chain of 10 ", "scaling: langgraph chain of 10 ",
                      "scaling: dbos chain of 10 "))
    growth = results["summary"]["scaling"]["chain"]["wall_per_node_ms"]["growth"]
    assert growth is not None and growth > 0


@pytest.mark.parametrize("shape", Runner.ENGINE_SHAPES)
def test_etcd_redis_rounds_start_with_their_floor(tmp_path: Path, shape: str) -> None:
    results, _, log = _bench(tmp_path, ("etcd_redis",), (shape,))
    section = results["etcd_redis"]
    assert _shapes_of(section["workloads"]) == {shape}
    for name, r in section["workloads"].items():
        _check_engine(f"etcd_redis/{name}", r)
        _keeps_every_round(f"etcd_redis/{name}", r)
    assert section["floor"]["floor"]["etcd_redis_sequential"]["nodes_per_s"] > 0
    floors = section["floors"]
    assert len(floors) == QUICK.rounds and section["floor"] in floors
    # The section's workloads are held against the floor measured where it starts.
    held = [c for c in results["summary"]["comparisons"]
            if c["name"].startswith("etcd+Redis in-process")]
    assert held and all("this section's" in c["detail"] for c in held), held
    _judged_on_rounds(results, ("etcd+Redis in-process",))
    # The floor comes first in every round.
    etcd = [(label, r) for label, r in _started(log) if label.startswith("etcd+redis: ")]
    assert [r for _, r in etcd] == sorted(r for _, r in etcd)
    for r in range(1, QUICK.rounds + 1):
        this_round = [label for label, rr in etcd if rr == r]
        assert this_round[0] == "etcd+redis: etcd + Redis floor for this section"
        assert len(this_round) == 1 + len(section["workloads"]), this_round


@pytest.mark.parametrize("shape", Runner.ENGINE_SHAPES)
def test_api_and_executors(tmp_path: Path, shape: str) -> None:
    results = _bench(tmp_path, ("api",), (shape,)).results
    api = results["api"]
    assert api["status"] in ("measured", "not measured yet")
    if api["status"] != "measured":
        assert api["reason"]
        return
    assert _shapes_of(api["workloads"]) == {shape}
    for name, r in api["workloads"].items():
        assert "error" not in r, f"api/{name}: {r}"
        assert r["statuses"] == {"SUCCEEDED": r["tasks"]}, name
        # etcd write requests, counted by its revision: transactions merged into one
        # request (docs/stores.md) count once, so only "some" is certain.
        assert r["write_txns"] >= 1, name
        assert r["write_txns_per_node"] == round(r["write_txns"] / r["nodes"], 3), name
        _keeps_every_round(f"api/{name}", r)
    assert len(api["floors"]) == QUICK.rounds and api["floor"] in api["floors"]
    assert any(c["name"].startswith("API+executors") for c in results["summary"]["comparisons"])
