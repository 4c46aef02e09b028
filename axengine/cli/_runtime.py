"""Run one engine operation against the configured store, then close it.

The CLI's store commands (``tasks``, ``approve``, ``snapshot``…) use the same
composition as every other entry point: a process shape holding the engine alone (no
executor, no reconciler), so nothing runs nodes or repairs behind the command's back.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from axengine.cli._common import config_of
from axengine.engine import Engine
from axengine.process import AxProcess, Shape

T = TypeVar("T")


def with_engine(args: argparse.Namespace, op: Callable[[Engine], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AxProcess(Shape(config=config_of(args), reconcile_interval=None)) as process:
            return await op(process.engine)

    return asyncio.run(main())
