"""A real model from configuration alone, from every process shape that runs nodes:
``ax server`` configured by ``ax.toml`` and ``ax executor`` configured by environment
(``ax run`` and ``ax.run`` are in tests/executors/test_llm_openai.py). The model is a
fake OpenAI-compatible endpoint on loopback (tests/fake_openai.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from axengine.client import Client
from tests.fake_openai import FakeOpenAI, fake_openai
from tests.topology import REPO, Topology, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FINANCIAL = REPO / "dags" / "financial_risk_assessment.yaml"
ACME = {"pdf_url": str(REPO / "dags" / "inputs" / "acme_annual_report.pdf")}
KEY = "sk-test-everywhere-0123456789"
METRICS = {"revenue_growth": 0.05, "net_profit_margin": 0.2, "debt_to_equity": 0.5}
SYSTEM = "You are a careful financial analyst."


def _answer(body: dict[str, Any]) -> str:
    prompt = body["messages"][-1]["content"]
    return json.dumps(METRICS) if "revenue_growth" in prompt else "plain answer"


def _check(api: FakeOpenAI, result: Any) -> str:
    """The financial run used the endpoint as configured; returns a summary."""
    assert result.status == "SUCCEEDED", result.errors
    (call,) = [c for c in api.calls if c.path.endswith("/chat/completions")]
    assert call.authorization == f"Bearer {KEY}"
    assert call.body["model"] == "gpt-4-turbo"
    assert call.body["temperature"] == 0.1
    assert call.system_prompt == SYSTEM
    usage = result.outputs["extract_metrics"]["_llm"]["usage"]
    assert usage["total_tokens"] > 0
    return (f"1 call to the fake endpoint (model {call.body['model']}, temperature "
            f"{call.body['temperature']}, system prompt, key), usage {usage}")


def test_ax_server_takes_its_model_from_ax_toml(tmp_path: Path,
                                                record_property: Any) -> None:
    with fake_openai(_answer, require_key=KEY) as api:
        (tmp_path / "ax.toml").write_text(
            f'home = "{tmp_path / "home"}"\n'
            "[handlers]\n"
            f'input_root = "{REPO / "dags" / "inputs"}"\n'
            "[llm]\n"
            f'base_url = "{api.base_url}"\napi_key = "{KEY}"\nsystem_prompt = "{SYSTEM}"\n')
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPENAI_", "AX_"))}
        server = subprocess.Popen(
            [sys.executable, "-m", "axengine.cli", "server", "--no-auth",
             "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        try:
            assert server.stdout is not None
            lines: list[str] = []
            url = wait_until(lambda: _http_url(server, lines), 30,
                             what="ax server listening")
            with Client(url) as client:
                result = client.run(FINANCIAL, ACME, timeout=25)
        finally:
            server.terminate()
            server.communicate(timeout=20)  # reaps it and closes its pipe
        record_property("summary", "ax server, configured by ax.toml only: "
                        + _check(api, result))


def _http_url(server: subprocess.Popen[str], lines: list[str]) -> str | None:
    assert server.stdout is not None
    line = server.stdout.readline()
    lines.append(line)
    if not line and server.poll() is not None:
        raise AssertionError("ax server exited:\n" + "".join(lines))
    match = re.search(r"http listening on (\S+)", line)
    return match.group(1) if match else None


def test_ax_executor_takes_its_model_from_the_environment(tmp_path: Path,
                                                          record_property: Any) -> None:
    with fake_openai(_answer, require_key=KEY) as api, \
            Topology(executors=0, root=tmp_path / "topo") as topo:
        index = topo.add_executor(start=False)
        topo.executors[index].env.update({
            "OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": KEY,
            "AX_LLM__SYSTEM_PROMPT": SYSTEM})
        topo.start_executor(index)
        with Client(topo.api_url, token=topo.token("submitter")) as client:
            result = client.run(FINANCIAL, ACME, timeout=25)
        record_property("summary", "ax executor, configured by environment only: "
                        + _check(api, result))


def test_retry_after_from_the_model_reaches_the_engine_through_ax_executor(
        tmp_path: Path, record_property: Any) -> None:
    """A 429 with ``Retry-After: 120`` from the model and its fallback: the node waits WAITING (no
    attempt spent) and is not offered again for 120 s, carried over gRPC from the
    executor to the engine."""
    with fake_openai(_answer, require_key=KEY) as api, \
            Topology(executors=0, root=tmp_path / "topo") as topo:
        # Both the model and its fallback answer 429.
        api.fail(429, times=2, headers={"Retry-After": "120"}, message="slow down")
        index = topo.add_executor(start=False)
        topo.executors[index].env.update({"OPENAI_BASE_URL": api.base_url,
                                          "OPENAI_API_KEY": KEY})
        topo.start_executor(index)
        with Client(topo.api_url, token=topo.token("submitter")) as client:
            task_id = client.submit(FINANCIAL, ACME).task_id

            def unavailable() -> Any:
                seen = [e for e in client.events(task_id) if e.kind == "unavailable"]
                return seen[0] if seen else None

            event = wait_until(unavailable, 25, what="the node kept WAITING")
    assert (event.node_id, event.state, event.attempt) == ("extract_metrics", "WAITING", 0)
    assert "Retry-After: 120s" in event.detail
    assert event.detail.endswith("(offered again in 120s)")
    record_property("summary", f"429 Retry-After 120 through ax executor: {event.detail}")


def test_ax_run_with_node_processes_takes_its_model_from_the_environment(
        record_property: Any) -> None:
    """--runner subprocess: each node runs in a clean process; the model provider's
    variables are the one credential that reaches it."""
    # A home the node user (nobody, under root) can reach; pytest's tmp_path is 0700.
    tmp_path = Path(tempfile.mkdtemp(prefix="ax-models-"))
    tmp_path.chmod(0o755)
    with fake_openai(_answer, require_key=KEY) as api, _removed(tmp_path):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AX_"))}
        env.update({"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": KEY,
                    "AX_LLM__SYSTEM_PROMPT": SYSTEM})
        done = subprocess.run(
            [sys.executable, "-m", "axengine.cli", "run", str(FINANCIAL), "--input",
             json.dumps(ACME), "--home", str(tmp_path / "home"), "--runner", "subprocess",
             "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout)
        (call,) = [c for c in api.calls if c.path.endswith("/chat/completions")]
    assert call.authorization == f"Bearer {KEY}" and call.system_prompt == SYSTEM
    usage = result["outputs"]["extract_metrics"]["_llm"]["usage"]
    record_property("summary", f"ax run --runner subprocess: 1 call from a node process "
                    f"(key, system prompt), usage {usage}")


@contextlib.contextmanager
def _removed(path: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)
