"""Request DAGs are parsed and validated in worker threads, a few at a time.

YAML composition, DAG validation and template compilation are CPU work proportional to
the document (a 2 MiB document of aliases, a 10,000-node DAG). Run on the event loop they
stall every other request of the process — ten small YAML bombs at once pushed
``/healthz`` to seconds — so the API hands them to a small dedicated pool: at most
:data:`DAG_PARSE_CONCURRENCY` run at once, the rest wait their turn in the pool's queue
while the loop keeps serving, and blob reads (the default executor) never queue behind
them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["DAG_PARSE_CONCURRENCY", "off_loop"]

#: DAG documents parsed at once per process. Two keep one core free for the event loop
#: on small machines; parsing holds the GIL in stretches, so more threads would not make
#: it faster, only the loop slower.
DAG_PARSE_CONCURRENCY = 2

_POOL = ThreadPoolExecutor(max_workers=DAG_PARSE_CONCURRENCY, thread_name_prefix="ax-dag")

P = ParamSpec("P")
R = TypeVar("R")


async def off_loop(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``fn(*args, **kwargs)`` in the DAG parsing pool and await its result."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))
