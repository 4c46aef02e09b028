"""The simple forms of template, read without Jinja (the fast path of the static check).

Checking a template statically needs its syntax tree, and building that tree with Jinja
(parse, then compile to find unknown filters) costs about 0.5 ms: 5 s for a DAG with a
template on each of 10,000 nodes. Most templates are far simpler than what Jinja can
express: a path or two (``{{ .nodes.extract.output.total }}``), a comparison
(``{{ .output.status == 'success' }}``), a filter (``{{ .input.tags|join(', ') }}``),
``'a' if x else 'b'``, text around them. For those the walk of
:mod:`axengine.template._static` finds nothing but the paths they read, so this module
recognises them with regular expressions and lists the paths; the static check turns
the list into the analysis the walk would give.

A simple form is, inside each ``{{ }}`` (or as a whole, for a bare guard or an
``if`` condition)::

    or-expression [if or-expression [else or-expression]]
    or-expression := [not ...] operand (operator [not ...] operand)*
    operand  := path-or-literal (| filter[(literal, ...)])*
    operator := == != < > <= >= + * / // % ** ~ and or   (``not`` only after and/or)

where a path is a name (not ``range``, ``loop`` and the like) followed by ``.name``,
``['key']`` or ``[0]`` parts with no space inside, a literal is a string without
backslash, brace or line break, a decimal number, ``true``/``false``/``none``, and a
filter is one the sandbox has, with no literal naming a filter (``map``), an attribute
or a test. Around that: no ``{% %}``, ``{# #}``, whitespace control or
carriage return, at most :data:`_MAX_TOKENS` tokens in an expression (deeper chains are
what Python's own compiler can refuse, so they take the full path).

Every simple form parses and compiles in the sandbox, and the paths listed are exactly
the ``Name``/``Getattr``/``Getitem`` nodes Jinja would build, in the order of its tree
(``tests/test_template_simple.py`` checks both on generated templates). Anything else,
near misses included, returns None and takes the full path: Jinja's parser and
compiler, as at run time.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from axengine.template._budget import _MAX_SOURCE_CHARS
from axengine.template._filters import _ATTRIBUTE_ARGUMENT, _TEST_ARGUMENT
from axengine.template._normalize import _KEYWORDS
from axengine.template._sandbox import _ENV


class Read(NamedTuple):
    """One path a simple template reads, as the syntax tree would show it."""

    #: The name the path starts with (its leading dot dropped).
    head: str
    #: 1-based line of the path within the source.
    line: int
    #: The first part when it names a field (``.x`` or ``['x']``); None when there is
    #: no part or it is an index (``[0]``).
    key: str | None
    #: The parts naming a field that starts with ``_``, as written (``._x``, ``['_x']``).
    internal: tuple[str, ...]


#: Tokens (operands, path parts, operators, filters) in one expression, at most. Jinja
#: nests parts, binary operators, filters and ``not`` one level per token in the code it
#: generates, and Python refuses code nested 200 brackets deep; so a longer chain takes
#: the full path, which fails on it as it always did.
_MAX_TOKENS = 40

_WS = r"[ \t\n]"
_END = r"(?![A-Za-z0-9_])"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# Jinja's operator words and constants, and the words after which normalize() drops a
# leading dot (so that `a.if.b` would not read as written): never a name of a path.
_RESERVED = sorted(_KEYWORDS | {"true", "false", "none", "True", "False", "None"})
# Names whose meaning is more than a context lookup: `range` must be called, the rest
# are defined by for loops, macros and Jinja itself.
_SPECIAL = ["range", "loop", "caller", "varargs", "kwargs", "self", "super"]
_HEAD = rf"(?!(?:{'|'.join(_RESERVED + _SPECIAL)}){_END}){_NAME}"
_FIELD = rf"(?!(?:{'|'.join(_RESERVED)}){_END}){_NAME}"
_SINGLE = r"[^'\\{}\r\n]*"  # what a string literal may hold between its quotes
_DOUBLE = r'[^"\\{}\r\n]*'
_STRING = rf"'{_SINGLE}'|\"{_DOUBLE}\""
_INT = r"(?:0|[1-9][0-9]{0,99})"  # longer: the full path (Python reads 4,300 digits)
_PART = rf"\.{_FIELD}|\[(?:{_STRING}|{_INT})\]"
_PATH = rf"\.?{_HEAD}(?:{_PART})*{_END}"
_LITERAL = rf"(?:{_STRING}|{_INT}(?:\.[0-9]+)?{_END}|(?:true|false|none|True|False|None){_END})"
_ARGS = rf"\({_WS}*(?:{_LITERAL}{_WS}*(?:,{_WS}*{_LITERAL}{_WS}*)*)?\)"
_FILTER = rf"\|{_WS}*{_NAME}{_END}(?:{_WS}*{_ARGS})?"
_OPERAND = rf"(?:{_PATH}|{_LITERAL})(?:{_WS}*{_FILTER})*"
_OPERATOR = (rf"(?:{_WS}*(?:==|!=|<=|>=|//|\*\*|[<>+*/%~]){_WS}*"
             rf"|{_WS}+(?:and|or){_WS}+(?:not{_WS}+)*)")

_OR = rf"{_WS}*(?:not{_WS}+)*{_OPERAND}(?:{_OPERATOR}{_OPERAND})*{_WS}*"
_AFTER_WS = r"(?<=[ \t\n])"
_BEFORE_WS = r"(?=[ \t\n])"
#: One simple expression, whole: ``value``, or ``value if test [else other]``.
_EXPRESSION = re.compile(
    rf"(?P<value>{_OR})(?:{_AFTER_WS}if{_BEFORE_WS}(?P<test>{_OR})"
    rf"(?:{_AFTER_WS}else{_BEFORE_WS}(?P<other>{_OR}))?)?"
)
#: The tokens of a simple expression that matter: paths and filters; strings, numbers
#: and words are matched only so that nothing inside them is taken for a path.
_TOKEN = re.compile(
    # A path, with its head and the field its first part names apart.
    rf"(?P<path>\.?(?P<head>{_HEAD})(?:\.(?P<attr>{_FIELD})|\['(?P<single>{_SINGLE})'\]"
    rf"|\[\"(?P<double>{_DOUBLE})\"\]|\[{_INT}\])?(?:{_PART})*{_END})"
    rf"|\|{_WS}*(?P<filter>{_NAME})(?:{_WS}*(?P<args>{_ARGS}))?"
    rf"|{_STRING}|{_NAME}|[0-9.]+|[=!<>+*/%~]+"
)
#: One part of a path: ``.name``, ``['key']``, ``["key"]`` or ``[0]``.
_PARTS = re.compile(rf"\.({_NAME})|\['({_SINGLE})'\]|\[\"({_DOUBLE})\"\]|\[{_INT}\]")
_LITERALS = re.compile(_LITERAL)


def _expression(source: str, start: int, end: int, line: int,
                reads: list[Read]) -> bool:
    """Append the reads of the simple expression ``source[start:end]`` (``line``: the
    line it starts on); False when it is not a simple expression."""
    match = _EXPRESSION.fullmatch(source, start, end)
    if match is None:
        return False
    # In the tree, `value if test else other` is CondExpr(test, value, other).
    tokens = 0
    for part in ("test", "value", "other"):
        if match.start(part) >= 0:
            count = _operands(source, match.start(part), match.end(part), start, line, reads)
            if count is None:
                return False
            tokens += count
    return tokens <= _MAX_TOKENS


def _operands(source: str, start: int, end: int, first: int, line: int,
              reads: list[Read]) -> int | None:
    """Append the reads of the or-expression ``source[start:end]`` (``first``: where its
    expression starts, on ``line``); the number of its tokens, or None when a filter
    is left to the full path."""
    tokens = 0
    multiline = "\n" in source[first:end]
    for token in _TOKEN.finditer(source, start, end):
        tokens += 1
        path = token["path"]
        if path is not None:
            # Each part of a path is one more level of nesting in the compiled code.
            tokens += path.count(".") + path.count("[")
            internal: tuple[str, ...] = ()
            if "._" in path or "['_" in path or '["_' in path:
                internal = _internal(source, token.end("head"), token.end())
            here = line + source.count("\n", first, token.start()) if multiline else line
            key = token["attr"]
            if key is None:
                key = token["single"] if token["double"] is None else token["double"]
            reads.append(Read(token["head"], here, key, internal))
        elif token["filter"] is not None and not _known_filter(token["filter"], token["args"]):
            return None
    return tokens


def _internal(source: str, start: int, end: int) -> tuple[str, ...]:
    """The parts of the path ``source[start:end]`` (after its head) naming a field that
    starts with ``_``, as written."""
    found: list[str] = []
    for part in _PARTS.finditer(source, start, end):
        name, single, double = part.groups()
        if name is not None and name.startswith("_"):
            found.append(f".{name}")
        elif single is not None and single.startswith("_"):
            found.append(f"[{single!r}]")
        elif double is not None and double.startswith("_"):
            found.append(f"[{double!r}]")
    return tuple(found)


def _known_filter(name: str, args: str | None) -> bool:
    """Whether ``|name(args)`` is a filter of the sandbox that the walk finds nothing in:
    a literal naming a filter (``map``), an attribute or a test is left to the full path."""
    if name not in _ENV.filters:
        return False
    count = 0 if args is None else len(_LITERALS.findall(args))
    if name == "map":
        return count == 0
    return all(position is None or count <= position
               for position in (_ATTRIBUTE_ARGUMENT.get(name), _TEST_ARGUMENT.get(name)))


def template_reads(source: str) -> tuple[Read, ...] | None:
    """The paths a template with markup reads, or None when it is not a simple form.

    Args:
        source: The template as written (leading dots and all).

    Returns:
        The reads in the order of their nodes in Jinja's tree: source order, except
        that ``a if b else c`` lists those of ``b`` first. None when the full check
        must read the template.
    """
    if (len(source) > _MAX_SOURCE_CHARS or "{%" in source or "{#" in source
            or "\r" in source):
        return None
    reads: list[Read] = []
    line, done = 1, 0
    start = source.find("{{")
    while start >= 0:
        end = source.find("}}", start + 2)
        if end < 0:
            return None  # a block that is never closed
        line += source.count("\n", done, start)
        if not _expression(source, start + 2, end, line, reads):
            return None
        done, start = start, source.find("{{", end + 2)
    return tuple(reads)


def condition_reads(code: str) -> tuple[Read, ...] | None:
    """The paths a bare expression (a guard without braces, an ``if`` condition) reads,
    or None when it is not a simple form."""
    if len(code) > _MAX_SOURCE_CHARS or "\r" in code:
        return None
    reads: list[Read] = []
    return tuple(reads) if _expression(code, 0, len(code), 1, reads) else None
