"""Every ``ax`` command in ``deploy/k8s`` parses with the real CLI, and the executor's
flags point at files its own Deployment mounts."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from axengine.cli import build_parser
from axengine.cli.executor import cmd_executor
from axengine.cli.services import cmd_api

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def _containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(file, pod spec, container)`` of every workload's container running ``ax``."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") not in ("Deployment", "StatefulSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            for container in pod["containers"]:
                if container.get("command", [None])[0] == "ax":
                    found.append((path.name, pod, container))
    return found


CONTAINERS = _containers()


def test_the_api_and_the_executor_run_ax() -> None:
    commands = sorted(c["command"][1] for _, _, c in CONTAINERS)
    assert commands == ["api", "executor"]


@pytest.mark.parametrize(("file", "pod", "container"), CONTAINERS,
                         ids=[f"{f}:{c['name']}" for f, _, c in CONTAINERS])
def test_every_ax_command_parses_and_its_files_are_mounted(
        file: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    args = build_parser().parse_args(container["command"][1:])
    assert args.func in (cmd_api, cmd_executor)
    mounted = [PurePosixPath(m["mountPath"]) for m in container.get("volumeMounts", [])]
    paths = [v for v in vars(args).values()
             if isinstance(v, str) and v.startswith("/") and "://" not in v]
    for value in paths:
        assert any(PurePosixPath(value).is_relative_to(m) for m in mounted), \
            f"{file}: {value} is not under a volume the container mounts"
    if args.func is cmd_executor:
        assert args.runner == "kubernetes"
        # A pod gets more than the executor's own grace to finish its nodes.
        assert pod["terminationGracePeriodSeconds"] > args.grace
