"""Shared machinery of the fuzz tests (``test_fuzz_rest.py``, ``test_fuzz_grpc.py``).

- :class:`World`: real ids to aim at (a task paused at a human gate, a finished task,
  their DAG hashes, node ids and fences), created through the API, and
  :meth:`World.quiesce`, which cancels whatever accepted fuzz requests set running so
  that nothing but the request under test writes to the store while it is checked.
- :class:`StoreProbe`: one long-lived etcd connection to read task records and the
  store's history (which keys a revision range wrote).
- :class:`Findings`: the failures of one test, deduplicated, with the request, the
  answer and the API's traceback; the test asserts at its end that there are none.
- hypothesis strategies: hostile strings, JSON values and raw JSON text (deep nesting,
  NaN/Infinity literals, huge ints, lone surrogates), DAG mappings (random node types,
  fields, edges and templates, hostile templates included) and DAG YAML documents
  (dumped mappings, unquoted ``{{``, tags, bounded alias bombs).

The store check (:func:`unchanged`): the key set read by ``store_state`` is identical
before and after a refused request, and so is the revision — except for revisions the
history shows were written by the reconciler's leadership record alone (renewed every
reconcile interval whatever the requests do); any other write fails the check.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from tests.api.conftest import GATE_YAML
from tests.security.conftest import StoreState, store_state
from tests.topology import Topology, wait_until

T = TypeVar("T")

#: Settings of every fuzz test; each test picks its ``max_examples``. No shrinking: a
#: test collects every distinct failure of its examples and reports the smallest
#: request of each (see :class:`Findings`), within the time budget.
FUZZ_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                              HealthCheck.data_too_large, HealthCheck.large_base_example,
                              HealthCheck.filter_too_much],
    "derandomize": False,
    "phases": [Phase.explicit, Phase.generate],
    "database": None,
    "print_blob": False,
}


def fuzz_settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples, **FUZZ_SETTINGS)  # type: ignore[arg-type]


#: Seconds after which a request that has not answered counts as a hang.
CALL_TIMEOUT = 10.0
#: Principals of the topology's tokens file (``None``: no token).
WHO = ("admin", "submitter", "submitter2", "approver", "executor", None)


DONE_DAG = {"name": "fuzz_done", "nodes": {
    "first": {"type": "tool_call", "tool": "echo", "input": {"x": "{{ .input.x }}"},
              "next": "second"},
    "second": {"type": "tool_call", "tool": "echo", "input": "{{ .nodes.first.output }}"},
}}

#: Node ids of the world's DAGs (targets of node_id strategies).
NODE_IDS = ("draft", "review", "publish", "first", "second")


# ---------------------------------------------------------------------------- store


class StoreProbe:
    """An etcd connection on its own event loop thread (reads only)."""

    def __init__(self, topology: Topology) -> None:
        from axengine.store.etcd import EtcdStore

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.store = EtcdStore.from_url(topology.store_url)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def tasks(self) -> list[Any]:
        from axengine import codec

        kvs = self.call(self.store.range("/ax/tasks/"))
        return [codec.decode_task(kv.value) for kv in kvs]

    def task(self, task_id: str) -> Any | None:
        from axengine import codec

        if not task_id:
            return None
        kv = self.call(self.store.get(f"/ax/tasks/{task_id}"))
        return None if kv is None else codec.decode_task(kv.value)

    def snapshot(self, task_id: str, node_id: str) -> Any | None:
        from axengine import codec

        kv = self.call(self.store.get(f"/ax/snapshots/{task_id}/{node_id}"))
        return None if kv is None else codec.decode_snapshot(kv.value)

    def writes(self, first: int, last: int) -> list[tuple[int, str, str]]:
        """``(revision, kind, key)`` of every change with ``first <= revision <= last``."""
        if last < first:
            return []

        async def read() -> list[tuple[int, str, str]]:
            out: list[tuple[int, str, str]] = []
            seen: set[int] = set()
            async for change in self.store.watch("", start_revision=first):
                rev = change.kv.mod_revision
                if rev > last:
                    break
                out.append((rev, change.kind, change.kv.key))
                seen.add(rev)
                if rev == last:
                    break
            return out

        # Changes of the last revision may be several (one transaction): read until a
        # later revision shows up or the stream is idle for a moment.
        async def bounded() -> list[tuple[int, str, str]]:
            try:
                return await asyncio.wait_for(read(), timeout=5.0)
            except TimeoutError:
                return [(0, "timeout", "history read timed out")]

        return self.call(bounded())

    def close(self) -> None:
        try:
            self.call(self.store.close(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


#: Keys written in the background whatever the requests do.
BACKGROUND_KEYS = ("/ax/leader/",)


def unchanged(probe: StoreProbe, before: StoreState, after: StoreState) -> str | None:
    """None when the store is unchanged (see the module doc), else what changed."""
    problems = []
    if before.keys != after.keys:
        added = sorted(after.keys - before.keys)[:10]
        removed = sorted(before.keys - after.keys)[:10]
        problems.append(f"key set changed: added {added}, removed {removed}")
    if before.revision != after.revision:
        writes = probe.writes(before.revision + 1, after.revision)
        foreign = [w for w in writes if not w[2].startswith(BACKGROUND_KEYS)]
        if foreign:
            problems.append(f"revision {before.revision} -> {after.revision}; writes: "
                            f"{foreign[:12]}")
    return "; ".join(problems) or None


# ---------------------------------------------------------------------------- world


@dataclass
class World:
    """Real ids the fuzzers aim at, kept valid across the module's tests."""

    topology: Topology
    probe: StoreProbe
    admin: httpx.Client
    gate_task: str = ""
    gate_hash: str = ""
    done_task: str = ""
    done_hash: str = ""
    #: Fences ever seen on the world's nodes.
    fences: set[int] = field(default_factory=lambda: {0, 1, 2})
    blob_shas: list[str] = field(default_factory=list)

    def submit(self, body: dict[str, Any]) -> tuple[str, str]:
        resp = self.admin.post("/v1/tasks", json=body)
        assert resp.status_code in (200, 201), resp.text
        return resp.json()["task_id"], resp.json()["dag_hash"]

    def ensure(self) -> None:
        """A task paused at its gate and a finished task (recreated when fuzzing moved
        them on: a decision, a cancel, a retry)."""
        gate = self.probe.task(self.gate_task)
        if gate is None or gate.status.value != "PAUSED":
            self.gate_task, self.gate_hash = self.submit(
                {"dag_yaml": GATE_YAML, "input": {"text": "fuzz"}})
            wait_until(lambda: self._status(self.gate_task) == "PAUSED", 30,
                       what="gate task paused")
        done = self.probe.task(self.done_task)
        if done is None or done.status.value != "SUCCEEDED":
            self.done_task, self.done_hash = self.submit({"dag": DONE_DAG,
                                                          "input": {"x": 1}})
            wait_until(lambda: self._status(self.done_task) == "SUCCEEDED", 30,
                       what="done task succeeded")
        for task, node in ((self.gate_task, "draft"), (self.done_task, "first"),
                           (self.done_task, "second"), (self.gate_task, "review")):
            snap = self.probe.snapshot(task, node)
            if snap is not None:
                self.fences.add(snap.fence)
                for ref in (snap.input_ref, snap.output_ref):
                    if ref is not None and ref.sha256 not in self.blob_shas:
                        self.blob_shas.append(ref.sha256)

    def _status(self, task_id: str) -> str:
        task = self.probe.task(task_id)
        return task.status.value if task is not None else ""

    def quiesce(self) -> None:
        """Cancel every task that could still write by itself (anything not final, but
        the world's paused gate task), and wait until none runs."""

        def settled() -> bool:
            busy = [t for t in self.probe.tasks() if not t.status.final
                    and not (t.task_id == self.gate_task and t.status.value == "PAUSED")]
            for task in busy:
                self.admin.post(f"/v1/tasks/{task.task_id}/cancel",
                                json={"reason": "fuzz quiesce"})
            return not busy

        wait_until(settled, 30, interval=0.05, what="no task running")

    def resolve(self, value: str) -> str:
        """Replace the placeholders of the strategies by the world's current ids."""
        return (value.replace("@gate", self.gate_task).replace("@done", self.done_task)
                .replace("@ghash", self.gate_hash).replace("@dhash", self.done_hash))

    def token(self, who: str | None) -> str:
        return self.topology.token(who) if who else ""


def make_world(topology: Topology) -> World:
    probe = StoreProbe(topology)
    admin = httpx.Client(base_url=topology.api_url, timeout=30,
                         headers={"Authorization": f"Bearer {topology.token('admin')}"})
    world = World(topology, probe, admin)
    world.ensure()
    return world


def close_world(world: World) -> None:
    world.admin.close()
    world.probe.close()


# ---------------------------------------------------------------------------- findings


@dataclass
class Finding:
    kind: str
    target: str
    request: str
    answer: str
    trace: str
    count: int = 1


class Findings:
    """Distinct failures of one test: kind + target + the API's exception line."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.items: dict[tuple[str, str, str], Finding] = {}
        self.stats: dict[str, int] = {}
        self._offset = 0

    @property
    def log_path(self) -> Path:
        return self.topology.logs / "api.log"

    def mark(self) -> None:
        """Remember where the API log is before a request."""
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0

    def new_log(self) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._offset)
            return fh.read().decode("utf-8", "replace")

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def add(self, kind: str, target: str, request: str, answer: str) -> None:
        log = self.new_log()
        trace = _last_exception(log) or "\n".join(
            line for line in log.splitlines()[-12:] if "HTTP/1.1" not in line)
        key = (kind, target, _signature(trace))
        found = self.items.get(key)
        if found is None:
            self.items[key] = Finding(kind, target, request, answer, trace)
        else:
            found.count += 1
            if len(request) < len(found.request):  # keep the smallest reproduction
                found.request, found.answer = request, answer
                found.trace = trace or found.trace

    def report(self) -> str:
        out = [f"{len(self.items)} distinct failure(s); answers seen: {self.stats}"]
        for n, f in enumerate(sorted(self.items.values(), key=lambda f: (f.kind, f.target)),
                              1):
            out.append(f"\n[{n}] {f.kind} on {f.target} (x{f.count})\n  request: "
                       f"{f.request}\n  answer: {f.answer}")
            if f.trace:
                out.append("  api.log:\n    " + "\n    ".join(f.trace.splitlines()[-14:]))
        return "\n".join(out)

    def check(self) -> None:
        print(self.report())
        assert not self.items, self.report()


def _signature(trace: str) -> str:
    """Exception class and the innermost frame of ax's code: one bug, one signature."""
    if not trace:
        return ""
    lines = trace.strip().splitlines()
    exc = lines[-1].split(":", 1)[0]
    frames = re.findall(r'File "(/[^"]*?/(?:axengine|executors)/[^"]+)", line \d+, in (\w+)',
                        trace)
    return f"{exc} @ {frames[-1][0].rsplit('/', 1)[-1]}:{frames[-1][1]}" if frames else exc


def _last_exception(log: str) -> str:
    """The last traceback (or ERROR line) the API printed."""
    lines = log.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.startswith("Traceback") or " ERROR " in line or line.startswith("ERROR"):
            start = i
    if start is None:
        return ""
    end = start + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t", "Traceback", "During",
                                                       "The above")) or not lines[end]
                                or (end + 1 < len(lines) and lines[end + 1].startswith(" "))):
        end += 1
    return "\n".join(lines[start:min(end + 1, len(lines))])[-4000:]


def short(value: Any, limit: int = 600) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...<{len(text)} chars>"


# ---------------------------------------------------------------------------- strategies

HOSTILE_STRINGS = (
    "", " ", ".", "..", "../..", "../../../etc/passwd", "%2e%2e", "%2e%2e%2f", "..%2f",
    "/", "//", "\\", "\\..\\..", "%00", "\x00", "\x7f", "\r\n", "\u202e", "\ufeff",
    "💥", "ä" * 3, "nul\x00byte", "{{ ''.__class__ }}", "{{", "}}", "{%", "%}", "*", "?",
    "#", "&", "=", "' OR '1'='1", "${jndi:ldap://127.0.0.1/a}", "/ax/tasks/", "/ax",
    "\\u0000", "NaN", "Infinity", "-1", "0", "null", "true", "[]", "{}", "9" * 40,
    "a" * 300, "x" * 5000,
)

HOSTILE_TEMPLATES = (
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ self.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ config }}",
    "{{ request }}",
    "{{ namespace.__init__ }}",
    "{% for i in range(100000000) %}x{% endfor %}",
    "{{ 'a' * 100000000 }}",
    "{{ 9 ** 9 ** 9 }}",
    "{{ range(10 ** 10) | list }}",
    "{{ .input.__class__ }}",
    "{{ .input | attr('__class__') }}",
    "{{ .nodes }}",
    "{{ .input }}",
    "{{ .input.x }}",
    "{{ .nodes.first.output.text }}",
    "{{ .nodes.nope.output }}",
    "{{ .output.status == 'success' }}",
    "{% import 'os' as os %}",
    "{% include '/etc/passwd' %}",
    "{% extends '/etc/passwd' %}",
    "{% raw %}{{{% endraw %}",
    "{{ '%s' % ('a' * 10 ** 8) }}",
    "{{ x.y.z(1)(2) }}",
    "{{ (1).__class__.__base__.__subclasses__() }}",
    "{{ .input.x ~ .input.y }}",
    "{{ [1] * 100000000 }}",
    "{{",
    "}}",
    "{{ }}",
    "{{ .input.x | e | safe }}",
    "{{ .input['__class__'] }}",
    "if .output.text == 'A': a\nelif x: b\nelse: c",
    "if 1: a",
)


def text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Unicode text, surrogates excluded (they cannot be UTF-8 encoded)."""
    return st.text(st.characters(blacklist_categories=("Cs",)), max_size=max_size)


def hostile_text(max_size: int = 40) -> st.SearchStrategy[str]:
    return st.one_of(text(max_size), st.sampled_from(HOSTILE_STRINGS),
                     st.sampled_from(HOSTILE_TEMPLATES),
                     st.integers(200, 20000).map(lambda n: "é" * n))


ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)

json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), text(30),
    st.sampled_from(HOSTILE_TEMPLATES), st.sampled_from(HOSTILE_STRINGS),
)

json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(text(12), ident), inner, max_size=4)),
    max_leaves=25,
)


def nested(depth: int, leaf: str = "1", kind: str = "list") -> str:
    """JSON text nested ``depth`` levels deep."""
    if kind == "list":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


depths = st.one_of(st.integers(1, 400), st.sampled_from([500, 999, 1000, 1001, 3000]))

#: JSON text that is not what json.dumps would write: the literals JSON lacks, huge
#: numbers, deep nesting, lone surrogate escapes, duplicated keys.
odd_json_leaf = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" + "0" * 400,
                     "9" * 5000, "-0", "1.5e-400", '"\\ud800"', '"\\udfff\\ud800"',
                     '"\\u0000"', '"a\\u0000b"', "[" * 5 + "]" * 5, "true"]),
    st.builds(nested, depths, st.just("1"), st.sampled_from(["list", "dict"])),
)


def json_text() -> st.SearchStrategy[str]:
    """A ``*_json`` field's text: valid JSON, odd JSON, or not JSON at all."""
    return st.one_of(
        json_value.map(lambda v: json.dumps(v)),
        odd_json_leaf,
        st.builds(lambda v, leaf: json.dumps({"v": v, "w": "@@"}).replace('"@@"', leaf),
                  json_value, odd_json_leaf),
        hostile_text(),
    )


# --- DAGs


def _edges(ids: list[str]) -> st.SearchStrategy[Any]:
    target = st.one_of(st.sampled_from(ids), ident, hostile_text(20))
    edge = st.fixed_dictionaries(
        {"target": target},
        optional={"condition": st.one_of(st.sampled_from(HOSTILE_TEMPLATES), text(20),
                                         json_value),
                  "when": st.one_of(ident, text(10), json_value),
                  "junk": json_value})
    return st.one_of(target, st.lists(edge, max_size=3), json_value)


_NUMBER = st.one_of(st.integers(-5, 100), st.floats(allow_nan=False), st.just(10**30),
                    text(5), st.none(), st.booleans())


def dag_node(ids: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    ntype = st.one_of(st.sampled_from(["tool_call", "llm_call", "condition",
                                       "human_gateway"]), text(12), json_value)
    template = st.one_of(st.sampled_from(HOSTILE_TEMPLATES), text(30))
    fields: dict[str, st.SearchStrategy[Any]] = {
        "tool": st.one_of(st.sampled_from(["echo", "no_such_tool"]), hostile_text(20)),
        "model": st.one_of(st.sampled_from(["gpt-4o-mini", "moderation-v1"]), text(10)),
        "prompt": template,
        "expression": template,
        "input": st.one_of(json_value, template,
                           st.dictionaries(ident, st.one_of(template, json_value),
                                           max_size=3)),
        "timeout": _NUMBER,
        "retry": _NUMBER,
        "stall_timeout": _NUMBER,
        "queue_timeout": _NUMBER,
        "temperature": _NUMBER,
        "max_tokens": _NUMBER,
        "next": _edges(ids),
        "on_failure": st.one_of(st.sampled_from(ids), text(10), json_value),
        "on_timeout": st.one_of(st.sampled_from(["reject", "approve"]), text(10)),
        "lane": st.one_of(st.just("default"), hostile_text(20)),
        "description": st.one_of(template, text(30)),
        "fallback": st.one_of(json_value, st.fixed_dictionaries(
            {"model": text(10), "threshold": _NUMBER})),
        "simulate": st.one_of(json_value, st.dictionaries(ident, _NUMBER, max_size=3)),
        "bogus_field": json_value,
    }
    return st.fixed_dictionaries({"type": ntype}, optional=fields)  # type: ignore[arg-type]


@st.composite
def dag_mapping(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible DAG document: random nodes, fields, edges and templates."""
    ids = draw(st.lists(st.one_of(ident, hostile_text(12)), min_size=1, max_size=5,
                        unique=True))
    nodes = {nid: draw(dag_node(ids)) for nid in ids}
    doc: dict[str, Any] = {"nodes": draw(st.one_of(st.just(nodes), st.just(nodes),
                                                   st.just(nodes), json_value))}
    if draw(st.booleans()):
        doc["name"] = draw(st.one_of(ident, hostile_text(20), json_value))
    if draw(st.booleans()):
        doc["deadline"] = draw(_NUMBER)
    if draw(st.booleans()):
        doc["description"] = draw(text(30))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(text(8))] = draw(json_value)
    return doc


def yaml_bomb(levels: int, width: int) -> str:
    """Billion laughs, bounded: ``width ** levels`` leaves after alias expansion."""
    lines = ["name: bomb", "a0: &a0 [lol, lol]"]
    for i in range(1, levels + 1):
        refs = ", ".join(f"*a{i - 1}" for _ in range(width))
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines += ["nodes:", "  n:", "    type: tool_call", "    tool: echo",
              f"    input: *a{levels}"]
    return "\n".join(lines) + "\n"


YAML_ODDITIES = (
    "name: x\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n    input: {{ .input.x }}\n",
    "name: x\nnodes:\n  a:\n    type: tool_call\n    tool: echo\n    input: {{ ''.__class__ }}\n",
    "nodes:\n  a: {type: llm_call, model: m, prompt: {{ .input }}}\n",
    "!!python/object/apply:os.system ['id']\n",
    "nodes: !!python/object/apply:subprocess.check_output [['id']]\n",
    "nodes:\n  a: !!binary aGVsbG8=\n",
    "nodes:\n  a: {type: tool_call, tool: echo, input: !!binary aGVsbG8=}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, input: 2001-12-14}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, input: 2001-12-14t21:59:43.10-05:00}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, input: !!set {x, y}}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, timeout: .nan}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, timeout: .inf}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, input: .nan}\n",
    "nodes:\n  a: {type: tool_call, tool: echo, input: {1: x, 2.5: y, null: z}}\n",
    "nodes:\n  1: {type: tool_call, tool: echo}\n",
    "nodes:\n  ? [a, b]\n  : {type: tool_call, tool: echo}\n",
    "nodes:\n  a: {type: tool_call, tool: echo}\n  a: {type: llm_call}\n",
    "a: &a [*a]\nnodes: {}\n",
    "base: &b {type: tool_call, tool: echo}\nnodes:\n  a: {<<: *b, input: 1}\n",
    "nodes: {}\n",
    "nodes: ~\n",
    "- a\n- b\n",
    "just a string",
    "",
    "---\nnodes: {}\n---\nnodes: {}\n",
    "%YAML 1.1\n---\nnodes: {}\n",
    "nodes:\n\ta: 1\n",
    "\x00\x01\x02",
    "nodes: {a: {type: tool_call, tool: echo, input: " + "[" * 300 + "]" * 300 + "}}\n",
    "nodes: {a: {type: tool_call, tool: echo, input: " + "[" * 3000 + "]" * 3000 + "}}\n",
    "nodes: {a: {type: tool_call, tool: echo, input: " + "{a: " * 300 + "1" + "}" * 300
    + "}}\n",
    "nodes: {a: {type: tool_call, tool: echo, retry: 1" + "0" * 400 + "}}\n",
    "nodes: {a: {type: tool_call, tool: echo, input: 0x" + "f" * 5000 + "}}\n",
)


def dag_yaml() -> st.SearchStrategy[str]:
    """DAG documents as YAML text."""
    return st.one_of(
        valid_dag().map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
        dag_mapping().map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
        dag_mapping().map(lambda d: json.dumps(d)),
        st.sampled_from(YAML_ODDITIES),
        st.builds(yaml_bomb, st.integers(1, 6), st.integers(2, 9)),
        st.just(GATE_YAML),
        text(200),
    )


# --- HTTP pieces

#: Path segments: placeholders of real ids, or hostile (already in wire form).
def path_segment(real: Iterable[str]) -> st.SearchStrategy[str]:
    from urllib.parse import quote

    return st.one_of(
        st.sampled_from(list(real)),
        st.sampled_from(["..", ".", "%2e%2e", "%2E%2e%2F..", "..%2f..%2f", "%2f", "%00",
                         "%ff%fe", "%", "%zz", "a%20b", "%2e", "...", "....//",
                         "%252e%252e", "~", ";x=1", "@gate%2f..%2f..%2f"]),
        text(30).map(lambda s: quote(s, safe="")),
        text(30).map(lambda s: quote(s, safe="/")),
        st.sampled_from(HOSTILE_STRINGS).map(lambda s: quote(s, safe="")),
        st.integers(300, 12000).map(lambda n: "a" * n),
        st.from_regex(r"[0-9a-f]{8,128}", fullmatch=True),
    )


def auth_header() -> st.SearchStrategy[bytes | str | None]:
    """``Authorization`` values (valid tokens most of the time); ``@tok:<who>`` is
    replaced by that principal's token."""
    valid = st.sampled_from([f"@tok:{w}" for w in WHO if w]).map(lambda t: f"Bearer {t}")
    garbage = st.one_of(
        st.sampled_from([b"Bearer", b"Bearer ", b"Bearer  ", b"bearer @tok:admin",
                         b"BEARER @tok:admin", b"Bearer @tok:admin ", b"Bearer  @tok:admin",
                         b"Basic YWRtaW46YWRtaW4=", b"Bearer \xff\xfe",
                         b"Bearer @tok:admin,Bearer @tok:executor", b"Token @tok:admin",
                         b"Bearer " + b"A" * 9000, b"Bearer @tok:admin\x00"]),
        text(40).map(lambda s: "Bearer " + s),
        st.binary(max_size=60),
    )
    return st.integers(0, 9).flatmap(
        lambda n: valid if n <= 5 else (st.none() if n == 6 else garbage))


@st.composite
def valid_dag(draw: st.DrawFn) -> dict[str, Any]:
    """A DAG that passes the schema, with random (often hostile) templates: what gets
    past validation to the template engine and the executors."""
    template = st.one_of(st.sampled_from(HOSTILE_TEMPLATES), text(20),
                         st.sampled_from(["{{ .input }}", "{{ .input.x }}", "plain"]))
    ids = draw(st.lists(ident, min_size=1, max_size=4, unique=True))
    nodes: dict[str, Any] = {}
    for i, nid in enumerate(ids):
        kind = draw(st.sampled_from(["tool_call", "tool_call", "llm_call", "condition",
                                     "human_gateway"]))
        node: dict[str, Any] = {"type": kind}
        if kind == "tool_call":
            node["tool"] = "echo"
            node["input"] = draw(st.one_of(template, st.dictionaries(ident, template,
                                                                     max_size=3)))
        elif kind == "llm_call":
            node.update(model="gpt-4o-mini", prompt=draw(template))
        elif kind == "condition":
            node["expression"] = draw(template)
        else:
            node["timeout"] = draw(st.sampled_from([1, 3600]))
            node["description"] = draw(template)
        if i + 1 < len(ids):
            node["next"] = draw(st.one_of(
                st.just(ids[i + 1]),
                st.lists(st.fixed_dictionaries({"target": st.sampled_from(ids[i + 1:])},
                                                optional={"condition": template}),
                         min_size=1, max_size=2)))
        nodes[nid] = node
    doc: dict[str, Any] = {"nodes": nodes}
    if draw(st.integers(0, 3)):
        doc["name"] = draw(ident)
    return doc


CONTENT_TYPES = (
    None, "application/json", "application/json; charset=utf-8", "text/plain",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz",
    "application/yaml", "application/json; charset=latin-1", "*/*", "garbage",
    "application/json; charset=utf-16", "application/problem+json", "",
)


def idempotency_header() -> st.SearchStrategy[bytes | None]:
    return st.one_of(
        st.none(), text(40).map(lambda s: s.encode()),
        st.sampled_from([b"", b" ", b"k" * 256, b"k" * 257, b"k" * 9000, b"\xff\xfe",
                         b"../../x", b"/ax/tasks/x", b"\x00"]),
    )


def is_finite_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_finite_json(v) for v in value)
    if isinstance(value, dict):
        return all(is_finite_json(v) for v in value.values())
    return True


__all__ = [
    "CALL_TIMEOUT", "WHO", "Findings", "StoreProbe", "World", "auth_header", "close_world",
    "dag_mapping", "dag_yaml", "fuzz_settings", "hostile_text", "idempotency_header",
    "json_text", "json_value", "make_world", "odd_json_leaf", "path_segment", "short",
    "store_state", "text", "unchanged",
]
