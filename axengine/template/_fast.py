"""Templates that only read values, evaluated without Jinja.

Most templates read a value or two: ``{{ .nodes.extract.output.total }}``,
``report {{ .input.doc }}``, a guard ``{{ .output.status == 'success' }}``, an ``if``
clause ``.output.growth > 0.15 and .output.margin < 0.12``. Rendering one through Jinja
under the sandbox's trace hook (a context object, the hook called on every frame) costs
more than the rest of a node's transition. A template whose syntax tree holds nothing
but names, ``.field`` / ``['key']`` / ``[0]`` lookups, constants, one comparison at a
time (``== != < > <= >=``), ``and``, ``or``, ``not`` and text around them is evaluated
here instead, by a closure built from that same tree (parsed and compiled by Jinja as
before, so it is the tree Jinja would run). No loop, call, filter or operator that
builds a value can appear in it: its time is bounded by its size, and it needs no hook.

It answers only the plain case: every lookup finds a value in a dict (a field) or a
list (an index in range), every comparison is one Python makes between those values,
and the result converts as the Jinja path converts it (:func:`_to_native` for a single
expression, the sandbox's ``finalize`` for text), under a budget of its own. Anything
else raises, and :func:`run` answers :data:`GAVE_UP`: the caller then renders the
template through Jinja, as always, which gives the result or the error it always gave
(a missing field, ``.items`` of a dict without such a field, a comparison Python
refuses, a value too large). ``tests/test_template_fast.py`` holds both paths to the
same answers.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from jinja2 import nodes

from axengine.template._budget import _SESSION, _Session
from axengine.template._values import _output, _output_text, _to_native

#: A compiled fast form: the template's value in a context.
Fast = Callable[[Mapping[str, Any]], Any]


class _GaveUp:
    def __repr__(self) -> str:
        return "GAVE_UP"


#: What :func:`run` answers when the fast form cannot: render through Jinja instead.
GAVE_UP: Any = _GaveUp()

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "gt": operator.gt,
    "lteq": operator.le, "gteq": operator.ge,
}
#: The exact types of constants a fast form may hold (bool included: ``true``).
_CONSTANTS = frozenset({str, int, float, bool, type(None)})
#: Names that are not (only) context lookups: ``range`` is the sandbox's global, ``self``
#: the template, the others defined by loops and macros.
_SPECIAL = frozenset({"range", "self", "loop", "caller", "varargs", "kwargs", "super"})


class _Miss(Exception):
    """A lookup the fast form does not answer (missing, or not a dict or list)."""


def native(expr: nodes.Node) -> Fast | None:
    """The fast form of a template that is one expression (its value as plain data,
    as :func:`~axengine.template._compiler._run` returns it), or None."""
    value = _expression(expr)
    if value is None:
        return None
    return lambda context: _to_native(value(context))


def text(tree: nodes.Template) -> Fast | None:
    """The fast form of a template of text and expressions (the text it renders), or
    None."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], nodes.Output):
        return None
    parts: list[str | Fast] = []
    for child in tree.body[0].nodes:
        if isinstance(child, nodes.TemplateData):
            parts.append(child.data)
            continue
        value = _expression(child)
        if value is None:
            return None
        parts.append(value)

    def render(context: Mapping[str, Any]) -> str:
        # As Jinja's generated code: text as it is, a value through the sandbox's
        # finalize (which bounds it); the whole under the output bound, as _run joins it
        # (past it, run() gives up and Jinja raises the error with its line).
        return _output(part if isinstance(part, str) else _output_text(part(context))
                       for part in parts)

    return render


def run(fast: Fast, context: Mapping[str, Any]) -> Any:
    """``fast(context)`` under a fresh budget, without the trace hook; :data:`GAVE_UP`
    when it raised, or when a render is under way already (inside a render the Jinja
    path runs, on that render's budget)."""
    if _SESSION.get() is not None:
        return GAVE_UP
    token = _SESSION.set(_Session(timed=False))
    try:
        return fast(context)
    except Exception:  # anything: the Jinja path gives the answer, or the error
        return GAVE_UP
    finally:
        _SESSION.reset(token)


def _expression(node: nodes.Node) -> Fast | None:
    """The closure computing ``node`` as Jinja's generated code would in the plain case
    (raising where it would not give a plain value), or None when ``node`` is not of
    the fast kinds. The tree is at most ``MAX_NESTING`` deep: so is this recursion."""
    if isinstance(node, nodes.Const):
        constant = node.value
        if type(constant) not in _CONSTANTS:
            return None
        return lambda context: constant
    if isinstance(node, nodes.Name):
        name = node.name
        if node.ctx != "load" or name in _SPECIAL:
            return None

        def load(context: Mapping[str, Any]) -> Any:
            if name in context:
                return context[name]
            raise _Miss
        return load
    if isinstance(node, nodes.Getattr):
        return _lookup(node.node, node.attr)
    if isinstance(node, nodes.Getitem):
        arg = node.arg
        if not isinstance(arg, nodes.Const) or type(arg.value) not in (str, int):
            return None
        return _lookup(node.node, arg.value)
    if isinstance(node, nodes.Compare):
        if len(node.ops) != 1 or node.ops[0].op not in _COMPARE:
            return None
        compare = _COMPARE[node.ops[0].op]
        left, right = _expression(node.expr), _expression(node.ops[0].expr)
        if left is None or right is None:
            return None
        return lambda context: compare(left(context), right(context))
    if isinstance(node, (nodes.And, nodes.Or)):
        first, second = _expression(node.left), _expression(node.right)
        if first is None or second is None:
            return None
        if isinstance(node, nodes.And):
            return lambda context: first(context) and second(context)
        return lambda context: first(context) or second(context)
    if isinstance(node, nodes.Not):
        operand = _expression(node.node)
        if operand is None:
            return None
        return lambda context: not operand(context)
    return None


def _lookup(owner: nodes.Node, key: str | int) -> Fast | None:
    """``owner.key`` / ``owner[key]``: a dict's field or a list's index, as the sandbox
    finds them first (``getattr`` and ``getitem`` read the data before any method).
    A name with a leading ``_`` is left to the sandbox."""
    inner = _expression(owner)
    if inner is None or (isinstance(key, str) and key.startswith("_")):
        return None
    if isinstance(key, str):
        def field(context: Mapping[str, Any]) -> Any:
            found = inner(context)
            if type(found) is dict and key in found:
                return found[key]
            raise _Miss
        return field

    def index(context: Mapping[str, Any]) -> Any:
        found = inner(context)
        if type(found) is list and 0 <= key < len(found):
            return found[key]
        raise _Miss
    return index
