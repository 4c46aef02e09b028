"""The tasks list (filters kept in the URL, live counts, live rows) and the DAG pages
(stored versions, their graph, a node's definition, the document as YAML)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.ui.conftest import UiServer, console_errors, sign_in, wait_for
from tests.ui.test_security import ECHO_GATE
from tests.ui.test_task_flow import click_node, states, submit, text_of, wait_status

pytestmark = pytest.mark.integration

ECHO = """\
name: ui_echo
description: one echo
nodes:
  say:
    type: tool_call
    tool: echo
    input: {text: "{{ .input.text }}"}
"""

_ROWS = ("return [...document.querySelectorAll('#task-rows tr')]"
         ".map((r) => [r.dataset.task, r.dataset.status])")


def rows(driver: WebDriver) -> dict[str, str]:
    return dict(driver.execute_script(_ROWS))


def query(driver: WebDriver) -> dict[str, list[str]]:
    return parse_qs(urlsplit(driver.current_url).query)


def test_tasks_filters_live_in_the_url_and_counts_follow(
        ax_server: UiServer, browser: WebDriver) -> None:
    done = submit(ax_server, ECHO, {"text": "a"}, labels={"team": "a"})
    waiting = submit(ax_server, ECHO_GATE, {"text": "b"}, labels={"team": "b"})
    wait_status(ax_server, done, "SUCCEEDED")
    wait_status(ax_server, waiting, "PAUSED")

    sign_in(browser, ax_server, "reader", path="/ui/?status=PAUSED")
    wait_for(browser, lambda d: waiting in rows(d), "the paused task listed")
    assert set(rows(browser).values()) == {"PAUSED"} and done not in rows(browser)
    toggle = browser.find_element(By.CSS_SELECTOR, '.status-toggle[data-status="PAUSED"]')
    assert toggle.get_attribute("aria-pressed") == "true"
    with ax_server.rest("reader") as client:
        counts = client.get("/v1/task-counts").json()["counts"]
    shown = wait_for(browser, lambda d: text_of(d, '[data-count="PAUSED"]'), "the counts")
    assert int(shown) == counts["PAUSED"]

    browser.find_element(By.CSS_SELECTOR, '.status-toggle[data-status="SUCCEEDED"]').click()
    wait_for(browser, lambda d: done in rows(d), "the succeeded task listed too")
    assert sorted(query(browser)["status"]) == ["PAUSED", "SUCCEEDED"]

    browser.find_element(By.ID, "filter-label").send_keys("team=b")
    browser.find_element(By.CSS_SELECTOR, '#task-filters button[type="submit"]').click()
    wait_for(browser, lambda d: done not in rows(d), "the label filter applied")
    assert query(browser)["label"] == ["team=b"] and waiting in rows(browser)

    # A new task that matches shows up by itself, and the count with it.
    before = int(text_of(browser, '[data-count="PAUSED"]'))
    newer = submit(ax_server, ECHO_GATE, {"text": "c"}, labels={"team": "b"})
    wait_for(browser, lambda d: list(rows(d))[:1] == [newer], "the new task on top")
    wait_for(browser, lambda d: int(text_of(d, '[data-count="PAUSED"]')) == before + 1,
             "the count up by one")

    # Filters survive a reload (they are the URL), and a row leads to its task.
    browser.refresh()
    wait_for(browser, lambda d: set(rows(d)) == {waiting, newer}, "the same rows")
    browser.find_element(By.LINK_TEXT, newer).click()
    wait_for(browser, lambda d: states(d).get("review") == "PAUSED", "the task page")
    assert console_errors(browser) == []


def test_dag_pages_show_the_stored_versions(ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, ECHO_GATE, {"text": "dag"})
    with ax_server.rest() as client:
        dag_hash = client.get(f"/v1/tasks/{task_id}").json()["dag_hash"]
        stored = client.get(f"/v1/dags/{dag_hash}").json()
    sign_in(browser, ax_server, "reader", path="/ui/dags")
    link = wait_for(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, f'#dag-rows tr[data-hash="{dag_hash}"] a'), "the DAG listed")
    link.click()
    wait_for(browser, lambda d: set(states(d)) == {"shout", "review", "publish"}, "the graph")
    types = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('g.gnode')]"
        ".map((g) => [g.dataset.node, g.dataset.type]))")
    assert types == {"shout": "tool_call", "review": "human_gateway", "publish": "tool_call"}
    # The document, as YAML: it reads back as the stored canonical form.
    assert yaml.safe_load(text_of(browser, "#dag-yaml")) == stored["dag"]
    click_node(browser, "review")
    definition = wait_for(browser, lambda d: text_of(d, "#node-panel pre.yaml"),
                          "the node's definition")
    assert yaml.safe_load(definition) == {"review": stored["dag"]["nodes"]["review"]}
    assert urlsplit(browser.current_url).query == "node=review"
    assert console_errors(browser) == []


def test_the_api_docs_render_offline_under_the_policy(ax_server: UiServer,
                                                      browser: WebDriver) -> None:
    """Swagger UI from the vendored files: every operation of the OpenAPI document is
    shown, and nothing was refused by the Content-Security-Policy or failed to load."""
    browser.get(f"{ax_server.url}/docs")
    with ax_server.rest() as rest:
        paths = rest.get("/openapi.json").json()["paths"]
    operations = sum(len(item) for item in paths.values())
    shown = wait_for(browser, lambda d: d.execute_script(
        "return document.querySelectorAll('.opblock').length") >= operations and
        d.execute_script("return document.querySelectorAll('.opblock').length"),
        "Swagger UI listing the operations")
    assert shown == operations
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map((r) => r.name)")
    assert loaded and all(url.startswith(ax_server.url) for url in loaded), loaded
    assert console_errors(browser) == []
