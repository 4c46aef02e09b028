"""Rendering inputs, evaluating guards, checking templates, building the context."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from axengine.errors import TemplateLimitError
from axengine.template import _fast
from axengine.template._budget import _MAX_SOURCE_CHARS, _error, _guarded
from axengine.template._compiler import _compile_condition, _compiled, _run
from axengine.template._normalize import _has_markup

_FALSE_STRINGS = frozenset({"", "false", "0", "none", "null"})


class _Missing:
    """Type of :data:`MISSING`."""

    def __repr__(self) -> str:
        return "MISSING"


#: Sentinel for :func:`template_context`: no ``output`` name (node inputs, not guards).
MISSING: object = _Missing()


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_STRINGS
    return bool(value)


def compile_template(source: str) -> None:
    """Check that a template compiles (after :func:`normalize`); cache the result.

    Args:
        source: Template source. Text without ``{{``, ``{%`` or ``{#`` always compiles.

    Raises:
        TemplateError: Syntax error, unknown filter; ``line`` is set.
        TemplateSecurityError: ``include``, ``import`` or ``extends``.
        TemplateLimitError: The source is longer than the bound.
    """
    if _has_markup(source):
        _compiled(source)


def render(source: str, context: Mapping[str, Any]) -> Any:
    """Render one template.

    Args:
        source: Template source. Anything that is not a ``str`` is returned unchanged,
            and so is text without template markup.
        context: The names the template sees (see :func:`template_context`).

    Returns:
        If ``source`` (stripped) is exactly one ``{{ expr }}``, the native value of
        ``expr`` as plain data (dict, list, str, int, float, bool or None); otherwise the
        rendered text.

    Raises:
        TemplateError: Compile or render error, including a missing field.
        TemplateSecurityError: The sandbox refused an operation.
        TemplateLimitError: A size or time bound was exceeded.
    """
    if not isinstance(source, str) or not _has_markup(source):
        return source
    compiled = _compiled(source)  # outside the clock: compiling is not the template's time
    if compiled.fast is not None:
        value = _fast.run(compiled.fast, context)
        if value is not _fast.GAVE_UP:
            return value
    return _guarded(lambda: _run(compiled, context), 0, compiled.line)


def _each_string(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _each_string(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _each_string(item)


def _render_tree(value: Any, context: Mapping[str, Any]) -> Any:
    return _each_rendered(value, lambda text: render(text, context))


def _each_rendered(value: Any, render_text: Callable[[str], Any]) -> Any:
    """``value`` with every string inside its dicts and lists replaced by
    ``render_text`` of it (tuples come back as lists, keys are not rendered)."""
    if isinstance(value, str):
        return render_text(value)
    if isinstance(value, Mapping):
        return {key: _each_rendered(item, render_text) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_each_rendered(item, render_text) for item in value]
    return value


def is_literal(value: Any) -> bool:
    """Whether no string inside ``value`` has template markup: its rendering, in any
    context, is :func:`literal_value` of it."""
    return not any(_has_markup(text) for text in _each_string(value))


def literal_value(value: Any) -> Any:
    """The rendering of a value with no markup (:func:`is_literal`): a fresh copy of its
    dicts and lists (tuples come back as lists), made without a context or a budget."""
    return _render_tree(value, {})


def render_value(value: Any, context: Mapping[str, Any]) -> Any:
    """Render every string inside dicts and lists (keys are not rendered).

    One time and size budget covers the whole structure. Tuples come back as lists.

    Args:
        value: A string, or a structure of dicts/lists with strings inside.
        context: The names the templates see.

    Returns:
        The same structure with each string replaced by :func:`render`'s result.

    Raises:
        TemplateError: As :func:`render`, for the first string that fails.
    """
    forms: dict[str, _fast.Fast] | None = {}
    for text in _each_string(value):
        if _has_markup(text):
            fast = _compiled(text).fast  # every template compiled first, as always
            if fast is None:
                forms = None
            elif forms is not None:
                forms[text] = fast
    if forms is not None:
        # Every template in it only reads values: rendered without Jinja, under one
        # fresh budget as below (axengine.template._fast). If one gives up, the whole
        # structure is rendered again, through Jinja.
        found = forms
        rendered = _fast.run(lambda ctx: _each_rendered(
            value, lambda text: found[text](ctx) if text in found else text), context)
        if rendered is not _fast.GAVE_UP:
            return rendered
    return _guarded(lambda: _render_tree(value, context))


def evaluate_guard(source: str, context: Mapping[str, Any]) -> bool:
    """Evaluate an edge guard such as ``{{ .output.status == 'success' }}``.

    A source without ``{{ }}`` is evaluated as a bare expression (``output.ok``).

    Args:
        source: The guard.
        context: The names it sees, ``output`` included.

    Returns:
        The truthiness of the native value; the strings ``""``, ``"false"``, ``"0"``,
        ``"none"`` and ``"null"`` (any case, surrounding blanks ignored) are false.

    Raises:
        TemplateError: Also when a referenced field is missing: never a silent False.
    """
    if not _has_markup(source) and len(source) > _MAX_SOURCE_CHARS:
        raise _error(TemplateLimitError, f"guard longer than {_MAX_SOURCE_CHARS} characters")
    compiled = _compiled(source) if _has_markup(source) else _compile_condition(source, 0)
    if compiled.fast is not None:
        value = _fast.run(compiled.fast, context)
        if value is not _fast.GAVE_UP:
            return _truthy(value)
    return _truthy(_guarded(lambda: _run(compiled, context), 0, compiled.line))


def template_context(
    *,
    input: Any,
    nodes: Mapping[str, Any],
    task: Mapping[str, Any] | None = None,
    output: Any = MISSING,
    node: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the names a template sees.

    Args:
        input: The task input.
        nodes: Output of each earlier node, by node id.
        task: Task facts (``id``, ``labels``).
        output: This node's output, for guards and condition expressions; leave it
            :data:`MISSING` when rendering a node's input.
        node: This node (``id`` and its rendered ``input``), for a prompt or a gate's
            description; None elsewhere.

    Returns:
        ``{"input": ..., "nodes": {id: {"output": ...}}, "task": {...}}`` plus
        ``"output"`` and ``"node"`` when given.
    """
    names: dict[str, Any] = {
        "input": input,
        "nodes": {node_id: {"output": nodes[node_id]} for node_id in sorted(nodes)},
        "task": dict(task) if task else {},
    }
    if output is not MISSING:
        names["output"] = output
    if node is not None:
        names["node"] = dict(node)
    return names
