"""Fixtures of the web UI tests: a real ``ax server`` (a subprocess with a tokens file
of an admin, an approver and a reader) and the system's headless Chromium driven by
Selenium.

Helpers wait on browser conditions (``WebDriverWait``), never on sleeps; ``rest()``
talks to the same server as the tests' own client, with a bearer token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.servers import ax_server_process
from tests.topology import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Seconds a browser condition may take (a task step, a live update).
WAIT = 15.0
#: Token name -> (token, roles). The reader can read everything and decide nothing.
TOKENS: dict[str, tuple[str, list[str]]] = {
    "root": ("tok-ui-root-0123456789ab", ["admin"]),
    "alice": ("tok-ui-alice-0123456789a", ["approve"]),
    "reader": ("tok-ui-reader-012345678", ["submit"]),
}
#: Console messages of the page that are expected answers, not faults (the login page
#: asks for a session first; the CSRF test provokes a 403).
_EXPECTED_CONSOLE = re.compile(r"Failed to load resource: the server responded with a "
                               r"status of (401|403)")


@dataclass
class UiServer:
    """A running ``ax server`` with the tokens of :data:`TOKENS`."""

    url: str
    home: Path
    #: The local mailbox of its send_email nodes.
    mail: Path

    def rest(self, who: str = "root") -> httpx.Client:
        """A REST client of the server authenticated as ``who``."""
        return httpx.Client(base_url=self.url, timeout=20,
                            headers={"Authorization": f"Bearer {TOKENS[who][0]}"})


@pytest.fixture(scope="module")
def ax_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    where = tmp_path_factory.mktemp("ui-server")
    tokens = where / "tokens.yaml"
    tokens.write_text(json.dumps({"tokens": [
        {"name": name, "token": token, "roles": roles}
        for name, (token, roles) in TOKENS.items()]}))
    tokens.chmod(0o600)
    with ax_server_process(tokens, where / "home", env={
            # The example reports are read from the repository (api trust reads local
            # files only under input_root).
            "AX_HANDLERS__INPUT_ROOT": str(ROOT / "dags" / "inputs"),
            # The tests read the mailbox of the server's send_email nodes here.
            "AX_HANDLERS__MAIL_DIR": str(where / "mail")}) as url:
        yield UiServer(url, where / "home", where / "mail")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """A fresh headless Chromium (no cookies, one tab) at 1280x900."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_window_size(1280, 900)
        driver.set_script_timeout(WAIT)
        yield driver
    finally:
        driver.quit()


# ---------------------------------------------------------------------------- helpers


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], Any], what: str,
             timeout: float = WAIT) -> Any:
    """Wait until ``condition(driver)`` is truthy; its value."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, message=f"waited {timeout:g}s for {what}")


def sign_in(driver: WebDriver, server: UiServer, who: str, *, path: str = "/ui/") -> None:
    """Sign in through the login form with ``who``'s token; wait for ``path``."""
    driver.get(f"{server.url}/ui/login?next={path}")
    field = wait_for(driver, lambda d: d.find_element(By.ID, "token"), "the login form")
    field.send_keys(TOKENS[who][0])
    driver.find_element(By.ID, "sign-in").click()
    wait_for(driver, lambda d: d.find_element(By.CLASS_NAME, "who-name").text == who,
             f"{who} signed in")


def console_errors(driver: WebDriver) -> list[str]:
    """Errors the page logged (script errors, CSP violations), expected answers aside."""
    logs: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return [entry["message"] for entry in logs
            if entry["level"] == "SEVERE" and not _EXPECTED_CONSOLE.search(entry["message"])]


def eventually(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll a server-side ``check`` (REST) until it is truthy; its value."""
    return wait_until(check, timeout, interval=0.1, what=what)
