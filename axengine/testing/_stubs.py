"""Stubs: what a node answers in a test instead of running its tool or model.

A test gives answers by key — a node id, ``tool:NAME`` (every node calling that tool)
or ``model:NAME`` (every ``llm_call`` of that model) — and ax routes the DAG on them as
it would on real outputs. A node id wins over its tool or model. An answer is:

- any JSON value: the node succeeds with it as its output (:func:`stub` says so
  explicitly, e.g. for a list, which :func:`calls` would otherwise not be);
- an outcome: :func:`fail`, :func:`unavailable`, :func:`timeout`, :func:`pause` (or the
  ``executors.contract`` outcomes themselves);
- :func:`calls` of answers: one per call, in order, the last one repeated (a failure,
  then a success on the retry);
- a callable ``(request) -> answer``, for outputs computed from the node's input.

Only ``tool_call`` and ``llm_call`` nodes run a handler, so only they take stubs: a
``condition`` is evaluated by ax from its upstream output (stub that node instead) and
a ``human_gateway`` waits for a decision (``decide=``, or time past its timeout).

:class:`StubBook` holds the answers of one task and is the handler of its nodes; a node
with no answer runs its real handler when the test allows it (``real=``) and otherwise
fails, and the test engine raises :class:`UnstubbedNodeError` naming it and the keys
that would stub it.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from axengine.dag import Dag, Node
from axengine.errors import InputError
from axengine.worker import timed_out
from executors.contract import (
    Failure,
    Handler,
    NodeContext,
    NodeRequest,
    Outcome,
    Paused,
    Success,
    Unavailable,
)

__all__ = [
    "Calls",
    "StubBook",
    "Timeout",
    "UnstubbedNodeError",
    "calls",
    "fail",
    "pause",
    "stub",
    "timeout",
    "unavailable",
]

#: Node types whose work a handler does (and a stub can replace).
HANDLER_TYPES = frozenset({"tool_call", "llm_call"})
#: Reason of the pause that stands for a node a recording does not hold.
NOT_RECORDED = "not in the recording: replay stops here"


class UnstubbedNodeError(AssertionError):
    """A node without a stub was reached, and the test did not allow real handlers."""


@dataclass(frozen=True)
class Timeout:
    """The node runs past its timeout: the runner's own outcome for a run it stopped at
    its timeout (``timed out after …``, retryable), answered at once — the test clock
    does not move by the timeout."""


@dataclass(frozen=True)
class Calls:
    """Answers given one per call, in order; the last one answers every later call."""

    answers: tuple[Any, ...]


def stub(output: Any) -> Success:
    """The node succeeds with ``output`` (any JSON value, lists included)."""
    return Success(output)


def fail(message: str = "stubbed failure", *, retryable: bool = True,
         details: Mapping[str, Any] | None = None) -> Failure:
    """The node fails; a retryable failure is retried (after its backoff, which the test
    clock skips) while the node has attempts left."""
    return Failure(message, retryable=retryable, details=dict(details or {}))


def unavailable(dependency: str = "stub", evidence: str = "stubbed outage", *,
                retry_after: float | None = None) -> Unavailable:
    """A dependency of the node is down: it stays WAITING, spends no attempt, and is
    offered again after ``retry_after`` (or the engine's default delay)."""
    return Unavailable(dependency, evidence, retry_after)


def timeout() -> Timeout:
    """The node times out (see :class:`Timeout`)."""
    return Timeout()


def pause(reason: str = "stubbed pause", *, seconds: float | None = None,
          checkpoint: Any = None) -> Paused:
    """The handler pauses the node (a vendor queue, a rate limit): resumed after
    ``seconds`` of the test clock, or by a resume call when None."""
    return Paused(reason, seconds=seconds, checkpoint=checkpoint)


def calls(*answers: Any) -> Calls:
    """One answer per call: ``calls(fail("flaky"), {"ok": True})`` fails the first
    attempt and succeeds on the retry.

    Raises:
        InputError: No answer given.
    """
    if not answers:
        raise InputError("calls() needs at least one answer")
    return Calls(tuple(answers))


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def _stub_hint(node: Node) -> str:
    keys = [f"{node.id!r}"]
    if node.tool:
        keys.append(f"'tool:{node.tool}'")
    if node.model:
        keys.append(f"'model:{node.model}'")
    return " or ".join(f"stubs={{{k}: ...}}" for k in keys)


def _wrong_type(node: Node, dag: Dag) -> str:
    if node.type == "condition":
        upstream = ", ".join(sorted(dag.predecessors[node.id])) or "its input"
        return (f"node {node.id!r} is a condition: ax evaluates it on the output of "
                f"{upstream}; stub that to choose a branch")
    return (f"node {node.id!r} is a human_gateway: give its decision with "
            f"decide={{{node.id!r}: 'approve'}} (or 'reject'), or advance the test clock "
            "past its timeout for its default route")


def check_keys(dag: Dag, keys: Iterable[str], what: str = "stub") -> None:
    """Refuse keys that name nothing in ``dag`` (a typo would silently stub nothing).

    Raises:
        InputError: The key, what it could have meant, and how keys are written.
    """
    tools = {n.tool for n in dag.nodes.values() if n.tool and n.type in HANDLER_TYPES}
    models = {n.model for n in dag.nodes.values() if n.model and n.type in HANDLER_TYPES}
    for key in keys:
        kind, _, name = key.partition(":")
        if name and kind == "tool":
            if name not in tools:
                raise InputError(f"{what} {key!r}: no node of {dag.name} calls tool "
                                 f"{name!r}{did_you_mean(name, tools)}; tools: "
                                 f"{', '.join(sorted(tools)) or 'none'}")
        elif name and kind == "model":
            if name not in models:
                raise InputError(f"{what} {key!r}: no node of {dag.name} uses model "
                                 f"{name!r}{did_you_mean(name, models)}; models: "
                                 f"{', '.join(sorted(models)) or 'none'}")
        elif key not in dag.nodes:
            raise InputError(f"{what} {key!r}: {dag.name} has no node {key!r}"
                             f"{did_you_mean(key, dag.nodes)}; a key is a node id, 'tool:NAME' "
                             "or 'model:NAME'")
        elif dag.nodes[key].type not in HANDLER_TYPES:
            raise InputError(_wrong_type(dag.nodes[key], dag))


@dataclass
class StubBook:
    """The answers of one task's nodes, and its handler (thread-safe: handlers run in
    the worker's threads).

    Args:
        dag: The DAG the task runs.
        stubs: Answers by node id, ``tool:NAME`` or ``model:NAME``.
        real: Which unstubbed nodes run their real handler: True (all), False (none:
            they fail and the test engine raises), or keys as in ``stubs``.
        real_handler: The real handler, built on first use.

    Raises:
        InputError: A key that names nothing in ``dag``, or a condition or gate.
    """

    dag: Dag
    stubs: Mapping[str, Any] = field(default_factory=dict)
    real: bool | Iterable[str] = False
    real_handler: Callable[[], Handler] | None = None
    #: Every handler call of the task, in order (stubbed or real).
    requests: list[NodeRequest] = field(default_factory=list)
    #: Nodes reached without an answer while real handlers were not allowed.
    unstubbed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stubs = dict(self.stubs)
        real_keys = () if isinstance(self.real, bool) else tuple(self.real)
        check_keys(self.dag, self.stubs)
        check_keys(self.dag, real_keys, "real")
        self._answers: dict[str, Any] = {}
        self._real: set[str] = set()
        for node in self.dag.nodes.values():
            keys = [node.id, f"tool:{node.tool}" if node.tool else "",
                    f"model:{node.model}" if node.model else ""]
            for key in keys:
                if key and key in self.stubs:
                    self._answers[node.id] = self.stubs[key]
                    break
            if self.real is True or any(k and k in real_keys for k in keys):
                self._real.add(node.id)
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, request: NodeRequest, ctx: NodeContext) -> Outcome:
        with self._lock:
            self.requests.append(request)
            n = self._counts.get(request.node_id, 0)
            self._counts[request.node_id] = n + 1
        # A map's items (node[3]) answer as their node; each counts its own calls.
        node = self.dag.node(request.node_id)
        if node.id in self._answers:
            return self._outcome(self._answers[node.id], request, node, n)
        if node.id in self._real and self.real_handler is not None:
            return self.real_handler()(request, ctx)
        with self._lock:
            if node.id not in self.unstubbed:
                self.unstubbed.append(node.id)
        return Failure(unstubbed_message(node), retryable=False)

    def _outcome(self, answer: Any, request: NodeRequest, node: Node, n: int) -> Outcome:
        if isinstance(answer, Calls):
            answer = answer.answers[min(n, len(answer.answers) - 1)]
        if callable(answer) and not isinstance(answer, Timeout):
            answer = answer(request)
        if isinstance(answer, Timeout):
            return timed_out(node.timeout, node.timeout)
        if isinstance(answer, Success | Failure | Unavailable | Paused):
            return answer
        return Success(answer)


def unstubbed_message(node: Node) -> str:
    """Why a node failed in a test, and the keys that would stub it."""
    what = node.type + (f", tool {node.tool!r}" if node.tool else "") + (
        f", model {node.model!r}" if node.model else "")
    return (f"node {node.id!r} ({what}) ran without a stub: give {_stub_hint(node)}; or "
            "let unstubbed nodes call their real handlers with real=True (or real=[keys])")
