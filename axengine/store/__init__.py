"""State stores: the ``StateStore`` protocol and its implementations.

``axengine.store.embedded.SqliteStore`` (embedded default) and
``axengine.store.etcd.EtcdStore`` (scaled out) implement the same contract, checked by one
conformance suite (``tests/store/test_conformance.py``).
"""

from __future__ import annotations

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
    TxnResult,
    Value,
    Version,
    WatchEvent,
)

__all__ = [
    "Compare",
    "Create",
    "Delete",
    "Get",
    "KeyValue",
    "Mod",
    "Op",
    "Put",
    "StateStore",
    "TxnResult",
    "Value",
    "Version",
    "WatchEvent",
]
