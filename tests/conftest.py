"""Shared fixtures: real etcd and Redis servers (session-scoped, private ports)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import Server, start_etcd, start_redis


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[Server]:
    """A real etcd started from its binary on a private port for this test session."""
    server = start_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    """A real redis-server started from its binary on a private port for this session."""
    server = start_redis()
    try:
        yield server
    finally:
        server.close()
