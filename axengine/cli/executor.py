"""``ax executor``: run nodes from the Redis queue against an ``ax api`` server.

The process prints one line naming its worker id once it is wired, serves until
SIGTERM/SIGINT, then shuts down gracefully (see :mod:`axengine.process`). With
``--metrics-address`` (the ``metrics_address`` setting) it serves its own Prometheus
metrics there and prints ``ax executor: metrics listening on URL`` first; the listener
closes after the executor has stopped (docs/observability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any

from axengine.api._defaults import parse_address
from axengine.cli._common import EXIT_FAILED, EXIT_OK, fail, parse_json_arg, positive_int
from axengine.cli.services import LOG_LEVELS, add_log_format, log_level
from axengine.config import AxConfig
from axengine.credentials import read_token_file, redact_url
from axengine.errors import AxError
from axengine.logs import configure
from axengine.metrics import AxMetrics, MetricsServer
from axengine.process import AxProcess, ExecutorSpec, RemoteApi, Shape, serve
from axengine.queue import DEFAULT_LANE, FAST_LANE
from axengine.runners import RUNNER_NAMES, THREAD, make_runners, runner_help
from axengine.settings import load_settings
from axengine.worker._process import DEFAULT_GRACE_SECONDS


def register(sub: Any) -> None:
    p = sub.add_parser(
        "executor", help="run nodes from the queue against an ax api server",
        description="Pop ready nodes from Redis, claim them through the API (gRPC), run "
        "them and commit their results with the fence of the claim. SIGTERM stops popping "
        "and gives running nodes --grace seconds; nodes still running then are handed back "
        "(WAITING again, no attempt spent). A second signal skips the rest of the grace.")
    p.add_argument("--api", required=True, metavar="HOST:PORT",
                   help="gRPC address of ax api (its --grpc option)")
    p.add_argument("--queue", required=True, metavar="URL",
                   help="redis://host:6379/0 — the queue ax api enqueues to")
    p.add_argument("--token-file", metavar="FILE",
                   help="file holding a bearer token with the executor role")
    p.add_argument("--token", default=None,
                   help="the token itself (prefer --token-file: argv is visible to others)")
    p.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                   help="nodes run at once, 1 or more (default 4)")
    p.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                   help="lease asked for on claim, renewed every third of it (default 30)")
    p.add_argument("--id", dest="worker_id", default=None, metavar="NAME",
                   help="stable worker id (default: w:<host>:<pid>:<random>); a restarted "
                   "executor with the same id recovers its unacked items at once")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help="time running nodes get to finish after SIGTERM (default "
                   f"{DEFAULT_GRACE_SECONDS:g})")
    p.add_argument("--lane", action="append", default=None, metavar="LANE",
                   help=f"lane to serve, in priority order (repeatable; default {FAST_LANE}, "
                   f"{DEFAULT_LANE})")
    p.add_argument("--runner", choices=RUNNER_NAMES, default=THREAD,
                   help=runner_help("this executor"))
    kube = p.add_argument_group("kubernetes runner (--runner kubernetes)")
    kube.add_argument("--job-settings", "--job-config", dest="job_config", default=None,
                      metavar="FILE", help="Job settings (YAML: namespace, image, API "
                      "address as pods see it, token Secret; see docs/deployment.md)")
    kube.add_argument("--kube-context", default=None, metavar="NAME",
                      help="kubeconfig context ($KUBECONFIG or ~/.kube/config; default: the "
                      "current context, or the in-cluster service account)")
    kube.add_argument("--pod-settings-secret", default=None, metavar="NAME",
                      help="Secret whose settings.json key holds the node pods' handler "
                      "settings (JSON, as --settings)")
    p.add_argument("--settings", default=None, metavar="JSON|FILE",
                   help="handler settings merged over the environment's, e.g. "
                   "'{\"simulate\": {\"latency\": 0.2}}' (see docs/executors.md)")
    p.add_argument("--log-level", default="info", type=log_level, metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)} (any case; default info)")
    add_log_format(p)
    p.add_argument("--metrics-address", default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics, port 0 = "
                   "any free port, 'off' = none (default: $AX_METRICS_ADDRESS, ax.toml, "
                   "or none)")
    p.set_defaults(func=cmd_executor)


def read_token(args: argparse.Namespace) -> str:
    """The bearer token from ``--token`` or the first non-empty line of ``--token-file``."""
    if args.token:
        return str(args.token)
    if not args.token_file:
        return ""
    try:
        return read_token_file(args.token_file, "--token-file")
    except ValueError as exc:
        raise AxError(str(exc)) from None


def kube_options(args: argparse.Namespace) -> Any:
    """The kubernetes runner's options, or None when another runner is chosen."""
    if args.runner != "kubernetes":
        if args.job_config or args.kube_context or args.pod_settings_secret:
            raise AxError("--job-settings, --kube-context and --pod-settings-secret apply "
                          "to --runner kubernetes")
        return None
    try:
        from axengine.runners.kubernetes import KubeOptions
    except ImportError as exc:
        raise AxError(f"--runner kubernetes needs lightkube ({exc}); install "
                      "axengine[kubernetes]") from exc
    return KubeOptions(job_config=args.job_config, context=args.kube_context,
                       settings_secret=args.pod_settings_secret)


def metrics_server(metrics: AxMetrics, address: str) -> MetricsServer | None:
    """The listener of ``address`` (``metrics_address``), not started; None when empty."""
    if not address:
        return None
    host, port = parse_address(address, "--metrics-address")
    return MetricsServer(metrics.registry, host=host, port=port)


def cmd_executor(args: argparse.Namespace) -> int:
    settings = load_settings(flags={"log_format": args.log_format,
                                    "metrics_address": args.metrics_address}).settings
    configure(level=args.log_level, log_format=settings.log_format)
    metrics = AxMetrics()
    try:
        listener = metrics_server(metrics, settings.metrics_address)
        if args.lease <= 0 or args.grace < 0:
            raise AxError("--lease must be positive and --grace not negative")
        extra = parse_json_arg(args.settings, "--settings") or {}
        if not isinstance(extra, dict):
            raise AxError("--settings must be a JSON object")
        token = read_token(args)
        runners = make_runners([args.runner], kube=kube_options(args))
    except AxError as exc:
        return fail(str(exc))
    configured = AxConfig.from_settings(settings)
    handler_settings = {**configured.handler_settings, **extra}
    shape = Shape(
        config=AxConfig(queue_url=args.queue), remote=RemoteApi(address=args.api, token=token),
        reconcile_interval=None,
        executor=ExecutorSpec(
            worker_id=args.worker_id, concurrency=args.concurrency, lease_seconds=args.lease,
            grace_seconds=args.grace, lanes=tuple(args.lane or (FAST_LANE, DEFAULT_LANE)),
            settings=handler_settings, runners=runners, runner=args.runner,
            observe=metrics.executed, observe_run=metrics.node_ran,
            fast_share=configured.worker.fast_share,
            aging_seconds=configured.worker.aging_seconds))

    def announce(process: AxProcess) -> None:
        assert process.executor is not None
        print(f"ax executor: worker {process.executor.worker_id} (pid {os.getpid()}) serving "
              f"api {args.api}, queue {redact_url(args.queue)}, concurrency "
              f"{args.concurrency}, lease {args.lease:g}s, runner {args.runner}", flush=True)

    with contextlib.ExitStack() as stack:
        try:
            if listener is not None:
                print(f"ax executor: metrics listening on {listener.start()}", flush=True)
                stack.callback(listener.close)
            report = asyncio.run(serve(shape, announce=announce))
        except AxError as exc:
            return fail(str(exc), EXIT_FAILED)
    assert report is not None
    how = "graceful" if report.graceful else f"handed back {len(report.handed_back)}"
    if report.released:
        how += f", left {len(report.released)} running"
    print(f"ax executor: worker {report.worker_id} stopped ({how})", flush=True)
    return EXIT_OK
