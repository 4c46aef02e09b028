"""Result cache for deterministic (temperature 0) model calls.

Entries live in a bounded in-memory LRU and, when the ``llm_cache_dir`` setting names a
directory, also as one small JSON file per key there, so a retried or resumed task on
another worker (or after a restart) reuses the answer instead of paying for it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CACHE_ENTRIES", "ResultCache", "cache_key"]

#: Completions kept in memory per process.
DEFAULT_CACHE_ENTRIES = 512


def cache_key(model: str, prompt: str, *, temperature: float, max_tokens: int | None) -> str:
    """sha256 over the model, the full prompt (input included) and the call parameters."""
    canonical = json.dumps(
        {"model": model, "prompt": prompt, "temperature": temperature, "max_tokens": max_tokens},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class ResultCache:
    """Completions by :func:`cache_key`. Thread-safe.

    Args:
        max_entries: In-memory LRU bound.
    """

    def __init__(self, *, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self._max = max_entries
        self._memory: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, directory: str | os.PathLike[str] | None = None) -> str | None:
        """The cached completion, from memory first, then from ``directory``."""
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return self._memory[key]
        if directory is None:
            return None
        try:
            data: Any = json.loads((Path(directory) / f"{key}.json").read_text("utf-8"))
        except (OSError, ValueError):
            # Missing or torn file: a miss, the call simply runs.
            return None
        completion = data.get("completion") if isinstance(data, dict) else None
        if not isinstance(completion, str):
            return None
        self._remember(key, completion)
        return completion

    def put(self, key: str, completion: str, directory: str | os.PathLike[str] | None = None,
            *, model: str = "") -> None:
        """Store a completion in memory and, when given, atomically in ``directory``."""
        self._remember(key, completion)
        if directory is None:
            return
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"model": model, "completion": completion}, fh, ensure_ascii=False)
            # Rename is atomic: a concurrent reader sees the old state or the whole entry.
            os.replace(tmp, target / f"{key}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def clear(self) -> None:
        """Drop the in-memory entries (files in cache directories are left alone)."""
        with self._lock:
            self._memory.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._memory)

    def _remember(self, key: str, completion: str) -> None:
        with self._lock:
            self._memory[key] = completion
            self._memory.move_to_end(key)
            while len(self._memory) > self._max:
                self._memory.popitem(last=False)
