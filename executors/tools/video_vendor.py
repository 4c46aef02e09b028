"""``video_vendor``: a slow, paid external job (seed 002's video vendor), simulated.

Input: ``{"prompt": "...", "seconds": 8}`` (the video length asked for).

The vendor job is submitted through the outbox record ``video:{task}:{node}:{input
revision}``, and the vendor's job record (id, submission time, expected durations) is
stored as the effect's result. A retry after a crash or a lease takeover therefore
*re-attaches* to the same vendor job and keeps waiting for it, instead of paying for a
second render. If an earlier attempt died between "submitting" and recording the job,
the tool fails without retry and asks a person to look the job up at the vendor.

While waiting it polls, reports business progress only when the vendor's state moves
(``vendor:queued`` → ``vendor:rendering 40%`` → ``vendor:downloaded``) and heartbeats in
between — so a stalled vendor shows up as missing progress, not as a dead worker.

Knobs (the ``video_vendor`` setting, overridden by the node's ``simulate:``):
``queue_seconds`` (default 0.2), ``render_seconds`` (default 1.0), ``poll_interval``
(default 0.1).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from executors.contract import Failure, NodeContext, NodeRequest, Outcome, Success
from executors.keepalive import Keepalive
from executors.tools._common import heartbeat_interval, pause, stopped

__all__ = ["VENDOR", "SimulatedVideoVendor", "video_vendor"]

_DEFAULTS = {"queue_seconds": 0.2, "render_seconds": 1.0, "poll_interval": 0.1}
_PROGRESS_STEP = 20  # percent between "rendering" checkpoints


class SimulatedVideoVendor:
    """A vendor whose job state is a pure function of the job record and the time.

    Because the state is derived from the record kept in the outbox, any worker process
    can re-attach to a job another one submitted. :attr:`submissions` counts paid
    submissions in this process (what idempotency must keep at one per node).

    Args:
        clock: Wall clock (job records must compare across processes).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.submissions = 0

    def submit(
        self, client_reference: str, prompt: str, seconds: float, *,
        queue_seconds: float, render_seconds: float,
    ) -> dict[str, Any]:
        """Start (and pay for) a render; returns the vendor's job record."""
        with self._lock:
            self.submissions += 1
        return {
            "vendor_job_id": "vj-" + hashlib.sha256(client_reference.encode()).hexdigest()[:16],
            "submitted_at": self._clock(),
            "queue_seconds": queue_seconds,
            "render_seconds": render_seconds,
            "seconds": seconds,
            "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
        }

    def status(self, job: Mapping[str, Any]) -> tuple[str, int]:
        """``(phase, percent)`` of a job: ``queued``, ``rendering`` or ``ready``."""
        elapsed = self._clock() - float(job["submitted_at"])
        queue, render = float(job["queue_seconds"]), float(job["render_seconds"])
        if elapsed < queue:
            return "queued", 0
        if render > 0 and elapsed < queue + render:
            return "rendering", int(100 * (elapsed - queue) / render)
        return "ready", 100

    def download_uri(self, job: Mapping[str, Any]) -> str:
        """Where the finished video can be fetched."""
        return f"vendor://sim-video/{job['vendor_job_id']}.mp4"


#: The process's simulated vendor.
VENDOR = SimulatedVideoVendor()


def video_vendor(request: NodeRequest, ctx: NodeContext) -> Outcome:
    """Render a video at the (simulated) vendor, at most one paid job per node input."""
    spec = request.input
    if not isinstance(spec, Mapping) or not isinstance(spec.get("prompt"), str):
        return Failure(
            f"node {request.node_id!r}: video_vendor input must be a mapping with a "
            "'prompt' string and 'seconds'",
            retryable=False,
        )
    knobs = {**_DEFAULTS, **dict(ctx.settings.get("video_vendor") or {}),
             **dict(request.config.get("simulate") or {})}
    seconds = spec.get("seconds", 5)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        return Failure(f"node {request.node_id!r}: 'seconds' must be positive", retryable=False)
    key = f"video:{request.task_id}:{request.node_id}:{request.input_revision}"
    effect = ctx.effect(key)
    prior = "DONE" if effect.state() == "DONE" else effect.begin()
    if prior == "DONE":
        job = dict(effect.result() or {})
        if not ctx.progress(f"vendor:reattached {job.get('vendor_job_id')}"):
            return stopped()
    elif prior == "NEW":
        job = VENDOR.submit(
            key, spec["prompt"], float(seconds),
            queue_seconds=float(knobs["queue_seconds"]),
            render_seconds=float(knobs["render_seconds"]),
        )
        effect.done(job)
    else:
        return Failure(
            f"video vendor job state unknown after a crash (idempotency key {key}): a job may "
            f"have been submitted and paid for. Look it up at the vendor by this client "
            "reference, then mark the effect done with its job id or retry by hand.",
            retryable=False,
            details={"effect": "UNKNOWN", "idempotency_key": key},
        )
    return _wait(job, float(knobs["poll_interval"]), ctx)


def _wait(job: Mapping[str, Any], poll: float, ctx: NodeContext) -> Outcome:
    keepalive = Keepalive(ctx, interval=heartbeat_interval(ctx))
    last = None
    while True:
        phase, percent = VENDOR.status(job)
        if phase == "ready":
            break
        marker = (
            "vendor:queued" if phase == "queued"
            else f"vendor:rendering {percent // _PROGRESS_STEP * _PROGRESS_STEP}%"
        )
        # Progress only when the vendor's state moved: a heartbeat is not progress.
        if marker != last:
            if not ctx.progress(marker):
                return stopped()
            last = marker
        if not pause(ctx, poll, keepalive):
            return stopped()
    if not ctx.progress("vendor:downloaded"):
        return stopped()
    return Success({
        "status": "ready",
        "video_uri": VENDOR.download_uri(job),
        "vendor_job_id": job["vendor_job_id"],
        "seconds": job.get("seconds"),
    })
