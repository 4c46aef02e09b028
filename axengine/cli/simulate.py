"""``ax history export`` and ``ax simulate``: tune timeout policies on recorded runs.

``ax history export`` writes the node runs of the local store (``--home``) as JSON Lines,
read through the engine like ``ax tasks``; ``ax simulate`` replays such a file under one
or more policy files (:mod:`axengine.timeouts`) and prints them side by side, with an
optional SVG of the completion-time distributions. See docs/simulator.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from axengine.cli._common import EXIT_OK, add_home, fail, positive_int
from axengine.cli._runtime import with_engine
from axengine.cli.tasks import pipe_safe
from axengine.errors import AxError
from axengine.simulate import (
    NodeRun,
    ReplayResult,
    cdf_svg,
    export_history,
    format_table,
    read_history_file,
    read_policy_file,
    replay,
    runs_to_jsonl,
)
from axengine.timeouts import Policy, seconds

__all__ = ["cmd_export", "cmd_simulate", "register"]


def register(sub: Any) -> None:
    """Add ``history`` (with its ``export`` action) and ``simulate``."""
    hp = sub.add_parser("history", help="export recorded node runs (input of ax simulate)")
    hsub = hp.add_subparsers(dest="history_command", metavar="ACTION", required=True)
    ep = hsub.add_parser("export", help="write every finished node run as JSON Lines")
    ep.add_argument("--dag", default="", metavar="NAME", help="only tasks of this DAG")
    ep.add_argument("--limit", type=positive_int, default=None, metavar="N",
                    help="only the newest N tasks (default: all)")
    ep.add_argument("-o", "--output", metavar="FILE", help="file to write (default: stdout)")
    add_home(ep)
    ep.set_defaults(func=pipe_safe(cmd_export))

    sp = sub.add_parser("simulate", help="replay a history under timeout policies and "
                        "compare them")
    sp.add_argument("--history", required=True, metavar="FILE",
                    help="JSON Lines written by ax history export")
    sp.add_argument("--policy", required=True, action="append", metavar="FILE",
                    help="a policy YAML file (repeat to compare several)")
    sp.add_argument("--dag", default="", metavar="NAME",
                    help="report only the runs of this DAG (every run still counts toward "
                    "the load)")
    sp.add_argument("--node", default="", metavar="ID",
                    help="report only the runs of this node id")
    sp.add_argument("--plot", metavar="SVG",
                    help="also write the completion-time CDF of every policy to this file")
    sp.add_argument("--runs", action="store_true",
                    help="also print every run's timeout decision under every policy")
    sp.set_defaults(func=pipe_safe(cmd_simulate))


def cmd_export(args: argparse.Namespace) -> int:
    """Write the store's node runs as JSON Lines; the count goes to stderr."""
    runs: list[NodeRun] = with_engine(
        args, lambda engine: export_history(engine, dag_name=args.dag, limit=args.limit))
    lines = runs_to_jsonl(runs)
    tasks = len({r.task_id for r in runs})
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.writelines(lines)
        except OSError as exc:
            return fail(f"-o {args.output}: cannot write: {exc.strerror or exc}")
        where = args.output
    else:
        sys.stdout.writelines(lines)
        where = "stdout"
    print(f"exported {len(runs)} node run(s) of {tasks} task(s) to {where}", file=sys.stderr)
    return EXIT_OK


def _policies(paths: list[str]) -> list[Policy]:
    policies: list[Policy] = []
    seen: dict[str, str] = {}
    for path in paths:
        policy = read_policy_file(path)
        if policy.name in seen:
            raise AxError(f"{path}: policy name {policy.name!r} is also the name of "
                          f"{seen[policy.name]}; give one of them a 'name' field")
        seen[policy.name] = path
        policies.append(policy)
    return policies


def _print_runs(results: list[ReplayResult]) -> None:
    for result in results:
        print(f"\n{result.policy.name}:")
        for v in result.verdicts:
            run = v.run
            verdict = ("ok" if v.killed_at is None else
                       f"{v.cause} at {seconds(v.killed_at)} s"
                       + (" (false kill)" if v.false_kill else ""))
            print(f"  {run.task_id} {run.node}#{run.attempt} {run.outcome.value} "
                  f"{seconds(run.duration)} s: {v.decision.explanation} -> {verdict}")


def cmd_simulate(args: argparse.Namespace) -> int:
    """Print the comparison table (and write the plot)."""
    try:
        policies = _policies(args.policy)
        history = read_history_file(args.history)
    except AxError as exc:
        return fail(str(exc))
    if not history:
        print(f"ax: warning: {args.history} holds no runs", file=sys.stderr)
    results = [replay(history, policy).select(
        lambda run: (not args.dag or run.dag == args.dag)
        and (not args.node or run.node == args.node)) for policy in policies]
    if history and not results[0].verdicts:
        print("ax: warning: no run matches --dag/--node", file=sys.stderr)
    print(format_table(results))
    if args.runs:
        _print_runs(results)
    if args.plot:
        try:
            Path(args.plot).write_text(cdf_svg(results), encoding="utf-8")
        except OSError as exc:
            return fail(f"--plot {args.plot}: cannot write: {exc.strerror or exc}")
        print(f"plot written to {args.plot}", file=sys.stderr)
    return EXIT_OK
