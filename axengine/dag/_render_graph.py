"""Render a :class:`Dag` as a Mermaid flowchart or a Graphviz DOT digraph.

Node shapes follow the node type in both formats: ``tool_call`` a box (Mermaid
subroutine), ``llm_call`` a rounded box, ``condition`` a diamond, ``human_gateway`` a
hexagon; a map node's detail ends with ``[map]``. Edges carry their guard
(``condition``, without the ``{{ }}``) or ``when`` label; ``on_failure`` edges are
dashed, and so is a bounded loop's back edge (dotted in Mermaid), labelled with its
``max_visits`` bound (``≤3 visits``) before the guard.

A ``dag`` node (a parallelogram in Mermaid, a component box in DOT) is followed by its
sub-DAG's nodes in a Mermaid ``subgraph`` / DOT ``cluster`` titled ``{node}: {DAG
name}``, with a dotted ``runs`` edge from the node to it. Node ids of a sub-DAG
(``review/check``) become ``n_review-check`` in Mermaid (DOT quotes every id).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from axengine.dag._model import SCOPE, Dag, Edge, Node

__all__ = ["to_dot", "to_mermaid"]

#: Edge labels longer than this are cut (with an ellipsis) to keep the graph readable.
MAX_LABEL = 60

_MERMAID_SHAPES: dict[str, tuple[str, str]] = {
    "tool_call": ("[[", "]]"),
    "llm_call": ("(", ")"),
    "condition": ("{", "}"),
    "human_gateway": ("{{", "}}"),
    "dag": ("[/", "/]"),
}
_DOT_SHAPES: dict[str, str] = {
    "tool_call": "shape=box",
    "llm_call": 'shape=box, style="rounded"',
    "condition": "shape=diamond",
    "human_gateway": "shape=hexagon",
    "dag": "shape=component",
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
    elif node.type == "dag" and node.subdag is not None:
        detail = f"dag: {node.subdag_file or node.subdag.name}"
    else:
        detail = node.type
    return f"{detail} [map]" if node.map is not None else detail


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;")


def _scoped(dag: Dag, scope: str | None, depth: int) -> Iterator[tuple[Node, int]]:
    """The nodes of ``scope`` (None: the DAG's own) with their nesting depth, each
    ``dag`` node followed by its sub-DAG's nodes; a sub-DAG ends at ``(dag node, -1)``."""
    for node in dag.nodes.values():
        if dag.scope_of(node.id) != scope:
            continue
        yield node, depth
        if node.subdag is not None:
            yield from _scoped(dag, node.id, depth + 1)
            yield node, -1


def _subdag_title(node: Node) -> str:
    return f"{node.id}: {node.subdag.name}" if node.subdag is not None else node.id


def _mid(node_id: str) -> str:
    """Mermaid id of a node: ``n_`` (Mermaid reserves words such as ``end``) and ``-``
    for the scope separator, which node ids never have."""
    return "n_" + node_id.replace(SCOPE, "-")


def _gid(node_id: str) -> str:
    return "g_" + node_id.replace(SCOPE, "-")


def _first_child(dag: Dag, node: Node) -> str | None:
    """The node a ``runs`` edge of DOT points at: the sub-DAG's first entry node."""
    if node.subdag is None:
        return None
    entries = node.subdag.entry_nodes or tuple(node.subdag.nodes)
    return f"{node.id}{SCOPE}{entries[0]}" if entries else None


def to_mermaid(dag: Dag) -> str:
    """The DAG as a Mermaid ``flowchart TD`` (node ids are prefixed ``n_``, since
    Mermaid reserves words such as ``end``)."""
    lines = ["flowchart TD"]
    for node, depth in _scoped(dag, None, 1):
        if depth < 0:
            lines.append("    " * (node.id.count(SCOPE) + 1) + "end")
            continue
        indent = "    " * depth
        left, right = _MERMAID_SHAPES.get(node.type, ("[", "]"))
        text = _mermaid_text(f"{node.id}<br/>{_node_detail(node)}")
        lines.append(f'{indent}{_mid(node.id)}{left}"{text}"{right}')
        if node.subdag is not None:
            title = _mermaid_text(_subdag_title(node))
            lines.append(f'{indent}subgraph {_gid(node.id)} ["{title}"]')
    for node in dag.nodes.values():
        for edge in node.next:
            label = _edge_label(edge)
            line = "-.->" if edge.loops else "-->"
            arrow = f'{line}|"{_mermaid_text(label)}"|' if label else line
            lines.append(f"    {_mid(node.id)} {arrow} {_mid(edge.target)}")
        if node.on_failure:
            lines.append(f'    {_mid(node.id)} -.->|"on_failure"| {_mid(node.on_failure)}')
        if node.subdag is not None:
            lines.append(f'    {_mid(node.id)} -.->|"runs"| {_gid(node.id)}')
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
    if any(node.subdag is not None for node in dag.nodes.values()):
        lines.append("    compound=true;")  # lets a `runs` edge end at a cluster
    for node, depth in _scoped(dag, None, 1):
        if depth < 0:
            lines.append("    " * (node.id.count(SCOPE) + 1) + "}")
            continue
        indent = "    " * depth
        shape = _DOT_SHAPES.get(node.type, "shape=box")
        text = _dot_text(f"{node.id}\n{_node_detail(node)}")
        lines.append(f"{indent}{_dot_text(node.id)} [{shape}, label={text}];")
        if node.subdag is not None:
            lines.append(f"{indent}subgraph {_dot_text('cluster_' + node.id)} {{")
            lines.append(f"{indent}    label={_dot_text(_subdag_title(node))};")
            lines.append(f"{indent}    style=dashed;")
    for node in dag.nodes.values():
        first = _first_child(dag, node)
        if first is not None:
            lines.append(
                f"    {_dot_text(node.id)} -> {_dot_text(first)} [label=\"runs\", "
                f"style=dotted, lhead={_dot_text('cluster_' + node.id)}];")
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
