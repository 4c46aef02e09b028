"""Timeout policies: how long one node run may take, and why.

A static timeout is either too eager (it kills slow but healthy runs) or too lax (a hung
run holds its slot for the whole window); seed 001 asks for timeouts derived from the
durations the same node recorded, the current load and the progress the run keeps
reporting, and for a simulator to tune them on recorded history before trusting them in
production. This module is the policy algebra both share: pure functions over values (no
clock, no store, no file), so the simulator (:mod:`axengine.simulate`) replays exactly
what the engine would decide.

Three kinds, each optionally carrying a *stall window* (seconds without a progress mark
after which a run counts as blocked, whatever its timeout; heartbeats never count as
progress):

- ``fixed``: one timeout in seconds.
- ``percentile``: the pNN of the durations earlier successful runs of the same DAG node
  recorded, times ``factor``, clamped to ``[min, max]``; ``fallback`` seconds instead of
  pNN times factor while fewer than ``min_samples`` durations are known.
- ``adaptive``: the percentile timeout times a load factor (a step table over a load
  signal such as queue depth or runs in flight), plus a *progress grace*: each time the
  deadline is reached while progress arrived within the last ``progress_grace``
  seconds, the deadline moves ``progress_grace`` seconds on, up to ``max``.

:func:`decide` answers a :class:`Decision`: the timeout and a sentence that explains it
(``"timeout 42 s = p99 30 s x load 1.2 + progress grace 6 s"``), for logs, the CLI and
the simulator's per-run report. :func:`policy_from_mapping` and :func:`parse_policy`
build a policy from a mapping or YAML text, refusing bad fields with the source and the
field named (``policy.yaml: field 'percentile': must be between 0 and 100, got 120``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from axengine.errors import InputError
from axengine.limits import finite_number, short_repr

__all__ = [
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_PERCENTILE",
    "POLICY_KINDS",
    "TIMES",
    "AdaptivePolicy",
    "Decision",
    "FixedPolicy",
    "LoadStep",
    "PercentilePolicy",
    "Policy",
    "PolicyError",
    "decide",
    "describe",
    "first_stall",
    "load_factor",
    "node_timeout_policy",
    "parse_policy",
    "percentile",
    "policy_from_mapping",
    "seconds",
]

#: Percentile used when a policy file names none.
DEFAULT_PERCENTILE = 99.0
#: Durations needed before a percentile is trusted over the fallback.
DEFAULT_MIN_SAMPLES = 5
#: The multiplication sign of explanations (spelled by name: it looks like an x).
TIMES = "\N{MULTIPLICATION SIGN}"
#: The policy kinds, as written in a policy file's ``kind`` field.
POLICY_KINDS = ("fixed", "percentile", "adaptive")


class PolicyError(InputError):
    """A policy mapping or file is invalid; the message names the source and the field."""


# ---------------------------------------------------------------------------- policies


@dataclass(frozen=True, kw_only=True)
class LoadStep:
    """One row of an adaptive policy's load table: from load ``at`` on, use ``factor``.

    Attributes:
        at: Lowest load (inclusive) the row applies to.
        factor: Multiplier of the percentile timeout at that load.
    """

    at: float
    factor: float


@dataclass(frozen=True, kw_only=True)
class FixedPolicy:
    """The same timeout for every run.

    Attributes:
        name: Shown in tables and plots.
        timeout: Seconds a run may take.
        stall_window: Seconds without progress after which a run is stalled (None: no
            stall detection).
    """

    name: str
    timeout: float
    stall_window: float | None = None
    kind: Literal["fixed"] = field(default="fixed", init=False)


@dataclass(frozen=True, kw_only=True)
class PercentilePolicy:
    """``percentile`` of the node's earlier durations times ``factor``, within [min, max].

    Attributes:
        name: Shown in tables and plots.
        percentile: Which percentile of the durations (0 < p ≤ 100, nearest rank).
        factor: Headroom over the percentile.
        min: Shortest timeout it may give.
        max: Longest timeout it may give (None: unbounded).
        fallback: Timeout while fewer than ``min_samples`` durations are known (not
            multiplied by ``factor``; still clamped to [min, max]).
        min_samples: Durations needed before the percentile is used.
        stall_window: Seconds without progress after which a run is stalled.
    """

    name: str
    percentile: float = DEFAULT_PERCENTILE
    factor: float = 1.0
    min: float = 0.0
    max: float | None = None
    fallback: float
    min_samples: int = DEFAULT_MIN_SAMPLES
    stall_window: float | None = None
    kind: Literal["percentile"] = field(default="percentile", init=False)


@dataclass(frozen=True, kw_only=True)
class AdaptivePolicy:
    """A percentile timeout scaled by load and extended while progress keeps arriving.

    Attributes:
        name: Shown in tables and plots.
        percentile: Which percentile of the durations (0 < p ≤ 100, nearest rank).
        factor: Headroom over the percentile (before the load factor).
        load: Load table, by ascending ``at``; the last row whose ``at`` the load reaches
            applies (factor 1 below the first row).
        progress_grace: Seconds added each time the deadline is reached with progress
            in the last ``progress_grace`` seconds (0: never extended).
        min: Shortest timeout it may give.
        max: Longest timeout, grace included (None: unbounded).
        fallback: Stands for the percentile and its ``factor`` while fewer than
            ``min_samples`` durations are known (still scaled by load, extended by
            grace and clamped).
        min_samples: Durations needed before the percentile is used.
        stall_window: Seconds without progress after which a run is stalled.
    """

    name: str
    percentile: float = DEFAULT_PERCENTILE
    factor: float = 1.0
    load: tuple[LoadStep, ...] = ()
    progress_grace: float = 0.0
    min: float = 0.0
    max: float | None = None
    fallback: float
    min_samples: int = DEFAULT_MIN_SAMPLES
    stall_window: float | None = None
    kind: Literal["adaptive"] = field(default="adaptive", init=False)


Policy = FixedPolicy | PercentilePolicy | AdaptivePolicy


@dataclass(frozen=True)
class Decision:
    """The timeout a policy gives one run, with the reasoning spelled out.

    Attributes:
        timeout: Seconds from the run's start after which it is stopped.
        explanation: E.g. ``"timeout 42 s = p99 30 s x load 1.2 + progress grace 6 s"``.
        grace: Seconds of progress grace included in ``timeout``.
        used_fallback: Too few durations were known: the fallback stood in.
    """

    timeout: float
    explanation: str
    grace: float = 0.0
    used_fallback: bool = False


# ---------------------------------------------------------------------------- decisions


def seconds(value: float) -> str:
    """``42`` / ``1.25`` / ``inf``: a number of seconds without trailing zeros."""
    if math.isinf(value):
        return "∞"
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def percentile(values: Sequence[float], p: float, *, ascending: bool = False) -> float:
    """The nearest-rank ``p``-th percentile: the ``ceil(p/100 * n)``-th smallest value.

    Nearest rank (rather than interpolation) keeps every timeout a duration that was
    actually observed, which makes simulator results checkable by hand.

    Args:
        values: The values.
        p: The percentile, 0 to 100.
        ascending: ``values`` are in ascending order already (not sorted again: the
            simulator keeps them so, and a copy per run made it quadratic).

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = values if ascending else sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def load_factor(steps: Sequence[LoadStep], load: float) -> float:
    """The factor of the last row of ``steps`` whose ``at`` ``load`` reaches (1 if none)."""
    factor = 1.0
    for step in sorted(steps, key=lambda s: s.at):
        if load >= step.at:
            factor = step.factor
    return factor


def first_stall(window: float | None, marks: Sequence[float], elapsed: float) -> float | None:
    """When a run first went more than ``window`` seconds without progress, or None.

    Args:
        window: The stall window (None: never stalled).
        marks: Offsets of the run's progress marks from its start (any order).
        elapsed: How long the run has been running (or ran, when it ended).

    Returns:
        The offset at which the run counts as stalled (the last progress before the gap,
        or the start, plus ``window``) when that is before ``elapsed``; a gap of exactly
        ``window`` is not a stall.
    """
    if window is None:
        return None
    last = 0.0
    for mark in sorted(m for m in marks if 0.0 <= m <= elapsed):
        if mark - last > window:
            return last + window
        last = mark
    return last + window if elapsed - last > window else None


def _clamp(value: float, low: float, high: float | None) -> tuple[float, str]:
    if value < low:
        return low, f", raised to min {seconds(low)} s"
    if high is not None and value > high:
        return high, f", capped at max {seconds(high)} s"
    return value, ""


def _base(policy: PercentilePolicy | AdaptivePolicy, durations: Sequence[float],
          ascending: bool) -> tuple[float, str, bool]:
    """The percentile term (or the fallback) and how it reads."""
    if len(durations) < policy.min_samples:
        text = (f"fallback {seconds(policy.fallback)} s ({len(durations)} sample"
                f"{'' if len(durations) == 1 else 's'} < {policy.min_samples})")
        return policy.fallback, text, True
    value = percentile(durations, policy.percentile, ascending=ascending)
    return value, f"p{seconds(policy.percentile)} {seconds(value)} s", False


def decide(policy: Policy, durations: Sequence[float] = (), *, load: float = 0.0,
           progress: Sequence[float] = (), elapsed: float | None = None,
           ascending: bool = False) -> Decision:
    """The timeout ``policy`` gives a run.

    Args:
        policy: The policy.
        durations: Durations of earlier successful runs of the same DAG node, known
            when the run started (the caller guarantees nothing later leaks in).
        load: The load signal the adaptive load table is indexed by.
        progress: Offsets of the run's progress marks from its start.
        elapsed: How long the run has run so far (or in all): grace stops being added
            once the deadline passes it, so the decision shows only the grace the run
            needed. None: extend as far as the marks allow.
        ascending: ``durations`` are in ascending order already (see :func:`percentile`).

    The grace loop only looks at marks up to the current deadline, so evaluating it
    while a run is live, with the marks received so far, gives the same deadline as
    evaluating it afterwards with every mark: the decision never depends on the future.
    """
    if isinstance(policy, FixedPolicy):
        return Decision(policy.timeout, f"timeout {seconds(policy.timeout)} s (fixed)")
    value, text, fell_back = _base(policy, durations, ascending)
    # The factor is headroom over observed durations; a fallback is a timeout already.
    if policy.factor != 1.0 and not fell_back:
        value *= policy.factor
        text += f" {TIMES} {seconds(policy.factor)}"
    if isinstance(policy, PercentilePolicy):
        timeout, clamped = _clamp(value, policy.min, policy.max)
        return Decision(timeout, f"timeout {seconds(timeout)} s = {text}{clamped}",
                        used_fallback=fell_back)
    factor = load_factor(policy.load, load)
    value *= factor
    text += f" {TIMES} load {seconds(factor)}"
    deadline = max(value, policy.min)
    raised = deadline > value
    grace = 0.0
    if policy.progress_grace > 0:
        step = policy.progress_grace
        marks = sorted(progress)
        while ((elapsed is None or deadline < elapsed)
               and (policy.max is None or deadline < policy.max)
               and any(deadline - step < m <= deadline for m in marks)):
            grant = step if policy.max is None else min(step, policy.max - deadline)
            deadline += grant
            grace += grant
    if raised:
        text += f", raised to min {seconds(policy.min)} s"
    if grace:
        text += f" + progress grace {seconds(grace)} s"
    timeout, clamped = _clamp(deadline, policy.min, policy.max)
    return Decision(timeout, f"timeout {seconds(timeout)} s = {text}{clamped}", grace=grace,
                    used_fallback=fell_back)


def describe(policy: Policy) -> str:
    """One line restating a policy's parameters (the legend of a simulator table)."""
    if isinstance(policy, FixedPolicy):
        text = f"fixed {seconds(policy.timeout)} s"
    else:
        text = f"{policy.kind} p{seconds(policy.percentile)}"
        if policy.factor != 1.0:
            text += f" {TIMES} {seconds(policy.factor)}"
        if isinstance(policy, AdaptivePolicy):
            if policy.load:
                text += f" {TIMES} load (" + ", ".join(
                    f"≥{seconds(s.at)}: {seconds(s.factor)}" for s in policy.load) + ")"
            if policy.progress_grace:
                text += f" + progress grace {seconds(policy.progress_grace)} s"
        text += f", min {seconds(policy.min)} s"
        if policy.max is not None:
            text += f", max {seconds(policy.max)} s"
        text += (f", fallback {seconds(policy.fallback)} s under {policy.min_samples} "
                 "samples")
    if policy.stall_window is not None:
        text += f"; stall window {seconds(policy.stall_window)} s"
    return text


# ---------------------------------------------------------------------------- loading

_COMMON = ("name", "kind", "stall_window")
_FIELDS: Mapping[str, tuple[str, ...]] = {
    "fixed": (*_COMMON, "timeout"),
    "percentile": (*_COMMON, "percentile", "factor", "min", "max", "fallback", "min_samples"),
    "adaptive": (*_COMMON, "percentile", "factor", "min", "max", "fallback", "min_samples",
                 "load", "progress_grace"),
}


class _Fields:
    """Reads typed fields off a policy mapping, raising :class:`PolicyError` that names
    the source and the field."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def error(self, name: str, message: str) -> PolicyError:
        return PolicyError(f"{self.source}: field {name!r}: {message}")

    def number(self, name: str, default: float | None = None, *, positive: bool = False,
               required: str = "") -> float | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise self.error(name, f"required {required}")
            return default
        number = finite_number(value)
        if number is None:
            raise self.error(name, f"must be a number of seconds, got {short_repr(value)}")
        if number < 0 or (positive and number == 0):
            raise self.error(name, f"must be {'above' if positive else 'at least'} 0, "
                                   f"got {value!r}")
        return number

    def required(self, name: str, what: str, *, positive: bool = True) -> float:
        value = self.number(name, positive=positive, required=what)
        assert value is not None
        return value


def _load_steps(fields: _Fields) -> tuple[LoadStep, ...]:
    raw = fields.data.get("load")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise fields.error("load", "must be a list of {at: LOAD, factor: F} rows, got "
                                   f"{type(raw).__name__}")
    steps = []
    for i, row in enumerate(raw):
        name = f"load[{i}]"
        if not isinstance(row, Mapping) or set(row) != {"at", "factor"}:
            raise fields.error(name, f"must be a mapping with 'at' and 'factor', got {row!r}")
        at, factor = row["at"], row["factor"]
        for key, value in (("at", at), ("factor", factor)):
            number = finite_number(value)
            if number is None or number < 0:
                raise fields.error(f"{name}.{key}", f"must be a number ≥ 0, got "
                                                    f"{short_repr(value)}")
        if factor == 0:
            raise fields.error(f"{name}.factor", "must be above 0, got 0")
        steps.append(LoadStep(at=float(at), factor=float(factor)))
    ats = [s.at for s in steps]
    if ats != sorted(ats) or len(set(ats)) != len(ats):
        raise fields.error("load", f"rows must have increasing 'at', got {ats}")
    return tuple(steps)


def policy_from_mapping(data: Any, source: str = "policy", *, name: str = "") -> Policy:
    """Build a policy from a mapping (a parsed policy file).

    Args:
        data: The mapping; ``kind`` selects the policy (default ``fixed`` when it has a
            ``timeout`` field).
        source: How errors name where the mapping came from (a file name).
        name: Name when the mapping has no ``name`` field (e.g. the file stem).

    Raises:
        PolicyError: An unknown kind or field, a missing field, a value out of range.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(f"{source}: a policy must be a mapping of fields, got "
                          f"{type(data).__name__}")
    kind = data.get("kind", "fixed" if "timeout" in data else None)
    if kind not in POLICY_KINDS:
        got = "nothing" if kind is None else repr(kind)
        raise PolicyError(f"{source}: field 'kind': must be one of {', '.join(POLICY_KINDS)}"
                          f", got {got}")
    allowed = _FIELDS[kind]
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PolicyError(f"{source}: field {key!r}: not a field of a {kind} policy"
                              f"{hint}; its fields are {', '.join(allowed)}")
    fields = _Fields(data, source)
    title = data.get("name", name or source)
    if not isinstance(title, str) or not title.strip():
        raise fields.error("name", f"must be a non-empty string, got {title!r}")
    stall = fields.number("stall_window", positive=True)
    if kind == "fixed":
        return FixedPolicy(name=title, timeout=fields.required("timeout", "for a fixed policy"),
                           stall_window=stall)
    pct = data.get("percentile", DEFAULT_PERCENTILE)
    if finite_number(pct) is None or not 0 < pct <= 100:
        raise fields.error("percentile", f"must be between 0 and 100, got {short_repr(pct)}")
    samples = data.get("min_samples", DEFAULT_MIN_SAMPLES)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise fields.error("min_samples", f"must be a whole number ≥ 1, got {samples!r}")
    low = fields.number("min", 0.0)
    high = fields.number("max", positive=True)
    assert low is not None
    if high is not None and high < low:
        raise fields.error("max", f"must be at least min ({seconds(low)}), got {high!r}")
    common: dict[str, Any] = {
        "name": title, "percentile": float(pct),
        "factor": fields.number("factor", 1.0, positive=True),
        "min": low, "max": high, "min_samples": samples, "stall_window": stall,
        "fallback": fields.required("fallback", f"for a {kind} policy (the timeout used "
                                                "while too few durations are known)"),
    }
    if kind == "percentile":
        return PercentilePolicy(**common)
    return AdaptivePolicy(**common, load=_load_steps(fields),
                          progress_grace=fields.number("progress_grace", 0.0) or 0.0)


def parse_policy(text: str, source: str = "policy", *, name: str = "") -> Policy:
    """Build a policy from YAML text (a policy file's content).

    Raises:
        PolicyError: Invalid YAML (with its line), or as :func:`policy_from_mapping`.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(f"{source}{where}: not valid YAML: {problem}") from exc
    return policy_from_mapping(data, source, name=name)


def node_timeout_policy(data: Mapping[str, Any], timeout: float, *,
                        source: str = "timeout_policy") -> Policy:
    """The policy of a DAG node's ``timeout_policy:``: the node's ``timeout`` is its
    ``max`` and ``fallback`` unless the mapping names them (a larger ``max`` is refused:
    ``timeout`` stays the hard bound the limits and the API check), and its ``name`` is
    ``node``.

    Raises:
        PolicyError: As :func:`policy_from_mapping`, naming ``source``.
    """
    merged: dict[str, Any] = {"name": "node", **data}
    if merged.get("kind") in ("percentile", "adaptive"):
        merged.setdefault("fallback", timeout)
        merged.setdefault("max", timeout)
    policy = policy_from_mapping(merged, source)
    high = getattr(policy, "max", None)
    if high is not None and high > timeout:
        raise PolicyError(f"{source}: field 'max': {seconds(high)} s is longer than the "
                          f"node's timeout {seconds(timeout)} s, which bounds every run")
    return policy
