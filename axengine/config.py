"""Settings of an ax process, read from the environment once, here and nowhere else.

| variable        | default                      | meaning                                   |
|-----------------|------------------------------|-------------------------------------------|
| ``AX_HOME``     | ``.ax``                      | directory of the embedded store and blobs |
| ``AX_STORE``    | ``sqlite:///$AX_HOME/ax.db`` | ``sqlite:///path`` or ``etcd://h:2379``   |
| ``AX_QUEUE``    | ``memory://``                | ``memory://`` or ``redis://h:6379/0``     |
| ``AX_BLOBS``    | ``$AX_HOME/blobs``           | blob directory (content-addressed)        |
| ``AX_PREFIX``   | ``/ax``                      | root of every store key                   |
| ``AX_MAIL_DIR`` | ``$AX_HOME/mail``            | local mailbox when no SMTP is configured  |
| ``AX_SMTP_URL`` | (unset)                      | ``smtp://host:port`` for real email       |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PREFIX", "AxConfig"]

#: Default root of every key ax writes to the state store (``AX_PREFIX``).
DEFAULT_PREFIX = "/ax"


@dataclass(frozen=True)
class AxConfig:
    """Where state, queue and blobs live, and what handlers are told."""

    home: Path = Path(".ax")
    store_url: str = ""
    queue_url: str = "memory://"
    blob_dir: Path | None = None
    prefix: str = DEFAULT_PREFIX
    handler_settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{(self.home / 'ax.db').resolve()}"

    @property
    def resolved_blob_dir(self) -> Path:
        return self.blob_dir or self.home / "blobs"

    @property
    def resolved_handler_settings(self) -> dict[str, Any]:
        """Handler settings with the local mailbox under ``home`` by default."""
        return {"mail_dir": str(self.home / "mail"), **self.handler_settings}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AxConfig:
        """Build from ``AX_*`` variables (see the module docstring), then ``overrides``
        (None values ignored)."""
        env = os.environ if env is None else env
        home = Path(env.get("AX_HOME", ".ax"))
        if overrides.get("home") is not None:
            home = Path(overrides["home"])
        settings: dict[str, Any] = {}
        if env.get("AX_MAIL_DIR"):
            settings["mail_dir"] = env["AX_MAIL_DIR"]
        if env.get("AX_SMTP_URL"):
            settings["smtp_url"] = env["AX_SMTP_URL"]
        config = cls(
            home=home,
            store_url=env.get("AX_STORE", ""),
            queue_url=env.get("AX_QUEUE", "memory://"),
            blob_dir=Path(env["AX_BLOBS"]) if env.get("AX_BLOBS") else None,
            prefix=env.get("AX_PREFIX", DEFAULT_PREFIX),
            handler_settings=settings,
        )
        extra = {k: v for k, v in overrides.items() if v is not None and k != "home"}
        return replace(config, **extra) if extra else config
