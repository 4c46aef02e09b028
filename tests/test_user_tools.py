"""Your own tools: ``@ax.tool`` functions, the one registry, discovery and the example.

Unit tests register into private registries; the discovery tests use unique names in
the process registry; the example project is pip-installed into a fresh virtual
environment and run by that environment's ``ax`` in subprocesses (entry-point discovery
is once per process).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest

import axengine as ax
from executors.contract import Failure, NodeContext, Success, Unavailable
from executors.handlers import handle
from executors.registry import tool_names
from executors.tools import (
    BUILTIN_TOOLS,
    REGISTRY,
    TOOLS,
    ToolError,
    ToolRegistrationError,
    ToolRegistry,
    configured_modules,
    tool,
)
from tests.executors.fakes import FakeContext, make_request

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ax-tools-demo"


def run(registry: ToolRegistry, name: str, value: Any, ctx: FakeContext | None = None,
        node_id: str = "node-1") -> Any:
    found = registry.get(name)
    assert found is not None
    return found(make_request(config={"tool": name}, input=value, node_id=node_id),
                 ctx or FakeContext())


# ----------------------------------------------------------------------------- binding


def test_type_hints_bind_and_validate_keyword_input() -> None:
    reg = ToolRegistry()

    @tool("add", registry=reg)
    def add(a: int, b: int = 10) -> int:
        return a + b

    assert run(reg, "add", {"a": "3"}) == Success(13)  # pydantic's lax mode: "3" → 3
    assert run(reg, "add", {"a": 1, "b": 2}) == Success(3)
    assert add(1, 2) == 3  # the decorator returns the function unchanged


def test_a_non_object_input_goes_to_the_only_parameter() -> None:
    reg = ToolRegistry()

    @tool("shout", registry=reg)
    def shout(text: str) -> str:
        return text.upper()

    assert run(reg, "shout", "hi") == Success("HI")
    assert run(reg, "shout", {"text": "yo"}) == Success("YO")


class Order(pydantic.BaseModel):
    sku: str
    quantity: int = pydantic.Field(gt=0)


def test_one_pydantic_model_parameter_takes_the_whole_input_and_models_are_dumped() -> None:
    reg = ToolRegistry()

    @tool("order", registry=reg)
    def order(o: Order) -> Order:
        return Order(sku=o.sku.lower(), quantity=o.quantity * 2)

    assert run(reg, "order", {"sku": "AB", "quantity": 2}) == Success(
        {"sku": "ab", "quantity": 4})


def test_async_tool_runs_in_its_own_loop_and_gets_ctx() -> None:
    reg = ToolRegistry()

    @tool("slow", registry=reg)
    async def slow(o: Order, ctx: NodeContext) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        ctx.progress(f"priced {o.sku}")
        return {"total": o.quantity * 1.5, "region": ctx.settings["region"]}

    ctx = FakeContext(settings={"region": "eu"})
    assert run(reg, "slow", {"sku": "A", "quantity": 2}, ctx) == Success(
        {"total": 3.0, "region": "eu"})
    assert ctx.markers == ["priced A"]


def test_async_tool_is_cancelled_when_the_run_stops() -> None:
    reg = ToolRegistry()
    finished = threading.Event()

    @tool("forever", registry=reg)
    async def forever() -> None:
        await asyncio.sleep(30)
        finished.set()

    ctx = FakeContext()
    threading.Timer(0.1, ctx.cancel).start()
    started = time.monotonic()
    outcome = run(reg, "forever", None, ctx)
    assert isinstance(outcome, Failure) and outcome.details.get("stopped") is True
    assert time.monotonic() - started < 2 and not finished.is_set()


def test_sync_tool_gets_ctx_settings_and_effects() -> None:
    reg = ToolRegistry()

    @tool("mailer", registry=reg)
    def mailer(to: str, ctx: NodeContext) -> dict[str, Any]:
        effect = ctx.effect(f"mail:{to}")
        first = effect.begin() == "NEW"
        effect.done({"to": to})
        return {"first": first, "from": ctx.settings.get("mail_from")}

    ctx = FakeContext(settings={"mail_from": "ax@example.com"})
    assert run(reg, "mailer", "a@example.com", ctx) == Success(
        {"first": True, "from": "ax@example.com"})
    assert ctx.effects["mail:a@example.com"].result() == {"to": "a@example.com"}


# ----------------------------------------------------------------------------- failures


def test_validation_error_names_node_tool_and_field_and_is_not_retried() -> None:
    reg = ToolRegistry()

    @tool("add2", registry=reg)
    def add2(a: int, b: int = 0) -> int:
        return a + b

    outcome = run(reg, "add2", {"a": "three", "c": 1}, node_id="sum")
    assert isinstance(outcome, Failure) and not outcome.retryable
    assert outcome.message.startswith("node 'sum': tool 'add2': invalid input: ")
    assert "field 'a': Input should be a valid integer" in outcome.message
    assert "field 'c': Extra inputs are not permitted" in outcome.message
    assert "(its parameters: a, b)" in outcome.message
    assert [e["field"] for e in outcome.details["errors"]] == ["a", "c"]

    missing = run(reg, "add2", {})
    assert isinstance(missing, Failure) and "field 'a': Field required" in missing.message

    @tool("order2", registry=reg)
    def order2(o: Order) -> Order:
        return o

    nested = run(reg, "order2", {"sku": "A", "quantity": 0})
    assert isinstance(nested, Failure) and not nested.retryable
    assert nested.message.endswith(
        "field 'quantity': Input should be greater than 0 (its input: Order)")


def test_exceptions_are_retryable_unless_the_tool_says_otherwise() -> None:
    reg = ToolRegistry()

    @tool("flaky", registry=reg)
    def flaky(mode: str) -> None:
        if mode == "crash":
            raise ConnectionError("price service reset the connection")
        raise ToolError("unknown SKU 'X'", retryable=False, details={"sku": "X"})

    crash = run(reg, "flaky", "crash", node_id="quote")
    assert isinstance(crash, Failure) and crash.retryable
    assert crash.message == ("node 'quote': tool 'flaky' raised ConnectionError: price "
                             "service reset the connection")
    refused = run(reg, "flaky", "refuse", node_id="quote")
    assert refused == Failure("node 'quote': tool 'flaky': unknown SKU 'X'", retryable=False,
                              details={"sku": "X", "exception": "ToolError"})
    assert ToolError("x").retryable is True


def test_outcomes_pass_through() -> None:
    reg = ToolRegistry()

    @tool("down", registry=reg)
    def down() -> Unavailable:
        return Unavailable("svc:prices", "503 from prices")

    assert run(reg, "down", None) == Unavailable("svc:prices", "503 from prices")


@pytest.mark.parametrize("value", [object(), math.nan, {"x": {1, object()}}])
def test_a_non_json_return_value_is_a_non_retryable_failure(value: Any) -> None:
    reg = ToolRegistry()

    @tool("bad", registry=reg)
    def bad() -> Any:
        return value

    outcome = run(reg, "bad", None)
    assert isinstance(outcome, Failure) and not outcome.retryable
    assert f"tool 'bad' returned a {type(value).__name__}, which is not JSON" in outcome.message


# ----------------------------------------------------------------------------- registration


def test_a_duplicate_name_is_refused_at_registration() -> None:
    reg = ToolRegistry()

    @tool("twice", registry=reg)
    def first() -> int:
        return 1

    with pytest.raises(ToolRegistrationError, match=r"tool 'twice' is registered twice: by "
                       r".*first and by .*second; rename one"):
        @tool("twice", registry=reg)
        def second() -> int:
            return 2

    tool("twice", registry=reg)(first)  # the same function again (a re-import): fine
    with pytest.raises(ToolRegistrationError, match=r"'echo' is registered twice: by "
                       r"executors.tools.echo:echo \(built in\)"):
        @ax.tool("echo")
        def echo(x: Any) -> Any:
            return x


@pytest.mark.parametrize("source", [
    "def f(*args): pass",
    "def f(**kwargs): pass",
    "def f(a, /): pass",
    "class Opaque: pass\ndef f(a: Opaque): pass",
])
def test_signatures_that_cannot_be_bound_are_refused(source: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(ToolRegistrationError, match=r"tool 'f' \("):
        tool("f", registry=ToolRegistry())(namespace["f"])


def test_malformed_names_are_refused() -> None:
    with pytest.raises(ToolRegistrationError, match="use letters, digits"):
        tool("has space", registry=ToolRegistry())(lambda: None)


def test_builtins_are_entries_of_the_one_registry() -> None:
    assert set(BUILTIN_TOOLS) <= tool_names()
    assert all(REGISTRY.get(name) is run for name, run in BUILTIN_TOOLS.items())
    assert TOOLS["echo"] is BUILTIN_TOOLS["echo"]
    assert ax.tool is tool and ax.ToolError is ToolError


# ----------------------------------------------------------------------------- discovery


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolRegistry]:
    """A process registry holding only the built-in tools, for tests that discover
    modules (so their tools do not leak into other tests); the modules they imported
    are forgotten afterwards."""
    from executors.tools import _registry

    fresh = ToolRegistry()
    for name, run in BUILTIN_TOOLS.items():
        fresh.register(name, run, origin=REGISTRY.origin(name) or name)
    monkeypatch.setattr(_registry, "REGISTRY", fresh)
    before = set(sys.modules)
    yield fresh
    for module in set(sys.modules) - before:
        if module.startswith("ax_test_"):
            del sys.modules[module]


@pytest.mark.usefixtures("fresh_registry")
def test_handle_loads_modules_named_by_the_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ax_test_settings_tools.py").write_text(textwrap.dedent("""
        import axengine as ax

        @ax.tool("ax_test_triple")
        def triple(n: int) -> int:
            return 3 * n
    """))
    (tmp_path / "ax_test_broken_tools.py").write_text("raise RuntimeError('half installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    request = make_request(config={"tool": "ax_test_triple"}, input=5)
    settings = {"tool_modules": ["ax_test_broken_tools", "ax_test_settings_tools"]}
    assert handle(request, FakeContext(settings=settings)) == Success(15)
    assert "ax_test_triple" in tool_names()
    assert "ax_test_triple" not in REGISTRY.names()  # the fixture's registry, not this one

    unknown = handle(make_request(config={"tool": "ax_test_nothing"}),
                     FakeContext(settings=settings))
    assert isinstance(unknown, Failure) and not unknown.retryable
    assert ("tool module 'ax_test_broken_tools': RuntimeError: half installed"
            in unknown.message)


def test_configured_modules_come_from_settings_and_environment(
        fresh_registry: ToolRegistry) -> None:
    env = {"AX_TOOL_MODULES": " b , c,,"}
    assert configured_modules({"tool_modules": ["a", "b"]}, env) == ("a", "b", "c")
    assert configured_modules({"tool_modules": "x,y"}, {}) == ("x", "y")
    assert configured_modules({"tool_modules": 3}, {}) == ()
    assert any("tool_modules must be a list" in e for e in fresh_registry.errors)


# ----------------------------------------------------------------------------- the example


@dataclass(frozen=True)
class Venv:
    """A fresh virtual environment holding the example project, pip-installed."""

    python: str
    site: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """The example project pip-installed into a fresh virtual environment, as a user
    would (``pip install ./examples/ax-tools-demo``). Offline: the venv reaches ax and
    its dependencies through a ``.pth`` line naming this checkout and the project's
    own environment (the test does not download ax's dependencies again), and the
    example is built without an index."""
    base = tmp_path_factory.mktemp("ax-tools-demo")
    source = base / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True,
                          timeout=30).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    (Path(site) / "ax-under-test.pth").write_text(f"{ROOT}\n{ours}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                    "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", str(source)],
                   check=True, timeout=120, capture_output=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AX_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    yield Venv(python=python, site=site, env=env)


def ax_cli(venv: Venv, *args: str, cwd: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    """``ax ARGS`` run by the fresh venv's interpreter."""
    return subprocess.run([venv.python, "-m", "axengine.cli", *args], cwd=cwd, env=venv.env,
                          capture_output=True, text=True, timeout=60)


def test_the_example_is_installed_in_the_fresh_venv_only(installed: Venv) -> None:
    where = subprocess.run(
        [installed.python, "-c", "import ax_tools_demo, sys; print(ax_tools_demo.__file__); "
         "print(sys.prefix)"], env=installed.env, capture_output=True, text=True,
        check=True, timeout=30).stdout.split()
    assert where[0].startswith(installed.site) and where[1] != sys.prefix
    assert importlib.util.find_spec("ax_tools_demo") is None  # not in the test's env


def test_example_validates_through_its_entry_point(installed: Venv) -> None:
    done = ax_cli(installed, "validate", "dags/quote.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK dags/quote.yaml (3 nodes" in done.stdout

    # The test's own interpreter has ax but not the example: the tool is unknown.
    refused = subprocess.run([sys.executable, "-m", "axengine.cli", "validate",
                              "dags/quote.yaml"], cwd=EXAMPLE, env=installed.env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "word_stats" in refused.stdout + refused.stderr


def test_example_runs_to_success(installed: Venv, tmp_path: Path) -> None:
    done = ax_cli(installed, "run", "dags/quote.yaml", "--input", "dags/input.json",
                  "--home", str(tmp_path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "SUCCEEDED" and result["path"] == ["stats", "quote", "summary"]
    assert result["outputs"]["stats"] == {"words": 13, "top": ["the", "ax"]}
    assert result["outputs"]["quote"] == {"sku": "AX-100", "quantity": 3, "currency": "USD",
                                          "unit_price": 13.75, "total": 41.25}
    assert result["outputs"]["summary"] == {"words": 13, "top": ["the", "ax"],
                                            "total": 41.25, "currency": "USD"}

    bad_sku = ax_cli(installed, "run", "dags/quote.yaml", "--input",
                     json.dumps({"note": "x", "sku": "NOPE", "quantity": 1}),
                     "--home", str(tmp_path), "--json")
    failed = json.loads(bad_sku.stdout)
    assert bad_sku.returncode == 1 and failed["states"]["quote"] in ("FAILED", "DEAD")
    assert "tool 'price_quote': unknown SKU 'NOPE'" in failed["errors"]["quote"]


def test_the_node_process_discovers_the_tools_too(installed: Venv) -> None:
    """``python -m executors.run_node`` (the subprocess runner's node process) runs
    ``executors.handlers:handle``, which loads the ``ax.tools`` entry points."""
    start = {"request": {"task_id": "t", "node_id": "quote", "node_type": "tool_call",
                         "attempt": 1, "fence": 1, "config": {"tool": "price_quote"},
                         "input": {"sku": "AX-200", "quantity": 2}},
             "settings": {}, "handler": "executors.handlers:handle"}
    node = subprocess.Popen([installed.python, "-m", "executors.run_node"], env=installed.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert node.stdin is not None and node.stdout is not None
        node.stdin.write(json.dumps(start) + "\n")
        node.stdin.flush()
        calls = []
        for line in node.stdout:
            message = json.loads(line)
            if "outcome" in message:
                break
            calls.append(message["call"])
            node.stdin.write(json.dumps({"id": message["id"], "value": True}) + "\n")
            node.stdin.flush()
        assert message["outcome"] == {"kind": "success", "output": {
            "sku": "AX-200", "quantity": 2, "currency": "EUR", "unit_price": 40.0,
            "total": 80.0}}
        assert calls == ["progress"]
    finally:
        node.kill()
        node.communicate(timeout=10)


@pytest.mark.integration
@pytest.mark.slow
def test_example_runs_through_ax_api_and_ax_executor(installed: Venv,
                                                     tmp_path: Path) -> None:
    """The API validates the DAG with the installed tools' names and an ``ax executor``
    of the fresh venv runs them: the same registry in every process that sees the
    package."""
    from axengine.client import Client
    from tests.topology import Topology

    with Topology(executors=0, root=tmp_path / "topo",
                  api_env={"PYTHONPATH": installed.site}) as topo:
        index = topo.add_executor(start=False)
        topo.executors[index].argv[0] = installed.python
        topo.start_executor(index)
        with Client(topo.api_url, token=topo.token("submitter")) as client:
            result = client.run(EXAMPLE / "dags" / "quote.yaml",
                                json.loads((EXAMPLE / "dags" / "input.json").read_text()),
                                timeout=25)
    assert result.status == "SUCCEEDED", result.errors
    assert list(result.path) == ["stats", "quote", "summary"]
    assert result.outputs["quote"]["total"] == 41.25
