"""handle(): dispatch by node type, and no exception ever escapes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import executors.handlers as handlers_module
from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from executors.handlers import HANDLERS, handle
from executors.registry import model_names, tool_names
from tests.executors.fakes import FakeContext, make_request


@pytest.fixture
def fake_handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Swap in a 'tool_call' handler whose behaviour the test sets."""
    box: dict[str, Any] = {}

    def run(request: NodeRequest, ctx: NodeContext) -> Outcome:
        behaviour = box["behaviour"]
        if isinstance(behaviour, BaseException):
            raise behaviour
        return behaviour  # type: ignore[no-any-return]

    monkeypatch.setattr(handlers_module, "HANDLERS", {**HANDLERS, "tool_call": run})
    yield box


def test_dispatches_by_node_type() -> None:
    assert set(HANDLERS) == {"llm_call", "tool_call"}
    tool = handle(make_request("tool_call", config={"tool": "echo"}, input=[1]), FakeContext())
    llm = handle(make_request("llm_call", config={"model": "sim-small", "prompt": "hi"}),
                 FakeContext())
    assert tool == Success([1])
    assert isinstance(llm, Success) and "text" in llm.output


@pytest.mark.parametrize(("node_type", "hint"), [("condition", "decided by the API"),
                                                  ("human_gateway", "decided by the API"),
                                                  ("quantum_call", "unknown")])
def test_other_node_types_fail_for_good(node_type: str, hint: str) -> None:
    outcome = handle(make_request(node_type), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert hint in outcome.message


def test_exception_becomes_retryable_failure(fake_handler: dict[str, Any]) -> None:
    fake_handler["behaviour"] = KeyError("boom")
    outcome = handle(make_request(node_id="parse"), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is True
    assert "KeyError" in outcome.message and "parse" in outcome.message
    assert outcome.details["exception"] == "KeyError"


def test_exception_may_declare_itself_not_retryable(fake_handler: dict[str, Any]) -> None:
    class Permanent(RuntimeError):
        retryable = False

    fake_handler["behaviour"] = Permanent("bad data")
    outcome = handle(make_request(), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False


def test_non_outcome_return_is_a_failure(fake_handler: dict[str, Any]) -> None:
    fake_handler["behaviour"] = {"status": "ok"}
    outcome = handle(make_request(), FakeContext())
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert "dict" in outcome.message


def test_registry_sees_tools_and_models() -> None:
    assert {"pdf_parser", "http_request", "send_email", "video_vendor", "echo",
            "sleep"} == tool_names()
    assert {"gpt-4-turbo", "moderation-v1"} <= model_names()
