"""Observability: metrics of every process (the executor's own ``/metrics`` included),
the cost of a scrape, REST route labels, JSON logs and the access log
(docs/observability.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from axengine.api import Authenticator, ServerOptions
from axengine.api._rest import create_app
from axengine.cli import build_parser
from axengine.cli.executor import metrics_server
from axengine.config import AxConfig
from axengine.dag import load_dag_text
from axengine.engine import Engine
from axengine.errors import InputError
from axengine.logs import ACCESS_LOGGER, FIELDS, JsonFormatter
from axengine.metrics import AxMetrics, MetricsServer, waiting_age
from axengine.queue.inprocess import InProcessQueue
from axengine.records import NodeState, Snapshot
from axengine.settings import SettingsError, load_settings
from axengine.store import KeyValue, StateStore, StoreWrapper
from axengine.store.embedded import SqliteStore
from executors.contract import Success
from tests.api.conftest import HANDLER_SETTINGS, start_server
from tests.fake_openai import fake_openai
from tests.topology import Topology, wait_until

TOKENS = {"tok-observer-0123456789": ("observer", ["submit"])}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition: (name, sorted labels) → value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


# ---------------------------------------------------------------------- every registry


def test_every_registry_has_process_runtime_and_model_metrics() -> None:
    text = generate_latest(AxMetrics().registry).decode()
    found = samples(text)
    names = {name for name, _ in found}
    rss = value(found, "process_resident_memory_bytes")
    print(f"{len(names)} sample names; resident memory {rss} bytes")
    assert rss is not None and rss > 0
    assert value(found, "process_cpu_seconds_total") is not None
    assert "python_info" in names
    assert any(name.startswith("python_gc_") for name in names)
    families = {f.name for f in text_string_to_metric_families(text)}
    for family in ("ax_llm_request_seconds", "ax_node_run_seconds", "ax_nodes",
                   "ax_oldest_waiting_seconds", "ax_queue_depth", "ax_api_requests",
                   "ax_llm_tokens"):
        assert family in families, family


def test_waiting_age_counts_due_waiting_nodes_only() -> None:
    def snap(state: NodeState, ready_at: float, not_before: float = 0.0) -> Snapshot:
        return Snapshot(task_id="t", node_id="n", state=state, ready_at=ready_at,
                        not_before=not_before)

    assert waiting_age(snap(NodeState.WAITING, 100.0), 130.0) == 30.0
    # Due once its backoff ended, not since it became ready.
    assert waiting_age(snap(NodeState.WAITING, 100.0, not_before=120.0), 130.0) == 10.0
    assert waiting_age(snap(NodeState.WAITING, 100.0, not_before=140.0), 130.0) is None
    assert waiting_age(snap(NodeState.RUNNING, 100.0), 130.0) is None
    assert waiting_age(snap(NodeState.WAITING, 0.0), 130.0) is None


# ---------------------------------------------------------------------- scrape cost


class RecordingStore(StoreWrapper):
    """Records every read: the keys and prefixes asked for, and the keys answered."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.calls = 0
        self.keys: list[str] = []

    async def get(self, key: str) -> KeyValue | None:
        self.calls += 1
        self.keys.append(key)
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, KeyValue]:
        self.calls += 1
        self.keys.extend(keys)
        return await self.inner.get_many(keys)

    async def range(self, prefix: str, *, start_after: str | None = None,
                    limit: int = 0) -> list[KeyValue]:
        self.calls += 1
        found = await self.inner.range(prefix, start_after=start_after, limit=limit)
        self.keys += [prefix, *(kv.key for kv in found)]
        return found

    async def count(self, prefix: str) -> int:
        self.calls += 1
        self.keys.append(prefix)
        return await self.inner.count(prefix)


DONE_DAG = "name: done\nnodes:\n  a: {type: tool_call, tool: echo, input: {x: 1}}\n"
OPEN_DAG = """\
name: open
nodes:
  run: {type: tool_call, tool: echo, input: {x: 1}}
  wait: {type: tool_call, tool: echo, input: {x: 2}, lane: fast}
  gate: {type: human_gateway, description: check, timeout: 3600}
"""


async def _scrape_after(finished: int, home: Path) -> tuple[int, list[str], list[str],
                                                             dict[Any, float], str]:
    """A store with ``finished`` SUCCEEDED tasks and one open task (a RUNNING node, a
    WAITING node of the fast lane due for 30 s, a PAUSED gate); the reads of one scrape."""
    now = [1_000_000.0]
    store = RecordingStore(SqliteStore(path=home / "ax.db"))
    engine = Engine(store=store, queue=InProcessQueue(), blob_dir=home / "blobs",
                    clock=lambda: now[0])
    metrics = AxMetrics()
    metrics.attach(engine)
    try:
        done = load_dag_text(DONE_DAG)
        finished_ids = []
        for _ in range(finished):
            task_id = (await engine.submit(done, {})).task_id
            claim = await engine.claim(task_id, "a", worker="w", lease_seconds=30)
            assert await engine.complete(task_id, "a", fence=claim.request.fence,
                                         outcome=Success({})) == "committed"
            finished_ids.append(task_id)
        open_id = (await engine.submit(load_dag_text(OPEN_DAG), {})).task_id
        assert (await engine.claim(open_id, "run", worker="w",
                                   lease_seconds=300)).result == "claimed"
        now[0] += 30
        await metrics.render(engine)  # drains the commit events, caches the DAG
        store.calls, store.keys = 0, []
        text = (await metrics.render(engine)).decode()
        return store.calls, store.keys, finished_ids, samples(text), open_id
    finally:
        await store.close()


def test_a_scrape_reads_no_finished_task(tmp_path: Path, record_property: Any) -> None:
    (tmp_path / "few").mkdir()
    (tmp_path / "many").mkdir()
    few = asyncio.run(_scrape_after(10, tmp_path / "few"))
    many = asyncio.run(_scrape_after(200, tmp_path / "many"))
    for _, keys, finished_ids, found, open_id in (few, many):
        # The reads are real (the open task is read) and never touch a finished task.
        assert any(open_id in key for key in keys)
        touched = [key for key in keys if any(tid in key for tid in finished_ids)]
        assert touched == [], touched[:3]
        assert value(found, "ax_nodes", state="running") == 1
        assert value(found, "ax_nodes", state="waiting") == 1
        assert value(found, "ax_nodes", state="paused") == 1
        assert value(found, "ax_oldest_waiting_seconds", lane="fast") == 30
        assert value(found, "ax_oldest_waiting_seconds", lane="default") == 0
    assert few[0] == many[0]
    assert len(few[1]) == len(many[1])
    summary = (f"one scrape: {few[0]} store reads / {len(few[1])} keys with 10 finished "
               f"tasks, {many[0]} / {len(many[1])} with 200; no finished task read")
    print(summary)
    record_property("summary", summary)


# ---------------------------------------------------------------------- node runs (ax server)

RUN_DAG = """\
name: timed
nodes:
  first: {type: tool_call, tool: echo, input: {x: 1}, next: second}
  second: {type: llm_call, model: gpt-3.5-turbo, prompt: say hi}
"""


def test_the_in_process_executor_times_node_runs(tmp_path: Path,
                                                 record_property: Any) -> None:
    options = ServerOptions(
        config=AxConfig.from_env(env={}, home=tmp_path / "home",
                                 handler_settings=HANDLER_SETTINGS),
        http="127.0.0.1:0", grpc=None, run_worker=True, reconcile_interval=3600.0)
    handle = start_server(options)
    try:
        client = handle.client(None)
        reply = client.post("/v1/tasks", json={"dag_yaml": RUN_DAG, "input": {}})
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["task_id"]
        wait_until(lambda: client.get(f"/v1/tasks/{task_id}").json()["status"]
                   == "SUCCEEDED", 20, what="the task succeeded")
        found = samples(client.get("/metrics").text)
    finally:
        handle.stop()
    echo = value(found, "ax_node_run_seconds_count", node_type="tool_call", target="echo")
    llm = value(found, "ax_node_run_seconds_count", node_type="llm_call",
                target="gpt-3.5-turbo")
    llm_sum = value(found, "ax_node_run_seconds_sum", node_type="llm_call",
                    target="gpt-3.5-turbo")
    summary = (f"ax server: ax_node_run_seconds count tool_call/echo {echo}, "
               f"llm_call/gpt-3.5-turbo {llm} (sum {llm_sum}s); ax_nodes after the run "
               f"{[value(found, 'ax_nodes', state=s) for s in ('running', 'waiting')]}")
    print(summary)
    record_property("summary", summary)
    assert echo == 1 and llm == 1
    assert llm_sum is not None and llm_sum > 0
    assert value(found, "ax_nodes", state="running") == 0
    assert value(found, "ax_nodes", state="waiting") == 0


# ---------------------------------------------------------------------- route labels


def test_route_labels_are_templates_and_unknown_paths_unmatched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "hello.txt").write_text("hi")
    sub = FastAPI()

    @sub.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    token = next(iter(TOKENS))
    calls = [
        ("GET", "/docs", None), ("GET", "/openapi.json", None), ("GET", "/metrics", None),
        ("GET", "/healthz", None), ("DELETE", "/healthz", None),
        ("GET", "/v1/tasks/t-nope", token), ("GET", "/v1/tasks/t-other", None),
        ("GET", "/files/hello.txt", None), ("GET", "/files/missing.txt", None),
        ("GET", "/sub/items/7", None), ("GET", "/sub/items/8", None),
        ("GET", "/no/such/path", None), ("GET", "/other%0Apath", None),
    ]

    async def main() -> tuple[list[int], str]:
        store = SqliteStore(path=tmp_path / "ax.db")
        engine = Engine(store=store, queue=InProcessQueue(), blob_dir=tmp_path / "blobs")
        metrics = AxMetrics()
        app = create_app(engine=engine, auth=Authenticator.from_tokens(TOKENS),
                         metrics=metrics)
        app.mount("/files", StaticFiles(directory=tmp_path / "files"), name="files")
        app.mount("/sub", sub)
        statuses = []
        try:
            transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 4321))
            async with httpx.AsyncClient(transport=transport, base_url="http://ax") as c:
                for method, path, bearer in calls:
                    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
                    statuses.append((await c.request(method, path, headers=headers))
                                    .status_code)
            return statuses, (await metrics.render(engine)).decode()
        finally:
            await store.close()

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    statuses, text = asyncio.run(main())
    counted = {(labels["method"], labels["route"], labels["code"]): v
               for (name, items), v in samples(text).items()
               if name == "ax_api_requests_total" for labels in [dict(items)]}
    print("ax_api_requests_total:", sorted(counted.items()))
    assert statuses == [200, 200, 200, 200, 405, 404, 401, 200, 404, 200, 200, 404, 404]
    assert counted == {
        ("GET", "/docs", "200"): 1, ("GET", "/openapi.json", "200"): 1,
        ("GET", "/metrics", "200"): 1, ("GET", "/healthz", "200"): 1,
        ("DELETE", "/healthz", "405"): 1,
        ("GET", "/v1/tasks/{task_id}", "404"): 1,
        # Refused by the authentication middleware, before routing: still its route.
        ("GET", "/v1/tasks/{task_id}", "401"): 1,
        ("GET", "/files", "200"): 1, ("GET", "/files", "404"): 1,
        ("GET", "/sub/items/{item_id}", "200"): 2,
        ("GET", "unmatched", "404"): 2,
    }
    # Every request is timed under the same labels, less the status.
    timed = {(labels["method"], labels["route"]): v
             for (name, items), v in samples(text).items()
             if name == "ax_api_request_seconds_count" for labels in [dict(items)]}
    assert sum(timed.values()) == len(statuses) == sum(counted.values())
    assert timed[("GET", "/v1/tasks/{task_id}")] == 2

    # The access log: one line per request, in order, with the route and the principal.
    records = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    fields = [getattr(r, FIELDS) for r in records]
    assert [(f["method"], f["status"]) for f in fields] == \
        [(m, s) for (m, _, _), s in zip(calls, statuses, strict=True)]
    by_path = {f["path"]: f for f in fields}
    assert by_path["/v1/tasks/t-nope"]["principal"] == "observer"
    assert by_path["/v1/tasks/t-nope"]["route"] == "/v1/tasks/{task_id}"
    assert by_path["/v1/tasks/t-other"]["principal"] == "-"
    assert by_path["/files/missing.txt"]["route"] == "/files"
    assert all(f["client"] == "10.1.2.3" and f["duration_ms"] >= 0 for f in fields)
    # The path as sent (percent-encoded): a newline in it cannot start a log line.
    assert "/other%0Apath" in by_path
    assert all("\n" not in r.getMessage() for r in records)
    assert all(token not in r.getMessage() for r in records)
    print(records[5].getMessage())


# ---------------------------------------------------------------------- logs


def test_json_formatter_writes_one_object_per_record() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("axengine.x", logging.ERROR, __file__, 1, "failed %s",
                                   ("here",), sys.exc_info())
    record.created = 0.25
    setattr(record, FIELDS, {"status": 500, "message": "not this one"})
    line = JsonFormatter().format(record)
    print(line)
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["time"] == "1970-01-01T00:00:00.250Z"
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "ERROR", "axengine.x", "failed here")
    assert entry["status"] == 500
    assert entry["exception"].startswith("Traceback") and "ValueError: boom" in \
        entry["exception"]


def test_log_and_metrics_settings_come_from_every_layer(tmp_path: Path) -> None:
    path = tmp_path / "ax.toml"
    path.write_text('log_format = "json"\naccess_log = false\n'
                    'metrics_address = "0.0.0.0:9464"\n')
    loaded = load_settings(env={}, config_file=path)
    s = loaded.settings
    assert (s.log_format, s.access_log, s.metrics_address) == ("json", False, "0.0.0.0:9464")
    assert loaded.source_of("metrics_address") == f"{path}:3"
    env = {"AX_LOG_FORMAT": "text", "AX_METRICS_ADDRESS": "127.0.0.1:0",
           "AX_ACCESS_LOG": "true"}
    loaded = load_settings(env=env, config_file=path)
    assert (loaded.settings.log_format, loaded.settings.access_log,
            loaded.settings.metrics_address) == ("text", True, "127.0.0.1:0")
    assert loaded.source_of("log_format") == "AX_LOG_FORMAT"
    # The flags as `ax executor` and `ax server` pass them win; "off" turns it off.
    args = build_parser().parse_args(["executor", "--api", "a:1", "--queue", "redis://r",
                                      "--metrics-address", "off", "--log-format", "json"])
    flags = {"log_format": args.log_format, "metrics_address": args.metrics_address}
    s = load_settings(env=env, flags=flags, config_file=path).settings
    assert (s.log_format, s.metrics_address) == ("json", "")
    assert metrics_server(AxMetrics(), s.metrics_address) is None
    server = build_parser().parse_args(["server", "--no-access-log"])
    assert load_settings(env=env, flags={"access_log": server.access_log},
                         config_file=path).settings.access_log is False
    with pytest.raises(SettingsError, match=r"AX_METRICS_ADDRESS: metrics_address: .*HOST:PORT"):
        load_settings(env={"AX_METRICS_ADDRESS": "9464"})
    with pytest.raises(SettingsError, match=r"--log-format: log_format"):
        load_settings(env={}, flags={"log_format": "xml"})


def test_metrics_server_reports_its_port_and_releases_it() -> None:
    metrics = AxMetrics()
    metrics.llm_tokens.labels("m", "prompt").inc(7)
    server = metrics_server(metrics, "127.0.0.1:0")
    assert server is not None
    with server:
        assert server.port != 0
        reply = httpx.get(server.url, timeout=10)
        assert reply.status_code == 200
        found = samples(reply.text)
        assert value(found, "ax_llm_tokens_total", model="m", kind="prompt") == 7
        with pytest.raises(InputError, match="cannot serve metrics"):
            MetricsServer(metrics.registry, host="127.0.0.1", port=server.port).start()
    print(f"served {len(reply.text)} bytes on {server.url}, then closed")
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url, timeout=2)


def test_ax_server_writes_json_logs_and_one_access_line_per_request(
        tmp_path: Path, record_property: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AX_")}
    env["AX_LOG_FORMAT"] = "json"  # the settings layer, not a flag
    stderr = tmp_path / "stderr.log"
    with open(stderr, "wb") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "axengine.cli", "server", "--no-auth", "--home",
             str(tmp_path / "home"), "--http", "127.0.0.1:0", "--grpc", "off",
             "--log-level", "info"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert server.stdout is not None
        url = wait_until(lambda: _listening(server), 20, what="ax server listening")
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{url}/v1/tasks/t-missing?page_token=secret-ish",
                         headers={"Authorization": "Bearer not-a-real-token"},
                         timeout=10).status_code == 404
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=20)
    assert server.returncode == 0
    lines = [line for line in stderr.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    access = [e for e in entries if e["logger"] == ACCESS_LOGGER]
    summary = (f"ax server with AX_LOG_FORMAT=json: {len(lines)} stderr lines, all JSON; "
               f"access lines {[(e['path'], e['route'], e['status']) for e in access]}")
    print(summary)
    record_property("summary", summary)
    assert [(e["method"], e["path"], e["route"], e["status"], e["principal"])
            for e in access] == [
        ("GET", "/healthz", "/healthz", 200, "-"),
        ("GET", "/v1/tasks/t-missing", "/v1/tasks/{task_id}", 404, "anonymous")]
    assert all(e["level"] == "INFO" and e["time"].endswith("Z") for e in access)
    # Other loggers write JSON too, and uvicorn's own access log stays off.
    assert {e["logger"] for e in entries} - {ACCESS_LOGGER}
    assert not any(e["logger"] == "uvicorn.access" for e in entries)
    text = stderr.read_text()
    assert "not-a-real-token" not in text and "secret-ish" not in text


def _listening(server: subprocess.Popen[str]) -> str | None:
    assert server.stdout is not None
    line = server.stdout.readline()
    if not line and server.poll() is not None:
        raise AssertionError(f"ax server exited with {server.returncode}")
    match = re.search(r"http listening on (\S+)", line)
    return match.group(1) if match else None


# ---------------------------------------------------------------------- ax executor

LLM_DAG = """\
name: observed
nodes:
  ask: {type: llm_call, model: gpt-4-turbo, prompt: "Say hi", next: echo}
  echo: {type: tool_call, tool: echo, input: {x: 1}}
"""
KEY = "sk-test-observability-0123456789"


@pytest.mark.integration
@pytest.mark.slow
def test_ax_executor_serves_its_own_metrics(tmp_path: Path, record_property: Any) -> None:
    with fake_openai("hello there", require_key=KEY) as api, \
            Topology(executors=0, root=tmp_path / "topo") as topo:
        index = topo.add_executor(start=False)
        proc = topo.executors[index]
        proc.argv += ["--metrics-address", "127.0.0.1:0"]
        proc.env.update({"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": KEY})
        topo.start_executor(index)
        url = proc.wait_for_line(r"^ax executor: metrics listening on (\S+)").group(1)
        with topo.client() as client:
            result = client.run(LLM_DAG, {}, timeout=25)
        assert result.status == "SUCCEEDED", result.errors
        usage = result.outputs["ask"]["_llm"]["usage"]
        executor = samples(httpx.get(url, timeout=10).text)
        api_side = samples(httpx.get(f"{topo.api_url}/metrics", timeout=10).text)
        assert proc.stop() == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=2)
    model = {"model": "gpt-4-turbo"}
    llm_runs = value(executor, "ax_node_run_seconds_count", node_type="llm_call",
                     target="gpt-4-turbo")
    echo_runs = value(executor, "ax_node_run_seconds_count", node_type="tool_call",
                      target="echo")
    requests = value(executor, "ax_llm_request_seconds_count", **model)
    prompt = value(executor, "ax_llm_tokens_total", kind="prompt", **model)
    api_prompt = value(api_side, "ax_llm_tokens_total", kind="prompt", **model)
    summary = (f"ax executor /metrics: node runs llm_call {llm_runs}, tool_call {echo_runs}; "
               f"model requests {requests}; prompt tokens: executor {prompt}, api "
               f"{api_prompt}, node usage {usage}")
    print(summary)
    record_property("summary", summary)
    assert llm_runs == 1 and echo_runs == 1
    assert requests == 1
    assert prompt == usage["prompt_tokens"] > 0
    assert value(executor, "ax_llm_tokens_total", kind="completion", **model) == \
        usage["completion_tokens"]
    # Each process counts the tokens once, in its own registry.
    assert api_prompt == prompt
    cpu = value(executor, "process_cpu_seconds_total")
    assert cpu is not None and cpu > 0
    assert len(api.completions) == 1



def test_docs_describe_every_ax_metric() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "observability.md").read_text()
    families = sorted({f.name for f in AxMetrics().registry.collect()
                       if f.name.startswith("ax_")})
    print(f"{len(families)} ax_* families: {', '.join(families)}")
    # Counters are collected without their _total suffix.
    missing = [name for name in families if f"`{name}`" not in docs
               and f"`{name}_total`" not in docs]
    assert missing == []
    # The names dashboards and alerts are written against.
    assert {"ax_node_run_seconds", "ax_llm_request_seconds", "ax_llm_tokens", "ax_nodes",
            "ax_oldest_waiting_seconds", "ax_queue_depth", "ax_api_requests"} <= set(families)
