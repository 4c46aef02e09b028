"""The benchmark harness runs end to end in ``--quick`` mode and writes well-formed results.

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
from typing import Any

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


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    return results, (out / "results.md").read_text(), proc.stderr


@pytest.mark.timeout(600)
def test_every_section_is_present(quick_run: tuple[dict[str, Any], str, str]) -> None:
    results, markdown, stderr = quick_run
    for section in (*Runner.SECTIONS, "meta", "summary"):
        assert section in results, section
        if section not in ("meta", "summary"):
            assert "error" not in results[section], results[section].get("traceback")
    assert results["meta"]["quick"] is True
    assert len(results["meta"]["host"]["load_start"]) == 3
    for heading in ("## Targets", "## Floor", "## Engines, same shapes", "## Scaling",
                    "## The SDK as users call it", "## Reconciler pass cost",
                    "## Validation of a large DAG", "## Profile"):
        assert heading in markdown
    # Progress lines carry the elapsed time.
    assert "s] == floor" in stderr and "s] wrote " in stderr


@pytest.mark.timeout(600)
def test_floor_and_engines_are_well_formed(
        quick_run: tuple[dict[str, Any], str, str]) -> None:
    results = quick_run[0]
    floor = results["floor"]
    for key in ("sqlite_inprocess", "etcd_redis_sequential", "etcd_redis_concurrent_8"):
        assert floor["floor"][key]["nodes_per_s"] > 0, key
    for key in ("etcd", "etcd_raw_aetcd", "redis_queue", "redis_raw"):
        for mode in ("sequential", "concurrent_8"):
            assert floor[key][mode]["ops"] > 0 and floor[key][mode]["latency"]["p99_ms"] > 0
    # The etcd + Redis floor is measured again where its section starts, and the
    # section's workloads are held against that one.
    again = results["etcd_redis"]["floor"]["floor"]
    assert again["etcd_redis_sequential"]["nodes_per_s"] > 0
    held = [c for c in results["summary"]["comparisons"]
            if c["name"].startswith("etcd+Redis in-process")]
    assert held and all("this section's" in c["detail"] for c in held), held
    for section in ("embedded", "etcd_redis"):
        workloads = results[section]["workloads"]
        assert {"financial_sequential", "chain", "fanout"} <= {
            k.replace("_default_lane", "") for k in workloads}, section
        for name, r in workloads.items():
            _check_engine(f"{section}/{name}", r)
    for group in ("chain", "concurrency"):
        assert len(results["scaling"][group]) >= 2
        for name, r in results["scaling"][group].items():
            _check_engine(f"scaling/{group}/{name}", r)
    for peer in ("langgraph_chain", "dbos_chain"):
        assert set(results["scaling"][peer]) <= set(results["scaling"]["chain"]), peer


@pytest.mark.timeout(600)
def test_ax_and_the_peers_take_turns_shape_by_shape_and_size_by_size(
        quick_run: tuple[dict[str, Any], str, str]) -> None:
    # The machine's speed drifts over minutes: a ratio compares figures taken next to
    # each other, not sections apart, and its rounds take turns.
    log = quick_run[2]

    def at(label: str) -> int:
        found = log.find(label)
        assert found >= 0, label
        return found

    assert at("embedded: chain of") < at("langgraph: chain (") < at("dbos: chain (") \
        < at("embedded: fan-out/fan-in of") < at("langgraph: fanout (")
    # (The quick main chain has 20 nodes: its scaling entry reuses the engines' run.)
    assert at("scaling: embedded chain of 10 ") < at("scaling: langgraph chain of 10 ") \
        < at("scaling: dbos chain of 10 ") < at("scaling: chain of 20: reusing")

    # Every child started in rounds, in the order it started: (label, round).
    started = [(label, int(r)) for label, r in re.findall(
        r"\] (.+?) \(round (\d+)/\d+\) \.\.\.$", log, re.MULTILINE)]
    rounds = QUICK.rounds
    for turns in (("embedded: chain of", "langgraph: chain (", "dbos: chain ("),
                  ("sdk: ax.run x", "sdk: langgraph open"),
                  ("sdk: ax.open, engine.run x 1 (chain", "langgraph: chain (",
                   "dbos: chain ("),
                  ("scaling: embedded chain of 10 ", "scaling: langgraph chain of 10 ",
                   "scaling: dbos chain of 10 ")):
        # From the group's first line on: round 1 of each turn, then round 2 of each.
        first = next(i for i, (label, _) in enumerate(started) if label.startswith(turns[0]))
        got = [(next((t for t in turns if label.startswith(t)), label), r)
               for label, r in started[first:first + len(turns) * rounds]]
        assert got == [(t, r) for r in range(1, rounds + 1) for t in turns], got
    # The etcd + Redis section measures its floor first in every round.
    etcd = [(label, r) for label, r in started if label.startswith("etcd+redis: ")]
    assert [r for _, r in etcd] == sorted(r for _, r in etcd)
    for r in range(1, rounds + 1):
        this_round = [label for label, rr in etcd if rr == r]
        assert this_round[0] == "etcd+redis: etcd + Redis floor for this section"
        assert len(this_round) == 8, this_round


@pytest.mark.timeout(600)
def test_compared_workloads_keep_every_round(
        quick_run: tuple[dict[str, Any], str, str]) -> None:
    results = quick_run[0]
    rounds = QUICK.rounds
    assert results["meta"]["sizes"]["rounds"] == rounds > 1
    kept: dict[str, Any] = {
        **{f"embedded/{n}": r for n, r in results["embedded"]["workloads"].items()},
        **{f"etcd_redis/{n}": r for n, r in results["etcd_redis"]["workloads"].items()},
        **{f"sdk/{n}": results["sdk"][n] for n in ("ax_oneshot", "langgraph_oneshot",
                                                   "ax_reuse_financial", "ax_reuse_chain")},
        **{f"{peer}/{n}": r for peer in ("langgraph", "dbos")
           for n, r in results["peer"][peer].items()},
        **{f"sdk/{peer}/{n}": r for peer, runs in results["sdk"]["peers"].items()
           for n, r in runs.items()},
        **{f"scaling/{key}/{n}": results["scaling"][key][n]
           for key in ("chain", "langgraph_chain", "dbos_chain")
           for n in results["scaling"][key] if int(n) <= results["meta"]["sizes"]["chain"]},
    }
    if results["api"]["status"] == "measured":
        kept.update({f"api/{n}": r for n, r in results["api"]["workloads"].items()})
    for name, r in kept.items():
        assert len(r["rounds"]) == rounds, name
        # The result shown is one of its rounds, and a round holds no rounds of its own.
        assert {k: v for k, v in r.items() if k != "rounds"} in r["rounds"], name
        assert all("rounds" not in each for each in r["rounds"]), name
    for section in ("etcd_redis", "api"):
        if section == "api" and results["api"]["status"] != "measured":
            continue
        floors = results[section]["floors"]
        assert len(floors) == rounds and results[section]["floor"] in floors, section
    # Every ratio with two sides was judged on its rounds (a peer whose package is not
    # installed here has no side to pair with).
    missing = [f"/ {label}" for label, key in (("LangGraph", "langgraph"), ("DBOS", "dbos"))
               if _peer_missing(results["peer"][key]["chain"])]
    judged = [c for c in results["summary"]["comparisons"]
              if c["name"].startswith(("embedded / ", "etcd+Redis in-process", "one-shot"))
              and not any(m in c["name"] for m in missing)]
    assert judged and all(len(c["rounds"]) == rounds for c in judged), judged


def test_peer_api_validation_profile_and_summary(
        quick_run: tuple[dict[str, Any], str, str]) -> None:
    results = quick_run[0]
    peer = results["peer"]["langgraph"]
    for name in ("langgraph", "dbos"):
        workloads = results["peer"][name]
        assert set(workloads) == {"financial_sequential", "financial_concurrent", "chain",
                                  "fanout"}, name
        for r in workloads.values():
            if _peer_missing(r):
                continue
            assert r["nodes"] == r["nodes_per_task"] * r["tasks"] and r["nodes_per_s"] > 0
            if name == "dbos":
                # Every step's output is in the system database, on a durable SQLite.
                assert r["recorded_steps"] == r["nodes"], r
                assert r["sqlite"] == {"journal_mode": "wal", "synchronous": 2}, r
    assert results["peer"]["celery"]["status"] == "skipped"

    api = results["api"]
    assert api["status"] in ("measured", "not measured yet")
    if api["status"] == "measured":
        for name, r in api["workloads"].items():
            assert "error" not in r, f"api/{name}: {r}"
            assert r["statuses"] == {"SUCCEEDED": r["tasks"]}, name
            assert r["write_txns"] >= r["nodes"], name
    else:
        assert api["reason"]

    validation = results["validation"]
    for variant in ("literal", "template_per_node"):
        assert validation[variant]["min_s"] > 0
    assert results["profile"]["by_tottime"] and results["profile"]["total_s"] > 0

    comparisons = results["summary"]["comparisons"]
    names = [c["name"] for c in comparisons]
    assert any(n.startswith("etcd+Redis in-process") for n in names)
    assert any(n.startswith("embedded / LangGraph") for n in names) or any(
        "error" in r for r in peer.values())
    for c in comparisons:
        assert set(c) >= {"name", "value", "target", "met", "detail"}
    growth = results["summary"]["scaling"]["chain"]["wall_per_node_ms"]["growth"]
    assert growth is not None and growth > 0


@pytest.mark.timeout(600)
def test_sdk_and_reconciler_are_well_formed(
        quick_run: tuple[dict[str, Any], str, str]) -> None:
    results = quick_run[0]
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
    assert sdk["ax_reuse_chain"]["size"] == sizes["chain"]
    assert sdk["ax_reuse_financial"]["open_s"] > 0
    if not _peer_missing(sdk["langgraph_oneshot"]):
        assert sdk["langgraph_oneshot"]["run_wall"]["n"] == sizes["sdk_oneshot_runs"]
    # The peers' runs next to the reusable engine's, which its targets are held against.
    for peer in ("langgraph", "dbos"):
        for name in ("financial_sequential", "chain"):
            r = sdk["peers"][peer][name]
            if not _peer_missing(r):
                assert r["nodes"] > 0 and r["wall_per_node_ms"] > 0, (peer, name)

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
    assert any(n.startswith("one-shot ax.run wall / CPU") for n in names)
    assert any(n.startswith("reusable engine / ") for n in names) or any(
        _peer_missing(r) for r in results["peer"]["langgraph"].values())
