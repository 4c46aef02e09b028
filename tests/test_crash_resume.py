"""Crash test with real processes: ``ax run`` is SIGKILLed at seeded points across the
financial DAG (including between the store commit and the enqueue), then
``ax run --resume`` must finish every time with the path of an uninterrupted run, each
node committed exactly once (counted from the events) and the email sent once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from axengine.faults import POINTS

ROOT = Path(__file__).resolve().parents[1]
DAG = "dags/financial_risk_assessment.yaml"
INPUT = "dags/inputs/financial_risk_assessment.json"
#: How many crash points must actually kill the process.
REQUIRED_KILLS = 50


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AX_")}
    env["AX_HOME"] = str(home)
    env.update(extra)
    return env


def ax(home: Path, *args: str, fault: str | None = None,
       env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI. ``fault`` is ``name:n`` (an AX_FAULT_POINT) or ``time:SECONDS`` (a
    SIGKILL from outside after that long)."""
    extra = dict(env_extra or {})
    argv = [sys.executable, "-m", "axengine.cli", *args]
    if fault and not fault.startswith("time:"):
        extra["AX_FAULT_POINT"] = fault
    if fault and fault.startswith("time:"):
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=_env(home, extra), text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            out, err = proc.communicate(timeout=float(fault.split(":")[1]))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)
    return subprocess.run(
        argv, cwd=ROOT, env=_env(home, extra), text=True, capture_output=True, timeout=120,
        stdin=subprocess.DEVNULL, check=False)


def timeline(home: Path, task_id: str) -> dict[str, Any]:
    shown = ax(home, "tasks", "show", task_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


def crash_and_resume(home: Path, fault: str) -> dict[str, Any]:
    crashed = ax(home, "run", DAG, "--input", INPUT, "--quiet", fault=fault)
    if crashed.returncode != -signal.SIGKILL:
        return {"fault": fault, "killed": False, "rc": crashed.returncode}
    listed = ax(home, "tasks", "list", "--json")
    tasks = json.loads(listed.stdout) if listed.returncode == 0 else []
    if not tasks:
        # Killed before the submit transaction committed: nothing exists, nothing to resume.
        return {"fault": fault, "killed": True, "before_submit": True}
    task_id = tasks[0]["task_id"]
    resumed = ax(home, "run", "--resume", task_id, "--json")
    assert resumed.returncode == 0, (fault, resumed.stdout, resumed.stderr)
    result = json.loads(resumed.stdout)
    shown = timeline(home, task_id)
    return {"fault": fault, "killed": True, "result": result, "shown": shown,
            "mails": sorted(p.name for p in (home / "mail").glob("*.eml"))}


@pytest.mark.slow
def test_sigkill_anywhere_then_resume(tmp_path: Path) -> None:
    baseline = ax(tmp_path / "baseline", "run", DAG, "--input", INPUT, "--json")
    assert baseline.returncode == 0, baseline.stderr
    expected = json.loads(baseline.stdout)
    assert expected["status"] == "SUCCEEDED"
    expected_path = expected["path"]
    assert len(expected_path) >= 4

    # Every occurrence of every fault point in one run (counted with AX_FAULT_TRACE),
    # plus kills from outside at seeded random times.
    trace = tmp_path / "trace.txt"
    traced = ax(tmp_path / "traced", "run", DAG, "--input", INPUT, "--quiet",
                env_extra={"AX_FAULT_TRACE": str(trace)})
    assert traced.returncode == 0, traced.stderr
    hits: dict[str, int] = {}
    for name in trace.read_text().split():
        hits[name] = hits.get(name, 0) + 1
    assert set(hits) == set(POINTS), hits
    faults: list[str] = [f"{name}:{n}" for name in POINTS for n in range(1, hits[name] + 1)]
    rng = random.Random(2026)
    faults += [f"time:{rng.uniform(0.3, 2.5):.3f}" for _ in range(12)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(
            lambda i_f: crash_and_resume(tmp_path / f"run{i_f[0]}", i_f[1]), enumerate(faults)))

    killed = [o for o in outcomes if o["killed"]]
    resumed = [o for o in killed if not o.get("before_submit")]
    assert len(resumed) >= REQUIRED_KILLS, [o["fault"] for o in outcomes if not o["killed"]]
    assert any(o["fault"].startswith("after-commit") for o in killed)
    print(f"\ncrash points tried {len(faults)}, killed {len(killed)}, resumed {len(resumed)}")
    for outcome in killed:
        if outcome.get("before_submit"):
            assert outcome["fault"].startswith(("time:", "before-commit:1")), outcome
            continue
        result, shown = outcome["result"], outcome["shown"]
        assert result["status"] == "SUCCEEDED", outcome["fault"]
        assert result["path"] == expected_path, outcome["fault"]
        commits: dict[str, int] = {}
        for event in shown["events"]:
            if event["kind"] in ("committed", "decided"):
                commits[event["node_id"]] = commits.get(event["node_id"], 0) + 1
        assert commits == {node: 1 for node in expected_path}, outcome["fault"]
        assert len(outcome["mails"]) == 1, (outcome["fault"], outcome["mails"])
