"""Side-by-side text table of replay results, one row per policy."""

from __future__ import annotations

from collections.abc import Sequence

from axengine.simulate._replay import ReplayResult
from axengine.timeouts import describe

__all__ = ["COLUMNS", "format_table"]

#: Column headers of :func:`format_table`, in order.
COLUMNS = ("POLICY", "RUNS", "TIMEOUTS", "STALL KILLS", "FALSE KILLS", "WASTED S",
           "BUSY S", "P50 S", "P99 S")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(result: ReplayResult) -> tuple[str, ...]:
    return (result.policy.name, str(result.runs), str(result.timeouts),
            str(result.stall_kills), str(result.false_kills), _s(result.wasted_seconds),
            _s(result.busy_seconds), _s(result.completion_percentile(50)),
            _s(result.completion_percentile(99)))


def format_table(results: Sequence[ReplayResult]) -> str:
    """The results as a table, then one line per policy restating its parameters, then
    a note for every policy that left runs unresolved (cut short in the history before
    it would have stopped them; they count as recorded)."""
    rows = [COLUMNS, *(_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.append("")
    name_width = max((len(r.policy.name) for r in results), default=0)
    lines += [f"{r.policy.name.ljust(name_width)}  {describe(r.policy)}" for r in results]
    for r in results:
        if r.unresolved:
            lines.append(f"note: {r.policy.name}: {r.unresolved} run(s) were cut short in "
                         "the history before this policy would have stopped them; they "
                         "count as recorded")
    return "\n".join(lines)
