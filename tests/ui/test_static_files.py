"""The UI's files, read as text: nothing in them parses data as HTML, runs strings as code,
uses inline script or style (the Content-Security-Policy would refuse them), or loads
anything from another host (the UI works offline)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "axengine" / "ui" / "static"
SCRIPTS = sorted(STATIC.glob("*.js"))

#: Sinks that would turn a task's value into markup or code.
_SINKS = re.compile(r"\b(innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\s*\(|"
                    r"new\s+Function|setAttribute\(\s*['\"](style|on\w+)['\"])")


def test_the_page_files_are_there() -> None:
    names = {p.name for p in STATIC.iterdir()}
    assert {"index.html", "app.js", "app.css", "icon.svg"} <= names
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_writes_markup_or_code(script: Path) -> None:
    text = script.read_text()
    found = [m.group(0) for m in _SINKS.finditer(text)]
    assert found == [], f"{script.name}: {found}"


def test_index_has_no_inline_script_or_style() -> None:
    html = (STATIC / "index.html").read_text()
    assert "<style" not in html and "style=" not in html
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.S)
    assert scripts == [""]  # the one module script, by src
    assert re.search(r'<script type="module" src="/ui/static/app.js">', html)
    assert not re.search(r"\son\w+=", html)


def test_nothing_is_loaded_from_another_host() -> None:
    for path in sorted(STATIC.iterdir()):
        for url in re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s'\")]*", path.read_text()):
            assert url == "http://www.w3.org/2000/svg", f"{path.name}: {url}"
