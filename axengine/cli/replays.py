"""``ax test [PATH...]``: replay every recorded fixture of a DAG repository.

Fixtures are the ``*.fixture.json`` files under each PATH (``ax snapshot export TASK -o
NAME.fixture.json``). Each one is replayed (:mod:`axengine.testing`): restored and
resumed — nothing it had committed may run again — and its recorded decisions replayed
on the DAG file of the same ``name:`` found under the PATHs (or given with ``--dag``),
so an edited guard that changes a recorded path fails here with a per-node diff. Of
several files with that name, the one nearest the fixture wins. Nodes the fixture had
not committed run their real handlers, as ``ax replay`` runs them.

Exit code: 0 when every fixture replays, 1 when one does not, 2 when there is none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from axengine.cli._common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from axengine.cli._junit import Case, junit_xml
from axengine.cli.tasks import pipe_safe
from axengine.config import AxConfig
from axengine.dag import MAX_DOCUMENT_BYTES, load_dag
from axengine.errors import AxError, DagError
from axengine.fixtures import load_fixture

__all__ = ["register", "run"]

#: What a fixture file is called.
FIXTURE_SUFFIX = ".fixture.json"
_DAG_SUFFIXES = (".yaml", ".yml")
#: Directories never searched (tools' caches, virtual environments, VCS data).
_SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "venv"})


def register(subparsers: Any) -> None:
    """Add the ``test`` sub-command to the ``ax`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "test",
        help="replay every recorded fixture (*.fixture.json) against its DAG file",
        description="Replay every *.fixture.json under PATH: nothing committed may run "
                    "again and every recorded decision must hold on the DAG file of the "
                    "same name.",
    )
    parser.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                        help="fixture files or directories searched for *.fixture.json and "
                             "DAG files (default: .)")
    parser.add_argument("--dag", action="append", default=[], metavar="FILE",
                        help="a DAG file to replay fixtures on (repeatable; besides the "
                             "ones found under PATH)")
    parser.add_argument("--format", choices=("text", "junit"), default="text",
                        help="text (PASS/FAIL per fixture with its diff) or junit (JUnit XML)")
    parser.set_defaults(func=pipe_safe(run))


def _walk(paths: Sequence[str], suffixes: tuple[str, ...]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            if path.name.endswith(suffixes):
                yield path
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs
                             if not d.startswith(".") and d not in _SKIPPED_DIRS)
            for name in sorted(names):
                if name.endswith(suffixes):
                    yield Path(root) / name


def _dag_name(path: Path) -> str | None:
    """The ``name:`` of a YAML file that is a DAG, or looks like one (a mapping with
    ``nodes``) but does not validate — its fixtures then fail with its problems."""
    try:
        return load_dag(path).name
    except DagError:
        pass
    try:
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            return None
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if isinstance(doc, dict) and "nodes" in doc and isinstance(doc.get("name"), str):
        return str(doc["name"])
    return None


@dataclass(frozen=True)
class Outcome:
    """What replaying one fixture gave."""

    fixture: str
    passed: bool
    text: str
    seconds: float


def _nearest(fixture: Path, files: list[Path]) -> list[Path]:
    """The DAG files sharing the longest directory prefix with ``fixture``."""
    def shared(dag: Path) -> int:
        a, b = fixture.resolve().parent.parts, dag.resolve().parent.parts
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                    min(len(a), len(b)))

    best = max(shared(f) for f in files)
    return [f for f in files if shared(f) == best]


def _dag_for(fixture: Path, name: str, dags: dict[str, list[Path]]) -> Path | str | None:
    """The DAG file to replay ``fixture`` on; a message when that is ambiguous."""
    found = dags.get(name, [])
    if not found:
        return None
    nearest = _nearest(fixture, found)
    if len(nearest) > 1:
        return (f"several DAG files are named {name!r}: "
                f"{', '.join(str(p) for p in nearest)}; give one with --dag")
    return nearest[0]


async def _replay_one(fixture: Path, dags: dict[str, list[Path]]) -> Outcome:
    # Loaded here, not with the command line: it brings the engine and the handlers.
    from axengine.testing import AsyncAxTestEngine

    started = time.monotonic()

    def done(passed: bool, text: str) -> Outcome:
        return Outcome(str(fixture), passed, text, time.monotonic() - started)

    try:
        name = str(load_fixture(fixture)["dag"].get("name", ""))
    except AxError as exc:
        return done(False, str(exc))
    dag = _dag_for(fixture, name, dags)
    if isinstance(dag, str):
        return done(False, f"{fixture}: {dag}")
    if dag is not None:
        try:
            load_dag(dag)
        except DagError as exc:
            return done(False, f"{fixture}: its DAG file {dag} does not validate:\n{exc}")
    with tempfile.TemporaryDirectory(prefix="ax-test-") as home:
        try:
            async with AsyncAxTestEngine(home, config=AxConfig.from_env(home=home)) as engine:
                replay = await engine.replay(fixture, dag=dag, real=True)
        except (AxError, AssertionError) as exc:
            return done(False, f"{fixture}: {exc}")
    text = replay.report()
    if dag is None:
        text += (f"\n  (no DAG file named {name!r} under the paths searched: decisions "
                 "checked on the recorded DAG)")
    return done(replay.ok, text)


def _headline(text: str) -> str:
    """The first diff line of a report (its first line when it has none)."""
    lines = text.splitlines()
    return lines[1].strip() if len(lines) > 1 and lines[1].startswith("  ") else lines[0]


def run(args: argparse.Namespace) -> int:
    """Replay every fixture under ``args.paths``; print the outcomes; the exit code."""
    fixtures = sorted(set(_walk(args.paths, (FIXTURE_SUFFIX,))))
    if not fixtures:
        return fail(f"no *{FIXTURE_SUFFIX} files under {', '.join(args.paths)} (record one "
                    f"with ax snapshot export TASK -o NAME{FIXTURE_SUFFIX})", EXIT_USAGE)
    dags: dict[str, list[Path]] = {}
    for path in [*_walk(args.paths, _DAG_SUFFIXES), *map(Path, args.dag)]:
        name = _dag_name(path)
        if name is not None and path not in dags.get(name, []):
            dags.setdefault(name, []).append(path)
    for forced in map(Path, args.dag):
        # A DAG named on the command line wins over files found with the same name.
        name = _dag_name(forced)
        if name is not None:
            dags[name] = [forced]

    async def main() -> list[Outcome]:
        return [await _replay_one(f, dags) for f in fixtures]

    outcomes = asyncio.run(main())
    failed = [o for o in outcomes if not o.passed]
    if args.format == "junit":
        print(junit_xml("ax test", [
            Case(name=o.fixture, classname="ax.test", file=o.fixture, seconds=o.seconds,
                 failure=None if o.passed else (_headline(o.text), "replay", o.text))
            for o in outcomes]))
    else:
        for o in outcomes:
            print(f"{'PASS' if o.passed else 'FAIL'} {o.text}")
        print(f"{len(outcomes)} fixture{'s' if len(outcomes) != 1 else ''}: "
              f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return EXIT_FAILED if failed else EXIT_OK
