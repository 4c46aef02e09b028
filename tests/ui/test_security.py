"""The web UI's security in a real headless Chromium: values from tasks (outputs, inputs,
errors, labels, gate descriptions) carrying markup and script are shown as text and run
nothing; the session cookie is out of scripts' reach; a state-changing request without
the CSRF token is refused, the same request with it goes through; admin actions show
to admins only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.ui.conftest import TOKENS, UiServer, console_errors, eventually, sign_in, wait_for
from tests.ui.test_task_flow import (
    click_node,
    header_status,
    states,
    submit,
    task_json,
    text_of,
    wait_status,
)

pytestmark = pytest.mark.integration

#: Would set window.__pwned if any of it were parsed as HTML.
MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
LABEL = '<svg onload="window.__pwned=3">'
ECHO_GATE = """\
name: ui_markup
nodes:
  shout:
    type: tool_call
    tool: echo
    input: "{{ .input.text }}"
    next: review
  review:
    type: human_gateway
    description: "check {{ .input.text }}"
    input: "{{ .nodes.shout.output }}"
    timeout: 3600
    next:
      - condition: "{{ .output.decision == 'approve' }}"
        target: publish
  publish:
    type: tool_call
    tool: echo
    input: {done: true}
"""
BAD_SLEEP = """\
name: ui_markup_error
nodes:
  nap:
    type: tool_call
    tool: sleep
    retry: 0
    input: "{{ .input.text }}"
"""
#: Nothing parsed: no element any of the values above would have made, no script run.
_INJECTED = ("return [typeof window.__pwned, "
             "document.querySelectorAll('#main img, #main script, #main iframe').length,"
             " document.querySelectorAll('#main svg [onload], #main [onerror]').length]")


def injected(driver: WebDriver) -> list[Any]:
    found: list[Any] = driver.execute_script(_INJECTED)
    return found


def test_markup_in_outputs_inputs_errors_and_labels_is_shown_as_text(
        ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, ECHO_GATE, {"text": MARKUP}, labels={"note": LABEL})
    wait_status(ax_server, task_id, "PAUSED")
    failed = submit(ax_server, BAD_SLEEP, {"text": MARKUP})
    wait_status(ax_server, failed, "FAILED")

    sign_in(browser, ax_server, "reader", path=f"/ui/tasks/{task_id}?node=shout")
    wait_for(browser, lambda d: text_of(d, '#node-panel [data-field="output"]'),
             "the output of shout")
    # The output and the input are the markup, character for character, as text.
    assert text_of(browser, '#node-panel [data-field="output"]') == MARKUP
    assert text_of(browser, '#node-panel [data-field="input"]') == MARKUP
    assert text_of(browser, "#task-labels") == f"note={LABEL}"
    assert MARKUP in text_of(browser, "#task-input")
    assert injected(browser) == ["undefined", 0, 0]
    # A reader sees no admin action.
    assert not browser.find_elements(By.ID, "cancel-task")
    assert not browser.find_elements(By.ID, "retry-node")

    # The gate: its rendered description and input, in the panel and in the inbox.
    click_node(browser, "review")
    wait_for(browser, lambda d: f"check {MARKUP}" in text_of(
        d, '#node-panel [data-field="description"]'), "the gate's description")
    assert text_of(browser, '#node-panel [data-field="input"]') == MARKUP
    assert injected(browser) == ["undefined", 0, 0]
    browser.find_element(By.CSS_SELECTOR, 'a[data-nav="approvals"]').click()
    css = f'article.approval[data-task="{task_id}"]'
    wait_for(browser, lambda d: text_of(d, css), "the gate in the inbox")
    assert f"check {MARKUP}" in text_of(browser, f"{css} .description")
    assert text_of(browser, f'{css} [data-field="input"]') == MARKUP
    assert "cannot decide" in browser.find_element(By.CSS_SELECTOR, ".page-head").text
    assert not browser.find_elements(By.CSS_SELECTOR, f"{css} button.approve")
    assert injected(browser) == ["undefined", 0, 0]

    # The tasks list: the label chip is text.
    browser.find_element(By.CSS_SELECTOR, 'a[data-nav="tasks"]').click()
    row = f'#tasks tr[data-task="{task_id}"]'
    wait_for(browser, lambda d: text_of(d, row), "the task in the list")
    assert f"note={LABEL}" in text_of(browser, row)
    assert injected(browser) == ["undefined", 0, 0]

    # An error quoting the markup.
    browser.get(f"{ax_server.url}/ui/tasks/{failed}?node=nap")
    wait_for(browser, lambda d: text_of(d, '#node-panel [data-field="error"]'), "the error")
    assert MARKUP in text_of(browser, '#node-panel [data-field="error"]')
    assert injected(browser) == ["undefined", 0, 0]
    # The timeline names the failure too, as text.
    browser.find_element(By.LINK_TEXT, "Timeline").click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'g.trow[data-node="nap"]'),
             "the timeline")
    assert injected(browser) == ["undefined", 0, 0]
    assert console_errors(browser) == []


_FETCH = """
const [url, csrf, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const headers = {'Content-Type': 'application/json'};
if (csrf !== null) headers['X-CSRF-Token'] = csrf;
fetch(url, {method: 'POST', credentials: 'same-origin', headers,
            body: JSON.stringify({reason: 'from a script'})})
  .then(async (r) => done([r.status, await r.text()]))
  .catch((e) => done([0, String(e)]));
"""
_SESSION = """
const done = arguments[arguments.length - 1];
fetch('/ui/session', {credentials: 'same-origin'}).then((r) => r.json()).then(done);
"""


def test_a_post_without_the_csrf_token_is_refused_and_the_cookie_is_out_of_reach(
        ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, ECHO_GATE, {"text": "csrf"})
    wait_status(ax_server, task_id, "PAUSED")
    sign_in(browser, ax_server, "root", path=f"/ui/tasks/{task_id}")
    wait_for(browser, lambda d: header_status(d) == "PAUSED", "the task page")

    # The session cookie: HttpOnly, SameSite=Strict, invisible to document.cookie.
    cookies = {c["name"]: c for c in browser.get_cookies()}
    assert set(cookies) == {"ax_session"}
    assert cookies["ax_session"]["httpOnly"] is True
    assert cookies["ax_session"]["sameSite"] == "Strict"
    visible = browser.execute_script("return document.cookie")
    assert "ax_session" not in visible and TOKENS["root"][0] not in visible

    url = f"/v1/tasks/{task_id}/cancel"
    status, body = browser.execute_async_script(_FETCH, url, None)
    assert status == 403, body
    error = json.loads(body)["error"]
    assert error["type"] == "Forbidden" and "CSRF" in error["message"]
    status, body = browser.execute_async_script(_FETCH, url, "not-the-token")
    assert status == 403, body
    assert task_json(ax_server, task_id)["status"] == "PAUSED"

    csrf = browser.execute_async_script(_SESSION)["csrf"]
    status, body = browser.execute_async_script(_FETCH, url, csrf)
    assert status == 200, body
    assert task_json(ax_server, task_id)["status"] == "CANCELLED"
    # The page follows: the stream ends with the task.
    wait_for(browser, lambda d: header_status(d) == "CANCELLED", "CANCELLED on the page")
    assert console_errors(browser) == []


def test_admin_cancels_and_retries_from_the_task_page(
        ax_server: UiServer, browser: WebDriver) -> None:
    task_id = submit(ax_server, ECHO_GATE, {"text": "admin"})
    wait_status(ax_server, task_id, "PAUSED")
    sign_in(browser, ax_server, "root", path=f"/ui/tasks/{task_id}")
    wait_for(browser, lambda d: header_status(d) == "PAUSED", "the task page")

    browser.find_element(By.ID, "cancel-task").click()
    browser.find_element(By.ID, "action-reason").send_keys("wrong input")
    browser.find_element(By.ID, "action-confirm").click()
    wait_for(browser, lambda d: header_status(d) == "CANCELLED", "CANCELLED on the page")
    wait_for(browser, lambda d: states(d).get("review") == "CANCELLED", "the gate cancelled")
    cancelled = eventually(lambda: [e for e in _events(ax_server, task_id)
                                    if e["kind"] == "cancelled"], "the cancel event")
    assert "root (wrong input)" in cancelled[0]["detail"]

    # Retry from the cancelled gate: the task waits at it again, on the same page.
    click_node(browser, "review")
    wait_for(browser, lambda d: "Retry from review" in text_of(d, "#retry-node"),
             "the retry button")
    browser.find_element(By.ID, "retry-node").click()
    browser.find_element(By.ID, "action-confirm").click()
    wait_for(browser, lambda d: header_status(d) == "PAUSED", "PAUSED again")
    wait_for(browser, lambda d: states(d).get("review") == "PAUSED", "the gate waiting again")
    assert any(e["kind"] == "retried" and e["actor"] == "root"
               for e in _events(ax_server, task_id))
    assert console_errors(browser) == []


def test_unknown_token_and_sign_out(ax_server: UiServer, browser: WebDriver) -> None:
    browser.get(f"{ax_server.url}/ui/approvals")
    # Not signed in: the login form, which remembers where to go.
    field = wait_for(browser, lambda d: d.find_element(By.ID, "token"), "the login form")
    assert "next=%2Fui%2Fapprovals" in browser.current_url
    field.send_keys("tok-not-in-the-file-000")
    browser.find_element(By.ID, "sign-in").click()
    wait_for(browser, lambda d: "not known" in text_of(d, "#login-error"), "the refusal")
    assert browser.get_cookies() == []

    field.clear()
    field.send_keys(TOKENS["alice"][0])
    browser.find_element(By.ID, "sign-in").click()
    wait_for(browser, lambda d: d.current_url.endswith("/ui/approvals"), "the inbox")
    assert text_of(browser, ".who-name") == "alice"
    browser.find_element(By.ID, "sign-out").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "token"), "the login form again")
    assert browser.get_cookies() == []
    # The old session is gone: a reload stays on the login page.
    browser.get(f"{ax_server.url}/ui/")
    wait_for(browser, lambda d: d.find_elements(By.ID, "token"), "the login form")
    assert console_errors(browser) == []


def _events(server: UiServer, task_id: str) -> list[dict[str, Any]]:
    with server.rest() as client:
        events: list[dict[str, Any]] = client.get(
            f"/v1/tasks/{task_id}/events").json()["events"]
        return events
