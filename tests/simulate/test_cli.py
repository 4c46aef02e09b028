"""``ax history export`` and ``ax simulate``: end to end on an embedded store, and the
errors that name the file to fix.

The commands are reached through a parser built with this module's ``register`` alone,
as ``ax`` builds its parser from every command module's ``register``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from axengine.cli.simulate import register
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import EngineConfig, RuleConfig
from axengine.local import LocalSession

SVG = "{http://www.w3.org/2000/svg}"

DAG = load_dag_text("""
name: sim-demo
nodes:
  draft:
    type: llm_call
    model: sim-small
    prompt: "Summarise {{ input.topic }}"
    simulate: {latency: 0.05, fail_attempts: 1}
    next: log
  log:
    type: tool_call
    tool: echo
    input: "{{ nodes.draft.output }}"
""")

FIXED = "kind: fixed\ntimeout: 0.04\n"
PERCENTILE = ("name: p50\nkind: percentile\npercentile: 50\nfactor: 2\nfallback: 5\n"
              "min_samples: 2\nstall_window: 30\n")


def ax(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ax")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def run_tasks(home: Path, count: int) -> None:
    # Fast retries: the first attempt of draft fails on purpose (simulate.fail_attempts).
    config = EngineConfig(rules=RuleConfig(backoff_base=0.01, backoff_cap=0.02))

    async def main() -> None:
        async with LocalSession(AxConfig(home=home), engine_config=config) as session:
            ids = [await session.submit(DAG, {"topic": f"topic {i}"}) for i in range(count)]
            for task_id in ids:
                assert (await session.wait(task_id, timeout=20)).status == "SUCCEEDED"

    asyncio.run(main())


def test_export_then_simulate_two_policies(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "ax"
    run_tasks(home, 3)
    history = tmp_path / "history.jsonl"
    assert ax(["history", "export", "--home", str(home), "-o", str(history)]) == 0
    assert "exported 9 node run(s) of 3 task(s)" in capsys.readouterr().err
    runs = [json.loads(line) for line in history.read_text().splitlines()]
    # Per task: draft fails once, then succeeds; log succeeds.
    assert sorted((r["node"], r["attempt"], r["outcome"]) for r in runs) == sorted(
        [("draft", 1, "failed"), ("draft", 2, "succeeded"), ("log", 1, "succeeded")] * 3)
    draft = next(r for r in runs if r["node"] == "draft")
    assert draft["type"] == "llm_call" and draft["model"] == "sim-small"
    assert draft["progress"] and draft["started"] <= draft["progress"][0] <= draft["ended"]
    assert next(r for r in runs if r["node"] == "log")["tool"] == "echo"

    # Only one DAG's tasks, to stdout.
    assert ax(["history", "export", "--home", str(home), "--dag", "other"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "exported 0 node run(s)" in captured.err

    fixed, pct = tmp_path / "fixed-40ms.yaml", tmp_path / "pct.yaml"
    fixed.write_text(FIXED)
    pct.write_text(PERCENTILE)
    plot = tmp_path / "cdf.svg"
    assert ax(["simulate", "--history", str(history), "--policy", str(fixed),
               "--policy", str(pct), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["POLICY", "RUNS", "TIMEOUTS"]
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    assert set(rows) == {"fixed-40ms", "p50"}       # named by file stem, or 'name'
    assert rows["fixed-40ms"][1] == rows["p50"][1] == "9"
    # Every draft run takes at least its 50 ms of latency: 40 ms kills all six.
    assert int(rows["fixed-40ms"][2]) >= 6 and int(rows["fixed-40ms"][4]) >= 6

    root = ET.parse(plot).getroot()
    assert root.tag == f"{SVG}svg"
    series = [g for g in root.iter(f"{SVG}g") if g.get("class") == "series"]
    assert [g.get("data-policy") for g in series] == ["fixed-40ms", "p50"]
    assert all(g.find(f"{SVG}path") is not None for g in series)
    assert root.find(f"{SVG}title") is not None


def test_simulate_names_the_bad_file(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "h.jsonl"
    history.write_text('{"task_id": "t", "dag": "d", "node": "n", "started": 0, '
                       '"duration": 1, "outcome": "succeeded"}\n{oops\n')
    good = tmp_path / "good.yaml"
    good.write_text(FIXED)
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: percentile\npercentile: 120\nfallback: 5\n")

    assert ax(["simulate", "--history", str(history), "--policy", str(good)]) == 2
    assert f"{history}:2: not valid JSON" in capsys.readouterr().err
    assert ax(["simulate", "--history", str(history), "--policy", str(good),
               "--policy", str(bad)]) == 2
    assert (f"{bad}: field 'percentile': must be between 0 and 100, got 120"
            in capsys.readouterr().err)
    missing = tmp_path / "missing.yaml"
    assert ax(["simulate", "--history", str(history), "--policy", str(missing)]) == 2
    assert f"{missing}: no such policy file" in capsys.readouterr().err
    assert ax(["simulate", "--history", str(tmp_path / "none.jsonl"),
               "--policy", str(good)]) == 2
    assert "none.jsonl: no such history file" in capsys.readouterr().err
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "good.yaml").write_text(FIXED)
    history.write_text(history.read_text().splitlines()[0] + "\n")
    assert ax(["simulate", "--history", str(history), "--policy", str(good),
               "--policy", str(twin / "good.yaml")]) == 2
    assert "policy name 'good' is also the name of" in capsys.readouterr().err


def test_simulate_runs_and_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "h.jsonl"
    history.write_text("".join(
        json.dumps({"task_id": f"t{i}", "dag": "d", "node": node, "started": 10 * i,
                    "duration": duration, "outcome": "succeeded"}) + "\n"
        for i, (node, duration) in enumerate([("a", 1), ("b", 3), ("a", 2)])))
    policy = tmp_path / "two.yaml"
    policy.write_text("kind: fixed\ntimeout: 2\n")
    assert ax(["simulate", "--history", str(history), "--policy", str(policy), "--node", "b",
               "--runs"]) == 0
    out = capsys.readouterr().out
    row = out.splitlines()[1].split()
    assert row[:5] == ["two", "1", "1", "0", "1"]
    assert "t1 b#1 succeeded 3 s: timeout 2 s (fixed) -> timeout at 2 s (false kill)" in out
