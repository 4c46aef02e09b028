"""Shared fixtures: real etcd and Redis servers (session-scoped, private ports), and the
``integration``/``slow`` markers every test gets from the fixtures it uses.

The fast lane is ``scripts/test -m "not slow and not integration"``: no server, no ax
process, no multi-second fault run.
"""

from __future__ import annotations

import gc
import inspect
import os
from collections.abc import Iterator

import pytest

import axengine  # noqa: F401  (first: it turns gRPC's fork handlers off, see its module)
from tests.servers import Server, start_etcd, start_redis

# The suite runs on what it configures itself: a developer's own model key, ax.toml
# or tool modules must never reach the tests (nor send the simulator's traffic to a
# real model). Subprocesses the tests start inherit this environment.
for _name in [n for n in os.environ
              if n.startswith(("OPENAI_", "AX_LLM", "AX_HANDLERS__", "AX_TOOL_MODULES"))
              or n in ("AX_CONFIG", "AX_SERVER", "AX_TOKEN", "AX_TOKEN_FILE")]:
    del os.environ[_name]

@pytest.fixture(scope="module", autouse=True)
def _collect_what_the_module_leaked() -> Iterator[None]:
    """Collect reference cycles when a module's tests are done.

    An unclosed socket or transport is reported (a ResourceWarning, an error under
    ``filterwarnings = error``) only when the collector frees it, which can be several
    modules later on the same worker: CI once failed a test that opens nothing with a
    socket some earlier module had left open. Collecting here reports a leak in the
    teardown of the last test of the module that leaked it.
    """
    yield
    gc.collect()


#: Fixtures that start real servers or ax processes, by name wherever they are defined:
#: a test using one, directly or through another fixture, is ``integration``.
SERVER_FIXTURES = frozenset({
    "etcd_server", "redis_server",  # here
    "secure_etcd",                  # tests/store/test_etcd.py: etcd with TLS and auth
    "topology",                     # tests/security/conftest.py, tests/test_client.py
    "cluster", "bare", "topo",      # tests/cluster/: etcd + Redis + ax api + ax executors
    "kube", "k8s_standin",          # tests/k8s/conftest.py: Kubernetes API stand-in (or real)
})
#: Of those, the ones whose tests kill, pause or restart processes: also ``slow``.
SLOW_FIXTURES = frozenset({"cluster", "bare", "topo"})
#: Parametrized fixtures that fetch ``etcd_server``/``redis_server`` with
#: ``request.getfixturevalue`` for some of their params (invisible in the fixture
#: closure): a case whose param names etcd or redis is ``integration``.
BACKEND_PARAMS = frozenset({
    "store",     # tests/store/conftest.py: sqlite | etcd
    "queues",    # tests/queue/conftest.py: inprocess | redis
    "backend",   # tests/api/conftest.py: api_server on embedded | etcd (+ Redis)
    "backends",  # tests/engine/test_backends.py: (sqlite|etcd, inprocess|redis)
})


#: Tests that are multi-second without a fixture that says so: ``slow``, with the reason.
#: Remove an entry when its reason is gone.
SLOW_TESTS: dict[str, str] = {}


def _starts_ax_process(item: pytest.Item) -> bool:
    """The test's own body runs ``python -m axengine.cli`` in a subprocess."""
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return "axengine.cli" in source and ("subprocess" in source or "Popen" in source)


def _uses_real_backend(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    return any(name in BACKEND_PARAMS and ("etcd" in str(value) or "redis" in str(value))
               for name, value in callspec.params.items())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests from their fixtures, so no test file has to remember its markers.

    Explicit ``pytestmark``/decorator markers stay; this only adds. A test that starts
    ax processes through a helper of its module (not in its own body) marks itself.
    """
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES or _uses_real_backend(item) or _starts_ax_process(item):
            item.add_marker(pytest.mark.integration)
        if used & SLOW_FIXTURES or item.nodeid in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the ``summary`` properties of passed tests (``record_property("summary",
    ...)``, e.g. the crash module's "crash points tried N, killed K, resumed R")."""
    lines = [f"{report.nodeid}: {value}"
             for report in terminalreporter.stats.get("passed", [])
             for name, value in report.user_properties if name == "summary"]
    if lines:
        terminalreporter.write_sep("-", "summaries")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[Server]:
    """A real etcd started from its binary on a private port for this test session."""
    server = start_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    """A real redis-server started from its binary on a private port for this session."""
    server = start_redis()
    try:
        yield server
    finally:
        server.close()
