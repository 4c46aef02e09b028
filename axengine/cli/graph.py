"""``ax graph DAG``: print a DAG as a Mermaid flowchart (default) or Graphviz DOT."""

from __future__ import annotations

import argparse
import sys
from typing import Any

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
    parser.add_argument("dag", metavar="DAG", help="the DAG file")
    parser.add_argument("--format", choices=("mermaid", "dot"), default="mermaid",
                        help="mermaid (default) or dot")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the graph of ``args.dag``; invalid DAGs print their problems to stderr."""
    try:
        dag = load_dag(args.dag)
    except DagError as exc:
        for problem in exc.problems:
            print(problem.format(), file=sys.stderr)
        return 1
    sys.stdout.write(to_dot(dag) if args.format == "dot" else to_mermaid(dag))
    return 0
