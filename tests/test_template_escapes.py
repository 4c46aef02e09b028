"""Known Jinja2 sandbox escapes and resource-exhaustion payloads: each must be refused.

Every payload must raise a TemplateError subclass with a message, within one second
(a security bound of the acceptance criteria), without running anything: payloads that
would reach a shell try to create a canary file, and ``os.system``/``os.popen`` are
replaced by tripwires for the duration of each test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from axengine.errors import TemplateError, TemplateLimitError, TemplateSecurityError
from axengine.template import (
    MAX_CALL_DEPTH,
    MAX_NESTING,
    evaluate_expression,
    evaluate_guard,
    render,
    template_context,
)

SEC = TemplateSecurityError
LIM = TemplateLimitError
ERR = TemplateError  # e.g. a name that does not exist in the sandbox

DOUBLING = "{% set s = 'x' * 60000 %}" + "{% set s = s ~ s %}" * 30 + "{{ s|length }}"
BRANCHING = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
MACRO_FLOOD = (
    "{% macro m() %}{% for i in range(10000) %}{{ 'x' * 60000 }}{% endfor %}{% endmacro %}"
)
EMPTY_LOOPS = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"

PAYLOADS: list[tuple[str, str, type[TemplateError]]] = [
    # --- escapes through Python internals
    ("mro-subclasses", "{{ ''.__class__.__mro__[1].__subclasses__() }}", SEC),
    ("mro-item-syntax", "{{ ''['__class__']['__mro__'] }}", SEC),
    ("self-init-globals", "{{ self.__init__.__globals__ }}", SEC),
    ("self-context", "{{ self._TemplateReference__context }}", SEC),
    ("self-block-call", "{% block b %}{% endblock %}{{ self.b() }}", SEC),
    ("cycler-os", "{{ cycler.__init__.__globals__.os.system('touch {canary}') }}", ERR),
    ("joiner-globals", "{{ joiner.__init__.__globals__ }}", ERR),
    ("lipsum-popen", "{{ lipsum.__globals__['os'].popen('touch {canary}').read() }}", ERR),
    ("namespace-globals", "{{ namespace.__init__.__globals__ }}", ERR),
    ("dict-global", "{{ dict(a=1) }}", ERR),
    ("flask-config", "{{ config.items() }}", ERR),
    ("flask-request", "{{ request.application.__globals__.__builtins__ }}", ERR),
    ("flashed-messages", "{{ get_flashed_messages.__globals__ }}", ERR),
    ("range-globals", "{{ range.__globals__ }}", SEC),
    ("range-self", "{{ range.__self__ }}", SEC),
    ("str-format-globals", "{{ ''.format.__globals__ }}", SEC),
    ("str-format-field", "{{ '{0.__class__}'.format(1) }}", SEC),
    ("str-format-map", "{{ '{a.__class__}'.format_map(input) }}", SEC),
    ("str-mro", "{{ 'x'.mro }}", SEC),
    ("percent-self", "{{ '%s' % self }}", SEC),
    ("percent-function", "{{ '%r' % (range,) }}", SEC),
    ("attr-filter", "{{ input|attr('__class__') }}", SEC),
    ("attr-hex-escape", r"{{ ()|attr('\x5f\x5fclass\x5f\x5f') }}", SEC),
    ("map-attribute", "{{ [input]|map(attribute='__class__')|list }}", SEC),
    ("input-class", "{{ input.__class__ }}", SEC),
    ("int-class", "{{ (1).__class__.__base__.__subclasses__() }}", SEC),
    ("dict-items-internals", "{{ input.__class__.__dict__.items() }}", SEC),
    ("loop-internals", "{% for i in [1] %}{{ loop.__class__ }}{% endfor %}", SEC),
    ("macro-globals", "{% macro m() %}{% endmacro %}{{ m._func.__globals__ }}", SEC),
    ("method-self", "{{ input.get.__self__ }}", SEC),
    ("bound-method-output", "{{ ''.join }}", SEC),
    ("bound-method-print", "x{{ input.items }}", SEC),
    ("unlisted-method", "{{ 'x'.center(100000000) }}", SEC),
    ("immutable-append", "{% set x = [] %}{{ x.append(1) }}", SEC),
    ("immutable-update", "{{ input.update({'a': 1}) or input }}", ERR),
    ("include", "{% include '/etc/passwd' %}", SEC),
    ("import", "{% import 'os' as os %}{{ os.system('touch {canary}') }}", SEC),
    ("from-import", "{% from 'os' import system %}{{ system('touch {canary}') }}", SEC),
    ("extends", "{% extends 'x' %}", SEC),
    ("debug-tag", "{% debug %}", ERR),
    ("pprint-filter", "{{ input|pprint }}", ERR),
    # --- resource exhaustion
    ("range-huge", "{{ range(10**9)|list }}", LIM),
    ("range-huge-literal", "{{ range(999999999999999999999)|list }}", LIM),
    ("str-repeat", "{{ 'a' * 10**9 }}", LIM),
    ("list-repeat", "{{ [1] * 10**9 }}", LIM),
    ("power-tower", "{{ 9 ** (9 ** 9) }}", LIM),
    ("power-huge", "{{ 2 ** 100000000 }}", LIM),
    ("int-squaring", "{% set n = 10 ** 2000 %}{{ n * n * n * n * n }}", LIM),
    ("nested-empty-loops", EMPTY_LOOPS, LIM),
    ("loop-filter-spin", "{% for i in range(10000) if range(10000)|sum < 0 %}{% endfor %}", LIM),
    ("recursive-macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", LIM),
    ("branching-macro", BRANCHING + "{{ f(60) }}", LIM),
    ("recursive-loop", "{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}", LIM),
    ("output-flood", "{% for i in range(10000) %}{{ 'x' * 100 }}{% endfor %}", LIM),
    ("doubling-concat", DOUBLING, LIM),
    ("join-amplify", "{{ (['x' * 60000] * 60000)|join|length }}", LIM),
    ("join-method-amplify", "{{ ''.join(['x' * 60000] * 60000)|length }}", LIM),
    ("replace-amplify", "{{ ('x' * 60000)|replace('x', 'y' * 60000)|length }}", LIM),
    ("replace-method-amplify", "{{ ('x' * 60000).replace('', 'y' * 60000)|length }}", LIM),
    ("string-of-shared-list", "{{ (['x' * 60000] * 60000)|string|length }}", LIM),
    ("tojson-indent", "{{ [[[[[1]]]]]|tojson(indent=100000) }}", LIM),
    ("center-filter", "{{ 'x'|center(999999999) }}", LIM),
    ("indent-filter", "{{ ('x\n' * 30000)|indent(60000)|length }}", LIM),
    ("format-width", "{{ '%999999999d' % 1 }}", LIM),
    ("format-star", "{{ '%*d' % (999999999, 1) }}", LIM),
    ("format-filter", "{{ '%0999999999d'|format(1) }}", LIM),
    ("sum-quadratic", "{{ ([[1] * 60000] * 60000)|sum(start=[])|length }}", LIM),
    ("batch-fill", "{{ [1]|batch(100000000, 'x')|list }}", LIM),
    ("map-amplify", "{{ range(10000)|map('string')|map('center', 60000)|list|length }}", LIM),
    ("macro-block-flood", MACRO_FLOOD + "{{ m()|length }}", LIM),
    ("deep-nesting", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", LIM),
    # Deep trees that parse: Jinja2's visitors and Python's compiler would recurse on them
    # (or refuse the generated code with a SyntaxError that is not a TemplateError).
    ("filter-chain", "{{ 1" + "|string" * 250 + " }}", LIM),
    ("operator-chain", "{{ " + " + ".join(["1"] * 300) + " }}", LIM),
    ("attribute-chain", "{{ input" + ".a" * 300 + " }}", LIM),
    ("nested-loops", "{% for i in [1] %}" * 25 + "x" + "{% endfor %}" * 25, LIM),
    # Python reads integers of 4,300 digits at most (a ValueError from Jinja2's lexer).
    ("huge-int-literal", "{{ 1" + "0" * 5000 + " }}", LIM),
    ("huge-int-index", "{{ input[1" + "0" * 5000 + "] }}", LIM),
]


@pytest.fixture
def tripwires(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace os.system/os.popen so that reaching them is recorded, not run."""
    reached: list[str] = []

    def trip(*args: Any, **kwargs: Any) -> None:
        reached.append(repr(args))
        raise AssertionError("the sandbox reached an operating system call")

    monkeypatch.setattr(os, "system", trip)
    monkeypatch.setattr(os, "popen", trip)
    return reached


def names() -> dict[str, Any]:
    return template_context(
        input={"x": 1, "text": "hello"},
        nodes={"a": {"b": 1}},
        task={"id": "t-1", "labels": {}},
        output={"status": "ok"},
    )


@pytest.mark.parametrize(
    ("payload", "expected"),
    [pytest.param(payload, expected, id=name) for name, payload, expected in PAYLOADS],
)
def test_payload_is_refused(
    payload: str, expected: type[TemplateError], tmp_path: Path, tripwires: list[str]
) -> None:
    canary = tmp_path / "canary"
    source = payload.replace("{canary}", str(canary))
    # The sandbox bounds the CPU time of the rendering thread; wall time also counts the
    # machine's other work, so the payloads are held to the CPU bound.
    started = time.thread_time()
    with pytest.raises(TemplateError) as exc:
        render(source, names())
    elapsed = time.thread_time() - started
    assert isinstance(exc.value, expected), f"{type(exc.value).__name__}: {exc.value}"
    assert str(exc.value)
    assert isinstance(getattr(exc.value, "line", None), int)
    assert elapsed < 1.0
    assert not canary.exists()
    assert tripwires == []


@pytest.mark.parametrize(
    "guard",
    [
        "{{ output.__class__.__mro__ }}",
        "{{ output|attr('__class__') }}",
        "{{ range(10**9)|length > 0 }}",
        "output.__class__",
        "(range(10000)|list|length) ** 99999 > 1",
    ],
)
def test_guard_payload_is_refused(guard: str) -> None:
    started = time.thread_time()
    with pytest.raises((TemplateSecurityError, TemplateLimitError)):
        evaluate_guard(guard, names())
    assert time.thread_time() - started < 1.0


def test_expression_payload_is_refused_with_its_line() -> None:
    source = "if output.status == 'x': a\nelif output.__class__: b\nelse: c"
    with pytest.raises(TemplateSecurityError) as exc:
        evaluate_expression(source, names())
    assert getattr(exc.value, "line", None) == 2


def test_time_limit_error_names_the_bound() -> None:
    started = time.thread_time()
    with pytest.raises(TemplateLimitError, match="CPU"):
        render(EMPTY_LOOPS, names())
    assert time.thread_time() - started < 1.0


def test_the_render_deadline_never_interrupts_code_outside_the_render() -> None:
    """A finalizer the garbage collector runs on the rendering thread (a gRPC channel's,
    an asyncio transport's) is not interrupted when the render's time is up; the next
    frame of the render itself is."""
    import sys

    from axengine.template._budget import _Interrupted, _Session

    def frame_of(module: str) -> Any:
        namespace: dict[str, Any] = {"__name__": module, "sys": sys}
        exec("def here():\n    return sys._getframe()\n", namespace)
        return namespace["here"]()

    session = _Session()
    session.deadline = 0.0  # the render's CPU time is spent
    session.countdown = 1
    session.trace(frame_of("asyncio.selector_events"), "call", None)  # no interruption
    assert session.countdown <= 0  # still counted: the next render frame checks
    with pytest.raises(_Interrupted):
        session.trace(frame_of("jinja2.runtime"), "call", None)


DEEPER_THAN_CALLS = f"macro calls or recursive loops nested deeper than {MAX_CALL_DEPTH} levels"
DEEPER_THAN_TREE = f"the template is nested deeper than {MAX_NESTING} levels"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", DEEPER_THAN_CALLS),
        ("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}", DEEPER_THAN_CALLS),
        ("{% macro f() %}{{ caller() }}{% endmacro %}"
         "{% macro g(n) %}{% call f() %}{{ g(n + 1) }}{% endcall %}{% endmacro %}{{ g(0) }}",
         DEEPER_THAN_CALLS),
        ("{{ " + "[" * 20000 + "1" + "]" * 20000 + " }}", DEEPER_THAN_TREE),
        ("{{ 1" + "|e" * 20000 + " }}", DEEPER_THAN_TREE),
    ],
    ids=["macro", "loop", "caller", "nested-lists", "filter-chain"],
)
def test_deep_recursion_is_refused_whatever_the_recursion_limit(payload: str,
                                                                 expected: str) -> None:
    # A host process may raise the recursion limit; Jinja2 calls, visitors and generators
    # that deep overflow the C stack (a segfault, not a RecursionError), so the sandbox
    # counts call levels and the compiler tree depth itself. In a child process, so that
    # a crash fails this test and not the test run.
    script = (
        "import sys; sys.setrecursionlimit(1_000_000)\n"
        "from axengine.errors import TemplateLimitError\n"
        "from axengine.template import render\n"
        "try:\n"
        "    render(sys.argv[1], {})\n"
        "except TemplateLimitError as exc:\n"
        "    print(type(exc).__name__, exc.line, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, payload], capture_output=True, text=True, timeout=25
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("TemplateLimitError 1 "), done.stdout
    assert expected in done.stdout


def test_macros_nest_up_to_the_call_depth_bound() -> None:
    source = (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% else %}bottom{% endif %}{% endmacro %}"
        "{{ f(depth) }}"
    )
    assert render(source, {"depth": MAX_CALL_DEPTH - 1}) == "bottom"
    with pytest.raises(TemplateLimitError, match="nested deeper than"):
        render(source, {"depth": MAX_CALL_DEPTH})
