"""A condition node's ``expression``: the ``if/elif/else`` form and its labels."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from axengine.errors import TemplateError
from axengine.template import _fast
from axengine.template._api import _truthy, render
from axengine.template._budget import _error, _guarded
from axengine.template._compiler import _compile_condition, _Compiled, _compiled, _run
from axengine.template._normalize import _has_markup
from axengine.template._simple import condition_reads, template_reads

_CLAUSE = re.compile(r"(if|elif|else)\b")
_C = TypeVar("_C")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|'[^'\\]+'|\"[^\"\\]+\"")


class _Clause:
    __slots__ = ("condition", "label", "line")

    def __init__(self, line: int, condition: _Compiled | None, label: str) -> None:
        self.line, self.condition, self.label = line, condition, label


def _is_if_form(source: str) -> bool:
    for raw in source.splitlines():
        text = raw.strip()
        if text and not text.startswith("#"):
            return _CLAUSE.match(text) is not None
    return False


def _split_clause(rest: str, line: int) -> tuple[str, str]:
    """Split ``<condition>: <label>`` at the first colon outside strings and brackets."""
    depth, quote = 0, ""
    i = 0
    while i < len(rest):
        c = rest[i]
        if quote:
            i += c == "\\"
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ":" and depth == 0:
            break
        i += 1
    else:
        raise _error(TemplateError, "missing ':' before the label", line)
    label = rest[i + 1 :].strip()
    if not _LABEL.fullmatch(label):
        hint = "use a name such as high_risk, or a quoted string"
        raise _error(TemplateError, f"bad label {label!r}: {hint}", line)
    return rest[:i].strip(), label.strip("'\"")


def _clauses(
    source: str, make: Callable[[str, int], _C]
) -> tuple[tuple[int, _C | None, str], ...]:
    """Read the ``if/elif/else`` form: (line, condition, label) per clause, the condition
    None for ``else``.

    ``make(code, line_base)`` makes of each condition what the caller needs: its
    compiled form to run it, its analysis to check it. It is called clause by clause as
    the form is read, so every caller meets the same first error.
    """
    clauses: list[tuple[int, _C | None, str]] = []
    closed = False  # an `else` was read
    last = 1
    for last, raw in enumerate(source.splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        match = _CLAUSE.match(text)
        if match is None:
            raise _error(TemplateError, f"expected if/elif/else, got {text[:40]!r}", last)
        keyword = match.group(1)
        if closed:
            raise _error(TemplateError, "nothing may follow the final 'else:'", last)
        if keyword == "if" and clauses:
            raise _error(TemplateError, "only the first clause is 'if'; use 'elif'", last)
        if keyword != "if" and not clauses:
            raise _error(TemplateError, f"'{keyword}' before 'if'", last)
        condition, label = _split_clause(text[match.end() :], last)
        if keyword == "else":
            if condition:
                raise _error(TemplateError, "'else' takes no condition; use 'elif'", last)
            clauses.append((last, None, label))
            closed = True
        elif not condition:
            raise _error(TemplateError, f"empty condition after '{keyword}'", last)
        else:
            clauses.append((last, make(condition, last - 1), label))
    if not closed:
        hint = "end with 'else: <label>' so the condition always yields a label"
        raise _error(TemplateError, f"missing final 'else:' ({hint})", last)
    return tuple(clauses)


@functools.lru_cache(maxsize=512)
def _if_form(source: str) -> tuple[_Clause, ...]:
    """The ``if/elif/else`` form with its conditions compiled, to run it."""
    return tuple(_Clause(line, condition, label)
                 for line, condition, label in _clauses(source, _compile_condition))


def _check_condition(code: str, line_base: int) -> None:
    """Raise what compiling ``code`` raises, without compiling a simple form (which
    always compiles: :mod:`axengine.template._simple`)."""
    if condition_reads(code) is None:
        _compile_condition(code, line_base)


def _not_an_expression(source: str) -> TemplateError:
    hint = "write 'if <expr>: <label>' lines ending with 'else: <label>', or a {{ }} template"
    return _error(TemplateError, f"not a condition expression ({hint})", 1 if source else 0)


def evaluate_expression(source: str, context: Mapping[str, Any]) -> str:
    """Evaluate a condition node's expression and return its label.

    Two forms: ``if <expr>: <label>`` / ``elif <expr>: <label>`` / ``else: <label>``
    lines (blank lines and ``#`` comments ignored; a label is a name or a quoted
    string), or a template whose value is the label.

    Args:
        source: The expression.
        context: The names it sees, ``output`` included.

    Returns:
        The label of the first true clause (the ``else`` label if none is).

    Raises:
        TemplateError: Malformed expression, a missing field (named in the message),
            or a template that does not produce a non-empty string.
    """
    if _is_if_form(source):
        clauses = _if_form(source)
        fast = _fast_choice(source)
        if fast is not None:
            label = _fast.run(fast, context)
            if label is not _fast.GAVE_UP:
                return cast(str, label)

        def choose() -> str:
            for clause in clauses[:-1]:
                condition = cast(_Compiled, clause.condition)
                run = functools.partial(_run, condition, context)
                if _truthy(_guarded(run, clause.line - 1, 1)):
                    return clause.label
            return clauses[-1].label

        return _guarded(choose)
    if not _has_markup(source):
        raise _not_an_expression(source)
    value = render(source, context)
    if not isinstance(value, str) or not value.strip():
        raise _error(TemplateError, f"the expression produced {value!r}, not a label")
    return value.strip()


@functools.lru_cache(maxsize=512)
def _fast_choice(source: str) -> _fast.Fast | None:
    """The ``if/elif/else`` form of ``source`` evaluated without Jinja, when each of its
    conditions only reads values (:mod:`axengine.template._fast`); else None."""
    clauses = _if_form(source)
    tests = [(cast(_Compiled, clause.condition).fast, clause.label) for clause in clauses[:-1]]
    if any(fast is None for fast, _ in tests):
        return None
    otherwise = clauses[-1].label

    def choose(context: Mapping[str, Any]) -> str:
        for fast, label in tests:
            if _truthy(cast(_fast.Fast, fast)(context)):
                return label
        return otherwise
    return choose


def expression_labels(source: str) -> tuple[str, ...] | None:
    """The labels a condition expression can produce, for validating ``when:`` edges.

    Args:
        source: The expression.

    Returns:
        The labels of the ``if/elif/else`` form in document order without duplicates,
        or None for the template form, whose labels cannot be known statically.

    Raises:
        TemplateError: ``elif``/``else`` before ``if``, text after ``else``, a missing
            final ``else``, an empty condition, a bad label, a syntax error in a
            condition or template; ``line`` is the line within ``source``.
    """
    if _is_if_form(source):
        clauses = _clauses(source, _check_condition)
        return tuple(dict.fromkeys(label for _, _, label in clauses))
    if not _has_markup(source):
        raise _not_an_expression(source)
    if template_reads(source) is None:  # a simple form always compiles
        _compiled(source)
    return None
