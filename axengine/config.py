"""What an ax process is built from: an :class:`AxConfig`, read from the settings layer.

The values come from :mod:`axengine.settings` (flags > ``AX_*`` environment >
``ax.toml`` > defaults; docs/configuration.md). The variables of earlier versions keep
their meaning:

| variable        | setting               | default                      |
|-----------------|-----------------------|------------------------------|
| ``AX_HOME``     | ``home``              | ``.ax``                      |
| ``AX_STORE``    | ``store``             | ``sqlite:///$AX_HOME/ax.db`` |
| ``AX_QUEUE``    | ``queue``             | ``memory://``                |
| ``AX_BLOBS``    | ``blobs``             | ``$AX_HOME/blobs``           |
| ``AX_PREFIX``   | ``prefix``            | ``/ax``                      |
| ``AX_MAIL_DIR`` | ``handlers.mail_dir`` | ``$AX_HOME/mail``            |
| ``AX_SMTP_URL`` | ``handlers.smtp_url`` | (unset: local mailbox)       |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from axengine.settings import DEFAULT_PREFIX, AxSettings, WorkerSettings, load_settings

__all__ = ["DEFAULT_PREFIX", "AxConfig"]

#: ``AxConfig`` field → setting name, for the overrides ``from_env`` takes as flags.
_FLAG_NAMES = {"home": "home", "store_url": "store", "queue_url": "queue",
               "blob_dir": "blobs", "prefix": "prefix", "server": "server",
               "token_file": "token_file"}


@dataclass(frozen=True)
class AxConfig:
    """Where state, queue and blobs live, and what handlers are told."""

    home: Path = Path(".ax")
    store_url: str = ""
    queue_url: str = "memory://"
    blob_dir: Path | None = None
    prefix: str = DEFAULT_PREFIX
    handler_settings: Mapping[str, Any] = field(default_factory=dict)
    #: URL of a remote ``ax api`` (``server``); empty: none.
    server: str = ""
    #: File holding the bearer token for ``server``.
    token_file: Path | None = None
    #: ``[worker]``: how an executor of this process shares its slots between lanes.
    worker: WorkerSettings = field(default_factory=WorkerSettings)

    @property
    def resolved_store_url(self) -> str:
        # (the resolved path is absolute: its leading slash is the URL's third)
        return self.store_url or f"sqlite://{(self.home / 'ax.db').resolve()}"

    @property
    def resolved_blob_dir(self) -> Path:
        return self.blob_dir or self.home / "blobs"

    @property
    def resolved_handler_settings(self) -> dict[str, Any]:
        """Handler settings with the local mailbox under ``home`` by default."""
        return {"mail_dir": str(self.home / "mail"), **self.handler_settings}

    @classmethod
    def from_settings(cls, settings: AxSettings) -> AxConfig:
        """The configuration the validated ``settings`` describe."""
        return cls(home=settings.home, store_url=settings.store, queue_url=settings.queue,
                   blob_dir=settings.blobs, prefix=settings.prefix,
                   handler_settings=settings.handler_settings(), server=settings.server,
                   token_file=settings.token_file, worker=settings.worker)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AxConfig:
        """Build from the settings layer: ``overrides`` (flags; None values ignored) >
        ``AX_*`` variables of ``env`` (default ``os.environ``) > ``ax.toml`` > defaults.

        Raises:
            SettingsError: A bad ax.toml, variable or override (the message says where).
        """
        flags = {_FLAG_NAMES[k]: v for k, v in overrides.items() if k in _FLAG_NAMES}
        config = cls.from_settings(load_settings(env=env, flags=flags).settings)
        extra = {k: v for k, v in overrides.items() if v is not None and k not in _FLAG_NAMES}
        return replace(config, **extra) if extra else config
