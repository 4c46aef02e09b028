"""``ax api`` and ``ax server``: run the API server (see ``docs/api.md``).

``ax api`` is the scaled-out control plane: state in etcd, work in Redis, executors in
other processes (``ax executor``) reaching it over gRPC. It refuses to start without a
tokens file unless ``--no-auth`` says so explicitly (``--insecure-no-auth``, the old
spelling, is a hidden alias).

``ax server`` is the same API with everything in one process for local use: the
embedded SQLite store in ``--home``, the in-process queue and an in-process executor.
``--no-auth`` is accepted only when every listener is on a loopback address.

Both log to stderr in ``--log-format`` (``text`` or ``json``) and write one access-log
line per HTTP request unless ``--no-access-log`` (docs/observability.md#logs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import TYPE_CHECKING, Any

from axengine.api._auth import Authenticator, load_tokens
from axengine.api._defaults import (
    DEFAULT_GRPC_MAX_MESSAGE,
    DEFAULT_MAX_BODY_BYTES,
    is_loopback,
    parse_address,
)
from axengine.api._quotas import (
    DEFAULT_MAX_ACTIVE_TASKS,
    DEFAULT_MAX_DEADLINE,
    DEFAULT_MAX_NODE_TIMEOUT,
    Quotas,
)
from axengine.cli._common import EXIT_USAGE, add_home, fail, flags_of, positive_int
from axengine.config import AxConfig
from axengine.engine import EngineConfig
from axengine.errors import AxError
from axengine.logs import LOG_FORMATS, configure
from axengine.runners import RUNNER_NAMES, THREAD, make_runners, runner_help
from axengine.settings import AxSettings, load_settings

if TYPE_CHECKING:
    from axengine.api._server import ServerOptions

__all__ = ["register"]


def _listener(value: str) -> str | None:
    return None if value.lower() in ("off", "none", "") else value


#: ``--log-level`` values; any case is accepted (``DEBUG`` = ``debug``).
LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level(value: str) -> str:
    """``--log-level``: one of :data:`LOG_LEVELS`, in any case."""
    if value.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"unknown log level {value!r} (use one of "
                                         f"{', '.join(LOG_LEVELS)})")
    return value.lower()


def add_log_format(p: argparse.ArgumentParser) -> None:
    """``--log-format``: the ``log_format`` setting (``AX_LOG_FORMAT``, ax.toml)."""
    p.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                   help="log lines on stderr: text, or one JSON object per line "
                   "(default: $AX_LOG_FORMAT, ax.toml, or text)")


def add_no_auth(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--no-auth`` (the one spelling); ``--insecure-no-auth`` is its old, hidden alias."""
    p.add_argument("--no-auth", dest="no_auth", action="store_true", help=help_text)
    p.add_argument("--insecure-no-auth", dest="no_auth", action="store_true",
                   help=argparse.SUPPRESS)


def _common(p: argparse.ArgumentParser, *, http: str, grpc: str, interval: float,
            embedded: bool = False) -> None:
    p.add_argument("--http", default=http, metavar="HOST:PORT",
                   help=f"REST listener, port 0 = any free port, 'off' = none (default {http})")
    p.add_argument("--grpc", default=grpc, metavar="HOST:PORT",
                   help=f"gRPC listener, port 0 = any free port, 'off' = none (default {grpc})")
    p.add_argument("--tokens", metavar="FILE",
                   help="bearer tokens and roles (YAML, see deploy/tokens.example.yaml)")
    if embedded:
        # ax server is the one-process shape: SQLite in --home and the in-process queue.
        p.add_argument("--store", help="sqlite:///path (default: sqlite:///HOME/ax.db)")
        p.add_argument("--queue", help=argparse.SUPPRESS)
    else:
        p.add_argument("--store",
                       help="etcd://host:2379 or sqlite:///path (default: $AX_STORE)")
        p.add_argument("--queue", help="redis://host:6379/0 or memory:// (default: $AX_QUEUE)")
    p.add_argument("--blobs", metavar="DIR", help="blob directory (default: $AX_BLOBS)")
    p.add_argument("--prefix", help="root of every store key (default: $AX_PREFIX or /ax)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies are refused with 413 (default 1 MiB)")
    p.add_argument("--grpc-max-message-bytes", type=int, default=DEFAULT_GRPC_MAX_MESSAGE,
                   help="larger gRPC requests are refused with RESOURCE_EXHAUSTED; also the "
                   "largest output an executor can return (default 8 MiB)")
    p.add_argument("--reconcile-interval", type=float, default=interval,
                   help=f"seconds between reconciler passes (default {interval:g})")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds in-flight requests get after SIGTERM (default 10)")
    p.add_argument("--max-node-timeout", type=float, default=DEFAULT_MAX_NODE_TIMEOUT,
                   metavar="S", help="refuse DAGs with a node timeout, stall_timeout or "
                   f"queue_timeout above S seconds; 0 = no bound "
                   f"(default {DEFAULT_MAX_NODE_TIMEOUT:g})")
    p.add_argument("--max-task-deadline", type=float, default=DEFAULT_MAX_DEADLINE,
                   metavar="S", help="refuse tasks whose deadline is above S seconds; "
                   f"0 = no bound (default {DEFAULT_MAX_DEADLINE:g})")
    p.add_argument("--max-active-tasks-per-principal", type=int,
                   default=DEFAULT_MAX_ACTIVE_TASKS, metavar="N",
                   help="refuse (429) a submit by a principal with N unfinished tasks; "
                   f"0 = unlimited (default {DEFAULT_MAX_ACTIVE_TASKS})")
    p.add_argument("--four-eyes", action="store_true",
                   help="every human_gateway refuses a decision by the task's submitter "
                   "(otherwise only gates with four_eyes: true)")
    p.add_argument("--allow-insecure-tokens-file", action="store_true",
                   help="accept (with a warning) a tokens file group or others can access")
    p.add_argument("--log-level", default="warning", type=log_level, metavar="LEVEL",
                   help=f"{', '.join(LOG_LEVELS)} (any case; default warning)")
    add_log_format(p)
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                   help="one INFO line per HTTP request, whatever --log-level is "
                   "(default: $AX_ACCESS_LOG, ax.toml, or on)")
    add_home(p)


def register(sub: Any) -> None:
    """Add ``ax api`` and ``ax server``."""
    api = sub.add_parser(
        "api", help="run the API server (REST + gRPC) on etcd and Redis",
        description="Run the stateless API server: REST under /v1 and gRPC, with the "
        "reconciler (one leader across replicas). Executors connect over gRPC.")
    _common(api, http="0.0.0.0:8080", grpc="0.0.0.0:50051", interval=1.0)
    add_no_auth(api, "serve without authentication (never on a shared network)")
    api.set_defaults(func=cmd_api)

    server = sub.add_parser(
        "server", help="run API + executor on the embedded store (local use)",
        description="Run the API, an in-process executor and the reconciler in one "
        "process on the embedded store in --home.")
    _common(server, http="127.0.0.1:8080", grpc="127.0.0.1:50051", interval=0.5,
            embedded=True)
    add_no_auth(server, "serve without authentication (loopback addresses only)")
    server.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                        help="nodes the in-process executor runs at once, 1 or more "
                        "(default 4)")
    server.add_argument("--runner", choices=RUNNER_NAMES, default=THREAD,
                        help=runner_help("the in-process executor"))
    server.set_defaults(func=cmd_server)


def _settings(args: argparse.Namespace) -> AxSettings:
    """The settings layer with this command's options as flags."""
    return load_settings(flags={**flags_of(args), "log_format": args.log_format,
                                "access_log": args.access_log}).settings


def _auth(args: argparse.Namespace, no_auth: bool, flag: str) -> Authenticator | None:
    if args.tokens and no_auth:
        raise AxError(f"give --tokens or {flag}, not both")
    if args.tokens:
        return load_tokens(args.tokens, allow_insecure=args.allow_insecure_tokens_file)
    if not no_auth:
        raise AxError(f"no --tokens FILE given (see deploy/tokens.example.yaml); pass "
                      f"{flag} explicitly to serve without authentication (the old "
                      f"spelling --insecure-no-auth is accepted too)")
    return None


def _options(args: argparse.Namespace, settings: AxSettings, **extra: Any) -> ServerOptions:
    if args.max_body_bytes <= 0:
        raise AxError("--max-body-bytes must be positive")
    if args.grpc_max_message_bytes <= 0:
        raise AxError("--grpc-max-message-bytes must be positive")
    http, grpc = _listener(args.http), _listener(args.grpc)
    for value, what in ((http, "--http"), (grpc, "--grpc")):
        if value is not None:
            parse_address(value, what)
    if http is None and grpc is None:
        raise AxError("both --http and --grpc are off: nothing to serve")
    for value, what in ((args.max_node_timeout, "--max-node-timeout"),
                        (args.max_task_deadline, "--max-task-deadline"),
                        (args.max_active_tasks_per_principal,
                         "--max-active-tasks-per-principal")):
        if not value >= 0:
            raise AxError(f"{what} must be 0 (no bound) or positive")
    quotas = Quotas(max_node_timeout=args.max_node_timeout,
                    max_deadline=args.max_task_deadline,
                    max_active_tasks=args.max_active_tasks_per_principal)
    from axengine.api._server import ServerOptions  # the server's frameworks: on use

    return ServerOptions(config=AxConfig.from_settings(settings), http=http, grpc=grpc,
                         quotas=quotas,
                         engine_config=EngineConfig(four_eyes=args.four_eyes),
                         max_body_bytes=args.max_body_bytes,
                         grpc_max_message_bytes=args.grpc_max_message_bytes,
                         reconcile_interval=args.reconcile_interval,
                         shutdown_grace=args.shutdown_grace, **extra)


def _run(options: ServerOptions, log_level: str, settings: AxSettings) -> int:
    configure(level=log_level, log_format=settings.log_format,
              access_log=settings.access_log)
    from axengine.api._server import serve

    return asyncio.run(serve(options))


def cmd_api(args: argparse.Namespace) -> int:
    """``ax api``."""
    try:
        settings = _settings(args)
        auth = _auth(args, args.no_auth, "--no-auth")
        options = _options(args, settings, auth=auth, role="api")
        if options.config.queue_url.startswith("memory"):
            print("ax: warning: the in-process queue (memory://) is invisible to executors "
                  "in other processes; use --queue redis://... or `ax server`", flush=True)
        return _run(options, args.log_level, settings)
    except AxError as exc:
        return fail(str(exc), EXIT_USAGE)


def cmd_server(args: argparse.Namespace) -> int:
    """``ax server``."""
    try:
        settings = _settings(args)
        auth = _auth(args, args.no_auth, "--no-auth")
        options = _options(args, settings, auth=auth, role="server", run_worker=True,
                           worker_concurrency=args.concurrency, runner=args.runner,
                           runners=make_runners([args.runner]))
        if auth is None:
            for value in (options.http, options.grpc):
                if value is not None and not is_loopback(parse_address(value, "")[0]):
                    raise AxError(f"--no-auth serves only loopback addresses, not {value}; "
                                  "give --tokens FILE to listen on the network")
        os.makedirs(options.config.home, exist_ok=True)
        return _run(options, args.log_level, settings)
    except AxError as exc:
        return fail(str(exc), EXIT_USAGE)
