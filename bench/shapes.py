"""The DAG shapes every engine runs, as ax DAG mappings, and the no-op handler.

Three shapes, built from ``tool_call`` nodes with the ``echo`` tool so that the same DAG
runs unchanged under the in-process no-op handler and under real ``ax executor``
processes (whose ``echo`` tool returns its input too):

``financial``
    The seed's financial DAG reduced to its control flow: ``parse_pdf`` →
    ``extract_metrics`` → ``assess_risk`` (a ``condition`` node with the seed's
    ``if/elif/else`` expression) → one of three ``send_*_email`` nodes →
    ``log_completion`` (a join). Seven nodes are declared; on the medium-risk path the
    echoed metrics select, five run (four handler calls and the inline condition) and
    two are skipped. Inputs and guards are templates, as in the seed.
``chain``
    ``n0`` → ``n1`` → ... → ``n{N-1}``: one node ready at a time, so the time from a
    node's ``ready`` to its ``committed`` event is the engine's per-node overhead.
``fanout``
    ``src`` → ``w0`` ... ``w{N-1}`` (in parallel) → ``join``: N + 2 nodes; every branch
    completion updates the join's readiness, the contended case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from executors.contract import NodeContext, NodeRequest, Outcome, Success, inline

__all__ = [
    "FINANCIAL_EXECUTED",
    "FINANCIAL_METRICS",
    "chain",
    "echo_handler",
    "executed_nodes",
    "fanout",
    "financial",
    "shape",
]

#: What ``extract_metrics`` returns: debt to equity above 2.0 selects medium risk.
FINANCIAL_METRICS: Mapping[str, float] = {
    "revenue_growth": 0.05, "net_profit_margin": 0.2, "debt_to_equity": 2.5,
}
#: Nodes of the financial shape that run on the medium-risk path.
FINANCIAL_EXECUTED = ("parse_pdf", "extract_metrics", "assess_risk",
                      "send_medium_risk_email", "log_completion")

_RISK_EXPRESSION = """\
if .output.revenue_growth > 0.15 and .output.net_profit_margin < 0.12: high_risk
elif .output.debt_to_equity > 2.0: medium_risk
else: low_risk
"""


@inline
def echo_handler(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """The no-op node: return the rendered input (what the ``echo`` tool does; inline
    like it, so the worker calls it on its event loop, as LangGraph and DBOS call a
    no-op node in the thread that runs the graph)."""
    return Success(request.input)


def financial(name: str = "bench_financial") -> dict[str, Any]:
    """The financial shape (see the module docstring)."""
    email = {"type": "tool_call", "tool": "echo", "next": "log_completion"}
    return {
        "name": name,
        "nodes": {
            "parse_pdf": {
                "type": "tool_call", "tool": "echo",
                "input": {"status": "success", "text": "report {{ .input.doc }}"},
                "next": [{"condition": "{{ .output.status == 'success' }}",
                          "target": "extract_metrics"}],
            },
            "extract_metrics": {
                "type": "tool_call", "tool": "echo",
                "input": {**FINANCIAL_METRICS,
                          "source": "{{ .nodes.parse_pdf.output.text }}"},
                "next": "assess_risk",
            },
            "assess_risk": {
                "type": "condition", "expression": _RISK_EXPRESSION,
                "next": [{"target": "send_high_risk_email", "when": "high_risk"},
                         {"target": "send_medium_risk_email", "when": "medium_risk"},
                         {"target": "send_low_risk_email", "when": "low_risk"}],
            },
            "send_high_risk_email": {
                **email, "input": {"to": "risk-officer@example.com",
                                   "growth": "{{ .nodes.extract_metrics.output.revenue_growth }}"},
            },
            "send_medium_risk_email": {
                **email, "input": {"to": "risk-team@example.com",
                                   "d2e": "{{ .nodes.extract_metrics.output.debt_to_equity }}"},
            },
            "send_low_risk_email": {
                **email, "input": {"to": "risk-team@example.com",
                                   "doc": "{{ .input.doc }}"},
            },
            "log_completion": {
                "type": "tool_call", "tool": "echo",
                "input": {"doc": "{{ .input.doc }}", "risk": "{{ .nodes.assess_risk.output }}"},
            },
        },
    }


def chain(n: int, *, template: bool = False, name: str | None = None) -> dict[str, Any]:
    """A chain of ``n`` echo nodes; with ``template`` each input renders the previous
    node's output (the first renders the task input)."""
    nodes: dict[str, Any] = {}
    for i in range(n):
        node: dict[str, Any] = {"type": "tool_call", "tool": "echo"}
        if template:
            node["input"] = ("{{ .input.seed }}" if i == 0
                             else "{{ .nodes.n" + str(i - 1) + ".output }}")
        else:
            node["input"] = {"i": i}
        if i + 1 < n:
            node["next"] = f"n{i + 1}"
        nodes[f"n{i}"] = node
    return {"name": name or f"bench_chain_{n}{'_t' if template else ''}", "nodes": nodes}


def fanout(width: int, *, name: str | None = None) -> dict[str, Any]:
    """``src`` → ``width`` parallel echo nodes → ``join``."""
    branches = [f"w{i}" for i in range(width)]
    nodes: dict[str, Any] = {
        "src": {"type": "tool_call", "tool": "echo", "input": {"i": -1}, "next": branches},
    }
    for i, nid in enumerate(branches):
        nodes[nid] = {"type": "tool_call", "tool": "echo", "input": {"i": i}, "next": "join"}
    nodes["join"] = {"type": "tool_call", "tool": "echo", "input": {"i": width}}
    return {"name": name or f"bench_fanout_{width}", "nodes": nodes}


def shape(kind: str, size: int = 0, *, lane: str | None = None) -> dict[str, Any]:
    """The mapping of shape ``kind`` (``financial``, ``chain``, ``fanout``) at ``size``;
    with ``lane``, every node is put in that queue lane (``fast`` or ``default``)."""
    if kind == "financial":
        mapping = financial()
    elif kind == "chain":
        mapping = chain(size)
    elif kind == "fanout":
        mapping = fanout(size)
    else:
        raise ValueError(f"unknown shape {kind!r}")
    if lane is not None:
        for node in mapping["nodes"].values():
            if node["type"] != "condition":
                node["lane"] = lane
    return mapping


def executed_nodes(kind: str, size: int = 0) -> int:
    """Nodes that run (commit) in one task of the shape."""
    if kind == "financial":
        return len(FINANCIAL_EXECUTED)
    if kind == "chain":
        return size
    if kind == "fanout":
        return size + 2
    raise ValueError(f"unknown shape {kind!r}")
