"""The simulated model: extraction, moderation, and its fault-injection knobs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from executors.contract import Failure, Success, Unavailable
from executors.handlers import handle
from executors.llm import (
    INPUT_MARKER,
    LlmCall,
    ProviderError,
    ProviderUnavailable,
    SimulatedProvider,
    knobs_for_model,
    merge_knobs,
)
from tests.executors.fakes import FakeContext, make_request
from tests.executors.samples import INPUTS, pdf_script

SEED_PROMPT = """You are a financial analyst. Extract these metrics from the text:
- Revenue Growth (YoY)
- Net Profit Margin
- Debt-to-Equity Ratio
Return JSON with keys: revenue_growth, net_profit_margin, debt_to_equity.
"""

MODERATION = "Classify the user post. Return one of: APPROVED, REJECTED, MANUAL."


def _complete(prompt: str, model: str = "sim-small", **knobs: Any) -> str:
    provider = SimulatedProvider(knobs=merge_knobs(None, knobs))
    return provider.complete(model, prompt, temperature=0.0, max_tokens=None, settings={})


def _llm(config: dict[str, Any], node_input: Any = None, *, attempt: int = 1,
         ctx: FakeContext | None = None, handler: LlmCall | None = None) -> Any:
    request = make_request("llm_call", config={"model": "sim-small", **config},
                           input=node_input, attempt=attempt)
    return (handler or LlmCall())(request, ctx or FakeContext())


def risk(m: dict[str, float]) -> str:
    """The seed DAG's assess_risk rule."""
    if m["revenue_growth"] > 0.15 and m["net_profit_margin"] < 0.12:
        return "high_risk"
    if m["debt_to_equity"] > 2.0:
        return "medium_risk"
    return "low_risk"


def test_extracts_requested_keys_from_the_input() -> None:
    text = "Revenue: 1,240.5 million USD\nRevenue growth: 18.0%\nNet profit margin: 14.0%\n" \
           "Debt-to-equity ratio: 1.4\nCEO: Wile E. Coyote\n"
    answer = json.loads(_complete(SEED_PROMPT + INPUT_MARKER + text))
    assert answer == {"revenue_growth": 0.18, "net_profit_margin": 0.14, "debt_to_equity": 1.4}
    assert list(answer) == ["revenue_growth", "net_profit_margin", "debt_to_equity"]


def test_negative_figures_keep_their_sign() -> None:
    prompt = "Return JSON with keys: revenue_growth, cash_flow." + INPUT_MARKER + \
             "Revenue growth: -3.5%\nCash flow: -$1,200\n"
    assert json.loads(_complete(prompt)) == {"revenue_growth": -0.035, "cash_flow": -1200}


def test_missing_key_is_null_and_strings_are_kept() -> None:
    prompt = "Return JSON with keys: ceo, employees, ebitda." + INPUT_MARKER + \
             "CEO: Wile E. Coyote\nEmployees: 5,300\n"
    assert json.loads(_complete(prompt)) == {"ceo": "Wile E. Coyote", "employees": 5300,
                                             "ebitda": None}


@pytest.mark.parametrize("report", pdf_script().REPORTS, ids=lambda r: r.filename)
def test_financial_flow_on_sample_reports(report: Any) -> None:
    """pdf_parser → llm_call (seed prompt) → the seed's risk rule, through handle()."""
    parsed = handle(make_request("tool_call", config={"tool": "pdf_parser"},
                                 input=str(INPUTS / report.filename)),
                    FakeContext(settings={"input_root": str(INPUTS)}))
    assert isinstance(parsed, Success) and parsed.output["status"] == "success"
    metrics = handle(
        make_request("llm_call", config={"model": "gpt-4-turbo", "prompt": SEED_PROMPT,
                                         "temperature": 0.1, "max_tokens": 512},
                     input=parsed.output["text"]),
        FakeContext(),
    )
    assert isinstance(metrics, Success)
    assert risk(metrics.output) == report.expected_risk


@pytest.mark.parametrize(
    ("post", "label"),
    [
        ("Win money fast, this is totally not a scam", "REJECTED"),
        ("Threats of violence against my neighbour", "REJECTED"),
        ("The claim is unclear and I could not verify it", "MANUAL"),
        ("Lovely weather in Lisbon today", "APPROVED"),
    ],
)
def test_moderation_cues(post: str, label: str) -> None:
    outcome = _llm({"model": "moderation-v1", "prompt": MODERATION}, post)
    assert outcome == Success({"text": label})


def test_moderation_cues_come_from_the_input_not_the_instructions() -> None:
    prompt = "Reject scams and violence. Return one of: APPROVED, REJECTED, MANUAL."
    assert _llm({"prompt": prompt}, "A picture of my cat") == Success({"text": "APPROVED"})


def test_plain_prompt_is_deterministic_per_model_and_bounded() -> None:
    a = _complete("Say hello to Alice", "sim-small")
    assert a == _complete("Say hello to Alice", "sim-small")
    assert a != _complete("Say hello to Alice", "sim-large")
    provider = SimulatedProvider()
    short = provider.complete("sim-small", "Say hello to Alice", temperature=0.0, max_tokens=3,
                              settings={})
    assert len(short.split()) == 3
    outcome = _llm({"prompt": "Say hello to Alice"})
    assert isinstance(outcome, Success) and set(outcome.output) == {"text"}


def test_fixed_output_knob() -> None:
    assert _llm({"prompt": "x", "simulate": {"output": "fixed"}}) == Success({"text": "fixed"})
    assert _llm({"prompt": "Return JSON.", "simulate": {"output": {"a": 1}}}) == Success({"a": 1})


def test_malformed_knob_fails_a_json_node_retryably() -> None:
    assert not _complete("Return JSON with keys: a.", malformed=True).lstrip().startswith("{")
    outcome = _llm({"prompt": SEED_PROMPT, "simulate": {"malformed": True}}, "Revenue growth: 1%")
    assert isinstance(outcome, Failure)
    assert outcome.retryable is True
    assert "format" in outcome.message


def test_fail_attempts_uses_the_attempt_number() -> None:
    config = {"prompt": "hi", "simulate": {"fail_attempts": 2}}
    results = [_llm(config, attempt=n) for n in (1, 2, 3)]
    assert [type(r).__name__ for r in results] == ["Failure", "Failure", "Success"]
    assert results[0].retryable is True
    assert "fail_attempts" in results[0].message


def test_unavailable_knobs() -> None:
    down = _llm({"prompt": "hi", "simulate": {"unavailable": True}})
    assert isinstance(down, Unavailable)
    assert down.dependency == "model:sim-small"
    assert "simulated outage" in down.evidence
    until = _llm({"prompt": "hi", "simulate": {"unavailable_until": time.time() + 3600}})
    assert isinstance(until, Unavailable) and "until" in until.evidence
    over = _llm({"prompt": "hi", "simulate": {"unavailable_until": time.time() - 1}})
    assert isinstance(over, Success)


def test_settings_knobs_are_merged_under_node_knobs() -> None:
    ctx = FakeContext(settings={"simulate": {"unavailable": True, "output": "from settings"}})
    assert isinstance(_llm({"prompt": "hi"}, ctx=ctx), Unavailable)
    ctx = FakeContext(settings={"simulate": {"unavailable": True, "output": "from settings"}})
    node = _llm({"prompt": "hi", "simulate": {"unavailable": False}}, ctx=ctx)
    assert node == Success({"text": "from settings"})


def test_per_model_knobs() -> None:
    merged = merge_knobs({"models": {"a": {"latency": 1}}},
                         {"output": "x", "models": {"a": {"unavailable": True}}})
    assert knobs_for_model(merged, "a") == {"output": "x", "latency": 1, "unavailable": True}
    assert knobs_for_model(merged, "b") == {"output": "x"}
    with pytest.raises(ProviderUnavailable):
        SimulatedProvider(knobs=merged).complete("a", "p", temperature=0, max_tokens=None,
                                                 settings={})


def test_latency_heartbeats_and_finishes() -> None:
    ctx = FakeContext(settings={"heartbeat_interval": 0.02})
    started = time.monotonic()
    outcome = _llm({"prompt": "hi", "simulate": {"latency": 0.25}}, ctx=ctx)
    assert isinstance(outcome, Success)
    assert time.monotonic() - started >= 0.25
    assert ctx.heartbeats >= 3


def test_latency_stops_on_stale_fence() -> None:
    ctx = FakeContext(settings={"heartbeat_interval": 0.0}, stale_after_heartbeats=3)
    started = time.monotonic()
    outcome = _llm({"prompt": "hi", "simulate": {"latency": 60}}, ctx=ctx)
    assert isinstance(outcome, Failure)
    assert "stopped" in outcome.message
    assert time.monotonic() - started < 5
    assert ctx.heartbeats == 3


def test_latency_stops_when_cancelled() -> None:
    ctx = FakeContext(on_progress=lambda _marker: None)
    ctx.cancel()
    started = time.monotonic()
    outcome = _llm({"prompt": "hi", "simulate": {"latency": 60}}, ctx=ctx)
    assert isinstance(outcome, Failure)
    assert time.monotonic() - started < 5


def test_knob_type_errors_are_not_retryable() -> None:
    with pytest.raises(ProviderError) as info:
        _complete("hi", latency="slow")
    assert info.value.retryable is False
    outcome = _llm({"prompt": "hi", "simulate": {"fail_attempts": "two"}})
    assert isinstance(outcome, Failure) and outcome.retryable is False
