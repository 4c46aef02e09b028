"""Which nodes a template reads, found in its syntax tree (for validation)."""

from __future__ import annotations

from typing import cast

from jinja2 import nodes

from axengine.template._compiler import _compiled
from axengine.template._expression import _if_form, _is_if_form
from axengine.template._normalize import _has_markup


def _node_ids(tree: nodes.Node) -> frozenset[str] | None:
    found: set[str] = set()
    static: set[int] = set()
    called = {id(call.node) for call in tree.find_all(nodes.Call)}
    for found_node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        node = cast(nodes.Getattr | nodes.Getitem, found_node)
        inner = node.node
        if not (isinstance(inner, nodes.Name) and inner.name == "nodes") or id(node) in called:
            continue  # nodes.get('x'), nodes.items() are method calls, not node ids
        if isinstance(node, nodes.Getattr):
            found.add(node.attr)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            found.add(node.arg.value)
        else:
            continue
        static.add(id(inner))
    for name in tree.find_all(nodes.Name):
        if name.name == "nodes" and (name.ctx != "load" or id(name) not in static):
            return None  # nodes[var], nodes|..., a loop over nodes, or a shadowing name
    return frozenset(found)


def referenced_nodes(source: str) -> frozenset[str] | None:
    """Node ids a template or condition expression reads as ``nodes.<id>``.

    Args:
        source: A template, or an ``if/elif/else`` expression. Plain text refers to
            no node.

    Returns:
        The ids used as ``nodes.<id>``, ``nodes['<id>']`` or ``nodes["<id>"]``; None when
        ``nodes`` is used dynamically (``nodes[var]``, ``nodes|...``, iterated,
        reassigned), so the set cannot be known.

    Raises:
        TemplateError: The source does not compile.
    """
    if _has_markup(source):
        return _node_ids(_compiled(source).tree)
    if not _is_if_form(source):
        return frozenset()
    found: set[str] = set()
    for clause in _if_form(source):
        ids = _node_ids(clause.condition.tree) if clause.condition else frozenset[str]()
        if ids is None:
            return None
        found |= ids
    return frozenset(found)
