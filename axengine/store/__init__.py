"""State stores: the ``StateStore`` protocol and its implementations.

``axengine.store.embedded.SqliteStore`` (embedded default) and
``axengine.store.etcd.EtcdStore`` (scaled out) implement the same contract, checked by one
conformance suite (``tests/store/test_conformance.py``). Both are exported here lazily,
so ``import axengine.store`` loads neither SQLite nor gRPC until one is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from axengine.store._protocol import (
    Compare,
    Create,
    Delete,
    Get,
    KeyValue,
    Mod,
    Op,
    Put,
    StateStore,
    StoreWrapper,
    TxnResult,
    Value,
    Version,
    WatchEvent,
)

if TYPE_CHECKING:
    from axengine.store.embedded import SqliteStore
    from axengine.store.etcd import EtcdStore
    from axengine.store.settings import EtcdSettings, SqliteSettings

__all__ = [
    "Compare",
    "Create",
    "Delete",
    "EtcdSettings",
    "EtcdStore",
    "Get",
    "KeyValue",
    "Mod",
    "Op",
    "Put",
    "SqliteSettings",
    "SqliteStore",
    "StateStore",
    "StoreWrapper",
    "TxnResult",
    "Value",
    "Version",
    "WatchEvent",
]

_LAZY = {
    "EtcdSettings": "axengine.store.settings",
    "EtcdStore": "axengine.store.etcd",
    "SqliteSettings": "axengine.store.settings",
    "SqliteStore": "axengine.store.embedded",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'axengine.store' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
