"""Compiling (cached) and running a template in the sandbox."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import TemplateSyntaxError
from jinja2.parser import Parser

from axengine.errors import TemplateError, TemplateLimitError, TemplateSecurityError
from axengine.limits import past_int_digits
from axengine.template import _fast
from axengine.template._budget import _MAX_SOURCE_CHARS, _error
from axengine.template._normalize import _scan_code, normalize
from axengine.template._sandbox import _ENV
from axengine.template._values import _bounded_range, _output, _to_native

_RESULT = "_ax_result"
#: Deepest nesting of a template's syntax tree: expressions inside expressions (a
#: filter, an operator, an attribute each add a level), blocks inside blocks.
MAX_NESTING = 100


class _Compiled:
    """A compiled template; ``native`` ones store their single expression's value."""

    __slots__ = ("fast", "line", "native", "template", "tree")

    def __init__(self, tree: nodes.Template, expr: nodes.Expr | None) -> None:
        self.line = expr.lineno if expr is not None else 0
        #: Its evaluation without Jinja when it only reads values (see
        #: :mod:`axengine.template._fast`), else None.
        self.fast = _fast.native(expr) if expr is not None else _fast.text(tree)
        if expr is not None:
            target = nodes.Name(_RESULT, "store", lineno=expr.lineno)
            tree = nodes.Template([nodes.Assign(target, expr, lineno=expr.lineno)], lineno=1)
            tree.set_environment(_ENV)
        self.tree = tree
        self.native = expr is not None
        try:
            self.template = _ENV.from_string(tree)
        except TemplateSyntaxError as exc:  # unknown filter or test, found by the compiler
            raise _error(TemplateError, exc.message or str(exc), exc.lineno) from exc
        except (RecursionError, SyntaxError, MemoryError) as exc:
            # Python refuses the generated code (more than 200 nested brackets, 20 nested
            # loops, 100 indentation levels) or recursed too deep building it.
            raise _error(TemplateLimitError, _too_deep(exc)) from None


def _too_deep(exc: BaseException | None = None) -> str:
    message = "the template is nested too deeply"
    if isinstance(exc, SyntaxError) and exc.msg:
        message += f" ({exc.msg})"
    return message


def _bad_literal(exc: ValueError) -> str:
    if past_int_digits(exc):
        return f"an integer literal longer than {sys.get_int_max_str_digits()} digits"
    return f"a literal Python cannot read ({exc})"


def _walk(tree: nodes.Node) -> None:
    """Refuse a tree nested deeper than :data:`MAX_NESTING` or holding a refused tag,
    in one walk without recursion (run before anything that recurses over the tree:
    Jinja2's visitors, ``find_all``'s nested generators and Python's compiler recurse
    on the C stack, which no recursion limit bounds when the host raised it)."""
    todo: list[tuple[nodes.Node, int]] = [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_NESTING:
            message = f"the template is nested deeper than {MAX_NESTING} levels"
            raise _error(TemplateLimitError, message, node.lineno)
        tag = _REFUSED_TAGS.get(type(node))
        if tag is not None:
            message = f"{{% {tag} %}} is not allowed in ax templates (no file, module or escaping)"
            raise _error(TemplateSecurityError, message, node.lineno)
        # Children pushed last first: they come off the stack in document order.
        todo.extend((child, depth + 1) for child in reversed(list(node.iter_child_nodes())))


_REFUSED_TAGS: dict[type[nodes.Node], str] = {
    nodes.Extends: "extends",
    nodes.Include: "include",
    nodes.Import: "import",
    nodes.FromImport: "from ... import",
    # Its argument is evaluated at compile time; ax renders text with autoescape off.
    nodes.ScopedEvalContextModifier: "autoescape",
}


@functools.lru_cache(maxsize=1024)
def _compile(normalized: str) -> _Compiled:
    try:
        tree = _ENV.parse(normalized)
    except TemplateSyntaxError as exc:
        raise _error(TemplateError, exc.message or str(exc), exc.lineno) from exc
    except RecursionError:
        raise _error(TemplateLimitError, _too_deep()) from None
    except ValueError as exc:  # Jinja2's lexer: an integer literal of over 4,300 digits
        raise _error(TemplateLimitError, _bad_literal(exc)) from None
    _walk(tree)
    expr = None
    if len(tree.body) == 1 and isinstance(tree.body[0], nodes.Output):
        parts = [
            n
            for n in tree.body[0].nodes
            if not (isinstance(n, nodes.TemplateData) and not n.data.strip())
        ]
        if len(parts) == 1 and not isinstance(parts[0], nodes.TemplateData):
            expr = parts[0]
    return _Compiled(tree, expr)


_normalized = functools.lru_cache(maxsize=1024)(normalize)


def _compiled(source: str) -> _Compiled:
    if len(source) > _MAX_SOURCE_CHARS:
        raise _error(TemplateLimitError, f"template longer than {_MAX_SOURCE_CHARS} characters")
    return _compile(_normalized(source))


@functools.lru_cache(maxsize=1024)
def _compile_condition(code: str, line_base: int) -> _Compiled:
    """Compile bare expression code (a guard without braces, an ``if`` condition)."""
    try:
        parser = Parser(_ENV, _scan_code(code, 0, None)[0], state="variable")
        expr = parser.parse_expression()
        if not parser.stream.eos:
            parser.fail(f"unexpected {parser.stream.current.value!r} after the condition")
    except TemplateSyntaxError as exc:
        line = exc.lineno + line_base
        raise _error(TemplateError, f"bad condition: {exc.message}", line) from exc
    except RecursionError:
        message = "the condition is nested too deeply"
        raise _error(TemplateLimitError, message, 1 + line_base) from None
    except ValueError as exc:
        message = f"bad condition: {_bad_literal(exc)}"
        raise _error(TemplateLimitError, message, 1 + line_base) from None
    try:
        _walk(expr)
        return _Compiled(nodes.Template([], lineno=1), expr)
    except TemplateError as exc:  # an unknown filter or test, a limit: the clause's line
        line = (getattr(exc, "line", 0) or 1) + line_base
        raise _error(type(exc), f"bad condition: {exc}", line) from exc


def _run(compiled: _Compiled, context: Mapping[str, Any]) -> Any:
    template = compiled.template
    # shared=True skips merging the globals ChainMap (slow under the trace hook); the one
    # global is added by hand, last, so the context cannot replace the bounded range.
    ctx = template.new_context({**context, "range": _bounded_range}, shared=True)
    if compiled.native:
        for _ in template.root_render_func(ctx):
            pass
        return _to_native(ctx.vars[_RESULT])
    return _output(template.root_render_func(ctx))
