"""Go-style leading dots from the seed: ``{{ .input.x }}`` means ``{{ input.x }}``."""

from __future__ import annotations

import re

#: Words after which a ``.name`` starts a path (``if .x``, ``a and .b``, ``for k in .m``).
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "if", "elif", "else", "for", "set", "with"})
_OPEN = re.compile(r"\{[{%#]")
_RAW = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}")
_ENDRAW = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")


def _has_markup(source: str) -> bool:
    return "{{" in source or "{%" in source or "{#" in source


def _scan_code(text: str, start: int, closer: str | None) -> tuple[str, int]:
    """Drop leading dots from expression code until ``closer`` (at bracket depth 0)."""
    out: list[str] = []
    prev, word, depth = "start", "", 0  # kind of the previous token: start|op|word|value
    i, end = start, len(text)
    while i < end:
        if closer is not None and depth == 0 and text.startswith(closer, i):
            break
        c = text[i]
        j = i + 1
        if c in "'\"":
            while j < end and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, end)
            prev = "value"
        elif c == "." and j < end and (text[j].isalpha() or text[j] == "_"):
            if prev in ("start", "op") or (prev == "word" and word in _KEYWORDS):
                i = j  # a path start: ``.input.x`` -> ``input.x``
                continue
        elif c.isalpha() or c == "_":
            while j < end and (text[j].isalnum() or text[j] == "_"):
                j += 1
            prev, word = "word", text[i:j]
        elif c.isdigit() or c == ".":  # numbers (1.5, .5, 1e3) and stray dots stay as they are
            while j < end and (text[j].isalnum() or text[j] in "._"):
                j += 1
            prev = "value"
        elif c in "([{":
            prev, depth = "op", depth + 1
        elif c in ")]}":
            prev, depth = "value", max(depth - 1, 0)
        elif not c.isspace():
            prev = "op"
        out.append(text[i:j])
        i = j
    return "".join(out), i


def normalize(source: str) -> str:
    """Rewrite the seed's Go-style leading dots: ``{{ .input.x }}`` -> ``{{ input.x }}``.

    Only a dot that starts a path is removed: at the start of an expression, after an
    operator, an opening bracket, a comma or a keyword (``and``, ``if``, ``in``...).
    Decimal numbers (``.5``), attribute access (``a.b``, ``f(x).y``), string literals,
    comments and ``{% raw %}`` blocks are left alone. When ``source`` has template
    markup, only the code inside ``{{ }}`` and ``{% %}`` is rewritten; without markup the
    whole source is treated as expression code (the ``if/elif/else`` form).

    Args:
        source: Template or expression source.

    Returns:
        The source with path-leading dots removed; line numbers are unchanged.
    """
    if not _has_markup(source):
        return _scan_code(source, 0, None)[0]
    out: list[str] = []
    i = 0
    while (match := _OPEN.search(source, i)) is not None:
        out.append(source[i : match.start()])
        opener, start = match.group(), match.start()
        verbatim_end = None
        if opener == "{#":
            found = source.find("#}", start)
            verbatim_end = len(source) if found < 0 else found + 2
        elif opener == "{%" and (raw := _RAW.match(source, start)) is not None:
            endraw = _ENDRAW.search(source, raw.end())
            verbatim_end = endraw.end() if endraw else len(source)
        if verbatim_end is not None:
            out.append(source[start:verbatim_end])
            i = verbatim_end
            continue
        code, i = _scan_code(source, match.end(), "}}" if opener == "{{" else "%}")
        out.append(opener + code)
    out.append(source[i:])
    return "".join(out)
