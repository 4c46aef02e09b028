"""http_request against a local server: business statuses, retries, bounds, allowlist.

The server listens on loopback, which the egress policy refuses by default: these tests
opt in the way an operator would (``egress_private_allowed``).
"""

from __future__ import annotations

import json

from executors.contract import Failure, Success
from executors.tools import tool_call
from tests.executors.fakes import FakeContext, make_request
from tests.executors.local_http import Reply, Seen, serve

#: What lets the tests reach their own loopback server.
LOOPBACK = {"egress_private_allowed": ["127.0.0.1"]}


def _run(spec: object, **settings: object) -> object:
    request = make_request(config={"tool": "http_request"}, input=spec,
                           task_id="t9", node_id="hook", input_revision="r3")
    return tool_call(request, FakeContext(settings={**LOOPBACK, **settings}))


def _json(status: int, value: object) -> Reply:
    return Reply(status, json.dumps(value).encode(), {"Content-Type": "application/json"})


def test_get_json() -> None:
    with serve({"/v": lambda _: _json(200, {"ok": True})}) as srv:
        outcome = _run(f"{srv.url}/v")
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == 200
    assert outcome.output["body"] == {"ok": True}
    assert outcome.output["headers"]["content-type"] == "application/json"


def test_post_json_carries_body_and_idempotency_key() -> None:
    def echo(seen: Seen) -> Reply:
        return Reply(201, seen.body, {"Content-Type": "text/plain; charset=utf-8"})

    with serve({"/hook": echo}) as srv:
        outcome = _run({"method": "post", "url": f"{srv.url}/hook", "json": {"a": 1},
                        "headers": {"X-Test": "yes"}})
        (seen,) = srv.seen
    assert isinstance(outcome, Success)
    assert outcome.output == {
        "status": 201,
        "headers": {"content-type": "text/plain; charset=utf-8", "content-length": "8"},
        "body": '{"a": 1}',
    }
    assert seen.method == "POST"
    assert seen.headers["Idempotency-Key"] == "http:t9:hook:r3"
    assert seen.headers["X-Test"] == "yes"
    assert seen.headers["Content-Type"] == "application/json"


def test_get_has_no_idempotency_key() -> None:
    with serve({"/v": lambda _: Reply(200, b"x")}) as srv:
        _run(f"{srv.url}/v")
        assert "Idempotency-Key" not in srv.seen[0].headers


def test_4xx_is_a_business_result() -> None:
    with serve({"/gone": lambda _: _json(404, {"error": "gone"})}) as srv:
        outcome = _run(f"{srv.url}/gone")
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == 404
    assert outcome.output["body"] == {"error": "gone"}


def test_5xx_is_retryable() -> None:
    with serve({"/x": lambda _: Reply(503, b"busy")}) as srv:
        outcome = _run(f"{srv.url}/x")
    assert isinstance(outcome, Failure)
    assert outcome.retryable is True
    assert outcome.details["status"] == 503


def test_connection_refused_is_retryable() -> None:
    with serve() as srv:
        url = srv.url
    outcome = _run(f"{url}/after-shutdown")
    assert isinstance(outcome, Failure)
    assert outcome.retryable is True


def test_redirect_is_returned_not_followed() -> None:
    with serve({"/r": lambda _: Reply(302, b"", {"Location": "http://example.com/"})}) as srv:
        outcome = _run(f"{srv.url}/r")
        assert len(srv.seen) == 1
    assert isinstance(outcome, Success)
    assert outcome.output["status"] == 302
    assert outcome.output["headers"]["location"] == "http://example.com/"


def test_response_bound() -> None:
    with serve({"/big": lambda _: Reply(200, b"x" * 2048)}) as srv:
        outcome = _run(f"{srv.url}/big", http_max_bytes=1024)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert "http_max_bytes" in outcome.message


def test_only_http_schemes_and_allowed_hosts() -> None:
    ftp = _run("ftp://127.0.0.1/x")
    other = _run("http://example.com/x", egress_allowed_hosts=["api.example.org"])
    assert isinstance(ftp, Failure) and ftp.retryable is False
    assert isinstance(other, Failure) and other.retryable is False
    assert "egress_allowed_hosts" in other.message


def test_loopback_refused_without_opt_in() -> None:
    with serve({"/v": lambda _: Reply(200, b"x")}) as srv:
        outcome = _run(f"{srv.url}/v", egress_private_allowed=[])
        assert srv.seen == []
    assert isinstance(outcome, Failure) and outcome.retryable is False
    assert "loopback" in outcome.message
    assert "egress_private_allowed" in outcome.message


def test_bad_input_shapes() -> None:
    for spec in (None, 3, {"url": 5}, {"url": "http://127.0.0.1/", "method": "BREW"},
                 {"url": "http://127.0.0.1/", "timeout": -1}):
        outcome = _run(spec)
        assert isinstance(outcome, Failure), spec
        assert outcome.retryable is False
