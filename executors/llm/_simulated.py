"""A deterministic, offline model: the default provider, and the fault injector of tests.

Its behaviour for a node comes from the node's ``simulate:`` mapping merged over the
``simulate`` handler setting (see :func:`merge_knobs`). Knobs, checked in this order:

``unavailable``
    ``true`` → every call raises :class:`ProviderUnavailable` (a model outage).
``unavailable_until``
    Epoch seconds; calls before then raise :class:`ProviderUnavailable`.
``latency``
    Seconds each call takes; waited in small steps that stop early once the run is
    cancelled or its fence goes stale.
``fail_attempts``
    The first N attempts of the node raise a retryable :class:`ProviderError`.
``output``
    A fixed completion: a string as is, any other JSON value serialised.
``malformed``
    ``true`` → prose where JSON was asked for.

Any knob can be scoped to one model with ``models: {<model>: {...}}``, so a DAG can take
its primary model down while the fallback keeps answering.

Without ``output`` the model *answers from the text* so the example DAGs behave like the
real thing:

- "Return JSON with keys: a, b, c" → a JSON object whose values are looked up in the text
  by each key's words (``revenue_growth`` matches "Revenue growth: 18.0%" → ``0.18``;
  percentages become fractions; a key not found is ``null``).
- "Return one of: APPROVED, REJECTED, MANUAL" → the label picked from cues in the input
  (harmful words → the rejecting label, hedging words → the manual-review label, else the
  approving one).
- anything else → a short completion derived from sha256(model + prompt).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from executors.llm._prompt import requested_choices, requested_keys, split_prompt
from executors.llm._provider import ProviderError, ProviderUnavailable

__all__ = ["SimulatedProvider", "knobs_for_model", "merge_knobs"]

_STEP = 0.05
_NUMBER_RE = re.compile(
    r"^\s*(?P<sign>[-+\u2212])?\s*[$€£]?\s*(?P<num>\d[\d,]*(?:\.\d+)?)\s*(?P<pct>%)?"
)
_REJECT_CUES = frozenset({
    "scam", "scams", "fraud", "fraudulent", "phishing", "violence", "violent", "kill",
    "weapon", "weapons", "hate", "abuse", "abusive", "spam", "malware", "threat", "threats",
})
_MANUAL_CUES = frozenset({
    "unclear", "ambiguous", "unsure", "uncertain", "borderline", "maybe", "unverified",
})


def merge_knobs(base: Mapping[str, Any] | None, node: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge a node's ``simulate`` mapping over the settings' one.

    Top-level knobs of the node win; the per-model ``models`` sections are merged model
    by model the same way.
    """
    base, node = dict(base or {}), dict(node or {})
    models: dict[str, dict[str, Any]] = {}
    for source in (base.get("models"), node.get("models")):
        for name, knobs in dict(source or {}).items():
            models.setdefault(str(name), {}).update(dict(knobs or {}))
    merged = {**base, **node}
    merged["models"] = models
    return merged


def knobs_for_model(merged: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The knobs that apply to ``model``: the top level overlaid with its own section."""
    top = {k: v for k, v in merged.items() if k != "models"}
    return {**top, **dict(merged.get("models", {}).get(model, {}))}


class SimulatedProvider:
    """The deterministic offline model.

    Args:
        knobs: Merged simulation knobs (:func:`merge_knobs`), before per-model scoping.
        attempt: The node's 1-based attempt number (for ``fail_attempts``).
        keepalive: Called between latency steps; False stops the call.
        clock: Wall clock for ``unavailable_until``.
        sleep: Sleep function (tests may speed it up).
    """

    def __init__(
        self,
        *,
        knobs: Mapping[str, Any] | None = None,
        attempt: int = 1,
        keepalive: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._knobs = dict(knobs or {})
        self._attempt = attempt
        self._keepalive = keepalive or (lambda: True)
        self._clock = clock
        self._sleep = sleep

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        temperature: float,
        max_tokens: int | None,
        settings: Mapping[str, Any],
    ) -> str:
        """See :class:`executors.llm.Provider`; ``settings`` is not used."""
        knobs = knobs_for_model(self._knobs, model)
        self._check_outage(model, knobs)
        self._wait(_number(knobs, "latency", 0.0))
        failures = int(_number(knobs, "fail_attempts", 0))
        if self._attempt <= failures:
            raise ProviderError(
                f"simulated transient failure of model {model!r} on attempt "
                f"{self._attempt} of the first {failures} (simulate.fail_attempts)",
                retryable=True,
            )
        if "output" in knobs:
            out = knobs["output"]
            return out if isinstance(out, str) else json.dumps(out)
        if knobs.get("malformed"):
            return (
                "Sure! Revenue looks like it grew nicely this year and the margins seem "
                "healthy, although debt is a little high."
            )
        return _answer(model, prompt, max_tokens)

    def _check_outage(self, model: str, knobs: Mapping[str, Any]) -> None:
        if knobs.get("unavailable"):
            raise ProviderUnavailable(
                f"model {model!r} is down: connection refused (simulated outage, "
                "simulate.unavailable)"
            )
        until = knobs.get("unavailable_until")
        if until is not None:
            until_f = _number(knobs, "unavailable_until", 0.0)
            now = self._clock()
            if now < until_f:
                stamp = datetime.fromtimestamp(until_f, UTC).isoformat(timespec="seconds")
                raise ProviderUnavailable(
                    f"model {model!r} is down until {stamp} ({until_f - now:.1f}s from now; "
                    "simulated outage, simulate.unavailable_until)"
                )

    def _wait(self, seconds: float) -> None:
        remaining = seconds
        while remaining > 0:
            step = min(_STEP, remaining)
            self._sleep(step)
            remaining -= step
            if not self._keepalive():
                raise ProviderError(
                    "model call stopped: the run was cancelled or its fence went stale",
                    retryable=True,
                )


def _number(knobs: Mapping[str, Any], name: str, default: float) -> float:
    value = knobs.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProviderError(
            f"simulate.{name} must be a number, got {value!r}: fix the node's simulate: "
            "mapping or the 'simulate' setting",
            retryable=False,
        )
    return float(value)


def _answer(model: str, prompt: str, max_tokens: int | None) -> str:
    instructions, node_input = split_prompt(prompt)
    context = prompt if node_input is None else node_input
    if keys := requested_keys(instructions):
        # The input section first: the instructions may name the same words without
        # figures ("- Revenue Growth (YoY)").
        return json.dumps({key: _lookup(key, context, prompt) for key in keys})
    if choices := requested_choices(instructions):
        return _moderate(choices, context)
    digest = hashlib.sha256(f"{model}\n{prompt}".encode()).hexdigest()
    first = next((ln.strip() for ln in prompt.splitlines() if ln.strip()), "")
    words = f"[{model} simulated {digest[:12]}] Noted: {first[:80]}".split()
    if max_tokens is not None and max_tokens > 0:
        words = words[:max_tokens]
    return " ".join(words)


def _lookup(key: str, *texts: str) -> Any:
    words = [w for w in re.split(r"[_\-\s]+", key) if w]
    label = r"[\s_-]*".join(re.escape(w) for w in words)
    pattern = re.compile(rf"\b{label}\b[^\n:=]{{0,40}}?[:=][ \t]*(?P<value>[^\n]+)", re.IGNORECASE)
    for text in texts:
        if match := pattern.search(text):
            return _value(match.group("value"))
    return None


def _value(raw: str) -> Any:
    if number := _NUMBER_RE.match(raw):
        digits = number.group("num").replace(",", "")
        value = -float(digits) if number.group("sign") in ("-", "\u2212") else float(digits)
        if number.group("pct"):
            # Round away binary noise: 18.0% must compare equal to 0.18 in a guard.
            return round(value / 100, 10)
        return int(value) if "." not in digits and abs(value) < 2**53 else value
    return raw.strip().rstrip(".")


def _moderate(choices: tuple[str, ...], text: str) -> str:
    words = set(re.findall(r"[a-z]+", text.lower()))

    def pick(*stems: str, prefix: bool = False) -> str | None:
        for choice in choices:
            low = choice.lower()
            if any(low.startswith(s) if prefix else s in low for s in stems):
                return choice
        return None

    if words & _REJECT_CUES and (label := pick("reject", "block", "deny", "unsafe")):
        return label
    if words & _MANUAL_CUES and (label := pick("manual", "review", "escalat", "unsure")):
        return label
    # Prefix match, so "UNSAFE" is never taken for "SAFE".
    return pick("approv", "allow", "accept", "safe", "ok", prefix=True) or choices[0]
