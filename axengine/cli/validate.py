"""``ax validate PATH...``: check DAG files and print every problem as ``file:line: ...``.

Directories are expanded to the ``*.yaml`` / ``*.yml`` files directly inside them.
The exit code is 0 only when every file is valid.

Formats: ``text`` (for people), ``json`` (a list of problems), ``github`` (workflow
commands: GitHub Actions shows each problem as an annotation on its file and line) and
``junit`` (JUnit XML, one test case per file, for CI test reports).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from axengine.cli._common import is_directory
from axengine.cli._junit import Case, junit_xml
from axengine.cli.tasks import pipe_safe
from axengine.dag import load_dag
from axengine.errors import DagError, DagProblem

__all__ = ["register", "run"]

_SUFFIXES = (".yaml", ".yml")
#: Output formats of ``--format``.
FORMATS = ("text", "json", "github", "junit")


def register(subparsers: Any) -> None:
    """Add the ``validate`` sub-command to the ``ax`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "validate",
        help="check DAG files (YAML errors, fields, edges, cycles, templates, names)",
        description="Check DAG files and print every problem as file:line: message.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="DAG files, or directories holding *.yaml / *.yml files")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (one line per problem), json (a list of problems), github "
                             "(GitHub Actions annotations: ::error file=F,line=L::message) or "
                             "junit (JUnit XML, one test case per file)")
    parser.set_defaults(func=pipe_safe(run))


def _expand(paths: list[str]) -> tuple[list[str], list[DagProblem]]:
    files: list[str] = []
    problems: list[DagProblem] = []
    for raw in paths:
        path = Path(raw)
        if is_directory(path):
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
    elif args.format == "junit":
        print(junit_xml("ax validate", _cases(list(args.paths), files, problems)))
    else:
        for line in ok_lines:
            print(line)
        for problem in problems:
            print(github_annotation(problem) if args.format == "github" else problem.format())
    return 1 if problems else 0


def _escape(text: str, *, prop: bool = False) -> str:
    # The escaping of GitHub's workflow commands: data escapes % CR LF; a property
    # value also : and , (which would end it).
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def github_annotation(problem: DagProblem) -> str:
    """``problem`` as a GitHub Actions workflow command, ``::error file=F,line=L::[code]
    message``: an annotation on its file and line (the line is left out when unknown)."""
    props = [f"file={_escape(problem.file, prop=True)}"]
    if problem.line:
        props.append(f"line={problem.line}")
    message = f"[{problem.code}] "
    message += problem.message if not problem.node else f"node {problem.node!r}: {problem.message}"
    if problem.hint:
        message += f" (hint: {problem.hint})"
    return f"::error {','.join(props)}::{_escape(message)}"


def _cases(paths: list[str], files: list[str], problems: list[DagProblem]) -> list[Case]:
    by_file: dict[str, list[DagProblem]] = {}
    for problem in problems:
        by_file.setdefault(problem.file, []).append(problem)
    cases = []
    # Every file checked, and every path that expanded to none (its problem is its own).
    for name in [*files, *(p for p in paths if p in by_file and p not in files)]:
        found = by_file.get(name, [])
        failure = None
        if found:
            first = found[0]
            summary = f"{len(found)} problem{'s' if len(found) > 1 else ''}: {first.message}"
            failure = (summary, first.code, "\n".join(p.format() for p in found))
        cases.append(Case(name=name, classname="ax.validate", failure=failure, file=name))
    return cases
