"""Which nodes a template reads, found in its syntax tree (for validation).

The ids come from the static analysis of :mod:`axengine.template._static`, which finds
them in the same pass as the problems it reports (without Jinja for the simple forms).
"""

from __future__ import annotations

from axengine.template._expression import _is_if_form
from axengine.template._normalize import _has_markup
from axengine.template._static import _if_analyses, _template_analysis


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
        return _template_analysis(source).refs
    if not _is_if_form(source):
        return frozenset()
    found: set[str] = set()
    for _, analysis, _ in _if_analyses(source):
        ids = analysis.refs if analysis is not None else frozenset[str]()
        if ids is None:
            return None
        found |= ids
    return frozenset(found)
