"""Prometheus metrics observed by node handlers, one set per process.

A handler knows nothing of the process it runs in (the same code runs in an executor's
thread, a node process or a Kubernetes Job), so these metrics are registered nowhere by
themselves: every ax process's registry includes them (:class:`axengine.metrics.AxMetrics`)
and serves them with its own. A node run by the ``subprocess`` or ``kubernetes`` runner
observes them in the node's own process, which nothing scrapes.
"""

from __future__ import annotations

from prometheus_client import Histogram

__all__ = ["LLM_REQUEST_BUCKETS", "LLM_REQUEST_SECONDS", "MAX_LABEL", "observe_llm_request"]

#: Longest label value kept (model and tool names are cut; the label set stays bounded).
MAX_LABEL = 100
#: Buckets of model request latency (seconds): short completions take a fraction of a
#: second, long ones (and client retries) minutes.
LLM_REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

#: Latency of each request to a model endpoint, answered or failed, client retries
#: included (``executors.llm.OpenAICompatibleProvider``).
LLM_REQUEST_SECONDS = Histogram(
    "ax_llm_request_seconds", "Latency of requests to model endpoints", ["model"],
    buckets=LLM_REQUEST_BUCKETS, registry=None)


def observe_llm_request(model: str, seconds: float) -> None:
    """Record one model request of ``seconds``."""
    LLM_REQUEST_SECONDS.labels(model[:MAX_LABEL]).observe(seconds)
