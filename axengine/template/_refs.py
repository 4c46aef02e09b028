"""Which nodes a template reads, found in its syntax tree (for validation).

The ids come from the static walk of :mod:`axengine.template._static`, which finds them
in the same pass as the problems it reports, on the tree the compiler already parsed.
"""

from __future__ import annotations

from axengine.template._compiler import _compiled
from axengine.template._expression import _if_form, _is_if_form
from axengine.template._normalize import _has_markup
from axengine.template._static import _analyse


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
        return _analyse(_compiled(source)).refs
    if not _is_if_form(source):
        return frozenset()
    found: set[str] = set()
    for clause in _if_form(source):
        ids = _analyse(clause.condition).refs if clause.condition else frozenset[str]()
        if ids is None:
            return None
        found |= ids
    return frozenset(found)
