"""docker-compose.dev.yml and deploy/Dockerfile, checked without a Docker engine.

The compose file is loaded as YAML; the commands of the ax services are parsed with the
real ``ax`` argument parser, so a renamed option or a wrong URL fails here rather than
at ``docker compose up``. Wiring is followed end to end: store and queue URLs name
services and their ports, the gRPC address the executor dials is the one the API
listens on and publishes, and the executor's token is one the mounted tokens file
grants the ``executor`` role.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from axengine.api._auth import Role, load_tokens
from axengine.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.dev.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def flags(argv: list[str]) -> dict[str, str]:
    """``--k=v`` and ``--k v`` options of a server's argv."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
                i += 1
            out[name] = value
        i += 1
    return out


def ax_args(service: dict[str, Any]) -> Any:
    command = service["command"]
    assert isinstance(command, list), "use the exec form: a list, no shell"
    assert command[0] == "ax"
    return build_parser().parse_args(command[1:])


def published(service: dict[str, Any]) -> set[int]:
    """Container ports the service publishes."""
    return {int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])}


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path → host path of the bind mounts (named volumes excluded)."""
    out = {}
    for volume in service.get("volumes", []):
        host, _, rest = str(volume).partition(":")
        target = rest.split(":")[0]
        if host.startswith((".", "/")):
            out[target] = (REPO / host).resolve()
    return out


def depends(service: dict[str, Any]) -> set[str]:
    dep = service.get("depends_on", {})
    return set(dep) if isinstance(dep, dict | list) else set()


def test_the_four_services_and_the_etcd_auth_bootstrap_exist(services: dict[str, Any]) -> None:
    assert set(services) == {"etcd", "etcd-auth", "redis", "ax-api", "ax-executor"}


def test_etcd_is_the_seed_image_with_the_seed_command_and_a_large_txn_limit(
        services: dict[str, Any]) -> None:
    etcd = services["etcd"]
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", etcd["image"])
    argv = etcd["command"]
    assert argv[0] == "etcd"
    opts = flags(argv)
    assert opts["--advertise-client-urls"] == "http://etcd:2379"
    assert opts["--listen-client-urls"] == "http://0.0.0.0:2379"
    assert opts["--max-txn-ops"] == "20000"
    assert 2379 in published(etcd)
    assert "etcd" in str(etcd["healthcheck"]["test"])


def test_redis_runs_without_persistence(services: dict[str, Any]) -> None:
    redis = services["redis"]
    assert redis["image"].startswith("redis:")
    assert flags(redis["command"])["--appendonly"] == "no"
    assert 6379 in published(redis)


def test_ax_services_build_one_image_from_the_dockerfile(services: dict[str, Any]) -> None:
    for name in ("ax-api", "ax-executor"):
        build = services[name]["build"]
        assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert services[name]["image"] == "ax:dev"


def test_api_command_parses_and_names_the_store_and_queue_services(
        services: dict[str, Any]) -> None:
    api = services["ax-api"]
    args = ax_args(api)
    assert args.command == "api"
    store, queue = urlsplit(args.store), urlsplit(args.queue)
    assert (store.scheme, store.hostname, store.port) == ("etcd", "etcd", 2379)
    assert (queue.scheme, queue.hostname, queue.port, queue.path) == (
        "redis", "redis", 6379, "/0")
    assert urlsplit(flags(services["etcd"]["command"])["--listen-client-urls"]).port == 2379
    assert depends(api) == {"etcd", "etcd-auth", "redis"}
    http_port = int(args.http.rsplit(":", 1)[1])
    grpc_port = int(args.grpc.rsplit(":", 1)[1])
    assert args.http.startswith("0.0.0.0:") and args.grpc.startswith("0.0.0.0:")
    assert {http_port, grpc_port} == {8080, 50051} == published(api)
    assert "/readyz" in str(api["healthcheck"]["test"])


def test_api_tokens_file_is_mounted_and_valid(services: dict[str, Any]) -> None:
    args = ax_args(services["ax-api"])
    host = mounts(services["ax-api"])[args.tokens]
    assert host.is_file()
    auth = load_tokens(host, allow_insecure=True)  # public example tokens, 0644 in git
    assert auth.source == str(host)


def test_executor_dials_the_api_grpc_listener_and_the_same_queue(
        services: dict[str, Any]) -> None:
    api_args = ax_args(services["ax-api"])
    executor = services["ax-executor"]
    args = ax_args(executor)
    assert args.command == "executor"
    host, _, port = args.api.rpartition(":")
    assert host == "ax-api"
    assert int(port) == int(api_args.grpc.rsplit(":", 1)[1])
    assert args.queue == api_args.queue
    assert depends(executor) == {"ax-api"}
    assert executor["depends_on"]["ax-api"]["condition"] == "service_healthy"


def test_executor_token_is_granted_the_executor_role_by_the_mounted_tokens(
        compose: dict[str, Any], services: dict[str, Any]) -> None:
    args = ax_args(services["ax-executor"])
    config = next(c for c in services["ax-executor"]["configs"]
                  if c["target"] == args.token_file)
    content = compose["configs"][config["source"]]["content"]
    default = re.fullmatch(r"\$\{AX_EXECUTOR_TOKEN:-([^}]+)\}", content)
    assert default is not None, "the token defaults to the example executor token"
    token = default.group(1)
    tokens_file = mounts(services["ax-api"])[ax_args(services["ax-api"]).tokens]
    principal = load_tokens(tokens_file, allow_insecure=True).authenticate(f"Bearer {token}")
    assert Role.EXECUTOR in principal.roles
    assert hashlib.sha256(token.encode()).hexdigest() in tokens_file.read_text()


def test_executor_gets_longer_to_stop_than_its_grace_period(services: dict[str, Any]) -> None:
    executor = services["ax-executor"]
    args = ax_args(executor)
    stop = re.fullmatch(r"(\d+)s", executor["stop_grace_period"])
    assert stop is not None
    assert int(stop.group(1)) > args.grace
    assert args.lease > 0 and args.concurrency >= 1
    assert executor["environment"]["AX_MAIL_DIR"].startswith("/var/lib/ax")


def test_dockerfile_copies_what_exists_and_installs_the_ax_command() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.1[1-9]", text, re.MULTILINE)
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE)
               for s in line.split()[:-1]]
    assert sources, "the Dockerfile copies the project"
    for source in sources:
        assert (REPO / source).exists(), source
    assert {"axengine", "executors", "proto", "pyproject.toml"} <= set(sources)
    # With the kubernetes extra: the executor's kubernetes runner needs lightkube.
    assert 'pip install ".[kubernetes]"' in text
    assert re.search(r"^USER ax$", text, re.MULTILINE), "runs unprivileged"
    assert 'ax = "axengine.cli:main"' in (REPO / "pyproject.toml").read_text()
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, re.MULTILINE)[0].split()}
    assert exposed == {8080, 50051}


# -- credentials: nothing unauthenticated is published, every ax URL carries credentials --


def test_no_published_port_binds_beyond_loopback(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port}"


def _secret_paths(compose: dict[str, Any], service: dict[str, Any]) -> set[str]:
    """Files the service gets from top-level secrets that come from the environment."""
    names = {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}
    for name in names:
        assert set(compose["secrets"][name]) == {"environment"}, "no password in the file"
    return {f"/run/secrets/{name}" for name in names}


def test_etcd_auth_bootstrap_enables_auth_for_the_ax_prefix(
        compose: dict[str, Any], services: dict[str, Any]) -> None:
    init = services["etcd-auth"]
    script = init["command"][-1]
    env = init["environment"]
    assert init["restart"] == "no"
    assert init["depends_on"]["etcd"]["condition"] == "service_healthy"
    assert "etcdctl auth enable" in script
    assert "role grant-permission ax --prefix=true readwrite" in script
    assert env["AX_KEY_PREFIX"] == "/ax/"
    assert {env["ETCD_ROOT_PASSWORD_FILE"], env["AX_ETCD_PASSWORD_FILE"]} == _secret_paths(
        compose, init)
    assert "--interactive=false" in script, "passwords go through stdin, not argv"
    api = services["ax-api"]["depends_on"]
    assert api["etcd-auth"]["condition"] == "service_completed_successfully"
    # The health check must keep passing once auth is on (`endpoint health` would not).
    assert services["etcd"]["healthcheck"]["test"][-1] == "status"


def test_redis_requires_the_password_from_a_secret(
        compose: dict[str, Any], services: dict[str, Any]) -> None:
    redis = services["redis"]
    script = redis["command"][2]
    assert "requirepass" in script and "redis-server -" in script
    assert _secret_paths(compose, redis) == {"/run/secrets/redis-password"}
    assert "/run/secrets/redis-password" in script
    assert "REDISCLI_AUTH" in str(redis["healthcheck"]["test"])


def test_ax_urls_carry_credentials_from_secret_files(
        compose: dict[str, Any], services: dict[str, Any]) -> None:
    from axengine.queue import RedisSettings
    from axengine.store.settings import EtcdSettings

    api, executor = services["ax-api"], services["ax-executor"]
    store = EtcdSettings.from_url(ax_args(api).store)
    assert (store.username, store.password) == ("ax", None)
    assert store.password_file in _secret_paths(compose, api)
    for service in (api, executor):
        queue = RedisSettings.from_url(ax_args(service).queue)
        assert queue.password is None
        assert queue.password_file == "/run/secrets/redis-password"
        assert queue.password_file in _secret_paths(compose, service)
    assert "password=" not in COMPOSE.read_text()
