"""Small DAGs the tests of ``axengine.testing`` run (the financial DAG is in dags/)."""

from __future__ import annotations

from pathlib import Path

from axengine.dag import load_dag_text

ROOT = Path(__file__).resolve().parents[2]
FINANCIAL = ROOT / "dags" / "financial_risk_assessment.yaml"
EXAMPLE_FIXTURE = ROOT / "examples" / "testing" / "fixtures" / "acme_medium.fixture.json"
LEGACY_FIXTURES = ROOT / "tests" / "data" / "fixtures"

#: A page is fetched (retried twice), summarized by a model, reviewed by a person
#: (approved after an hour without an answer) and published; a failed fetch alerts.
FLOW = load_dag_text("""\
name: flow
nodes:
  fetch:
    type: tool_call
    tool: http_request
    input: "{{ input.url }}"
    timeout: 30
    retry: 2
    next:
      - condition: "{{ output.ok }}"
        target: summarize
      - condition: "{{ not output.ok }}"
        target: alert
  summarize:
    type: llm_call
    model: gpt-4o-mini
    prompt: "Summarize the page."
    input: "{{ nodes.fetch.output.body }}"
    next: review
  review:
    type: human_gateway
    description: Publish this summary?
    input: "{{ nodes.summarize.output }}"
    timeout: 3600
    on_timeout: approve
    next:
      - condition: "{{ output.decision == 'approve' }}"
        target: publish
  publish: {type: tool_call, tool: echo, input: "{{ nodes.review.output.data }}"}
  alert: {type: tool_call, tool: echo, input: alert}
""", file="flow.yaml")

PAGE = {"ok": True, "body": "<h1>news</h1>"}
#: Every node of FLOW answered, the gate approved: the happy path.
FLOW_STUBS = {"fetch": PAGE, "model:gpt-4o-mini": "a summary", "tool:echo": "done"}
HAPPY = ["fetch", "summarize", "review", "publish"]

#: What the model extracts for each branch of the financial DAG's assess_risk.
METRICS = {
    "high_risk": {"revenue_growth": 0.30, "net_profit_margin": 0.05, "debt_to_equity": 1.0},
    "medium_risk": {"revenue_growth": 0.08, "net_profit_margin": 0.14, "debt_to_equity": 2.4},
    "low_risk": {"revenue_growth": 0.05, "net_profit_margin": 0.20, "debt_to_equity": 0.5},
}
