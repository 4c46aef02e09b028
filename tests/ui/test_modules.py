"""The UI's pure modules, run in the browser on values built here: the graph layout
(random DAGs: edges point down, boxes never overlap, the same DAG gives the same
picture), the YAML writer (what it writes reads back as the same value) and the timeline
derivation (bars and markers of a hand-written event history)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import yaml
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.ui.conftest import ROOT, UiServer, console_errors, wait_for

pytestmark = pytest.mark.integration

_CALL = """
const [module, name, args, done] = [arguments[0], arguments[1], arguments[2],
                                    arguments[arguments.length - 1]];
import(module).then((m) => {
  const out = m[name](...args);
  // Maps do not cross the WebDriver boundary: send their entries.
  const plain = (v) => v instanceof Map ? Object.fromEntries(v)
    : (v && typeof v === 'object' && !Array.isArray(v))
      ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)])) : v;
  done({ok: plain(out)});
}).catch((e) => done({error: String(e && e.stack || e)}));
"""


@pytest.fixture
def page(ax_server: UiServer, browser: WebDriver) -> WebDriver:
    """A page of the UI (the login form: no session needed) to import modules into."""
    browser.get(f"{ax_server.url}/ui/login")
    wait_for(browser, lambda d: d.find_element(By.ID, "token"), "the login page")
    return browser


def call(driver: WebDriver, module: str, name: str, *args: Any) -> Any:
    answer = driver.execute_async_script(_CALL, f"/ui/static/{module}", name, list(args))
    assert "error" not in answer, answer["error"]
    return answer["ok"]


def _random_dag(rng: random.Random, n: int) -> tuple[list[str], list[dict[str, str]]]:
    ids = [f"n{i}_{rng.choice(['fetch', 'parse', 'review', 'x'])}" for i in range(n)]
    edges = []
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.choice([1, 1, 2, 3]))):
            edges.append({"from": ids[i], "to": ids[j]})
    rng.shuffle(ids)  # document order is not topological order
    return ids, edges


def _check_layout(ids: list[str], edges: list[dict[str, str]], laid: dict[str, Any]) -> None:
    nodes = laid["nodes"]
    assert set(nodes) == set(ids)
    for e in edges:
        a, b = nodes[e["from"]], nodes[e["to"]]
        assert a["layer"] < b["layer"], e
    by_layer: dict[int, list[dict[str, Any]]] = {}
    for box in nodes.values():
        by_layer.setdefault(box["layer"], []).append(box)
        assert box["x"] - box["w"] / 2 >= 0 and box["x"] + box["w"] / 2 <= laid["width"] + 1e-6
        assert box["y"] + box["h"] / 2 <= laid["height"] + 1e-6
    for boxes in by_layer.values():
        boxes.sort(key=lambda b: b["x"])
        for left, right in itertools.pairwise(boxes):
            assert right["x"] - left["x"] >= left["w"] - 1e-6, (left, right)
    assert len(laid["edges"]) == len(edges)
    for e in laid["edges"]:
        a, b = nodes[e["from"]], nodes[e["to"]]
        first, last = e["points"][0], e["points"][-1]
        assert first == pytest.approx([a["x"], a["y"] + a["h"] / 2])
        assert last == pytest.approx([b["x"], b["y"] - b["h"] / 2])
        ys = [p[1] for p in e["points"]]
        assert ys == sorted(ys)


def test_layout_of_random_dags(page: WebDriver) -> None:
    rng = random.Random(13)
    for n in (1, 2, 5, 9, 16, 30):
        for _ in range(3):
            ids, edges = _random_dag(rng, n)
            laid = call(page, "layout.js", "layout", ids, edges)
            _check_layout(ids, edges, laid)
            assert call(page, "layout.js", "layout", ids, edges) == laid


def test_layout_of_the_financial_dag(page: WebDriver) -> None:
    dag = yaml.safe_load((ROOT / "dags" / "financial_risk_assessment.yaml").read_text())
    ids = list(dag["nodes"])
    edges = []
    for source, node in dag["nodes"].items():
        targets = node.get("next") or []
        targets = [targets] if isinstance(targets, str) else [t["target"] for t in targets]
        edges += [{"from": source, "to": t} for t in targets]
    laid = call(page, "layout.js", "layout", ids, edges)
    _check_layout(ids, edges, laid)
    layers = {n: box["layer"] for n, box in laid["nodes"].items()}
    assert layers["parse_pdf"] == 0 and layers["log_completion"] == 5
    assert laid["crossings"] <= 2
    # A 1280-wide screen shows it whole beside the node panel.
    assert laid["width"] < 800 and laid["height"] < 560
    # A cycle (never valid, still drawn) does not hang the layout.
    cyclic = call(page, "layout.js", "layout", ["a", "b"],
                  [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}])
    assert len(cyclic["edges"]) == 2


TRICKY: dict[str, Any] = {
    "plain": "hello world", "looks_true": "true", "yes": "yes", "number": "1.5",
    "hex": "0x1F", "empty": "", "colon": "a: b", "dash": "- x", "hash": "#x", "at": "@x",
    "quote": "it's \"quoted\"", "unicode": "déjà vu — ✓", "tab": "a\tb",
    "multi": "line one\n  indented\nlast\n", "multi_no_newline": "a\nb",
    "leading": "  leading space", "trailing": "trailing ", "template": "{{ .input.x }}",
    "null": None, "int": 3, "float": 0.25, "bool": False, "list": [1, "two", None, [3]],
    "objects": [{"target": "a", "when": "x"}, {}], "empty_map": {}, "empty_list": [],
    "nested": {"deeper": {"still": ["a", {"b": "c\nd"}]}}, "true": 1, "1": "key is a number",
}


def test_yaml_reads_back_as_the_same_value(page: WebDriver) -> None:
    text = call(page, "yaml.js", "toYaml", TRICKY)
    assert yaml.safe_load(text) == TRICKY, text
    dag = yaml.safe_load((ROOT / "dags" / "financial_risk_assessment.yaml").read_text())
    text = call(page, "yaml.js", "toYaml", dag)
    assert yaml.safe_load(text) == dag
    assert "description: |\n" in text or "prompt: |\n" in text


def _event(seq: int, kind: str, at: float, node: str = "n", attempt: int = 0,
           detail: str = "") -> dict[str, Any]:
    return {"seq": seq, "event_id": f"{int(at * 1e6):017d}-{seq:04d}", "kind": kind,
            "at": at, "node_id": node, "attempt": attempt, "detail": detail}


def test_timeline_derivation(page: WebDriver) -> None:
    events = [
        _event(1, "submitted", 100.0, node=""),
        _event(2, "ready", 100.0),
        _event(3, "claimed", 101.0, attempt=1),
        _event(4, "retry", 103.0, attempt=1, detail="boom (retry in 2.0s)"),
        _event(5, "claimed", 106.0, attempt=2),
        _event(6, "stall_warning", 107.0, attempt=2, detail="no progress for 60s"),
        _event(7, "lease_expired", 108.0, attempt=2, detail="lease expired; owner w1"),
        _event(8, "claimed", 109.0, attempt=3),
        _event(9, "paused", 110.0, attempt=2, detail="waiting for a vendor"),
        _event(10, "resumed", 115.0, attempt=2),
        _event(11, "claimed", 116.0, attempt=3),
        _event(12, "committed", 117.0, attempt=3),
        _event(13, "paused", 117.0, node="gate"),
        _event(14, "decided", 120.0, node="gate", attempt=1, detail="approve by alice: ok"),
        _event(15, "committed", 120.0, node="cond", attempt=1, detail="label=x -> y"),
        _event(16, "skipped", 120.0, node="other"),
        _event(17, "ready", 120.0, node="late"),
    ]
    tl = call(page, "timeline.js", "deriveTimeline", events, ["n", "gate", "cond", "late"],
              125.0)

    def bars(row: dict[str, Any]) -> list[tuple[str, float, float]]:
        return [(s["kind"], s["start"], s["end"]) for s in row["segments"]]

    rows = tl["rows"]
    assert [(r["node"], r["attempt"], r["kind"]) for r in rows] == [
        ("n", 1, "attempt"), ("n", 2, "attempt"), ("n", 3, "attempt"), ("n", 3, "attempt"),
        ("gate", 1, "gate"), ("cond", 1, "attempt"), ("late", 0, "waiting")]
    assert bars(rows[0]) == [("queued", 100, 101), ("running", 101, 103),
                             ("backoff", 103, 105)]
    assert rows[0]["outcome"] == "failed"
    assert bars(rows[1]) == [("queued", 105, 106), ("running", 106, 108)]
    assert rows[1]["outcome"] == "expired"
    assert [m["kind"] for m in rows[1]["markers"]] == ["stall", "lease"]
    # A handler's pause ends the run; the resumed run is a row of its own.
    assert bars(rows[2]) == [("queued", 108, 109), ("running", 109, 110), ("paused", 110, 115)]
    assert bars(rows[3]) == [("queued", 115, 116), ("running", 116, 117)]
    assert rows[3]["outcome"] == "succeeded"
    assert bars(rows[4]) == [("paused", 117, 120)] and rows[4]["outcome"] == "approve"
    assert [m["kind"] for m in rows[4]["markers"]] == ["decision"]
    assert bars(rows[5]) == [("running", 120, 120)]  # a condition: decided on the spot
    assert bars(rows[6]) == [("queued", 120, 125)]  # still waiting, up to "now"
    assert rows[6]["segments"][0]["open"] is True
    assert tl["skipped"] == ["other"]
    assert tl["totals"] == {"queued": 1 + 1 + 1 + 1 + 5, "running": 2 + 2 + 1 + 1,
                            "paused": 5 + 3, "backoff": 2}
    assert (tl["start"], tl["end"]) == (100, 125)


def test_no_console_errors_on_import(page: WebDriver) -> None:
    for module in ("layout.js", "yaml.js", "timeline.js", "graph.js", "dom.js"):
        page.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "import(arguments[0]).then(() => done(true), (e) => done(String(e)));",
            f"/ui/static/{module}")
    assert console_errors(page) == []
