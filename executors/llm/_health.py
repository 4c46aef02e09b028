"""Per-process model health: recent success rate (for fallback) and circuit breakers.

Two different questions, kept apart:

- :class:`ModelHealth` — *is this model doing its job?* A sliding window of recent call
  outcomes (outages, transient errors and malformed answers count as misses). The
  ``llm_call`` handler switches to a node's fallback model when the primary's rate drops
  below the node's threshold.
- :class:`CircuitBreakers` — *can this model be reached at all?* Consecutive
  unavailability errors open the model's circuit for a cool-down; calls during it are
  answered ``Unavailable`` without touching the endpoint. After the cool-down one probe
  call goes through (half-open): success closes the circuit, another outage re-opens it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_CIRCUIT_COOLDOWN",
    "DEFAULT_CIRCUIT_FAILURES",
    "DEFAULT_HEALTH_MAX_AGE",
    "DEFAULT_HEALTH_MIN_SAMPLES",
    "DEFAULT_HEALTH_WINDOW",
    "CircuitBreakers",
    "CircuitState",
    "ModelHealth",
]

#: Calls remembered per model.
DEFAULT_HEALTH_WINDOW = 20
#: Below this many remembered calls a model's rate is unknown (never "unhealthy").
DEFAULT_HEALTH_MIN_SAMPLES = 5
#: Seconds after which a remembered call is forgotten, so a model that lost traffic to
#: its fallback gets tried again once its bad record has aged out.
DEFAULT_HEALTH_MAX_AGE = 300.0
#: Consecutive unavailability errors that open a model's circuit (``llm_circuit_failures``).
DEFAULT_CIRCUIT_FAILURES = 3
#: Seconds a circuit stays open before a probe call (``llm_circuit_cooldown``).
DEFAULT_CIRCUIT_COOLDOWN = 30.0

CircuitState = Literal["closed", "open", "half_open"]


class ModelHealth:
    """Sliding-window success rate per model. Thread-safe.

    Args:
        window: Calls remembered per model.
        min_samples: Fewer remembered calls than this → :meth:`success_rate` is None.
        max_age: Seconds after which a remembered call is dropped.
        clock: Monotonic clock.
    """

    def __init__(
        self,
        *,
        window: int = DEFAULT_HEALTH_WINDOW,
        min_samples: int = DEFAULT_HEALTH_MIN_SAMPLES,
        max_age: float = DEFAULT_HEALTH_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._min_samples = min_samples
        self._max_age = max_age
        self._clock = clock
        self._calls: dict[str, deque[tuple[float, bool]]] = {}
        self._lock = threading.Lock()

    def record(self, model: str, ok: bool) -> None:
        """Remember one call of ``model`` and whether it produced a usable answer."""
        with self._lock:
            calls = self._calls.setdefault(model, deque(maxlen=self._window))
            calls.append((self._clock(), ok))

    def success_rate(self, model: str) -> float | None:
        """Share of recent calls that succeeded, or None with too few samples."""
        with self._lock:
            calls = self._calls.get(model)
            if calls is None:
                return None
            horizon = self._clock() - self._max_age
            while calls and calls[0][0] < horizon:
                calls.popleft()
            if len(calls) < self._min_samples:
                return None
            return sum(ok for _, ok in calls) / len(calls)

    def reset(self) -> None:
        """Forget every model's history."""
        with self._lock:
            self._calls.clear()


@dataclass
class _Circuit:
    consecutive: int = 0
    open_until: float | None = None
    probe_started: float | None = None
    evidence: str = ""


class CircuitBreakers:
    """One circuit breaker per model name. Thread-safe.

    Args:
        failures: Default consecutive unavailability errors that open a circuit.
        cooldown: Default seconds a circuit stays open.
        clock: Monotonic clock.
    """

    def __init__(
        self,
        *,
        failures: int = DEFAULT_CIRCUIT_FAILURES,
        cooldown: float = DEFAULT_CIRCUIT_COOLDOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}
        self._lock = threading.Lock()

    def state(self, model: str) -> CircuitState:
        """The circuit's state as of now."""
        with self._lock:
            circuit = self._circuits.get(model)
            if circuit is None or circuit.open_until is None:
                return "closed"
            return "open" if self._clock() < circuit.open_until else "half_open"

    def acquire(self, model: str) -> str | None:
        """Ask to call ``model``.

        Returns:
            None when the call may go ahead (closed circuit, or this caller is the one
            half-open probe); otherwise the evidence to report as ``Unavailable``.
        """
        with self._lock:
            circuit = self._circuits.get(model)
            if circuit is None or circuit.open_until is None:
                return None
            now = self._clock()
            if now < circuit.open_until:
                return (
                    f"circuit for model {model!r} is open for another "
                    f"{circuit.open_until - now:.1f}s after {circuit.consecutive} consecutive "
                    f"unavailability errors; last: {circuit.evidence}"
                )
            # A probe that never reported (its thread died) must not block forever.
            if circuit.probe_started is not None and now - circuit.probe_started < self.cooldown:
                return (
                    f"circuit for model {model!r} is half-open and a probe call is in "
                    f"flight; last error: {circuit.evidence}"
                )
            circuit.probe_started = now
            return None

    def reopens_in(self, model: str) -> float | None:
        """Seconds until an open circuit lets a probe through; None when not open."""
        with self._lock:
            circuit = self._circuits.get(model)
            if circuit is None or circuit.open_until is None:
                return None
            left = circuit.open_until - self._clock()
            return left if left > 0 else None

    def release(self, model: str) -> None:
        """Give back a half-open probe that was granted but not used."""
        with self._lock:
            circuit = self._circuits.get(model)
            if circuit is not None:
                circuit.probe_started = None

    def success(self, model: str) -> None:
        """The endpoint answered (even with an error of its own): close the circuit."""
        with self._lock:
            self._circuits.pop(model, None)

    def unavailable(
        self,
        model: str,
        evidence: str,
        *,
        failures: int | None = None,
        cooldown: float | None = None,
        retry_after: float | None = None,
    ) -> CircuitState:
        """Count an unavailability error; opens the circuit at the threshold.

        Args:
            model: Model name.
            evidence: What was seen (kept for the denials while open).
            failures: Threshold for this call (default: the constructor's).
            cooldown: Cool-down for this call (default: the constructor's).
            retry_after: Seconds the endpoint asked to be left alone (``Retry-After``):
                the circuit opens at once for exactly that long instead of the
                cool-down, since the endpoint said so itself.

        Returns:
            The circuit's state after counting.
        """
        threshold = self.failures if failures is None else failures
        pause = self.cooldown if cooldown is None else cooldown
        with self._lock:
            circuit = self._circuits.setdefault(model, _Circuit())
            circuit.consecutive += 1
            circuit.evidence = evidence
            # A failed half-open probe re-opens at once: the model is still down.
            if retry_after is not None and retry_after > 0:
                pause = retry_after
            if (circuit.probe_started is not None or circuit.consecutive >= threshold
                    or (retry_after is not None and retry_after > 0)):
                circuit.open_until = self._clock() + pause
                circuit.probe_started = None
                return "open"
            return "closed"

    def reset(self) -> None:
        """Close every circuit."""
        with self._lock:
            self._circuits.clear()
