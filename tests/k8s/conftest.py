"""Fixtures for tests of the Kubernetes runner: ``kube`` (the stand-in, or a real cluster)
and ``k8s_standin`` (always the stand-in). See :mod:`tests.k8s.standin`.

``AX_K8S_CONTEXT`` is read once, here: when it names a kubeconfig context (of
``$KUBECONFIG`` or ``~/.kube/config``), ``kube`` is a :class:`RealCluster` on it, in
namespace ``AX_K8S_NAMESPACE`` (default ``default``), with Python image
``AX_K8S_PYTHON_IMAGE``; tests that use knobs then skip, saying which knob.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.standin import KubeStandIn, RealCluster

#: The kubeconfig context of a real cluster to run ``kube`` tests against, if any.
REAL_CONTEXT = os.environ.get("AX_K8S_CONTEXT") or None
REAL_NAMESPACE = os.environ.get("AX_K8S_NAMESPACE") or "default"
REAL_PYTHON_IMAGE = os.environ.get("AX_K8S_PYTHON_IMAGE") or "python:3.11-slim"
REAL_KUBECONFIG = Path(os.environ.get("KUBECONFIG") or "~/.kube/config").expanduser()


@pytest.fixture
def k8s_standin(tmp_path: Path) -> Iterator[KubeStandIn]:
    """A fresh stand-in for one test, stopped after it (pod processes killed)."""
    with KubeStandIn(tmp_path / "k8s") as standin:
        yield standin


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeStandIn | RealCluster]:
    """The Kubernetes API the test talks to: the stand-in unless ``AX_K8S_CONTEXT`` is set."""
    if REAL_CONTEXT is not None:
        yield RealCluster(REAL_KUBECONFIG, REAL_CONTEXT, REAL_NAMESPACE, REAL_PYTHON_IMAGE)
        return
    with KubeStandIn(tmp_path / "k8s") as standin:
        yield standin
