"""``ax graph DAG``: print a DAG as a Mermaid flowchart (default) or Graphviz DOT."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from axengine.cli._common import is_directory
from axengine.cli.tasks import pipe_safe
from axengine.dag import load_dag, to_dot, to_mermaid
from axengine.errors import DagError

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``graph`` sub-command to the ``ax`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "graph",
        help="print a DAG as a Mermaid or DOT graph",
        description="Print a DAG with edge labels (guards, `when` labels) and node "
        "shapes by type.",
    )
    parser.add_argument("dag", metavar="DAG",
                        help="the DAG file (one graph per DAG: not a directory)")
    parser.add_argument("--format", choices=("mermaid", "dot"), default="mermaid",
                        help="mermaid (default) or dot")
    parser.set_defaults(func=pipe_safe(run))


def run(args: argparse.Namespace) -> int:
    """Print the graph of ``args.dag``; invalid DAGs print their problems to stderr."""
    path = Path(args.dag)
    if is_directory(path):
        found = sorted(p.name for p in path.iterdir()
                       if p.suffix in (".yaml", ".yml") and p.is_file())
        listed = ", ".join(found[:5]) + (", …" if len(found) > 5 else "")
        print(f"ax: error: ax graph draws one DAG per graph and {args.dag} is a directory"
              + (f" (its DAGs: {listed}); give one file" if found else "")
              + f"; check them all with: ax validate {args.dag}", file=sys.stderr)
        return 2
    try:
        dag = load_dag(args.dag)
    except DagError as exc:
        for problem in exc.problems:
            print(problem.format(), file=sys.stderr)
        return 1
    sys.stdout.write(to_dot(dag) if args.format == "dot" else to_mermaid(dag))
    return 0
