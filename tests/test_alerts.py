"""The Prometheus alerts (deploy/prometheus/alerts.yaml) and the Grafana dashboard
(deploy/grafana/ax.json): promtool accepts the rules and their unit tests pass
(tests/data/alerts_test.yaml), every metric either names exists in ax's registry, and
the dashboard is a well-formed Grafana dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from axengine.metrics import AxMetrics

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "tests" / "data" / "alerts_test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "ax.json"

#: Series Prometheus writes itself for every scrape target (not in ax's registry).
PROMETHEUS_SERIES = frozenset({"up"})
#: What the dashboard must show (the golden metrics of docs/observability.md).
DASHBOARD_METRICS = frozenset({
    "ax_api_requests_total", "ax_node_outcomes_total", "ax_node_run_seconds_bucket",
    "ax_llm_request_seconds_bucket", "ax_llm_tokens_total", "ax_queue_depth",
    "ax_oldest_waiting_seconds", "ax_nodes", "ax_lease_expiries_total",
    "ax_stall_verdicts_total", "ax_retries_exhausted_total", "ax_tasks_finished_total",
    "ax_snapshot_write_seconds_bucket", "process_cpu_seconds_total",
    "process_resident_memory_bytes", "up",
})
#: Alerts the design's sources ask for (seed 003's golden metrics, seed 000's contract).
REQUIRED_ALERTS = frozenset({
    "AxSnapshotWriteLatencyHigh", "AxQueueBacklog", "AxNodeTimeoutRateHigh",
    "AxOldestWaitingTooOld", "AxNodesDead", "AxNodeFailureRateHigh", "AxLeaseExpirySpike",
    "AxApiErrorRatioHigh", "AxExecutorsAbsent", "AxQueueDepthGrowing",
})
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right",
                       "and", "or", "unless", "bool", "offset", "inf", "nan"})


def _promtool() -> str:
    found = shutil.which("promtool")
    # Installed by the test bootstrap (Debian's prometheus package): never skipped.
    assert found, "promtool is missing: apt-get install prometheus"
    return found


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (Grafana variables allowed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)      # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)                  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                 # ranges, subqueries
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
                  " ", expr)                               # label lists
    names = set()
    for match in re.finditer(r"(?<![A-Za-z0-9_:.$])([A-Za-z_:][A-Za-z0-9_:]*)", expr):
        following = expr[match.end():].lstrip()
        if following.startswith("(") or match.group(1) in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.add(match.group(1))
    return names


def registry_names(metrics: AxMetrics) -> set[str]:
    """Every series name the registry can expose, labelled children or not yet."""
    suffixes = {"counter": ("_total", "_created"),
                "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"),
                "info": ("_info",)}
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def _dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in _panels(_dashboard())
            for target in panel.get("targets", [])]


# ---------------------------------------------------------------------- promtool


def test_promtool_checks_the_rules(record_property: Any) -> None:
    done = subprocess.run([_promtool(), "check", "rules", str(ALERTS)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    count = len(_rules())
    assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout
    record_property("summary", f"promtool check rules: {count} rules")


def test_promtool_unit_tests_fire_and_stay_quiet(record_property: Any) -> None:
    done = subprocess.run([_promtool(), "test", "rules", str(ALERT_TESTS)],
                          capture_output=True, text=True, timeout=60, cwd=ALERT_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    # At least two alerts proven both ways: they fire, and they stay quiet otherwise.
    both = fired & quiet
    assert len(both) >= 2, (fired, quiet)
    assert fired <= {rule["alert"] for rule in _rules()}
    record_property("summary", f"promtool test rules: {len(fired)} alerts fire "
                    f"({', '.join(sorted(fired))}), {len(both)} of them also shown quiet")


# ---------------------------------------------------------------------- structure


def test_metric_names_are_found_in_promql() -> None:
    expr = ('sum by (le, lane) (rate(foo_bucket{a="b",c=~"x|y"}[5m])) > 3 * bar offset 1d '
            'and on () up{job=~"$api_job"} == 0 or histogram_quantile(0.9, baz[$__rate_interval])')
    assert metric_names(expr) == {"foo_bucket", "bar", "up", "baz"}


def test_every_metric_name_exists_in_the_ax_registry() -> None:
    known = registry_names(AxMetrics()) | PROMETHEUS_SERIES
    used = {name: where for where, exprs in (("alerts.yaml", [r["expr"] for r in _rules()]),
                                             ("ax.json", _dashboard_exprs()))
            for expr in exprs for name in metric_names(expr)}
    missing = {name: where for name, where in used.items() if name not in known}
    assert not missing, f"metrics not in AxMetrics' registry: {missing}"
    assert "ax_snapshot_write_seconds_bucket" in used  # the extraction found something


def test_the_rules_are_complete_and_labelled() -> None:
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    assert set(names) >= REQUIRED_ALERTS, REQUIRED_ALERTS - set(names)
    for rule in rules:
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_dashboard_is_valid(record_property: Any) -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] == 39
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = _panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], int] = {}
    used: set[str] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = panel["id"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        refs = [target["refId"] for target in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
            # Every variable used is defined (Grafana's own start with $__).
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var.startswith("__") or var in variables, (panel["title"], var)
            used |= metric_names(target["expr"])
    assert used >= DASHBOARD_METRICS, DASHBOARD_METRICS - used
    record_property("summary", f"{len(panels)} panels, {len(used)} metrics")


@pytest.mark.parametrize("path", [ALERTS, ALERT_TESTS])
def test_yaml_files_parse(path: Path) -> None:
    assert yaml.safe_load(path.read_text())
