"""pdf_parser: real PDFs through pypdf, business failures, bounded fetches."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from executors.contract import Failure, Success
from executors.tools import tool_call
from tests.executors.fakes import FakeContext, make_request
from tests.executors.local_http import Reply, serve
from tests.executors.samples import ACME, ROOT, pdf_script

#: Local trust (``ax run``): any readable regular file, loopback URLs allowed. The
#: api-trust refusals are tested in ``test_policy.py`` and ``tests/security``.
LOCAL = {"trust": "local"}


def _run(source: object, **settings: object) -> tuple[object, FakeContext]:
    ctx = FakeContext(settings={**LOCAL, **settings})
    request = make_request(config={"tool": "pdf_parser"}, input=source)
    return tool_call(request, ctx), ctx


def test_parses_sample_report_with_page_progress() -> None:
    outcome, ctx = _run(str(ACME))
    assert isinstance(outcome, Success)
    out = outcome.output
    assert out["status"] == "success"
    assert out["pages"] == 1
    assert "Revenue growth: 8.0%" in out["text"]
    assert out["sha256"] == hashlib.sha256(ACME.read_bytes()).hexdigest()
    assert ctx.markers == ["page 1/1"]


def test_relative_path_resolves_against_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    outcome, _ = _run("dags/inputs/globex_annual_report.pdf")
    assert isinstance(outcome, Success)
    assert "Revenue growth: 22.0%" in outcome.output["text"]


def test_file_uri_and_mapping_input() -> None:
    outcome, _ = _run({"pdf_url": ACME.as_uri()})
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "success"


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"this is not a pdf at all", "not a readable PDF"),
        (b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog", "not a readable PDF"),
    ],
)
def test_corrupt_pdf_is_a_business_failure(tmp_path: Path, content: bytes, error: str) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(content)
    outcome, _ = _run(str(path))
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "failed"
    assert error in outcome.output["error"]


def test_missing_file_is_a_business_failure(tmp_path: Path) -> None:
    outcome, _ = _run(str(tmp_path / "nope.pdf"))
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "failed"
    assert "no such file" in outcome.output["error"]


def test_empty_input_is_a_business_failure() -> None:
    outcome, _ = _run("")
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "failed"


def test_wrong_input_type_is_not_retryable() -> None:
    outcome, _ = _run(42)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False


def test_size_bound(tmp_path: Path) -> None:
    outcome, _ = _run(str(ACME), pdf_max_bytes=100)
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "failed"
    assert "pdf_max_bytes" in outcome.output["error"]


def test_pdf_without_text_is_a_business_failure(tmp_path: Path) -> None:
    path = tmp_path / "blank.pdf"
    path.write_bytes(pdf_script().build_pdf(()))
    outcome, _ = _run(str(path))
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "failed"
    assert "no extractable text" in outcome.output["error"]


def test_fetch_over_http_from_loopback() -> None:
    pdf = ACME.read_bytes()
    with serve({"/r.pdf": lambda _: Reply(200, pdf, {"Content-Type": "application/pdf"})}) as srv:
        outcome, _ = _run(f"{srv.url}/r.pdf")
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "success"
    assert outcome.output["sha256"] == hashlib.sha256(pdf).hexdigest()


def test_http_404_is_business_and_500_retries() -> None:
    with serve({"/boom": lambda _: Reply(500, b"oops")}) as srv:
        missing, _ = _run(f"{srv.url}/missing.pdf")
        boom, _ = _run(f"{srv.url}/boom")
    assert isinstance(missing, Success)
    assert missing.output["status"] == "failed"
    assert "404" in missing.output["error"]
    assert isinstance(boom, Failure)
    assert boom.retryable is True


def test_http_host_not_allowed_is_not_fetched() -> None:
    with serve() as srv:
        url = srv.url.replace("127.0.0.1", "localhost")
        outcome, _ = _run(f"{url}/r.pdf", egress_allowed_hosts=["api.example.org"])
        assert srv.seen == []
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "failed"
    assert "egress_allowed_hosts" in outcome.output["error"]


def test_api_trust_refuses_loopback_url_and_local_path() -> None:
    with serve() as srv:
        url, _ = _run(f"{srv.url}/r.pdf", trust="api")
        assert srv.seen == []
    path, _ = _run(str(ACME), trust="api")
    for outcome, setting in ((url, "egress_private_allowed"), (path, "input_root")):
        assert isinstance(outcome, Success)
        assert outcome.output["status"] == "failed"
        assert setting in outcome.output["error"]
        assert "sha256" not in outcome.output


def test_api_trust_reads_under_input_root() -> None:
    outcome, _ = _run(str(ACME), trust="api", input_root=str(ACME.parent))
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == "success"


def test_stops_when_fence_goes_stale() -> None:
    ctx = FakeContext(settings=dict(LOCAL), stale_after_progress=1)
    outcome = tool_call(make_request(config={"tool": "pdf_parser"}, input=str(ACME)), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.details.get("stopped") is True
