"""The static check: what the sandbox would refuse, found in the syntax tree.

The sandbox (:mod:`axengine.template._sandbox`) refuses unsafe operations while a template
runs, and stays the wall that holds. This module is the first wall: it reads the tree the
compiler already parsed and reports, without running anything, what can never work
whatever the data is, so that ``ax validate`` and the API reject a hostile DAG with
file:line instead of failing when its node runs:

* a name nobody defines (only ``input``, ``nodes``, ``task``, ``range()``, ``output`` in
  guards and condition expressions, ``node`` in prompts and gate descriptions, and what
  the template itself defines with ``{% set %}``, ``{% for %}``, ``{% with %}`` and
  macros) -> ``unknown-name``;
* an attribute or item named with a leading ``_``, also through ``|attr``,
  ``|map(attribute=...)`` and the other attribute-taking filters -> ``unsafe-template``;
* a call of anything but ``range()``, a macro, ``caller()``, ``loop()`` and the
  allowlisted methods (``.format()``, ``.mro()``, ``.append()`` are refused), a method
  or ``range`` used without being called, an attribute a literal does not allow
  (``'x'.mro``) -> ``unsafe-template``;
* a filter or test the sandbox does not have (``pprint``, ``random``) -> ``unknown-name``.

What depends on the data is left to the sandbox: ``output.items`` is the field when the
output has one and the dict method otherwise, and ``'a' * n`` is only too big for some
``n``. Scoping is not modelled: a name set anywhere in the template counts as defined
(using it out of scope is an ordinary undefined-name error at run time).

One iterative walk (no recursion, so deep trees are fine) gives the problems, the names
the template reads from its context and the ``nodes.<id>`` it references
(:mod:`axengine.template._refs`); it is cached with the compiled template.

Validating a DAG must not cost a Jinja compile per template (5 s for 10,000 nodes), so a
template in one of the simple forms of :mod:`axengine.template._simple` (paths,
comparisons, known filters, text around them) is not given to Jinja at all: the paths it
reads give the analysis the walk would (:func:`_reads_analysis`). Every other template is
parsed and compiled as at run time, and walked.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import nodes

from axengine.errors import TemplateLimitError
from axengine.template._budget import _MAX_SOURCE_CHARS, _error
from axengine.template._compiler import _RESULT, _compile_condition, _Compiled, _compiled
from axengine.template._expression import _clauses, _is_if_form, _not_an_expression
from axengine.template._filters import _ATTRIBUTE_ARGUMENT, _TEST_ARGUMENT
from axengine.template._normalize import _has_markup
from axengine.template._sandbox import (
    _ENV,
    _MAPPING_METHODS,
    _SEQUENCE_METHODS,
    _STR_METHODS,
)
from axengine.template._simple import Read, condition_reads, template_reads

#: Which template a source is: where it is written decides how it is read and what it sees
#: (``prompt``: an ``llm_call``'s prompt or a gate's description, which also see ``node``).
TemplateKind = Literal["template", "prompt", "guard", "expression"]

#: Names every template reads from its context, and the sandbox's one global.
_CONTEXT_NAMES = frozenset({"input", "nodes", "task", "range"})
#: Guards and condition expressions also read the output being decided on.
_DECISION_NAMES = _CONTEXT_NAMES | {"output"}
#: A prompt (or a gate's description) also reads its own node's rendered input.
_PROMPT_NAMES = _CONTEXT_NAMES | {"node"}
_ALLOWED: dict[str, frozenset[str]] = {
    "template": _CONTEXT_NAMES, "prompt": _PROMPT_NAMES,
    "guard": _DECISION_NAMES, "expression": _DECISION_NAMES,
}
#: Methods the sandbox lets a template call (on a str, a mapping, a list or a range, and
#: ``loop.cycle()``/``loop.changed()``); it checks the owner's type when the call runs.
_CALLABLE = _STR_METHODS | _MAPPING_METHODS | _SEQUENCE_METHODS | {"cycle", "changed"}
#: Names a template may call besides its own macros.
_CALLABLE_NAMES = frozenset({"range", "caller", "loop"})
#: Names people try that plain Jinja, Flask or Ansible would provide.
_FOREIGN_NAMES = frozenset(
    {"lipsum", "cycler", "joiner", "namespace", "dict", "self", "super", "config"}
    | {"request", "session", "g", "url_for", "get_flashed_messages", "varargs", "kwargs"}
)
_LEFT_OUT_FILTERS = frozenset({"pprint", "random", "urlize"})

_UNSAFE = "unsafe-template"
_UNKNOWN = "unknown-name"
_DATA_HINT = (
    "templates read data only: input.<field>, nodes.<id>.output, task.<field>; "
    "see docs/templates.md"
)
_CALL_HINT = (
    "only range(), macros, caller(), loop() and a few str/dict/list methods (lower, "
    "split, get, items...) can be called; use filters (|format, |join, |list...) instead"
)


@dataclass(frozen=True)
class TemplateProblem:
    """One problem the static check found in a template.

    Attributes:
        code: ``unsafe-template`` (the sandbox would refuse it) or ``unknown-name``
            (a name, filter or test that does not exist in ax templates).
        message: What is wrong, naming the offending name or attribute.
        line: 1-based line within the template or expression source.
        hint: How to fix it.
    """

    code: str
    message: str
    line: int
    hint: str


@dataclass(frozen=True)
class _Analysis:
    """What one walk of a tree found; lines are relative to that tree."""

    problems: tuple[TemplateProblem, ...]
    #: Names read but never defined by the template, with the first line reading each.
    free: tuple[tuple[str, int], ...]
    #: ``nodes.<id>`` ids read; None when ``nodes`` is used dynamically.
    refs: frozenset[str] | None


def _literal_names(node: nodes.Node) -> tuple[str, frozenset[str]] | None:
    """Type name and allowed attributes of a literal; None when the type is not known."""
    if isinstance(node, nodes.Const):
        if isinstance(node.value, str):
            return "str", _STR_METHODS
        return type(node.value).__name__, frozenset()
    if isinstance(node, (nodes.TemplateData, nodes.Concat)):
        return "str", _STR_METHODS
    if isinstance(node, nodes.List):
        return "list", _SEQUENCE_METHODS
    if isinstance(node, nodes.Tuple):
        return "tuple", _SEQUENCE_METHODS
    return None  # a dict literal reads fields first, like any mapping


def _const_str(node: nodes.Node | None) -> str | None:
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        return node.value
    return None


class _Walker:
    """One pass over a tree, parents before children (so a Call marks its callee first)."""

    def __init__(self) -> None:
        self.problems: dict[tuple[str, str, int], TemplateProblem] = {}
        self.loads: dict[str, int] = {}
        self.stores: set[str] = set()
        self.macros: set[str] = set()
        self.called: list[tuple[str, int]] = []
        self.callees: set[int] = set()
        self.static_nodes: set[int] = set()
        self.refs: set[str] = set()
        self.dynamic = False
        self.has_for = self.has_macro = False

    def report(self, code: str, message: str, line: int, hint: str) -> None:
        self.problems.setdefault((code, message, line), TemplateProblem(code, message, line, hint))

    def walk(self, tree: nodes.Node) -> _Analysis:
        stack: list[nodes.Node] = [tree]
        while stack:
            node = stack.pop()
            visit = _VISITORS.get(type(node))
            if visit is not None:
                visit(self, node)
            stack.extend(node.iter_child_nodes())
        return self.result()

    # -- names ------------------------------------------------------------------------

    def visit_name(self, node: nodes.Name) -> None:
        if node.ctx != "load":
            self.stores.add(node.name)
            self.dynamic |= node.name == "nodes"  # a template that shadows `nodes`
            return
        if node.name == "nodes" and id(node) not in self.static_nodes:
            self.dynamic = True  # nodes[x], nodes|list, a loop over nodes
        if node.name == "range" and id(node) not in self.callees:
            self.report(_UNSAFE, "`range` is a function: it can only be called",
                        node.lineno, "call it: range(10)")
        self.load(node.name, node.lineno)

    def load(self, name: str, line: int) -> None:
        # Siblings are met last first: keep the smallest line, the first use.
        if line < self.loads.get(name, line + 1):
            self.loads[name] = line

    def visit_nsref(self, node: nodes.NSRef) -> None:
        self.load(node.name, node.lineno)
        self.attribute(None, node.attr, node.lineno, called=False, spelled=f".{node.attr}")

    def visit_macro(self, node: nodes.Macro) -> None:
        self.has_macro = True
        self.macros.add(node.name)

    def visit_call_block(self, node: nodes.CallBlock) -> None:
        self.has_macro = True

    def visit_for(self, node: nodes.For) -> None:
        self.has_for = True

    # -- attributes and items -----------------------------------------------------------

    def visit_getattr(self, node: nodes.Getattr) -> None:
        called = id(node) in self.callees
        self.attribute(node.node, node.attr, node.lineno, called, f".{node.attr}")
        self.node_ref(node, node.attr, called)

    def visit_getitem(self, node: nodes.Getitem) -> None:
        key = _const_str(node.arg)
        called = id(node) in self.callees
        if key is not None:
            # The sandbox reads obj['name'] on a non-mapping as the attribute `name`.
            self.attribute(node.node, key, node.lineno, called, f"[{key!r}]")
        self.node_ref(node, key, called)

    def node_ref(self, node: nodes.Getattr | nodes.Getitem, key: str | None,
                 called: bool) -> None:
        inner = node.node
        # nodes.get('x') and nodes.items() are method calls, not node ids.
        if isinstance(inner, nodes.Name) and inner.name == "nodes" and key is not None \
                and not called:
            self.refs.add(key)
            self.static_nodes.add(id(inner))

    def attribute(self, owner: nodes.Node | None, name: str, line: int, called: bool,
                  spelled: str) -> None:
        if name.startswith("_"):
            self.report(_UNSAFE, _internal_message(spelled), line, _DATA_HINT)
            return
        literal = _literal_names(owner) if owner is not None else None
        if literal is None:
            return  # a mapping reads the field first: only the data can tell
        kind, allowed = literal
        if name not in allowed:
            if called and name not in _CALLABLE:
                return  # visit_call reports it: one problem per mistake
            self.report(_UNSAFE, f"reads {spelled} of a {kind}, which templates may not use",
                        line, _CALL_HINT)
        elif not called:
            self.report(_UNSAFE, f"{spelled} of a {kind} is a method: it must be called",
                        line, f"call it: {spelled}(...)")

    # -- calls, filters, tests ----------------------------------------------------------

    def visit_call(self, node: nodes.Call) -> None:
        callee = node.node
        self.callees.add(id(callee))
        if isinstance(callee, nodes.Name):
            self.called.append((callee.name, node.lineno))
            return
        method = callee.attr if isinstance(callee, nodes.Getattr) else (
            _const_str(callee.arg) if isinstance(callee, nodes.Getitem) else None)
        if method is None:
            self.report(_UNSAFE, "calls the result of an expression", node.lineno, _CALL_HINT)
        elif not method.startswith("_") and method not in _CALLABLE:
            self.report(_UNSAFE, f"calls .{method}(), which templates may not call",
                        node.lineno, _method_hint(method))

    def visit_filter(self, node: nodes.Filter) -> None:
        name = node.name
        if name not in _ENV.filters:
            self.unknown_callable("filter", name, node.lineno)
            return
        if name == "map":
            self.map_arguments(node)
        elif name in _ATTRIBUTE_ARGUMENT:
            self.attribute_argument(node, _ATTRIBUTE_ARGUMENT[name], 0)
        position = _TEST_ARGUMENT.get(name)
        if position is not None and len(node.args) > position:
            test = _const_str(node.args[position])
            if test is not None and test not in _ENV.tests:
                self.unknown_callable("test", test, node.lineno)

    def visit_test(self, node: nodes.Test) -> None:
        if node.name not in _ENV.tests:
            self.unknown_callable("test", node.name, node.lineno)

    def map_arguments(self, node: nodes.Filter) -> None:
        self.attribute_argument(node, None, 0)
        inner = _const_str(node.args[0]) if node.args else None
        if inner is None:
            return
        if inner not in _ENV.filters:
            self.unknown_callable("filter", inner, node.lineno)
        elif inner in _ATTRIBUTE_ARGUMENT:  # map('attr', '__class__')
            self.attribute_argument(node, _ATTRIBUTE_ARGUMENT[inner], 1)

    def attribute_argument(self, node: nodes.Filter, position: int | None,
                           skip: int) -> None:
        """Check the attribute path a filter argument names (``'a.b'`` reads a, then b)."""
        values = [kw.value for kw in node.kwargs if kw.key == "attribute"]
        if position is not None and len(node.args) > position + skip:
            values.append(node.args[position + skip])
        for value in values:
            path = _const_str(value)
            if path is None:
                continue  # computed at run time: the sandbox checks it then
            for part in path.split("."):
                if part.startswith("_"):
                    self.report(_UNSAFE, f"|{node.name} reads the attribute {path!r}: names "
                                "starting with '_' are Python internals, never data",
                                node.lineno, _DATA_HINT)
                    break

    def unknown_callable(self, what: str, name: str, line: int) -> None:
        table = _ENV.filters if what == "filter" else _ENV.tests
        if what == "filter" and name in _LEFT_OUT_FILTERS:
            hint = f"{name} is left out of ax templates on purpose (see docs/templates.md)"
        else:
            hint = _close(name, table) or f"see the {what}s in docs/templates.md"
        self.report(_UNKNOWN, f"no {what} named {name!r}", line, hint)

    # -- result -------------------------------------------------------------------------

    def result(self) -> _Analysis:
        self.stores.discard(_RESULT)  # the compiler's own name for a native value
        defined = self.stores | self.macros
        if self.has_for:
            defined.add("loop")
        if self.has_macro:
            defined.update(("caller", "varargs", "kwargs"))
        for name, line in self.called:
            if name in _CALLABLE_NAMES or name in self.macros:
                continue
            # A name the template set, or one of the context's: data, never a function.
            # (A name nobody defines is reported as unknown below.)
            if name in defined or name in _DECISION_NAMES | _PROMPT_NAMES:
                self.report(_UNSAFE, f"calls {name!r}, which is not a macro", line, _CALL_HINT)
        free = tuple((name, line) for name, line in self.loads.items() if name not in defined)
        problems = tuple(self.problems.values())  # in walk order (parents first)
        return _Analysis(problems, free, None if self.dynamic else frozenset(self.refs))


_VISITORS: dict[type[nodes.Node], Callable[[_Walker, Any], None]] = {
    nodes.Name: _Walker.visit_name,
    nodes.NSRef: _Walker.visit_nsref,
    nodes.Macro: _Walker.visit_macro,
    nodes.CallBlock: _Walker.visit_call_block,
    nodes.For: _Walker.visit_for,
    nodes.Getattr: _Walker.visit_getattr,
    nodes.Getitem: _Walker.visit_getitem,
    nodes.Call: _Walker.visit_call,
    nodes.Filter: _Walker.visit_filter,
    nodes.Test: _Walker.visit_test,
}


def _internal_message(spelled: str) -> str:
    return f"reads {spelled}: names starting with '_' are Python internals, never data"


def _reads_analysis(reads: tuple[Read, ...]) -> _Analysis:
    """What the walk would find in the tree of a simple template (:mod:`._simple`).

    Such a tree has no definitions, calls, filters or tests the walk reports on: only
    ``Name`` nodes, each under the ``Getattr``/``Getitem`` nodes of its path. ``reads``
    come in the order of their nodes in the tree; the walk meets them last first and
    each path's parts outside in, and keeps the first of equal problems and the first
    insertion of a name: so do the loops below.
    """
    problems: dict[tuple[str, str, int], TemplateProblem] = {}
    loads: dict[str, int] = {}
    refs: set[str] = set()
    dynamic = False
    for read in reversed(reads):
        for spelled in reversed(read.internal):
            message = _internal_message(spelled)
            problems.setdefault((_UNSAFE, message, read.line),
                                TemplateProblem(_UNSAFE, message, read.line, _DATA_HINT))
        if read.head == "nodes":
            if read.key is None:
                dynamic = True  # `nodes` itself, or nodes[0]
            else:
                refs.add(read.key)
        if read.line < loads.get(read.head, read.line + 1):
            loads[read.head] = read.line
    return _Analysis(tuple(problems.values()), tuple(loads.items()),
                     None if dynamic else frozenset(refs))


def _close(word: str, candidates: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def _method_hint(method: str) -> str:
    if method in ("format", "format_map"):
        return "format text with the |format filter ('%s km'|format(x)) or join with ~"
    return _CALL_HINT


@functools.lru_cache(maxsize=2048)
def _analyse(compiled: _Compiled) -> _Analysis:
    """The static analysis of a compiled template (its tree), cached with it."""
    return _Walker().walk(compiled.tree)


@functools.lru_cache(maxsize=4096)
def _template_analysis(source: str) -> _Analysis:
    """The analysis of a template with markup: read without Jinja when it is a simple
    form, else from the tree the compiler parsed (raising what compiling raises)."""
    reads = template_reads(source)
    if reads is not None:
        return _reads_analysis(reads)
    return _analyse(_compiled(source))


@functools.lru_cache(maxsize=1024)
def _condition_analysis(code: str, line_base: int) -> _Analysis:
    """The analysis of bare expression code (a guard without braces, an ``if``
    condition), as :func:`_template_analysis`; lines are relative to the code."""
    reads = condition_reads(code)
    if reads is not None:
        return _reads_analysis(reads)
    return _analyse(_compile_condition(code, line_base))


@functools.lru_cache(maxsize=512)
def _if_analyses(source: str) -> tuple[tuple[int, _Analysis | None, str], ...]:
    """The ``if/elif/else`` form: (line, analysis of its condition, label) per clause;
    raises what :func:`~axengine.template._expression._if_form` raises."""
    return _clauses(source, _condition_analysis)


def _unknown_name(name: str, line: int, kind: TemplateKind) -> TemplateProblem:
    allowed = _ALLOWED[kind]
    shown = ", ".join(sorted(n if n != "range" else "range()" for n in allowed))
    if name == "output" and "output" not in allowed:
        return TemplateProblem(
            _UNKNOWN, "'output' exists only in guards and condition expressions", line,
            "read an earlier node's result as nodes.<id>.output",
        )
    if name == "node" and "node" not in allowed:
        return TemplateProblem(
            _UNKNOWN, "'node' (this node's rendered input) exists only in a prompt and a "
            "gate's description", line,
            "read the task input as input.<field>, an earlier node's result as "
            "nodes.<id>.output",
        )
    if name in _FOREIGN_NAMES:
        hint = (f"ax templates have no {name!r}: no Jinja globals, Flask objects or "
                f"self; they can use {shown}")
    else:
        hint = _close(name, allowed) or f"templates can use {shown}, and names they set"
    return TemplateProblem(_UNKNOWN, f"{name!r} is not defined", line, hint)


def _analyses(source: str, kind: TemplateKind) -> list[tuple[_Analysis, int]]:
    """Each compiled part of ``source`` with the line offset of its tree."""
    if kind == "expression" and _is_if_form(source):
        return [(analysis, line - 1) for line, analysis, _ in _if_analyses(source)
                if analysis is not None]
    if _has_markup(source):
        return [(_template_analysis(source), 0)]
    if kind == "guard":  # a bare guard is one expression, as evaluate_guard reads it
        if len(source) > _MAX_SOURCE_CHARS:
            raise _error(TemplateLimitError, f"guard longer than {_MAX_SOURCE_CHARS} characters")
        return [(_condition_analysis(source, 0), 0)]
    if kind == "expression":
        raise _not_an_expression(source)
    return []  # plain text renders as itself


def names_read(source: str) -> dict[str, int]:
    """Names ``source`` reads from its context (``input``, ``nodes``...), each with the
    1-based line that first reads it, from the same analysis as :func:`check_template`;
    names the template defines itself are not included.

    Raises:
        TemplateError: ``source`` does not compile (as :func:`compile_template`).
    """
    if not _has_markup(source):
        return {}
    found: dict[str, int] = {}
    for name, line in _template_analysis(source).free:
        found[name] = min(line, found.get(name, line))
    return found


def check_template(source: str, *, kind: TemplateKind = "template") -> tuple[TemplateProblem, ...]:
    """Check a template statically: names, attributes and calls the sandbox would refuse.

    Nothing is rendered. A simple form (a path, a comparison, known filters, text around
    them) is read without Jinja; any other template is compiled as
    :func:`compile_template` does (cached) and its tree walked once.

    Args:
        source: A template, a guard (a template or one bare expression) or a condition
            node's expression (the ``if/elif/else`` form or a template).
        kind: Which kind of template ``source`` is: it decides how ``source`` is read,
            whether ``output`` exists (guards and expressions only) and whether ``node``
            does (``prompt``: a prompt or a gate's description).

    Returns:
        The problems, by line (empty when the template is clean).

    Raises:
        TemplateError: ``source`` does not compile (as :func:`compile_template`).
        TemplateSecurityError: ``include``, ``import``, ``extends`` or ``autoescape``.
    """
    allowed = _ALLOWED[kind]
    found: list[TemplateProblem] = []
    for analysis, base in _analyses(source, kind):
        for name, line in reversed(analysis.free):
            if name not in allowed:
                found.append(_unknown_name(name, line + base, kind))
        # The walk meets siblings last first and `a.b.c()` outside in: reversed, the
        # problems of a line read in source order.
        for problem in reversed(analysis.problems):
            found.append(TemplateProblem(problem.code, problem.message, problem.line + base,
                                         problem.hint))
    return tuple(sorted(found, key=lambda p: p.line))  # stable: same line keeps that order
