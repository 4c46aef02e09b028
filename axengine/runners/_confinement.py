"""What confines one node process of the ``subprocess`` runner: its settings, its
resource limits, its user and the paths its interpreter imports from.

Private to :mod:`axengine.runners`: :mod:`axengine.runners.subprocess` re-exports the
public names (:class:`SubprocessSettings`, :class:`NodeLimits`, :func:`node_limits`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import pwd
import resource
import site
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from axengine.dag import parse_quantity
from axengine.errors import InputError
from executors.contract import NodeRequest
from executors.run_node import DEFAULT_HANDLER

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_OPEN_FILES",
    "ROOT_NODE_USER",
    "NodeLimits",
    "NodeUser",
    "SubprocessSettings",
    "apply_limits",
    "format_size",
    "node_limits",
    "node_user",
    "package_roots",
    "site_dirs",
]

#: ``RLIMIT_AS`` of a node that names no ``resources.limits.memory`` (Python with the
#: handlers loaded uses well under 100 MiB of address space).
DEFAULT_MEMORY_BYTES = 1 << 30
#: ``RLIMIT_NOFILE`` of every node process.
DEFAULT_OPEN_FILES = 256
#: Seconds between SIGTERM and SIGKILL when a run is stopped or times out.
DEFAULT_GRACE_SECONDS = 5.0
#: Variables copied from the executor's environment (when set); no other one is. The
#: model provider's endpoint and key are the nodes' own credentials (an LLM node calls
#: the model from its process), unlike the executor's token and store credentials.
DEFAULT_ENV_ALLOWLIST: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "TZ",
                                          "OPENAI_BASE_URL", "OPENAI_API_KEY")
#: The node user of an executor running as root, unless the settings name another.
ROOT_NODE_USER = "nobody"
#: Binary size units.
_MIB = 1 << 20
_GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class SubprocessSettings:
    """How the ``subprocess`` runner starts node processes.

    Attributes:
        cpu_seconds: ``RLIMIT_CPU`` of a node without ``resources.limits.cpu``; None:
            one core for the node's timeout (``ceil(timeout)`` CPU seconds). SIGXCPU at
            the limit, SIGKILL one second later.
        memory_bytes: ``RLIMIT_AS`` of a node without ``resources.limits.memory``.
        open_files: ``RLIMIT_NOFILE``.
        grace_seconds: Between SIGTERM and SIGKILL when a run is stopped or times out.
        run_as_user: User (name or uid) the node processes run as. None: ``nobody`` when
            the executor runs as root, otherwise the executor's own user (only root can
            switch users).
        env_allowlist: Variables copied from the executor's environment.
        python: The interpreter of node processes (Python 3.11 or later); None: this
            one, or a fallback of the same version the node user can run.
        handler: Import path (``module:function``) of the handler node processes run.
            Set only from code (tests name a test handler here); no CLI flag, handler
            setting or DAG field reaches it.
    """

    cpu_seconds: int | None = None
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    open_files: int = DEFAULT_OPEN_FILES
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    run_as_user: str | None = None
    env_allowlist: tuple[str, ...] = DEFAULT_ENV_ALLOWLIST
    python: str | None = None
    handler: str = DEFAULT_HANDLER

    def __post_init__(self) -> None:
        if self.cpu_seconds is not None and self.cpu_seconds < 1:
            raise InputError("subprocess runner: cpu_seconds must be at least 1")
        if self.memory_bytes < _MIB or self.open_files < 16:
            raise InputError("subprocess runner: memory_bytes must be at least 1 MiB and "
                             "open_files at least 16")
        if not self.grace_seconds >= 0:
            raise InputError("subprocess runner: grace_seconds must not be negative")
        module, sep, attr = self.handler.partition(":")
        if not (module and sep and attr):
            raise InputError(f"subprocess runner: handler {self.handler!r}: use "
                             "module:function")


@dataclass(frozen=True)
class NodeLimits:
    """The resource limits of one node process."""

    memory_bytes: int
    cpu_seconds: int | None
    open_files: int

    def rlimits(self) -> tuple[tuple[int, int, int], ...]:
        """``(resource, soft, hard)`` for ``setrlimit``, within the executor's own hard
        limits (a process cannot raise them)."""
        wanted = [(resource.RLIMIT_AS, self.memory_bytes, 0),
                  (resource.RLIMIT_NOFILE, self.open_files, 0)]
        if self.cpu_seconds is not None:
            # SIGXCPU at the soft limit; SIGKILL a second later if it is ignored.
            wanted.append((resource.RLIMIT_CPU, self.cpu_seconds, 1))
        out = []
        for which, value, slack in wanted:
            _, hard = resource.getrlimit(which)
            if hard == resource.RLIM_INFINITY:
                out.append((which, value, value + slack))
            else:
                soft = min(value, hard)
                out.append((which, soft, min(soft + slack, hard)))
        return tuple(out)


def node_limits(request: NodeRequest, timeout: float,
                settings: SubprocessSettings) -> NodeLimits:
    """The limits of ``request``'s process: its ``resources.limits`` over the settings.

    Raises:
        InputError: A quantity of the node's ``resources.limits`` cannot be read.
    """
    resources = request.config.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    limits = limits if isinstance(limits, Mapping) else {}
    memory = settings.memory_bytes
    if limits.get("memory") is not None:
        memory = math.ceil(_quantity(limits["memory"], request.node_id, "memory"))
    finite = math.isfinite(timeout) and timeout > 0
    cpu: int | None = None
    if limits.get("cpu") is not None:
        cores = _quantity(limits["cpu"], request.node_id, "cpu")
        cpu = math.ceil(cores * timeout) if finite else None
    elif settings.cpu_seconds is not None:
        cpu = settings.cpu_seconds
    elif finite:
        cpu = math.ceil(timeout)
    return NodeLimits(memory_bytes=max(memory, 1),
                      cpu_seconds=None if cpu is None else max(cpu, 1),
                      open_files=settings.open_files)


def _quantity(value: Any, node_id: str, name: str) -> float:
    try:
        return float(parse_quantity(str(value)))
    except ValueError as exc:
        raise InputError(f"node {node_id!r}: resources.limits.{name} {value!r} is not a "
                         "Kubernetes quantity (e.g. 500m, 2, 256Mi, 1Gi)") from exc


def format_size(n: int) -> str:
    if n % _GIB == 0:
        return f"{n // _GIB} GiB"
    if n % _MIB == 0:
        return f"{n // _MIB} MiB"
    return f"{n / _MIB:.1f} MiB"


def apply_limits(limits: tuple[tuple[int, int, int], ...]) -> None:
    # Runs in the child between fork and exec, after the switch of user: no locks, no
    # allocation beyond what setrlimit needs.
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


@dataclass(frozen=True)
class NodeUser:
    name: str
    uid: int
    gid: int
    switch: bool


def node_user(wanted: str | None) -> NodeUser:
    euid = os.geteuid()
    if wanted is None:
        if euid != 0:
            try:
                name = pwd.getpwuid(euid).pw_name
            except KeyError:
                name = str(euid)
            return NodeUser(name, euid, os.getegid(), switch=False)
        wanted = ROOT_NODE_USER
    try:
        entry = pwd.getpwuid(int(wanted)) if wanted.isdigit() else pwd.getpwnam(wanted)
    except KeyError as exc:
        raise InputError(f"subprocess runner: run_as_user {wanted!r} is no user of this "
                         "host") from exc
    if entry.pw_uid == euid:
        return NodeUser(entry.pw_name, euid, os.getegid(), switch=False)
    if euid != 0:
        raise InputError(f"subprocess runner: run_as_user {wanted!r}: only an executor "
                         f"running as root can run nodes as another user (this one is uid "
                         f"{euid})")
    return NodeUser(entry.pw_name, entry.pw_uid, entry.pw_gid, switch=True)


def unreachable(path: str, user: NodeUser) -> str | None:
    """Why ``user`` cannot reach ``path`` (a directory above it it may not search), or
    None. Judged from the mode bits, owner and group of each existing ancestor — the
    user's primary group only, no ACLs: a hint for a clear message, not a gate."""
    current = os.path.dirname(os.path.abspath(path))
    blocked = None
    while True:
        try:
            info = os.stat(current)
        except OSError:
            info = None
        if info is not None:
            if info.st_uid == user.uid:
                bit = stat.S_IXUSR
            elif info.st_gid == user.gid:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not info.st_mode & bit:
                blocked = (f"{current} is mode {stat.S_IMODE(info.st_mode):04o} (owner uid "
                           f"{info.st_uid}), which user {user.name} may not enter")
        parent = os.path.dirname(current)
        if parent == current:
            return blocked
        current = parent


def site_dirs() -> tuple[str, ...]:
    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return tuple(os.path.realpath(d) for d in dirs if os.path.isdir(d))


def package_roots(modules: Iterable[str], sites: tuple[str, ...]) -> tuple[str, ...]:
    """Directories to put on ``PYTHONPATH`` so ``modules`` import in the node process:
    the parent of each top-level package, unless it is a site directory (those are added
    as site directories, after the standard library: a site-packages on ``PYTHONPATH``
    could shadow it)."""
    roots: list[str] = []
    for module in modules:
        top = module.split(".", 1)[0]
        spec = importlib.util.find_spec(top)
        if spec is None:
            raise InputError(f"subprocess runner: cannot find the package {top!r}")
        places = list(spec.submodule_search_locations or [])
        found = [os.path.dirname(p) for p in places] or (
            [os.path.dirname(spec.origin)] if spec.origin else [])
        for root in (os.path.realpath(r) for r in found):
            if root not in sites and root not in roots:
                roots.append(root)
    return tuple(roots)
