"""Render a :class:`Dag` as a Mermaid flowchart or a Graphviz DOT digraph.

Node shapes follow the node type in both formats: ``tool_call`` a box (Mermaid
subroutine), ``llm_call`` a rounded box, ``condition`` a diamond, ``human_gateway`` a
hexagon; a map node's detail ends with ``[map]``. Edges carry their guard
(``condition``, without the ``{{ }}``) or ``when`` label; ``on_failure`` edges are
dashed, and so is a bounded loop's back edge (dotted in Mermaid), labelled with its
``max_visits`` bound (``≤3 visits``) before the guard.
"""

from __future__ import annotations

import re

from axengine.dag._model import Dag, Edge, Node

__all__ = ["to_dot", "to_mermaid"]

#: Edge labels longer than this are cut (with an ellipsis) to keep the graph readable.
MAX_LABEL = 60

_MERMAID_SHAPES: dict[str, tuple[str, str]] = {
    "tool_call": ("[[", "]]"),
    "llm_call": ("(", ")"),
    "condition": ("{", "}"),
    "human_gateway": ("{{", "}}"),
}
_DOT_SHAPES: dict[str, str] = {
    "tool_call": "shape=box",
    "llm_call": 'shape=box, style="rounded"',
    "condition": "shape=diamond",
    "human_gateway": "shape=hexagon",
}
_GUARD = re.compile(r"^\s*\{\{-?\s*(.*?)\s*-?\}\}\s*$", re.DOTALL)


def _guard_label(edge: Edge) -> str | None:
    if edge.when is not None:
        return edge.when
    if edge.condition is None:
        return None
    found = _GUARD.match(edge.condition)
    label = " ".join((found.group(1) if found else edge.condition).split())
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def _edge_label(edge: Edge) -> str | None:
    label = _guard_label(edge)
    if edge.max_visits is None:
        return label
    bound = f"≤{edge.max_visits} visits"
    return f"{bound}: {label}" if label else bound


def _node_detail(node: Node) -> str:
    if node.type == "tool_call" and node.tool:
        detail = f"tool_call: {node.tool}"
    elif node.type == "llm_call" and node.model:
        detail = f"llm_call: {node.model}"
    else:
        detail = node.type
    return f"{detail} [map]" if node.map is not None else detail


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;")


def to_mermaid(dag: Dag) -> str:
    """The DAG as a Mermaid ``flowchart TD`` (node ids are prefixed ``n_``, since
    Mermaid reserves words such as ``end``)."""
    lines = ["flowchart TD"]
    for node in dag.nodes.values():
        left, right = _MERMAID_SHAPES.get(node.type, ("[", "]"))
        text = _mermaid_text(f"{node.id}<br/>{_node_detail(node)}")
        lines.append(f'    n_{node.id}{left}"{text}"{right}')
    for node in dag.nodes.values():
        for edge in node.next:
            label = _edge_label(edge)
            line = "-.->" if edge.loops else "-->"
            arrow = f'{line}|"{_mermaid_text(label)}"|' if label else line
            lines.append(f"    n_{node.id} {arrow} n_{edge.target}")
        if node.on_failure:
            lines.append(f'    n_{node.id} -.->|"on_failure"| n_{node.on_failure}')
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(dag: Dag) -> str:
    """The DAG as a Graphviz ``digraph`` (top to bottom)."""
    lines = [
        f"digraph {_dot_text(dag.name)} {{",
        "    rankdir=TB;",
        '    node [fontname="Helvetica"];',
        '    edge [fontname="Helvetica", fontsize=10];',
    ]
    for node in dag.nodes.values():
        shape = _DOT_SHAPES.get(node.type, "shape=box")
        text = _dot_text(f"{node.id}\n{_node_detail(node)}")
        lines.append(f"    {_dot_text(node.id)} [{shape}, label={text}];")
    for node in dag.nodes.values():
        for edge in node.next:
            label = _edge_label(edge)
            parts = [f"label={_dot_text(label)}"] if label else []
            if edge.loops:
                parts.append("style=dashed")
            attrs = f" [{', '.join(parts)}]" if parts else ""
            lines.append(f"    {_dot_text(node.id)} -> {_dot_text(edge.target)}{attrs};")
        if node.on_failure:
            lines.append(
                f"    {_dot_text(node.id)} -> {_dot_text(node.on_failure)} "
                '[label="on_failure", style=dashed, color=red];'
            )
    lines.append("}")
    return "\n".join(lines) + "\n"
