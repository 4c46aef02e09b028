"""Crash test with real processes: ``ax run`` is SIGKILLed at seeded points across the
financial DAG (including between the store commit and the enqueue), then
``ax run --resume`` must finish every time with the path of an uninterrupted run, each
node committed exactly once (counted from the events) and the email sent once.

One case per crash: every occurrence of every fault point of one run
(``after-commit#3`` is the 3rd time the run passes ``faults.point("after-commit")``),
then SIGKILLs from outside at seeded random times (``time#1-1.234s``). The occurrences
are planned in :data:`SCENARIOS` and :func:`test_planned_crash_points_match_a_fresh_trace`
fails as soon as a fresh ``AX_FAULT_TRACE`` of the run differs, so the plan can neither
shrink nor fall behind silently. :func:`test_crash_summary` (last) prints the figures of
the whole module: crash points tried, killed, resumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from axengine.config import AxConfig
from axengine.faults import POINTS
from axengine.records import Event
from axengine.wiring import build_runtime

#: Every test here runs ``ax`` processes; the crash cases are also ``slow``.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DAG = "dags/financial_risk_assessment.yaml"
#: How many crash cases must actually kill the process and then resume.
REQUIRED_KILLS = 50


@dataclass(frozen=True)
class Scenario:
    """One uninterrupted run of DAG that the crash cases interrupt.

    ``hits``: how many times the run passes each fault point, as counted with
    ``AX_FAULT_TRACE`` (the run is deterministic). One crash case per occurrence; update
    it from the message of the trace test when the engine changes.
    """

    args: tuple[str, ...]
    hits: dict[str, int]
    #: Gate decisions given up front (again on ``--resume``).
    decide: tuple[str, ...] = ()
    #: The DAG file it runs.
    dag: str = DAG
    #: Emails the run sends (each exactly once, crash or not).
    mails: int = 1


SCENARIOS: dict[str, Scenario] = {
    # The medium-risk path: a chain whose nodes the worker claims in the transaction
    # that commits their predecessor (one pop for the whole task).
    "medium": Scenario(("--input", "dags/inputs/financial_risk_assessment.json"), {
        "before-commit": 8,
        "after-commit": 8,
        "after-enqueue": 1,
        "after-pop": 1,
        "after-claim": 4,
        "handler-running": 4,
        "before-complete": 4,
        "after-complete": 4,
        "after-ack": 1,
        "effect-begun": 1,
        "effect-performed": 1,
    }),
    # The high-risk path through the human gate, approved up front: the decision
    # readies notify_high_risk through the queue again.
    "gate": Scenario(("--input", '{"pdf_url": "dags/inputs/globex_annual_report.pdf"}'), {
        "before-commit": 10,
        "after-commit": 10,
        "after-enqueue": 2,
        "after-pop": 2,
        "after-claim": 4,
        "handler-running": 4,
        "before-complete": 4,
        "after-complete": 4,
        "after-ack": 2,
        "effect-begun": 1,
        "effect-performed": 1,
    }, decide=("--decide", "send_high_risk_email=approve")),
}
#: Kills from outside after a seeded random delay (the same 12 delays on every run).
_rng = random.Random(2026)
TIMED_KILLS: list[float] = [round(_rng.uniform(0.3, 2.5), 3) for _ in range(12)]

#: ``(id, scenario, fault)``: ``fault`` is ``name:n`` (an AX_FAULT_POINT) or
#: ``time:SECONDS``.
POINT_CASES = [(f"{scenario}-{name}#{n}", scenario, f"{name}:{n}")
               for scenario, plan in SCENARIOS.items()
               for name in POINTS for n in range(1, plan.hits.get(name, 0) + 1)]
TIMED_CASES = [(f"medium-time#{i}-{delay:.3f}s", "medium", f"time:{delay:.3f}")
               for i, delay in enumerate(TIMED_KILLS, 1)]


@dataclass(frozen=True)
class Outcome:
    """What one crash case did (for :func:`test_crash_summary`)."""

    fault: str
    killed: bool
    resumed: bool


#: Outcomes of the crash cases run in this process, by scenario and fault.
OUTCOMES: dict[str, Outcome] = {}


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
        argv, cwd=ROOT, env=_env(home, extra), text=True, capture_output=True, timeout=60,
        stdin=subprocess.DEVNULL, check=False)


def stored(home: Path, task_id: str | None = None) -> tuple[str | None, list[Event]]:
    """The task in ``home`` (None: nothing was submitted) and its events, read from the
    store in this process, as ``ax tasks list``/``show`` do (two fewer ax processes per
    crash case)."""
    async def read() -> tuple[str | None, list[Event]]:
        runtime = build_runtime(AxConfig.from_env(env={}, home=home))
        try:
            found = task_id
            if found is None:
                tasks = await runtime.engine.list_tasks()
                found = tasks[0].task_id if tasks else None
            return found, (await runtime.engine.events(found) if found else [])
        finally:
            await runtime.close()

    return asyncio.run(read())


@dataclass(frozen=True)
class Reference:
    """The uninterrupted run: its result and the fault points it passed, in order."""

    result: dict[str, Any]
    trace: list[str]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    """One uninterrupted run of each scenario, traced with ``AX_FAULT_TRACE``."""
    out = {}
    for name, scenario in SCENARIOS.items():
        tmp = tmp_path_factory.mktemp(f"reference-{name}")
        trace = tmp / "trace.txt"
        run = ax(tmp / "home", "run", scenario.dag, *scenario.args, *scenario.decide, "--json",
                 env_extra={"AX_FAULT_TRACE": str(trace)})
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert result["status"] == "SUCCEEDED"
        assert len(result["path"]) >= 4
        out[name] = Reference(result, trace.read_text().split())
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_planned_crash_points_match_a_fresh_trace(scenario: str,
                                                  references: dict[str, Reference]) -> None:
    hits = dict(Counter(references[scenario].trace))
    assert set(hits) == set(POINTS), hits
    assert hits == SCENARIOS[scenario].hits, (
        f"the {scenario} run passes its fault points a different number of times now; "
        f"set its hits to {dict((p, hits.get(p, 0)) for p in POINTS)}")


def crash_and_resume(home: Path, scenario: str, fault: str,
                     expected_path: list[str], plan: Scenario | None = None,
                     path_key: Callable[[list[str]], Any] = list) -> Outcome:
    """Kill ``ax run`` of ``scenario`` at ``fault``, resume it, check the resumed task;
    return what happened. ``plan``: the scenario when it is not one of
    :data:`SCENARIOS`; ``path_key``: what of the path must equal the uninterrupted
    run's (all of it, by default)."""
    plan = plan or SCENARIOS[scenario]
    crashed = ax(home, "run", plan.dag, *plan.args, *plan.decide, "--quiet", fault=fault)
    if crashed.returncode != -signal.SIGKILL:
        assert crashed.returncode == 0, (fault, crashed.returncode, crashed.stderr)
        return Outcome(fault, killed=False, resumed=False)
    task_id, _ = stored(home)
    if task_id is None:
        # Killed before the submit transaction committed: nothing exists, nothing to resume.
        assert fault.startswith(("time:", "before-commit:1")), fault
        return Outcome(fault, killed=True, resumed=False)
    resumed = ax(home, "run", "--resume", task_id, *plan.decide, "--json")
    assert resumed.returncode == 0, (fault, resumed.stdout, resumed.stderr)
    result = json.loads(resumed.stdout)
    assert result["status"] == "SUCCEEDED", fault
    assert path_key(result["path"]) == path_key(expected_path), fault
    # Each node committed once per time the path passes it (a loop's node once a visit).
    commits = Counter(event.node_id for event in stored(home, task_id)[1]
                      if event.kind in ("committed", "decided"))
    assert commits == Counter(expected_path), fault
    mails = sorted(p.name for p in (home / "mail").glob("*.eml"))
    assert len(mails) == plan.mails, (fault, mails)
    return Outcome(fault, killed=True, resumed=True)


def _record(scenario: str, outcome: Outcome) -> None:
    OUTCOMES[f"{scenario}-{outcome.fault}"] = outcome
    state = ("resumed" if outcome.resumed else "killed before submit" if outcome.killed
             else "not killed")
    print(f"{scenario} {outcome.fault}: {state}")


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "fault"), [(s, f) for _, s, f in POINT_CASES],
                         ids=[i for i, _, _ in POINT_CASES])
def test_sigkill_at_fault_point_then_resume(scenario: str, fault: str,
                                            references: dict[str, Reference],
                                            tmp_path: Path) -> None:
    outcome = crash_and_resume(tmp_path, scenario, fault,
                               references[scenario].result["path"])
    _record(scenario, outcome)
    # The run passes this point (see the trace test), so it must have died there.
    assert outcome.killed, f"{scenario}: {fault} did not kill ax run"


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "fault"), [(s, f) for _, s, f in TIMED_CASES],
                         ids=[i for i, _, _ in TIMED_CASES])
def test_sigkill_at_random_time_then_resume(scenario: str, fault: str,
                                            references: dict[str, Reference],
                                            tmp_path: Path) -> None:
    # A delay longer than the run kills nothing: the case then only counts as tried.
    _record(scenario, crash_and_resume(tmp_path, scenario, fault,
                                       references[scenario].result["path"]))


@pytest.mark.slow
def test_crash_summary(record_property: Any) -> None:
    """The whole module's figures; needs every crash case above in this process."""
    tried = [f"{s}-{f}" for _, s, f in POINT_CASES + TIMED_CASES]
    missing = [f for f in tried if f not in OUTCOMES]
    if missing:
        pytest.skip(f"{len(missing)} of {len(tried)} crash cases did not run here "
                    "(deselected, failed or in another worker)")
    killed = [o for o in OUTCOMES.values() if o.killed]
    resumed = [o for o in killed if o.resumed]
    summary = (f"crash points tried {len(tried)}, killed {len(killed)}, "
               f"resumed {len(resumed)}")
    print(summary)
    record_property("summary", summary)
    assert len(resumed) >= REQUIRED_KILLS, [o.fault for o in OUTCOMES.values() if not o.killed]
    assert any(o.fault.startswith("after-commit") for o in killed)
