"""An API process: REST on uvicorn and gRPC on top of its process shape.

:class:`ApiServer` assembles an :class:`~axengine.process.AxProcess` (engine with
metrics, the reconciler — which only acts while this process holds the leadership
record in the store, so replicas take turns — and, for ``ax server``, an in-process
executor), then binds the listeners (port 0 picks a free port; the real one is
reported).

Shutdown (:meth:`ApiServer.stop`, or SIGTERM/SIGINT under :func:`serve`) is graceful:
watch streams are told to end, the listeners stop accepting, in-flight requests finish
(up to ``shutdown_grace`` seconds), then the process shuts down as every shape does
(nodes in flight get the executor's grace and are handed back; leadership is handed
back; the store and queue are closed). A second signal ends the executor's grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import uvicorn

from axengine.api._auth import Authenticator
from axengine.api._defaults import DEFAULT_GRPC_MAX_MESSAGE, is_loopback, parse_address
from axengine.api._grpc import add_services
from axengine.api._grpc_auth import AuthInterceptor
from axengine.api._grpc_decode import DecodeInterceptor
from axengine.api._quotas import Quotas
from axengine.api._rest import DEFAULT_MAX_BODY_BYTES, create_app
from axengine.api._takers import Takers
from axengine.config import AxConfig
from axengine.credentials import redact_url
from axengine.engine import Engine, EngineConfig
from axengine.errors import InputError
from axengine.metrics import AxMetrics
from axengine.process import AxProcess, ExecutorSpec, Shape, stop_on_signals
from axengine.worker import THREAD, Runner

__all__ = ["DEFAULT_GRPC_MAX_MESSAGE", "ApiServer", "Listening", "ServerOptions", "is_loopback",
           "parse_address", "serve"]

log = logging.getLogger("axengine.api.server")

#: Replies may be larger than any request: a claim carries the rendered node input and
#: its rendered prompt, each possibly a copy of a large task input.
GRPC_SEND_FACTOR = 4


@dataclass(frozen=True)
class ServerOptions:
    """What an API process serves and how.

    Attributes:
        config: Store, queue, blob directory and key prefix.
        http: REST listener ``host:port`` (None: no REST).
        grpc: gRPC listener ``host:port`` (None: no gRPC).
        auth: Tokens and roles; None turns authentication off.
        run_worker: Run an in-process executor (``ax server``).
        worker_concurrency: Nodes the in-process executor runs at once.
        lease_seconds: Lease the in-process executor asks for.
        reconcile_interval: Seconds between reconciler passes.
        max_body_bytes: Largest REST request body.
        grpc_max_message_bytes: Largest gRPC request (replies may be
            :data:`GRPC_SEND_FACTOR` times larger).
        shutdown_grace: Seconds in-flight requests get after a stop.
        engine_config: Engine tunables (``four_eyes`` among them).
        quotas: What one submitter may ask for (node timeouts, deadline, unfinished
            tasks); ``lane: fast`` and priority > 0 need the ``expedite`` role.
        role: Prefix of this process's owner id (``api`` or ``server``).
        runner: Where the in-process executor runs nodes that do not name a runner.
        runners: Runners besides ``thread`` for the in-process executor, by name
            (:func:`axengine.runners.make_runners`).
    """

    config: AxConfig
    http: str | None = "127.0.0.1:8080"
    grpc: str | None = "127.0.0.1:50051"
    auth: Authenticator | None = None
    run_worker: bool = False
    worker_concurrency: int = 4
    lease_seconds: float = 30.0
    reconcile_interval: float = 1.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    grpc_max_message_bytes: int = DEFAULT_GRPC_MAX_MESSAGE
    shutdown_grace: float = 10.0
    engine_config: EngineConfig | None = None
    quotas: Quotas = field(default_factory=Quotas)
    role: str = "api"
    runner: str = THREAD
    runners: Mapping[str, Runner] = field(default_factory=dict)


@dataclass(frozen=True)
class Listening:
    """Where a started server listens (real ports, also when 0 was asked)."""

    http_url: str | None
    grpc_address: str | None


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Without it, Nagle + delayed ACK add ~40 ms to every request on a kept-alive
        # connection after the first.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {_format(host, port)}: {exc.strerror or exc}") \
            from exc
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the process handles signals once, for
    every component, and uvicorn must not re-raise them after its shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return None


class ApiServer:
    """One API process: its :class:`~axengine.process.AxProcess` (engine, reconciler,
    and for ``ax server`` an executor) with the REST and gRPC listeners on top.
    ``await start()``, then ``await stop()`` (both in one loop)."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.metrics = AxMetrics()
        self.stopping = asyncio.Event()
        #: Executors' Takes waiting for a submit to hand them a first node.
        self.takers = Takers(on_end=lambda result: self.metrics.takes.labels(result).inc())
        self.metrics.takes_waiting.set_function(self.takers.__len__)
        executor = None
        if options.run_worker:
            executor = ExecutorSpec(
                concurrency=options.worker_concurrency, lease_seconds=options.lease_seconds,
                settings=options.config.resolved_handler_settings, poll_timeout=0.2,
                observe=self.metrics.completed, observe_run=self.metrics.node_ran,
                runners=options.runners,
                runner=options.runner, fast_share=options.config.worker.fast_share,
                aging_seconds=options.config.worker.aging_seconds)
        self.process = AxProcess(Shape(
            config=options.config, executor=executor,
            reconcile_interval=options.reconcile_interval,
            engine_config=options.engine_config, metrics=self.metrics, role=options.role))
        self.owner = self.process.owner
        self._uvicorn: _Uvicorn | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._grpc: Any = None
        self._started = False

    @property
    def engine(self) -> Engine:
        return self.process.engine

    async def start(self) -> Listening:
        """Start the process (a first reconciler pass included), then the listeners."""
        opts = self.options
        await self.process.start()
        self._started = True
        try:
            http_url = await self._start_http() if opts.http else None
            grpc_address = await self._start_grpc() if opts.grpc else None
        except BaseException:
            await self.stop()
            raise
        return Listening(http_url, grpc_address)

    async def _start_http(self) -> str:
        assert self.options.http is not None
        host, port = parse_address(self.options.http, "--http")
        sock = _bind(host, port)
        app = create_app(engine=self.engine, auth=self.options.auth, metrics=self.metrics,
                         stopping=self.stopping, max_body_bytes=self.options.max_body_bytes,
                         quotas=self.options.quotas, takers=self.takers)
        config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning",
                                access_log=False, ws="none",
                                timeout_graceful_shutdown=int(self.options.shutdown_grace))
        self._uvicorn = _Uvicorn(config)
        self._http_task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:
            if self._http_task.done():
                self._http_task.result()  # raises what stopped it
                raise InputError(f"the REST server on {self.options.http} did not start")
            # uvicorn reports readiness only through this flag.
            await asyncio.sleep(0.01)
        return f"http://{_format(host, sock.getsockname()[1])}"

    async def _start_grpc(self) -> str:
        assert self.options.grpc is not None
        host, port = parse_address(self.options.grpc, "--grpc")
        limit = self.options.grpc_max_message_bytes
        auth = self.options.auth
        # Authentication runs in an interceptor, before a request body is read.
        server = grpc.aio.server(
            interceptors=[*([AuthInterceptor(auth)] if auth is not None else []),
                          DecodeInterceptor()],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit * GRPC_SEND_FACTOR),
                ("grpc.so_reuseport", 0),
            ])
        add_services(server, engine=self.engine, auth=self.options.auth,
                     metrics=self.metrics, stopping=self.stopping, quotas=self.options.quotas,
                     takers=self.takers)
        try:
            bound = server.add_insecure_port(_format(host, port))
        except RuntimeError as exc:
            raise InputError(f"cannot listen on {self.options.grpc}: {exc}") from exc
        if not bound:
            raise InputError(f"cannot listen on {self.options.grpc}")
        await server.start()
        self._grpc = server
        return _format(host, int(bound))

    async def _shutdown_listeners(self) -> None:
        waits = []
        if self._uvicorn is not None and self._http_task is not None:
            self._uvicorn.should_exit = True
            waits.append(self._http_task)
        if self._grpc is not None:
            waits.append(asyncio.ensure_future(self._grpc.stop(self.options.shutdown_grace)))
        for result in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError):
                log.warning("listener stopped with an error: %r", result)

    async def stop(self) -> None:
        """Stop gracefully (see the module docstring); idempotent."""
        if not self._started:
            return
        self._started = False
        self.stopping.set()
        self.takers.close()
        await self._shutdown_listeners()
        await self.process.shutdown()


def _print(line: str) -> None:
    print(f"ax: {line}", flush=True)


async def serve(options: ServerOptions, *, stop: asyncio.Event | None = None,
                install_signals: bool = True,
                on_ready: Callable[[Listening], None] | None = None) -> int:
    """Run an API process until ``stop`` is set (or SIGTERM/SIGINT); return 0.

    Prints ``ax: http listening on URL``, ``ax: grpc listening on HOST:PORT`` and
    ``ax: ready`` once every listener accepts connections.
    """
    stop = stop or asyncio.Event()
    server = ApiServer(options)
    with (stop_on_signals(stop, server.process.hurry, name=server.owner) if install_signals
          else contextlib.nullcontext()):
        listening = await server.start()
        if listening.http_url:
            _print(f"http listening on {listening.http_url}")
            _print(f"web UI {listening.http_url}/ui/ (API docs {listening.http_url}/docs)")
        if listening.grpc_address:
            _print(f"grpc listening on {listening.grpc_address}")
        mode = "no authentication" if options.auth is None else \
            f"tokens from {options.auth.source}"
        _print(f"store {redact_url(options.config.resolved_store_url)}, queue "
               f"{redact_url(options.config.queue_url)}, {mode}"
               + (", in-process executor" if options.run_worker else ""))
        _print("ready")
        if on_ready is not None:
            on_ready(listening)
        await stop.wait()
        _print("stopping")
        await server.stop()
    _print("stopped")
    sys.stdout.flush()
    return 0
