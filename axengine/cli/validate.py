"""``ax validate PATH...``: check DAG files and print every problem as ``file:line: ...``.

Directories are expanded to the ``*.yaml`` / ``*.yml`` files directly inside them.
The exit code is 0 only when every file is valid.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from axengine.cli.tasks import pipe_safe
from axengine.dag import load_dag
from axengine.errors import DagError, DagProblem

__all__ = ["register", "run"]

_SUFFIXES = (".yaml", ".yml")


def register(subparsers: Any) -> None:
    """Add the ``validate`` sub-command to the ``ax`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate",
        help="check DAG files (YAML errors, fields, edges, cycles, templates, names)",
        description="Check DAG files and print every problem as file:line: message.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="DAG files, or directories holding *.yaml / *.yml files")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (one line per problem) or json (a list of problems)")
    parser.set_defaults(func=pipe_safe(run))


def _expand(paths: list[str]) -> tuple[list[str], list[DagProblem]]:
    files: list[str] = []
    problems: list[DagProblem] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in _SUFFIXES and p.is_file())
            if not found:
                problems.append(DagProblem("no *.yaml or *.yml files in this directory",
                                           raw, code="unreadable"))
            files.extend(str(p) for p in found)
        else:
            files.append(raw)
    return files, problems


def run(args: argparse.Namespace) -> int:
    """Validate ``args.paths``; print problems (or OK lines); return the exit code."""
    files, problems = _expand(list(args.paths))
    ok_lines: list[str] = []
    for file in files:
        try:
            dag = load_dag(file)
        except DagError as exc:
            problems.extend(exc.problems)
            continue
        ok_lines.append(f"OK {file} ({len(dag.nodes)} nodes, hash {dag.hash[:12]})")
    if args.format == "json":
        print(json.dumps([
            {"file": p.file, "line": p.line, "node": p.node, "field": p.field,
             "code": p.code, "message": p.message, "hint": p.hint}
            for p in problems
        ], indent=2))
    else:
        for line in ok_lines:
            print(line)
        for problem in problems:
            print(problem.format())
    return 1 if problems else 0
