"""Run one engine operation against the configured store, then close it."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from axengine.cli._common import config_of
from axengine.engine import Engine
from axengine.wiring import build_runtime

T = TypeVar("T")


def with_engine(args: argparse.Namespace, op: Callable[[Engine], Awaitable[T]]) -> T:
    async def main() -> T:
        runtime = build_runtime(config_of(args))
        try:
            return await op(runtime.engine)
        finally:
            await runtime.close()

    return asyncio.run(main())

