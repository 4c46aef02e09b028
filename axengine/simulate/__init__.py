"""The timeout-policy simulator: replay recorded node runs under candidate policies.

Seed 001 asks for a way to tune timeouts on history instead of on production: export
the node runs the engine recorded (:func:`export_history`, through the engine's public
reads), replay them under each policy of :mod:`axengine.timeouts` without letting a
policy see durations recorded after the run it decides (:func:`replay`), and compare
timeouts, false kills, wasted seconds and completion times side by side
(:func:`format_table`, :func:`cdf_svg`). docs/simulator.md describes the model.

The core is pure (runs in, results out); reading files is :mod:`._files`, reading the
store is :func:`export_history`.
"""

from __future__ import annotations

from axengine.simulate._export import ENDING_KINDS, NodeInfo, export_history, runs_from_events
from axengine.simulate._files import read_history_file, read_policy_file
from axengine.simulate._history import (
    FINISHED,
    HistoryError,
    NodeRun,
    RunOutcome,
    parse_history,
    run_from_json,
    run_to_json,
    runs_to_jsonl,
    sort_runs,
)
from axengine.simulate._plot import cdf_svg
from axengine.simulate._replay import ReplayResult, RunVerdict, judge, replay
from axengine.simulate._report import COLUMNS, format_table

__all__ = [
    "COLUMNS",
    "ENDING_KINDS",
    "FINISHED",
    "HistoryError",
    "NodeInfo",
    "NodeRun",
    "ReplayResult",
    "RunOutcome",
    "RunVerdict",
    "cdf_svg",
    "export_history",
    "format_table",
    "judge",
    "parse_history",
    "read_history_file",
    "read_policy_file",
    "replay",
    "run_from_json",
    "run_to_json",
    "runs_from_events",
    "runs_to_jsonl",
    "sort_runs",
]
