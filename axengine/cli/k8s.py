"""``ax k8s job DAG NODE``: print the Kubernetes Job a node's first attempt would get.

A dry run of the Kubernetes runner's manifest (:func:`axengine.runners.job.build_job`)
with no cluster and no engine: the DAG is validated, the node's claim request is built
as the engine's claim builds it (every canonical field but ``next`` and ``input`` in
``config``), and the Job is printed as YAML, ready for ``kubectl apply --dry-run=server
-f -`` or a review.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any

import yaml

from axengine.cli._common import EXIT_USAGE, fail, key_value_pairs, parse_json_arg
from axengine.dag import load_dag
from axengine.errors import AxError, DagError
from axengine.runners.job import (
    EXECUTOR_NODE_TYPES,
    JobSettings,
    build_job,
    load_job_settings,
)
from executors.contract import NodeRequest

__all__ = ["DRY_RUN_TASK_ID", "register", "run"]

#: Task id of the printed Job unless ``--task-id`` names one.
DRY_RUN_TASK_ID = "t-dry-run"


def register(subparsers: Any) -> None:
    """Add the ``k8s`` sub-command group to the ``ax`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "k8s", help="Kubernetes helpers (print the Job a node would run in)",
        description="Kubernetes helpers. No cluster is needed.")
    sub = parser.add_subparsers(dest="k8s_command", metavar="COMMAND", required=True)
    job = sub.add_parser(
        "job", help="print the batch/v1 Job the kubernetes runner would create for a node",
        description="Validate DAG and print, as YAML, the Job the kubernetes runner "
        "creates for NODE's first attempt (attempt 1). No cluster is contacted. The Job "
        "never carries the node's input: the pod fetches its rendered input from the API "
        "under the claim's fence, so nothing is rendered here.")
    job.add_argument("dag", metavar="DAG", help="the DAG file")
    job.add_argument("node", metavar="NODE", help="a tool_call or llm_call node of DAG")
    job.add_argument("--input", default=None, metavar="JSON|FILE",
                     help="task input (checked as JSON; it is not part of the Job)")
    job.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="a task label (repeatable); picks the canary image when it "
                     "matches the canary selector of the settings")
    job.add_argument("--config", default=None, metavar="FILE",
                     help="job settings YAML, or a ConfigMap holding it such as "
                     "deploy/k8s/job-settings.yaml (default: the built-in settings)")
    job.add_argument("--task-id", default=DRY_RUN_TASK_ID, metavar="ID",
                     help=f"task id (default {DRY_RUN_TASK_ID})")
    job.add_argument("--fence", type=int, default=1, metavar="N",
                     help="the claim's fence (default 1)")
    job.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the Job of ``args.node``; problems go to stderr with exit code 2."""
    try:
        dag = load_dag(args.dag)
    except DagError as exc:
        for problem in exc.problems:
            print(problem.format(), file=sys.stderr)
        return EXIT_USAGE
    node = dag.nodes.get(args.node)
    if node is None:
        close = difflib.get_close_matches(args.node, list(dag.nodes), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else \
            f" (nodes: {', '.join(dag.nodes)})"
        return fail(f"{args.dag}: no node {args.node!r}{hint}")
    if node.type not in EXECUTOR_NODE_TYPES:
        runnable = [nid for nid, n in dag.nodes.items() if n.type in EXECUTOR_NODE_TYPES]
        return fail(f"{args.dag}:{node.line}: node {node.id!r} is a {node.type} node: the "
                    f"API server decides it, no Job runs it (Job nodes: "
                    f"{', '.join(runnable) or 'none'})")
    if args.fence < 1:
        return fail(f"--fence {args.fence}: a fence is 1 or more")
    if not args.task_id:
        return fail("--task-id: a task id is not empty")
    try:
        parse_json_arg(args.input, "--input")  # checked only: a Job carries no input
        labels = key_value_pairs(args.label, "--label")
        settings = load_job_settings(args.config) if args.config else JobSettings()
        # As the engine's claim builds it: the canonical node minus its edges and input.
        config = {k: v for k, v in node.canonical().items() if k not in ("next", "input")}
        request = NodeRequest(task_id=args.task_id, node_id=node.id, node_type=node.type,
                              attempt=1, fence=args.fence, config=config, input=None,
                              labels=labels)
        job = build_job(request, settings=settings, dag_hash=dag.hash)
    except AxError as exc:
        return fail(str(exc))
    sys.stdout.write(yaml.safe_dump(job, sort_keys=False))
    return 0
