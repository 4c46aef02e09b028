"""Runners: where a claimed node runs (the seam is :class:`axengine.worker.Runner`).

- ``thread``: a thread of the executor (shares its memory, environment and files); the
  Worker builds it.
- ``subprocess``: a fresh process per attempt: clean environment, own process group,
  rlimits, another user under root (:mod:`axengine.runners.subprocess`).
- ``kubernetes``: a ``batch/v1`` Job per attempt, whose container reports through the
  API with the fence (:mod:`axengine.runners.kubernetes`; needs the ``kubernetes``
  extra).

:func:`make_runners` is the one place runners are built by name, for every process
shape (``ax run``, ``ax server``, ``ax executor``, :class:`~axengine.local.LocalSession`);
:data:`RUNNER_NAMES` is the one list the CLI offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from axengine.errors import InputError
from axengine.runners.subprocess import SUBPROCESS, SubprocessRunner, SubprocessSettings
from axengine.worker import THREAD, Runner
from executors.contract import Handler

if TYPE_CHECKING:  # lightkube is an optional extra: imported only with the runner
    from axengine.runners.kubernetes import KubeOptions

__all__ = [
    "RUNNER_CHOICES",
    "RUNNER_NAMES",
    "SUBPROCESS",
    "THREAD",
    "SubprocessRunner",
    "SubprocessSettings",
    "make_runners",
    "runner_help",
]

#: Runners an executor can be told to use (``--runner``) and what a node gets from each,
#: the default first. The CLI's choices and help come from here.
RUNNER_CHOICES: dict[str, str] = {
    THREAD: "a thread of the executor (the default)",
    SUBPROCESS: "a fresh process per node: clean environment, own process group, "
                "resource limits, another user when run as root",
    "kubernetes": "a Kubernetes Job per node attempt, which reports through the API "
                  "(--job-settings, --kube-context; needs the kubernetes extra)",
}
#: The names of :data:`RUNNER_CHOICES`.
RUNNER_NAMES: tuple[str, ...] = tuple(RUNNER_CHOICES)


def runner_help(who: str) -> str:
    """``--runner`` help text: where ``who`` runs nodes, naming every choice."""
    choices = "; ".join(f"{name}: {what}" for name, what in RUNNER_CHOICES.items())
    return (f"where {who} runs nodes that do not name a runner — {choices} "
            "(see docs/executors.md#runners)")


def make_runners(names: Sequence[str], *, handler: Handler | None = None,
                 settings: SubprocessSettings | None = None,
                 kube: KubeOptions | None = None) -> dict[str, Runner]:
    """Build the runners named ``names`` (``thread`` is built by the Worker around its
    handler, so it is not in the result).

    Args:
        names: Runner names, from :data:`RUNNER_NAMES`.
        handler: The handler of in-process runs, when the caller has its own. Runners
            that run node code in another process run it by import path and refuse a
            callable they cannot ship there.
        settings: Of the ``subprocess`` runner (its ``handler`` names the node
            processes' handler).
        kube: Of the ``kubernetes`` runner (Job settings file, kubeconfig context).

    Returns:
        The runners by name.

    Raises:
        InputError: An unknown name (the message lists the known ones), or a custom
            ``handler`` for a runner that cannot run it.
    """
    from executors.handlers import handle

    runners: dict[str, Runner] = {}
    for name in dict.fromkeys(names):
        if name == THREAD:
            continue
        if name == SUBPROCESS:
            if handler is not None and handler is not handle:
                raise InputError("the subprocess runner runs node code in a new process by "
                                 "import path; name the handler in "
                                 "SubprocessSettings(handler='module:function') instead of "
                                 "passing a callable")
            runners[name] = SubprocessRunner(settings)
        elif name == "kubernetes":
            try:
                from axengine.runners.kubernetes import KubernetesRunner
            except ImportError as exc:
                raise InputError(f"the kubernetes runner needs lightkube ({exc}); install "
                                 "axengine[kubernetes]") from exc
            if kube is None:
                # Only `ax executor` configures it (Job settings, cluster, pod settings);
                # pods report through an API, which `ax run` does not serve.
                raise InputError("the kubernetes runner runs under `ax executor --runner "
                                 "kubernetes --job-settings FILE` (see docs/executors.md"
                                 "#the-kubernetes-runner)")
            runners[name] = KubernetesRunner.from_options(kube)
        else:
            raise InputError(f"unknown runner {name!r}; known runners: "
                             f"{', '.join(RUNNER_NAMES)}")
    return runners
