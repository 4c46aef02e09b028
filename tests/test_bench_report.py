"""The benchmark's judgement over rounds, on hand-made results: which round a workload
shows, and how a comparison pairs the rounds of its two sides.

Each figure below is chosen so that the median of the paired per-round ratios differs
from the ratio of the two sides' median rounds (and from any other pairing), so an
assertion on the value fails if the pairing is lost.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import report
from bench.common import Progress, median_round
from bench.runner import QUICK, SEQUENTIAL_FLOOR, Runner, Turn, keep_median

_LG_FIN = "embedded / LangGraph, financial_sequential wall time per node"
_ETCD_CHAIN = "etcd+Redis in-process chain_default_lane / floor"


def _engine(wall_per_node_ms: float) -> dict[str, Any]:
    """One run of a workload, as far as the report reads it."""
    return {"wall_per_node_ms": wall_per_node_ms,
            "nodes_per_s": round(1000 / wall_per_node_ms, 6)}


def _in_rounds(*rounds: dict[str, Any], figure: tuple[str, ...] = ("wall_per_node_ms",)
               ) -> dict[str, Any]:
    """A workload kept as the runner keeps it: its median round, every round under
    ``rounds``."""
    out: dict[str, dict[str, Any]] = {}
    keep_median(out, "w", figure)(list(rounds))
    return out["w"]


def _comparison(results: dict[str, Any], name: str) -> dict[str, Any]:
    comparisons: list[dict[str, Any]] = report.summarize(results)["comparisons"]
    found = [c for c in comparisons if c["name"] == name]
    assert len(found) == 1, [c["name"] for c in comparisons]
    return found[0]


def _vs_langgraph(ax: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    return _comparison({"embedded": {"workloads": {"financial_sequential": ax}},
                        "peer": {"langgraph": {"financial_sequential": peer}}}, _LG_FIN)


def test_a_peer_ratio_is_the_median_of_the_paired_round_ratios() -> None:
    # Rounds 3 / 2, 1 / 4, 2 / 8: ratios 1.5, 0.25, 0.25 → 0.25. The medians' ratio
    # (2 / 4) is 0.5, the sorted rounds' pairing 0.5, the reversed pairing 0.375.
    ax = _in_rounds(_engine(3), _engine(1), _engine(2))
    peer = _in_rounds(_engine(2), _engine(4), _engine(8))
    c = _vs_langgraph(ax, peer)
    assert c["value"] == 0.25
    assert c["met"] is True
    assert c["rounds"] == [1.5, 0.25, 0.25]
    # The figures are the sides' median rounds; the per-round ratios follow, in order.
    assert c["detail"] == "ax 2 ms vs LangGraph 4 ms; rounds 1.50, 0.25, 0.25"


def test_an_even_count_of_rounds_takes_the_mean_of_the_middle_two() -> None:
    # 1 / 4 and 3 / 2: ratios 0.25 and 1.5 → 0.875; the shown rounds (the lower
    # middle: 1 ms and 2 ms) would give 0.5.
    ax = _in_rounds(_engine(1), _engine(3))
    peer = _in_rounds(_engine(4), _engine(2))
    assert ax["wall_per_node_ms"] == 1 and peer["wall_per_node_ms"] == 2
    c = _vs_langgraph(ax, peer)
    assert c["value"] == 0.875
    assert c["met"] is False
    assert c["detail"].endswith("; rounds 0.25, 1.50")


def test_a_side_without_rounds_gives_the_single_ratio() -> None:
    # An older results file: the peer ran once. The ratio is of the figures shown.
    ax = _in_rounds(_engine(3), _engine(1), _engine(2))
    c = _vs_langgraph(ax, _engine(8))
    assert c["value"] == 0.25
    assert c["rounds"] == []
    assert c["detail"] == "ax 2 ms vs LangGraph 8 ms"


def test_a_round_that_failed_is_kept_but_neither_shown_nor_paired() -> None:
    failed = {"error": "exit 1", "stderr_tail": ["boom"]}
    ax = _in_rounds(failed, _engine(1), _engine(3))
    assert ax["rounds"][0] == failed and "error" not in ax
    assert ax["wall_per_node_ms"] == 1
    # Rounds 2 and 3 only: 1 / 4 and 3 / 10 → 0.25, 0.3 → 0.275.
    peer = _in_rounds(_engine(2), _engine(4), _engine(10))
    c = _vs_langgraph(ax, peer)
    assert c["value"] == 0.275
    assert c["rounds"] == [0.25, 0.3]


def test_a_workload_whose_every_round_failed_shows_the_failure() -> None:
    kept = _in_rounds({"error": "exit 1"}, {"error": "timed out after 300s"})
    assert kept["error"] == "exit 1" and len(kept["rounds"]) == 2
    assert not any(c["name"] == _LG_FIN for c in report.summarize(
        {"embedded": {"workloads": {"financial_sequential": kept}},
         "peer": {"langgraph": {"financial_sequential": _engine(2)}}})["comparisons"])


def _floor(sequential: float) -> dict[str, Any]:
    return {"floor": {"etcd_redis_sequential": {"nodes_per_s": sequential},
                      "etcd_redis_concurrent_8": {"nodes_per_s": 2 * sequential}}}


def _etcd_section(workload: dict[str, Any], *floors: dict[str, Any]) -> dict[str, Any]:
    """The run's first floor and an etcd + Redis section whose floor was measured in
    each round (as the runner keeps it)."""
    section: dict[str, Any] = {"workloads": {"chain_default_lane": workload},
                               "floor": median_round(floors, SEQUENTIAL_FLOOR),
                               "floors": list(floors)}
    return {"floor": {"floor": {"etcd_redis_sequential": {"nodes_per_s": 400.0}}},
            "etcd_redis": section}


def test_a_floor_ratio_pairs_each_round_with_the_floor_measured_in_that_round() -> None:
    # 100 / 200, 300 / 200, 200 / 1000 nodes/s: 50 %, 150 %, 20 % → 50 %, missed. The
    # shown rounds (200 against the median floor 200) would give 100 %, met.
    workload = _in_rounds(_engine(10), _engine(1000 / 300), _engine(5))
    results = _etcd_section(workload, _floor(200), _floor(200), _floor(1000))
    c = _comparison(results, _ETCD_CHAIN)
    assert c["value"] == 0.5
    assert c["met"] is False
    assert c["detail"] == (
        "200.0 nodes/s vs this section's etcd_redis_sequential floor 200 nodes/s (the "
        "run's first: 400.0); rounds 50.0%, 150.0%, 20.0%")


def test_a_floor_round_that_failed_is_not_paired() -> None:
    workload = _in_rounds(_engine(10), _engine(1000 / 300), _engine(5))
    results = _etcd_section(workload, _floor(200), {"error": "exit 1"}, _floor(1000))
    c = _comparison(results, _ETCD_CHAIN)
    assert c["rounds"] == [0.5, 0.2]
    assert c["value"] == 0.35


def test_a_section_without_floor_rounds_keeps_the_single_floor_ratio() -> None:
    workload = _in_rounds(_engine(10), _engine(1000 / 300), _engine(5))
    results = _etcd_section(workload, _floor(250))
    del results["etcd_redis"]["floors"]
    c = _comparison(results, _ETCD_CHAIN)
    assert c["value"] == 0.8 and c["rounds"] == []
    # Without a floor of its own the section is held against the run's first floor.
    del results["etcd_redis"]["floor"]
    c = _comparison(results, _ETCD_CHAIN)
    assert c["value"] == 0.5
    assert "the run's etcd_redis_sequential floor 400.0" in c["detail"]


def _sdk_run(wall_p50_ms: float, wall_over_cpu: float) -> dict[str, Any]:
    return {"run_wall": {"p50_ms": wall_p50_ms}, "run_cpu": {"p50_ms": 1.0},
            "wall_over_cpu": wall_over_cpu, "wall_s": 1.0, "cpu_s": 1.0, "runs": 10}


def test_the_one_shot_sdk_pairs_its_rounds_and_takes_the_median_wall_over_cpu() -> None:
    wall_p50 = ("run_wall", "p50_ms")
    ax = _in_rounds(_sdk_run(30, 1.2), _sdk_run(10, 1.8), _sdk_run(20, 1.4),
                    figure=wall_p50)
    langgraph = _in_rounds(_sdk_run(10, 1.0), _sdk_run(20, 1.0), _sdk_run(5, 1.0),
                           figure=wall_p50)
    comparisons = {c["name"]: c for c in report.summarize(
        {"sdk": {"ax_oneshot": ax, "langgraph_oneshot": langgraph}})["comparisons"]}
    # 30 / 10, 10 / 20, 20 / 5: 3, 0.5, 4 → 3 (the shown rounds, 20 / 10, give 2).
    per_call = comparisons["one-shot ax.run / LangGraph open + build + compile + invoke, "
                           "financial, per call (p50)"]
    assert per_call["value"] == 3 and per_call["met"] is False
    # Wall / CPU has one side: the rounds' values are listed in order (their median is
    # the next test's).
    wall_cpu = comparisons["one-shot ax.run wall / CPU, financial"]
    assert wall_cpu["rounds"] == [1.2, 1.8, 1.4]
    assert wall_cpu["value"] == 1.4


def test_the_one_shot_wall_over_cpu_is_the_rounds_median_not_the_shown_rounds() -> None:
    ax = _in_rounds(_sdk_run(30, 1.2), _sdk_run(10, 1.8), _sdk_run(20, 1.6),
                    figure=("run_wall", "p50_ms"))
    assert ax["wall_over_cpu"] == 1.6  # the round shown: 20 ms per call
    c = next(c for c in report.summarize({"sdk": {"ax_oneshot": ax}})["comparisons"]
             if c["name"] == "one-shot ax.run wall / CPU, financial")
    assert c["value"] == 1.6
    ax["rounds"][2]["wall_over_cpu"] = 1.3
    c = next(c for c in report.summarize({"sdk": {"ax_oneshot": ax}})["comparisons"]
             if c["name"] == "one-shot ax.run wall / CPU, financial")
    assert c["value"] == 1.3


def test_rounds_take_turns_and_each_turn_keeps_its_own_rounds() -> None:
    runner = Runner(QUICK, Progress(quiet=True))
    ran: list[str] = []
    kept: dict[str, list[dict[str, Any]]] = {}

    def turn(name: str) -> Turn:
        def run(label: str) -> dict[str, Any]:
            ran.append(label)
            return {"label": label}

        return Turn(name, run, lambda rounds: kept.__setitem__(name, rounds))

    runner._in_rounds([turn("ax"), turn("peer")])
    assert QUICK.rounds == 2
    assert ran == ["ax (round 1/2)", "peer (round 1/2)", "ax (round 2/2)",
                   "peer (round 2/2)"]
    assert kept == {"ax": [{"label": "ax (round 1/2)"}, {"label": "ax (round 2/2)"}],
                    "peer": [{"label": "peer (round 1/2)"}, {"label": "peer (round 2/2)"}]}


@pytest.mark.parametrize(("walls", "shown"), [((3, 1, 2), 2), ((4, 1), 1), ((5,), 5)])
def test_the_round_shown_is_the_median_by_its_figure(walls: tuple[int, ...],
                                                     shown: int) -> None:
    kept = _in_rounds(*(_engine(w) for w in walls))
    assert kept["wall_per_node_ms"] == shown
    assert [r["wall_per_node_ms"] for r in kept["rounds"]] == list(walls)
    assert all("rounds" not in r for r in kept["rounds"])


def test_the_engines_table_names_what_went_wrong_in_any_round() -> None:
    def run(wall: float, statuses: dict[str, int]) -> dict[str, Any]:
        return {**_engine(wall), "shape": "chain", "size": 10, "tasks": 1, "nodes": 10,
                "tasks_per_s": 1.0, "statuses": statuses}

    # The round shown (2 ms) went well; the others did not, and the table says so.
    kept = _in_rounds({"error": "exit 1"}, run(2, {"SUCCEEDED": 1}),
                      run(3, {"FAILED": 1}))
    row = next(line for line in report.markdown(
        {"embedded": {"workloads": {"chain": kept}}}).splitlines()
        if line.startswith("| ax embedded | chain |"))
    assert row.endswith("| round 1: failed (exit 1); round 3: not succeeded {'FAILED': 1} |")
