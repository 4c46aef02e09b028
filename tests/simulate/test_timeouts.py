"""Timeout policies: decisions and their explanations, and policy files refused with the
file and field named. Pure: no store, no clock, no file (YAML comes as text)."""

from __future__ import annotations

import pytest

from axengine.timeouts import (
    AdaptivePolicy,
    FixedPolicy,
    LoadStep,
    PercentilePolicy,
    PolicyError,
    decide,
    first_stall,
    load_factor,
    parse_policy,
    percentile,
    policy_from_mapping,
)

X = "\N{MULTIPLICATION SIGN}"


def test_nearest_rank_percentile() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0      # ceil(2.5) = 3rd smallest
    assert percentile(values, 99) == 5.0
    assert percentile(values, 20) == 1.0      # ceil(1.0) = 1st
    assert percentile(values, 0.1) == 1.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_fixed_decision() -> None:
    d = decide(FixedPolicy(name="f", timeout=60))
    assert d.timeout == 60 and d.explanation == "timeout 60 s (fixed)"


def test_percentile_decision_fallback_and_clamps() -> None:
    policy = PercentilePolicy(name="p", percentile=99, factor=1.5, min=10, max=100,
                              fallback=300, min_samples=3)
    few = decide(policy, [20.0, 30.0])
    assert few.timeout == 100 and few.used_fallback
    # The fallback is a timeout already: no headroom factor, but still clamped.
    assert few.explanation == ("timeout 100 s = fallback 300 s (2 samples < 3), "
                               "capped at max 100 s")
    normal = decide(policy, [20.0, 30.0, 10.0])
    assert normal.timeout == 45 and not normal.used_fallback
    assert normal.explanation == f"timeout 45 s = p99 30 s {X} 1.5"
    low = decide(policy, [2.0, 3.0, 4.0])
    assert low.timeout == 10
    assert low.explanation == f"timeout 10 s = p99 4 s {X} 1.5, raised to min 10 s"


def test_adaptive_explanation_has_load_and_grace() -> None:
    policy = AdaptivePolicy(name="a", percentile=99, fallback=60, min_samples=1,
                            load=(LoadStep(at=0, factor=1.0), LoadStep(at=8, factor=1.2)),
                            progress_grace=6)
    # p99 30 s x load 1.2 = 36 s; progress at 35 s (within the last 6 s) extends to 42 s,
    # which is past the run's 40 s: no further grace is needed.
    d = decide(policy, [10.0, 30.0], load=9, progress=[5.0, 35.0], elapsed=40)
    assert d.timeout == pytest.approx(42) and d.grace == 6
    assert d.explanation == f"timeout 42 s = p99 30 s {X} load 1.2 + progress grace 6 s"
    # Below the first threshold of load the factor is 1; no progress: no grace.
    quiet = decide(policy, [10.0, 30.0], load=3, progress=[5.0], elapsed=40)
    assert quiet.timeout == 30 and quiet.grace == 0
    assert quiet.explanation == f"timeout 30 s = p99 30 s {X} load 1"


def test_grace_keeps_coming_only_while_progress_does_and_stops_at_max() -> None:
    policy = AdaptivePolicy(name="a", percentile=50, fallback=4, min_samples=99,
                            progress_grace=2, max=9)
    # Marks every second: 4 -> 6 -> 8 -> 9 (the last step is cut at max).
    steady = decide(policy, progress=[float(t) for t in range(1, 20)], elapsed=20)
    assert steady.timeout == 9 and steady.grace == 5
    # A mark at 3 s extends 4 -> 6; none in (4, 6]: the run is stopped at 6 s.
    stops = decide(policy, progress=[3.0], elapsed=20)
    assert stops.timeout == 6 and stops.grace == 2
    # Decided live (marks so far, elapsed so far) or afterwards, the deadline agrees.
    live = decide(policy, progress=[1.0, 2.0, 3.0], elapsed=5.5)
    assert live.timeout == 6


def test_load_factor_and_stalls() -> None:
    steps = (LoadStep(at=0, factor=0.8), LoadStep(at=10, factor=1.5))
    assert load_factor(steps, 0) == 0.8 and load_factor(steps, 10) == 1.5
    assert load_factor((), 100) == 1.0
    assert first_stall(None, [], 100) is None
    assert first_stall(2.5, [2, 4, 6, 8], 10) is None          # gaps of 2 s
    assert first_stall(2.5, [2, 6], 10) == 4.5                 # 2 -> 6 is silent 4 s
    assert first_stall(2.5, [], 3) == 2.5                      # silent from the start
    assert first_stall(2.5, [], 2.5) is None                   # exactly the window is fine


def test_policy_files_load() -> None:
    policy = parse_policy("""
kind: adaptive
percentile: 95
factor: 1.2
load: [{at: 0, factor: 1}, {at: 4, factor: 1.3}]
progress_grace: 30
min: 10
max: 900
fallback: 300
stall_window: 120
""", "adaptive.yaml", name="adaptive")
    assert isinstance(policy, AdaptivePolicy)
    assert policy.name == "adaptive" and policy.percentile == 95
    assert policy.load == (LoadStep(at=0, factor=1.0), LoadStep(at=4, factor=1.3))
    assert policy.stall_window == 120 and policy.max == 900
    fixed = policy_from_mapping({"timeout": 5, "name": "five"}, "f.yaml")
    assert fixed == FixedPolicy(name="five", timeout=5.0)


@pytest.mark.parametrize(("text", "message"), [
    ("kind: percentile\npercentile: 120\nfallback: 5\n",
     "policy.yaml: field 'percentile': must be between 0 and 100, got 120"),
    ("kind: percentile\n", "policy.yaml: field 'fallback': required for a percentile policy"),
    ("kind: fixed\ntimout: 5\n",
     "policy.yaml: field 'timout': not a field of a fixed policy (did you mean 'timeout'?)"),
    ("kind: fixed\ntimeout: soon\n",
     "policy.yaml: field 'timeout': must be a number of seconds, got 'soon'"),
    ("kind: fixed\ntimeout: 0\n", "policy.yaml: field 'timeout': must be above 0, got 0"),
    ("kind: sometimes\n", "policy.yaml: field 'kind': must be one of fixed, percentile, "
                          "adaptive, got 'sometimes'"),
    ("percentile: 99\n", "policy.yaml: field 'kind': must be one of"),
    ("kind: percentile\nfallback: 5\nmin: 10\nmax: 5\n",
     "policy.yaml: field 'max': must be at least min (10), got 5"),
    ("kind: percentile\nfallback: 5\nmin_samples: 0\n",
     "policy.yaml: field 'min_samples': must be a whole number ≥ 1, got 0"),
    ("kind: adaptive\nfallback: 5\nload: [{at: 4, factor: 1}, {at: 2, factor: 2}]\n",
     "policy.yaml: field 'load': rows must have increasing 'at', got [4.0, 2.0]"),
    ("kind: adaptive\nfallback: 5\nload: [{at: 1}]\n",
     "policy.yaml: field 'load[0]': must be a mapping with 'at' and 'factor'"),
    ("- just\n- a list\n", "policy.yaml: a policy must be a mapping of fields, got list"),
    ("kind: fixed\ntimeout: [5\n", "policy.yaml:3: not valid YAML"),
    # An integer past a float is refused by name, not an OverflowError.
    (f"kind: fixed\ntimeout: 1{'0' * 400}\n", "policy.yaml: field 'timeout': must be a "
                                             "number of seconds, got 10000000000000000"),
    (f"kind: adaptive\nfallback: 5\nload: [{{at: 1{'0' * 400}, factor: 1}}]\n",
     "policy.yaml: field 'load[0].at': must be a number ≥ 0, got 100000000000000"),
    (f"kind: percentile\nfallback: 5\npercentile: 1{'0' * 400}\n",
     "policy.yaml: field 'percentile': must be between 0 and 100, got 1000000000"),
])
def test_policy_errors_name_file_and_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml")
    assert str(info.value).startswith(message), str(info.value)
