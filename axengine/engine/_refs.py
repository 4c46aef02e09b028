"""Which upstream outputs a node's templates read, and rendering that names the template.

A transition loads only the snapshots its decision depends on: these helpers find the
``nodes.<id>`` a node's input, prompt, description, guards or expression reference (from
each template's AST), so the rule asks for exactly those (``Need``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from axengine import template
from axengine.dag import Node
from axengine.errors import TemplateError

__all__ = ["expression_refs", "guard_refs", "literal_params", "map_refs", "named",
           "param_refs", "passed_output", "template_refs"]

#: An input that is one node's whole output and nothing else: ``{{ .nodes.<id>.output }}``
#: (the leading dot optional, blanks around).
_PASSED = re.compile(r"\s*\{\{\s*\.?nodes\.([A-Za-z_][A-Za-z0-9_]*)\.output\s*\}\}\s*")


def named(which: str, render: Callable[[Any, Mapping[str, Any]], Any], source: Any,
           ctx: Mapping[str, Any]) -> Any:
    """Render one of a node's templates; an error says which one failed (``prompt
    template: no field 'x'``), as ``ax validate`` names it, keeping its class and line."""
    try:
        return render(source, ctx)
    except TemplateError as exc:
        named = type(exc)(f"{which}: {exc}")
        named.line = getattr(exc, "line", 0)  # type: ignore[attr-defined]
        raise named from exc


def _templates_in(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _templates_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _templates_in(v)


def _refs_of(src: str) -> frozenset[str] | None:
    if "nodes" not in src:
        return frozenset()
    if "{{" in src or "{%" in src:
        return template.referenced_nodes(src)
    # A bare guard (no markup) is evaluated as one expression.
    return template.referenced_nodes("{{ " + src + " }}")


def _union_refs(sources: Iterable[str]) -> frozenset[str] | None:
    refs: set[str] = set()
    for src in sources:
        found = _refs_of(src)
        if found is None:
            return None
        refs |= found
    return frozenset(refs)


_T = TypeVar("_T")


def _per_node(compute: Callable[[Node], _T]) -> Callable[[Node], _T]:
    """``compute`` remembered on the node, as :attr:`Node.targets` is: a node is frozen
    and its references are read on every decision that touches it."""
    attr = f"_{compute.__name__}"

    @functools.wraps(compute)
    def per_node(node: Node) -> _T:
        try:
            return node.__dict__[attr]  # type: ignore[no-any-return]
        except KeyError:
            found = compute(node)
            object.__setattr__(node, attr, found)
            return found

    return per_node


@_per_node
def param_refs(node: Node) -> frozenset[str] | None:
    sources = list(_templates_in(node.input))
    if node.prompt is not None:
        sources.append(node.prompt)
    if node.description is not None and node.type == "human_gateway":
        sources.append(node.description)
    return _union_refs(sources)


@_per_node
def literal_params(node: Node) -> bool:
    """Whether the node's input, prompt and (a gate's) description hold no template
    markup: rendering them gives them back, whatever the context."""
    texts = [node.prompt] if node.prompt is not None else []
    if node.description is not None and node.type == "human_gateway":
        texts.append(node.description)
    return template.is_literal(node.input) and template.is_literal(texts)


@_per_node
def passed_output(node: Node) -> str | None:
    """The node (as the input's template names it) whose whole output is ``node``'s
    input — ``input: "{{ .nodes.<id>.output }}"`` — or None: the rendering of such an
    input is a copy of that output, equal to it."""
    found = _PASSED.fullmatch(node.input) if isinstance(node.input, str) else None
    return found.group(1) if found is not None else None


@_per_node
def guard_refs(node: Node) -> frozenset[str] | None:
    return _union_refs(e.condition for e in node.next if e.condition is not None)


@_per_node
def expression_refs(node: Node) -> frozenset[str] | None:
    expression = node.expression or ""
    if "{{" in expression:
        return _refs_of(expression)
    # The if/elif/else form is not a template: load every node only when it needs them.
    return None if "nodes" in expression else frozenset()


@_per_node
def map_refs(node: Node) -> frozenset[str] | None:
    """The nodes a map node's ``map`` template reads."""
    return _union_refs([node.map] if node.map is not None else [])


def template_refs(source: str) -> frozenset[str] | None:
    """The nodes one template reads (None: it may read any)."""
    return _union_refs([source])
