"""The acceptance of the web UI in a real headless Chromium against a real ``ax server``:
the financial task of the globex report waits at its gate on the task page, is approved
from the inbox in a second tab, and reaches SUCCEEDED on the first tab without a reload;
approve-with-edits changes what the gate passes on; the timeline shows where the time
went. The tests write the README's screenshots (docs/images/ui-*.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.ui.conftest import (
    ROOT,
    WAIT,
    UiServer,
    console_errors,
    eventually,
    sign_in,
    wait_for,
)

pytestmark = pytest.mark.integration

FINANCIAL = (ROOT / "dags" / "financial_risk_assessment.yaml").read_text()
GLOBEX = {"pdf_url": str(ROOT / "dags" / "inputs" / "globex_annual_report.pdf")}
GATE = "send_high_risk_email"
BEFORE_GATE = ["parse_pdf", "extract_metrics", "assess_risk"]
PATH = [*BEFORE_GATE, GATE, "notify_high_risk", "log_completion"]
NOT_TAKEN = ["send_alert", "send_medium_risk_email", "send_low_risk_email"]
IMAGES = ROOT / "docs" / "images"
#: A second kind of gate, so the inbox shows more than one.
PUBLISH = """\
name: quarterly_summary
nodes:
  draft:
    type: tool_call
    tool: echo
    input:
      title: "Q{{ .input.quarter }} summary for {{ .input.team }}"
      summary: "Revenue up 22%, margin down to 9%.\\nTwo new markets opened."
    next: publish_review
  publish_review:
    type: human_gateway
    description: "Publish the Q{{ .input.quarter }} summary of {{ .input.team }} to the intranet?"
    input: "{{ .nodes.draft.output }}"
    timeout: 7200
"""


def submit(server: UiServer, dag_yaml: str, task_input: Any, *,
           labels: dict[str, str] | None = None) -> str:
    with server.rest() as client:
        answer = client.post("/v1/tasks", json={"dag_yaml": dag_yaml, "input": task_input,
                                                "labels": labels or {}})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["task_id"])


def task_json(server: UiServer, task_id: str) -> dict[str, Any]:
    with server.rest() as client:
        answer = client.get(f"/v1/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body


def wait_status(server: UiServer, task_id: str, status: str) -> dict[str, Any]:
    found: dict[str, Any] = eventually(
        lambda: (t := task_json(server, task_id))["status"] == status and t,
        f"task {task_id} {status}")
    return found


# The page redraws its graph on every event: read it in one script, never through
# element references that a redraw makes stale.
_STATES = ("return Object.fromEntries([...document.querySelectorAll('g.gnode')]"
           ".map(g => [g.dataset.node, g.dataset.state]))")
_EDGES = ("return Object.fromEntries([...document.querySelectorAll('path.edge')]"
          ".map(p => [p.dataset.from + '>' + p.dataset.to, p.dataset.edge]))")


def states(driver: WebDriver) -> dict[str, str]:
    found: dict[str, str] = driver.execute_script(_STATES)
    return found


def edges(driver: WebDriver) -> dict[str, str]:
    found: dict[str, str] = driver.execute_script(_EDGES)
    return found


def node_state(driver: WebDriver, node: str) -> str | None:
    return states(driver).get(node)


def header_status(driver: WebDriver) -> str | None:
    found: str | None = driver.execute_script(
        "return document.getElementById('task-status')?.dataset.status ?? null")
    return found


def text_of(driver: WebDriver, css: str) -> str:
    found: str = driver.execute_script(
        "return document.querySelector(arguments[0])?.textContent ?? ''", css)
    return found


def click(driver: WebDriver, css: str) -> None:
    """Click the element ``css`` selects (again, if a redraw of the live page replaced it
    between finding it and clicking it)."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    WebDriverWait(driver, WAIT, ignored_exceptions=[StaleElementReferenceException]).until(
        clicked, message=f"could not click {css}")


def click_node(driver: WebDriver, node: str) -> None:
    """Click a node of the graph."""
    click(driver, f'g.gnode[data-node="{node}"]')


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save the page as docs/images/<name>: the viewport made 1280 wide and as tall as
    the page (900 at least, 1300 at most), then the window put back."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    target = IMAGES / name
    size = driver.get_window_size()
    chrome, page = driver.execute_script(
        "return [window.outerHeight - window.innerHeight,"
        " document.documentElement.scrollHeight]")
    driver.set_window_size(1280, min(max(900, page), 1300) + chrome)
    try:
        assert driver.save_screenshot(str(target)), target
    finally:
        driver.set_window_size(size["width"], size["height"])
    return target


def test_gate_approved_in_the_inbox_finishes_the_task_page_live(
        ax_server: UiServer, browser: WebDriver) -> None:
    other = submit(ax_server, PUBLISH, {"team": "finance", "quarter": 3})
    task_id = submit(ax_server, FINANCIAL, GLOBEX, labels={"team": "risk", "report": "globex"})
    wait_status(ax_server, other, "PAUSED")
    wait_status(ax_server, task_id, "PAUSED")

    sign_in(browser, ax_server, "alice")
    browser.get(f"{ax_server.url}/ui/tasks/{task_id}")
    wait_for(browser, lambda d: node_state(d, GATE) == "PAUSED", "the gate PAUSED")
    shown = states(browser)
    assert all(shown[n] == "SUCCEEDED" for n in BEFORE_GATE), shown
    assert header_status(browser) == "PAUSED"
    # Edges out of the condition: the high-risk one taken, the others not; the edges
    # after the gate not decided yet.
    drawn = edges(browser)
    assert drawn[f"assess_risk>{GATE}"] == "taken"
    assert drawn["assess_risk>send_medium_risk_email"] == "not-taken"
    assert drawn["assess_risk>send_low_risk_email"] == "not-taken"
    assert drawn[f"{GATE}>notify_high_risk"] == "pending"

    # The gate's panel: its description and the email it would send, as text.
    click_node(browser, GATE)
    panel_css = f'#node-panel .node-panel-body[data-node="{GATE}"]'
    panel = wait_for(browser, lambda d: text_of(d, panel_css), "the gate panel")
    assert "High risk detected" in panel and "risk-officer@example.com" in panel
    assert browser.current_url.endswith(f"?node={GATE}")
    screenshot(browser, "ui-task.png")

    # The page follows the task through its event stream (not by polling)...
    wait_for(browser, lambda d: d.find_element(By.ID, "main").get_attribute("data-live")
             == "stream", "the event stream open")
    # ...and a marker no reload survives: the first tab must finish on its own.
    browser.execute_script("window.__axFirstLoad = 'kept';")
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(f"{ax_server.url}/ui/approvals")
    card = wait_for(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f'article.approval[data-task="{task_id}"][data-node="{GATE}"]'),
        "the gate in the inbox")
    assert "High risk detected" in card.text
    screenshot(browser, "ui-inbox.png")
    card.find_element(By.CSS_SELECTOR, "textarea.comment").send_keys("numbers checked")
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait_for(browser, lambda d: not d.find_elements(
        By.CSS_SELECTOR, f'article.approval[data-task="{task_id}"]'), "the card gone")
    assert f"Approved {GATE} of task {task_id}" in browser.find_element(
        By.ID, "inbox-flash").text
    assert console_errors(browser) == []
    browser.close()

    browser.switch_to.window(first)
    wait_for(browser, lambda d: header_status(d) == "SUCCEEDED", "SUCCEEDED in the header")
    wait_for(browser, lambda d: all(node_state(d, n) == "SUCCEEDED" for n in PATH),
             "every node of the path SUCCEEDED")
    assert browser.execute_script("return window.__axFirstLoad") == "kept"
    # The stream ended with the task.
    assert browser.find_element(By.ID, "main").get_attribute("data-live") == "off"
    shown = states(browser)
    assert all(shown[n] == "SKIPPED" for n in NOT_TAKEN), shown
    assert console_errors(browser) == []

    gate = task_json(ax_server, task_id)["nodes"][GATE]
    assert gate["decision"]["decision"] == "approve"
    assert gate["decision"]["by"] == "alice"
    assert gate["decision"]["comment"] == "numbers checked"
    # The gate's panel shows the decision; the email node's, its one outbox record.
    panel = wait_for(browser, lambda d: "numbers checked" in (t := text_of(d, panel_css)) and t,
                     "the decision in the gate's panel")
    assert "alice" in panel and "approve" in panel
    click_node(browser, "notify_high_risk")
    effects = wait_for(browser, lambda d: text_of(
        d, '#node-panel [data-node="notify_high_risk"] [data-field="effects"]'),
        "the email's effect")
    assert f"email:{task_id}:notify_high_risk:" in effects and "DONE" in effects
    assert list(ax_server.mail.glob("*.eml"))


def test_approve_with_edits_changes_what_the_gate_passes_on(
        ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, FINANCIAL, GLOBEX)
    wait_status(ax_server, task_id, "PAUSED")
    sign_in(browser, ax_server, "alice", path="/ui/approvals")
    card = wait_for(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f'article.approval[data-task="{task_id}"]'), "the gate in the inbox")
    card.find_element(By.CSS_SELECTOR, "button.edit-toggle").click()
    edits = card.find_element(By.CSS_SELECTOR, "textarea.edits")
    reviewed = yaml.safe_load(edits.get_attribute("value") or "")
    assert reviewed["to"] == "risk-officer@example.com"

    # Invalid JSON: an error, nothing sent (the gate still waits).
    edits.clear()
    edits.send_keys('{"to": "cfo@example.com",')
    card.find_element(By.CSS_SELECTOR, "button.approve-edits").click()
    error = wait_for(browser, lambda d: card.find_element(By.CSS_SELECTOR, ".edits-error").text,
                     "the JSON error")
    assert "Not valid JSON" in error and "Nothing was sent" in error
    assert task_json(ax_server, task_id)["nodes"][GATE]["state"] == "PAUSED"

    corrected = {**reviewed, "to": "cfo@example.com", "subject": "High risk: <b>globex</b>"}
    edits.clear()
    browser.execute_script("arguments[0].value = arguments[1];", edits,
                           yaml.safe_dump(corrected, default_flow_style=True, width=10_000))
    # YAML flow style is not JSON: refused as well.
    card.find_element(By.CSS_SELECTOR, "button.approve-edits").click()
    wait_for(browser, lambda d: "Not valid JSON" in card.find_element(
        By.CSS_SELECTOR, ".edits-error").text, "the flow-YAML error")
    import json
    browser.execute_script("arguments[0].value = arguments[1];", edits, json.dumps(corrected))
    card.find_element(By.CSS_SELECTOR, "textarea.comment").send_keys("send it to the CFO")
    card.find_element(By.CSS_SELECTOR, "button.approve-edits").click()
    wait_for(browser, lambda d: "with edits" in d.find_element(By.ID, "inbox-flash").text,
             "the confirmation")

    done = wait_status(ax_server, task_id, "SUCCEEDED")
    gate = done["nodes"][GATE]
    assert gate["output"]["data"] == corrected
    assert gate["decision"]["edited"] is True and gate["decision"]["by"] == "alice"
    with ax_server.rest() as client:
        events = client.get(f"/v1/tasks/{task_id}/events").json()["events"]
    decided = [e for e in events if e["kind"] == "decided"]
    assert len(decided) == 1 and "with edits" in decided[0]["detail"]
    assert console_errors(browser) == []


def _slowed_financial() -> str:
    """The financial DAG with simulated latency and one transient model failure, so its
    timeline has something to show besides the gate: runs of visible length, a failed
    attempt, its backoff and the retry."""
    dag = yaml.safe_load(FINANCIAL)
    dag["name"] = "financial_risk_assessment_slowed"
    dag["nodes"]["parse_pdf"]["simulate"] = {"latency": 0.4}
    dag["nodes"]["extract_metrics"]["simulate"] = {"latency": 0.5, "fail_attempts": 1}
    dag["nodes"]["notify_high_risk"]["simulate"] = {"latency": 0.3}
    return str(yaml.safe_dump(dag, sort_keys=False))


_BARS = """
return [...document.querySelectorAll('#timeline g.trow')].map((row) => ({
  node: row.dataset.node, attempt: Number(row.dataset.attempt), outcome: row.dataset.outcome,
  bars: [...row.querySelectorAll('rect.bar')].map((b) => ({
    kind: b.dataset.kind, seconds: Number(b.dataset.seconds), open: b.dataset.open === 'true',
    start: Number(b.dataset.start), end: Number(b.dataset.end)})),
  marks: [...row.querySelectorAll('g.mark')].map((m) => m.dataset.kind)}));
"""


def test_timeline_shows_where_the_time_went(ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, _slowed_financial(), GLOBEX, labels={"team": "risk"})
    wait_status(ax_server, task_id, "PAUSED")
    sign_in(browser, ax_server, "alice", path=f"/ui/tasks/{task_id}/timeline")

    def gate_row(d: WebDriver) -> dict[str, Any] | None:
        rows = [r for r in d.execute_script(_BARS) if r["node"] == GATE]
        return rows[0] if rows else None

    waiting = wait_for(browser, gate_row, "the gate's row")
    assert [b["kind"] for b in waiting["bars"]] == ["paused"] and waiting["bars"][0]["open"]
    browser.execute_script("window.__axFirstLoad = 'kept';")
    # The open bar grows with the clock until someone decides.
    grown = wait_for(browser, lambda d: (r := gate_row(d)) and r["bars"][0]["seconds"]
                     > waiting["bars"][0]["seconds"] + 0.5 and r, "the paused bar growing")
    with ax_server.rest("alice") as client:
        answer = client.post(f"/v1/tasks/{task_id}/nodes/{GATE}/decision",
                             json={"decision": "approve", "comment": "timeline"})
        assert answer.status_code == 200, answer.text
    wait_for(browser, lambda d: header_status(d) == "SUCCEEDED", "SUCCEEDED on the timeline")
    assert browser.execute_script("return window.__axFirstLoad") == "kept"

    task = task_json(ax_server, task_id)
    rows = browser.execute_script(_BARS)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_node.setdefault(row["node"], []).append(row)
    # One row per attempt: extract_metrics failed once, then ran again.
    assert set(by_node) == set(PATH)
    assert [r["attempt"] for r in by_node["extract_metrics"]] == [1, 2]
    first, second = by_node["extract_metrics"]
    assert first["outcome"] == "failed" and "failure" in first["marks"]
    # Claimed by the commit that readied it (the worker went on with its slot), a node
    # never queued and its first bar is the run; through the queue, a queued bar leads.
    assert [b["kind"] for b in first["bars"]] in (["queued", "running", "backoff"],
                                                  ["running", "backoff"])
    assert 0.5 <= first["bars"][-1]["seconds"] <= 1.5  # backoff_base 1 s, ±20 % jitter
    assert [b["kind"] for b in second["bars"]][-1] == "running"
    assert second["bars"][-1]["seconds"] >= 0.45  # the simulated latency
    for node in PATH:
        assert task["nodes"][node]["state"] == "SUCCEEDED"
        if node != GATE:  # a gate never runs: it waits for a person
            assert any(b["kind"] == "running" for r in by_node[node] for b in r["bars"]), node
    assert all(not b["open"] for r in rows for b in r["bars"])
    # The gate: one paused bar, as long as the gate waited, closed by the decision.
    (gate,) = by_node[GATE]
    (paused,) = gate["bars"]
    assert paused["kind"] == "paused" and gate["outcome"] == "approve"
    assert "decision" in gate["marks"]
    assert paused["seconds"] > grown["bars"][0]["seconds"]
    assert abs(paused["seconds"] - task["nodes"][GATE]["paused_seconds"]) < 0.01
    decided = task["nodes"][GATE]["decision"]["at"]
    assert abs(paused["end"] - decided) < 0.01
    # The summary adds the bars up: waiting (queued, paused, backoff) against running.
    summary = browser.find_element(By.ID, "timeline-summary")
    bars = [b for r in rows for b in r["bars"]]
    for kind in ("queued", "running", "paused", "backoff"):
        total = sum(b["seconds"] for b in bars if b["kind"] == kind)
        assert abs(float(summary.get_attribute(f"data-{kind}") or 0) - total) < 0.01, kind
    waited = float(summary.get_attribute("data-waiting") or 0)
    assert waited >= paused["seconds"] > 0
    assert console_errors(browser) == []
    screenshot(browser, "ui-timeline.png")
    # A row's name leads to the node's panel on the task page, in the same page.
    click(browser, f'g.trow[data-node="{GATE}"] a')
    wait_for(browser, lambda d: "timeline" in text_of(
        d, f'#node-panel .node-panel-body[data-node="{GATE}"] [data-field="decision"]'),
        "the gate's panel")
    assert browser.execute_script("return window.__axFirstLoad") == "kept"


#: A map over the input, then a loop that drafts twice inside a sub-DAG (inline).
DYNAMIC = """\
name: dynamic_work
nodes:
  summarise:
    type: tool_call
    tool: echo
    map: "{{ .input.sections }}"
    input: "{{ .item | upper }}"
    next: revise
  revise:
    type: dag
    input: {summaries: "{{ .nodes.summarise.output }}"}
    dag:
      name: revise_until_done
      nodes:
        draft:
          type: tool_call
          tool: echo
          input: {visit: "{{ .visit }}"}
          next: check
        check:
          type: condition
          expression: |
            if .output.visit >= 2: done
            else: again
          next:
            - {target: draft, when: again, max_visits: 3}
"""


def test_a_map_s_items_a_loop_s_visits_and_a_sub_dag_s_nodes_open_from_their_node(
        ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, DYNAMIC, {"sections": ["intro", "risks", "outlook"]})
    task = wait_status(ax_server, task_id, "SUCCEEDED")
    assert task["nodes"]["summarise"]["output"] == ["INTRO", "RISKS", "OUTLOOK"]

    sign_in(browser, ax_server, "root")  # an admin: the Retry button is shown
    browser.get(f"{ax_server.url}/ui/tasks/{task_id}?node=summarise")
    items_css = '#node-panel [data-field="items"]'
    listed = wait_for(browser, lambda d: text_of(d, items_css), "the map's items")
    assert all(f"summarise[{i}]" in listed for i in range(3)), listed
    assert "Items (3)" in text_of(browser, "#node-panel")
    # An item opens its own panel: its input and output.
    click(browser, '[data-instance="summarise[1]"]')
    item_css = '#node-panel .node-panel-body[data-node="summarise[1]"]'
    item = wait_for(browser, lambda d: text_of(d, item_css), "the item's panel")
    assert "RISKS" in item and "SUCCEEDED" in item
    assert browser.current_url.endswith("?node=summarise%5B1%5D")

    # The sub-DAG node lists its nodes; the loop's last node lists its earlier visit.
    click_node(browser, "revise")
    children = wait_for(browser, lambda d: text_of(d, '#node-panel [data-field="children"]'),
                        "the sub-DAG's nodes")
    assert "revise/draft" in children and "revise/check" in children
    click(browser, '[data-instance="revise/check"]')
    visits = wait_for(browser, lambda d: text_of(d, '#node-panel [data-field="visits"]'),
                      "the kept visit")
    assert "revise/check#1" in visits
    assert "condition" in text_of(browser, '#node-panel .panel-head')
    assert console_errors(browser) == []
    # Retry is offered from nodes of the task's DAG, not from instances of them.
    button = browser.find_element(By.ID, "retry-node")
    assert button.get_attribute("disabled") is not None
    assert "retry from the node revise" in (button.get_attribute("title") or "")
    # The graph says how far the map went (items done of all).
    browser.get(f"{ax_server.url}/ui/tasks/{task_id}")
    label = wait_for(browser, lambda d: text_of(d, 'g.gnode[data-node="summarise"]'),
                     "the map node's box")
    assert "3/3" in label, label
