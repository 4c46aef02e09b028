"""The financial DAG through Kubernetes Jobs, on whatever the ``kube`` fixture is: the
stand-in here, a real cluster when ``AX_K8S_CONTEXT`` names a kubeconfig context.

etcd, Redis and ``ax api`` run on this machine (tests/topology.py); ``ax executor
--runner kubernetes`` creates one Job per node attempt in ``kube``'s namespace; each
Job's container (``python -m axengine.runners.job_entry``) fetches its run from the API
and commits through it with its fence.

On a real cluster (e.g. kind, see docs/deployment.md) the test also needs:

- ``AX_K8S_PYTHON_IMAGE``: an image with ax installed (``docker build -f deploy/Dockerfile
  -t ax:dev .`` then ``kind load docker-image ax:dev``);
- ``AX_K8S_API_HOST``: the address pods reach this machine at (on kind, the host's
  address on the kind network, e.g. the gateway of ``docker network inspect kind``); the
  API's gRPC listener then binds every interface of this machine;
- optionally ``AX_K8S_INPUT_ROOT``: where the image holds the example inputs (default
  ``/opt/ax/dags/inputs``, as deploy/Dockerfile lays them out).

The fault cases (executor SIGKILL, exit 137, image pull errors, 410…) need the
stand-in's knobs and are in tests/runners/test_kubernetes.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client as KubeClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from axengine.client import Client
from tests.topology import REPO, Topology

ACME_PATH = ["parse_pdf", "extract_metrics", "assess_risk", "send_medium_risk_email",
             "log_completion"]


def _where(kube: Any) -> tuple[str, str, str, str]:
    """``(grpc bind host, API host as pods see it, input root in pods, mail dir in
    pods)`` for the stand-in or the real cluster."""
    if not kube.is_real:
        return "127.0.0.1", "127.0.0.1", str(REPO / "dags" / "inputs"), ""
    api_host = os.environ.get("AX_K8S_API_HOST")
    if not api_host:
        pytest.skip("AX_K8S_API_HOST is not set: the real cluster's pods need the address "
                    "of this machine's ax api (see this module's docstring)")
    inputs = os.environ.get("AX_K8S_INPUT_ROOT", "/opt/ax/dags/inputs")
    return "0.0.0.0", api_host, inputs, "/tmp/mail"  # /tmp: the pod's writable emptyDir


def test_the_financial_dag_runs_through_jobs(kube: Any, tmp_path: Path,
                                             record_property: Any) -> None:
    bind, api_host, inputs, pod_mail = _where(kube)
    with Topology(executors=0, lease=5.0, grpc_host=bind, root=tmp_path / "topo") as topo:
        settings = {"input_root": inputs, "mail_dir": pod_mail or str(topo.mail_dir)}
        with KubeClient(config=kube.config()) as k8s:
            for name, data in (("ax-test-job-token", {"token": topo.executor_token}),
                               ("ax-test-pod-settings",
                                {"settings.json": json.dumps(settings)})):
                k8s.create(Secret(metadata=ObjectMeta(name=name, namespace=kube.namespace),
                                  stringData=data))
        job_config = tmp_path / "job-settings.yaml"
        job_config.write_text(yaml.safe_dump({
            "namespace": kube.namespace, "api_address": f"{api_host}:{topo.grpc_port}",
            "default_image": kube.python_image, "token_secret": "ax-test-job-token",
            "ttl_seconds_after_finished": 600}))
        index = topo.add_executor(start=False, worker_id="k8s-financial-0")
        executor = topo.executors[index]
        executor.argv += ["--runner", "kubernetes", "--job-settings", str(job_config),
                          "--kube-context", kube.context,
                          "--pod-settings-secret", "ax-test-pod-settings"]
        executor.env["KUBECONFIG"] = str(kube.kubeconfig)
        topo.start_executor(index)

        with Client(topo.api_url, token=topo.token("submitter")) as client:
            submitted = client.submit(REPO / "dags" / "financial_risk_assessment.yaml",
                                      {"pdf_url": f"{inputs}/acme_annual_report.pdf"})
            result = client.wait(submitted.task_id, timeout=25)
            claims = [e.actor for e in client.events(submitted.task_id)
                      if e.kind == "claimed"]

    assert result.status == "SUCCEEDED", result.errors
    assert list(result.path) == ACME_PATH
    # Every node an executor runs was claimed once, by the kubernetes executor.
    assert claims == ["k8s-financial-0"] * 4
    where = "a real cluster" if kube.is_real else "the stand-in"
    summary = f"financial DAG SUCCEEDED through Jobs on {where}: {len(claims)} claims"
    if not kube.is_real:
        jobs = kube.requests(verb="create", resource="jobs", status=201)
        assert len(jobs) == 4  # one Job per claim, none twice
        summary += f", {len(jobs)} Jobs created"
    record_property("summary", summary)
