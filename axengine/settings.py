"""The one configuration layer of ax: ``ax.toml``, ``AX_*`` variables and flags.

Every setting has one name, used everywhere: ``home`` is ``home = ".ax"`` in
``ax.toml``, ``AX_HOME`` in the environment and ``--home`` on the command line;
``handlers.egress_allowed_hosts`` is ``egress_allowed_hosts`` under ``[handlers]``,
``AX_HANDLERS__EGRESS_ALLOWED_HOSTS`` in the environment (``__`` nests). Precedence,
highest first::

    flags  >  AX_* environment  >  ax.toml  >  defaults

The file is the one named by ``--config FILE`` (see :func:`use_config_file`), else by
``AX_CONFIG``, else ``ax.toml`` in the working directory when it exists. The variables
``AX_MAIL_DIR`` and ``AX_SMTP_URL`` of earlier versions still set
``handlers.mail_dir`` and ``handlers.smtp_url`` (below ``AX_HANDLERS__*``). Relative
paths are relative to the working directory, wherever they come from.

:func:`load_settings` returns the validated :class:`AxSettings` with the source of
every value (``ax config show`` prints them); :class:`~axengine.config.AxConfig` is
built from it. Errors::

    AxError
     └── SettingsError     a bad ax.toml, AX_* variable or flag (names file:line / variable)

The full format: docs/configuration.md.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from axengine.credentials import MASK, redact_url
from axengine.errors import AxError
from axengine.limits import FileTooLarge, NotRegularFile, read_regular
from axengine.queue import DEFAULT_AGING_SECONDS, DEFAULT_FAST_SHARE

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILE_NAME",
    "DEFAULT_PREFIX",
    "ENV_PREFIX",
    "LEGACY_HANDLER_ENV",
    "AxSettings",
    "HandlerSettings",
    "LoadedSettings",
    "SettingsError",
    "ToolsSettings",
    "WorkerSettings",
    "config_file_in_use",
    "display_value",
    "load_settings",
    "use_config_file",
]

#: Default root of every key ax writes to the state store (``prefix``).
DEFAULT_PREFIX = "/ax"
#: Prefix of every environment variable of the layer.
ENV_PREFIX = "AX_"
#: Variable naming the configuration file (``--config FILE`` wins over it).
CONFIG_ENV = "AX_CONFIG"
#: File looked up in the working directory when neither names one.
CONFIG_FILE_NAME = "ax.toml"
#: Variables of earlier versions, each setting one handler setting.
LEGACY_HANDLER_ENV: Mapping[str, str] = {"AX_MAIL_DIR": "mail_dir", "AX_SMTP_URL": "smtp_url"}

#: Key words that make a free-form (``[llm]``) value a secret in ``ax config show``.
_SECRET_WORDS = ("key", "password", "secret", "token")


class SettingsError(AxError):
    """A bad configuration value or file; the message names where it came from."""


class HandlerSettings(BaseModel):
    """``[handlers]``: the settings node handlers receive (docs/executors.md#settings).

    Unset (None) means the handler's own default. Names and shapes are exactly what
    the handlers read from ``ctx.settings``.
    """

    model_config = ConfigDict(extra="forbid")

    heartbeat_interval: float | None = None
    simulate: dict[str, Any] | None = None
    llm_provider: str | None = None
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = None
    llm_timeout: float | None = None
    llm_max_response_bytes: int | None = None
    llm_cache_dir: str | None = None
    llm_circuit_failures: int | None = None
    llm_circuit_cooldown: float | None = None
    trust: Literal["api", "local"] | None = None
    egress_allowed_hosts: list[str] | None = None
    egress_private_allowed: list[str] | None = None
    input_root: str | None = None
    mail_allowed_recipients: list[str] | None = None
    tool_policy: dict[str, dict[str, Any]] | None = None
    http_max_bytes: int | None = None
    http_timeout: float | None = None
    pdf_max_bytes: int | None = None
    pdf_timeout: float | None = None
    smtp_url: SecretStr | None = None
    smtp_timeout: float | None = None
    mail_dir: str | None = None
    mail_from: str | None = None
    video_vendor: dict[str, float] | None = None


class ToolsSettings(BaseModel):
    """``[tools]``: extra tool modules, passed to handlers as ``tool_modules``."""

    model_config = ConfigDict(extra="forbid")

    modules: list[str] = []


class WorkerSettings(BaseModel):
    """``[worker]``: how the executor of a process shares its slots between lanes
    (docs/queues.md#lanes)."""

    model_config = ConfigDict(extra="forbid")

    #: Share of the executor's concurrency the fast lane is served first in (rounded
    #: down, at least one slot; 1.0: every slot). Above it a freed slot takes other
    #: lanes' work first and fast work only when none waits.
    fast_share: float = Field(default=DEFAULT_FAST_SHARE, gt=0, le=1)
    #: Seconds after which a waiting item is served before every lane and priority.
    aging_seconds: float = Field(default=DEFAULT_AGING_SECONDS, ge=0)


class AxSettings(BaseSettings):
    """Every setting of an ax process. Build it with :func:`load_settings`.

    ``AxSettings()`` reads the same layers (flags excepted) without recording sources.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", env_ignore_empty=True,
        extra="forbid", case_sensitive=False)

    home: Path = Path(".ax")
    #: ``sqlite:///path`` or ``etcd://host:2379``; empty: SQLite under ``home``.
    store: str = ""
    queue: str = "memory://"
    #: Blob directory; unset: ``home/blobs``.
    blobs: Path | None = None
    prefix: str = DEFAULT_PREFIX
    #: URL of a remote ``ax api`` the CLI talks to (``http://127.0.0.1:8080``).
    server: str = ""
    #: File holding the bearer token for ``server`` (never the token itself).
    token_file: Path | None = None
    #: Log lines of ``ax server``, ``ax api`` and ``ax executor`` on stderr: ``text`` or
    #: ``json`` (one object per line; docs/observability.md#logs).
    log_format: Literal["text", "json"] = "text"
    #: ``ax server`` and ``ax api``: one INFO line per HTTP request, whatever the log level.
    access_log: bool = True
    #: ``ax executor``: ``HOST:PORT`` serving its ``/metrics`` (port 0: any free port);
    #: empty or ``off``: none.
    metrics_address: str = ""
    handlers: HandlerSettings = HandlerSettings()
    #: Free-form; its schema belongs to executors/llm. Passed as ``handler_settings["llm"]``.
    llm: dict[str, Any] = {}
    tools: ToolsSettings = ToolsSettings()
    worker: WorkerSettings = WorkerSettings()

    @field_validator("metrics_address")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        if value.strip().lower() in ("", "off", "none"):
            return ""
        host, sep, port = value.rpartition(":")
        if not sep or not host.strip("[]") or not port.isdigit() or int(port) > 65535:
            raise ValueError("use HOST:PORT (port 0: any free port), e.g. 127.0.0.1:9464, "
                             "or off")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = os.environ
        return (init_settings, env_settings, _DictSource(settings_cls, _legacy_env(env)),
                _DictSource(settings_cls, _read_toml(_config_path(env))[0]))

    def handler_settings(self) -> dict[str, Any]:
        """What handlers receive as ``ctx.settings``: set ``[handlers]`` keys (secrets
        revealed), ``llm`` and ``tool_modules`` when given."""
        out: dict[str, Any] = {}
        for name, value in self.handlers.model_dump(exclude_none=True).items():
            out[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
        if self.llm:
            out["llm"] = dict(self.llm)
        if self.tools.modules:
            out["tool_modules"] = list(self.tools.modules)
        return out


@dataclass(frozen=True)
class LoadedSettings:
    """Validated settings with the source of each value.

    Attributes:
        settings: The effective settings.
        sources: Dotted key (``handlers.trust``, ``llm.base_url``) → ``default``, the
            ax.toml path (with ``:line`` when known), the variable name, or ``flag``.
        config_file: The ax.toml read, if any.
    """

    settings: AxSettings
    sources: Mapping[str, str] = field(default_factory=dict)
    config_file: Path | None = None

    def source_of(self, key: str) -> str:
        return self.sources.get(key, "default")

    def rows(self) -> list[tuple[str, Any, str]]:
        """Every setting as (dotted key, value as displayed, source), in model order;
        secrets masked (:func:`display_value`)."""
        return [(key, display_value(key, value), self.source_of(key))
                for key, value in _walk(self.settings)]


def _walk(settings: AxSettings) -> Iterator[tuple[str, Any]]:
    for name in AxSettings.model_fields:
        value = getattr(settings, name)
        if isinstance(value, BaseModel):
            for sub in type(value).model_fields:
                yield f"{name}.{sub}", getattr(value, sub)
        elif name == "llm":
            yield from _flatten(value, "llm.")
        else:
            yield name, value


def _flatten(data: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


# --- the file named by --config -------------------------------------------------------

_active_config_file: Path | None = None


def use_config_file(path: str | Path | None) -> None:
    """Make ``path`` the configuration file of this process (``ax --config FILE``);
    None goes back to ``AX_CONFIG`` / ``./ax.toml``."""
    global _active_config_file
    _active_config_file = Path(path) if path is not None else None


def config_file_in_use(env: Mapping[str, str] | None = None) -> Path | None:
    """The ax.toml the settings come from: ``--config``, ``AX_CONFIG``, ``./ax.toml``."""
    return _config_path(os.environ if env is None else env)


def _config_path(env: Mapping[str, str]) -> Path | None:
    if _active_config_file is not None:
        return _active_config_file
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    local = Path(CONFIG_FILE_NAME)
    return local if local.is_file() else None


# --- the layers --------------------------------------------------------------------------


class _DictSource(PydanticBaseSettingsSource):
    """A layer already read into a mapping (ax.toml, legacy variables)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


class _MappingEnvSource(EnvSettingsSource):
    """The ``AX_*`` layer read from a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items()
                if k.upper().startswith(ENV_PREFIX) and not (self.env_ignore_empty and v == "")}


def _legacy_env(env: Mapping[str, str]) -> dict[str, Any]:
    handlers = {name: env[var] for var, name in LEGACY_HANDLER_ENV.items() if env.get(var)}
    return {"handlers": handlers} if handlers else {}


_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'. ]+?)\s*=")


def _line_index(text: str) -> dict[str, int]:
    """Dotted key → line number of its definition (best effort: plain TOML layouts)."""
    index: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        if m := _TABLE.match(line):
            table = m.group(1).replace('"', "").replace("'", "").replace(" ", "")
            index.setdefault(table, number)
        elif m := _KEY.match(line):
            key = m.group(1).replace('"', "").replace("'", "").replace(" ", "")
            index.setdefault(f"{table}.{key}" if table else key, number)
    return index


#: Largest configuration file read (an ax.toml is a few KiB).
MAX_CONFIG_BYTES = 1024 * 1024


def _read_toml(path: Path | None) -> tuple[dict[str, Any], dict[str, int]]:
    """The file's tables and its line index; nothing when ``path`` is None."""
    if path is None:
        return {}, {}
    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise SettingsError(f"configuration file {path}: {exc.strerror or exc}") from None
    except NotRegularFile:
        raise SettingsError(f"configuration file {path}: not a regular file") from None
    except FileTooLarge:
        raise SettingsError(f"configuration file {path}: larger than {MAX_CONFIG_BYTES} bytes"
                            ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SettingsError(f"configuration file {path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text), _line_index(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"configuration file {path}: not valid TOML: {exc}") from None


#: Settings whose value is itself a mapping: one value, one source, replaced as a whole
#: by a higher layer.
_MAPPING_LEAVES = frozenset({"handlers.simulate", "handlers.tool_policy",
                             "handlers.video_vendor"})


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any], prefix: str,
                sources: dict[str, str], source: str) -> None:
    """Merge ``over`` into ``base`` table by table, noting ``source`` for each value."""
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and dotted not in _MAPPING_LEAVES:
            if not isinstance(base.get(key), dict):
                base[key] = {}
            _deep_merge(base[key], value, f"{dotted}.", sources, source)
        else:
            base[key] = value
            sources[dotted] = source


def _env_name(dotted: str, env: Mapping[str, str]) -> str:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ENV_PREFIX + "__".join(parts[:n]).upper()
        if any(k.upper() == name for k in env):
            return name
    return ENV_PREFIX + "__".join(parts).upper()


def load_settings(*, env: Mapping[str, str] | None = None,
                  flags: Mapping[str, Any] | None = None,
                  config_file: str | Path | None = None) -> LoadedSettings:
    """Read every layer, validate, and record where each value came from.

    Args:
        env: The environment (default ``os.environ``).
        flags: Command-line values by setting name (``{"home": ...}``); None values are
            ignored (a flag not given).
        config_file: The ax.toml to read (default: ``--config``, ``AX_CONFIG``,
            ``./ax.toml``).

    Raises:
        SettingsError: A value is malformed or a key unknown; the message names the
            file and line, the variable or the flag, with a did-you-mean for a typo.
    """
    env = os.environ if env is None else env
    path = Path(config_file) if config_file is not None else _config_path(env)
    file_data, lines = _read_toml(path)
    env_data = _MappingEnvSource(AxSettings, env)()
    flag_data = {k: v for k, v in (flags or {}).items() if v is not None}

    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    _deep_merge(merged, file_data, "", sources, str(path))
    for dotted in list(sources):
        if sources[dotted] == str(path) and dotted in lines:
            sources[dotted] = f"{path}:{lines[dotted]}"
    for var, name in LEGACY_HANDLER_ENV.items():
        if env.get(var):
            _deep_merge(merged, {"handlers": {name: env[var]}}, "", sources, var)
    env_sources: dict[str, str] = {}
    _deep_merge(merged, env_data, "", env_sources, "env")
    sources.update({k: _env_name(k, env) for k in env_sources})
    _deep_merge(merged, flag_data, "", sources, "flag")
    try:
        settings = AxSettings.model_validate(merged)
    except ValidationError as exc:
        raise SettingsError(_explain(exc, sources, path)) from None
    return LoadedSettings(settings=settings, sources=sources, config_file=path)


def _explain(exc: ValidationError, sources: Mapping[str, str], path: Path | None) -> str:
    problems = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        dotted = ".".join(loc)
        where = _where(dotted, sources)
        if error["type"] == "extra_forbidden":
            known = _known_keys(loc[:-1])
            hint = difflib.get_close_matches(loc[-1], known, n=1)
            suggestion = f" (did you mean {'.'.join([*loc[:-1], hint[0]])}?)" if hint else \
                f" (known: {', '.join(sorted(known))})"
            problems.append(f"{where}: unknown key {dotted}{suggestion}")
        else:
            problems.append(f"{where}: {dotted}: {error['msg']}")
    head = "bad configuration" + (f" ({path})" if path else "")
    return head + ":\n  " + "\n  ".join(problems)


def _where(dotted: str, sources: Mapping[str, str]) -> str:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        found = sources.get(".".join(parts[:n]))
        if found:
            return "--" + parts[0].replace("_", "-") if found == "flag" else found
    return "default"


def _known_keys(table: list[str]) -> list[str]:
    model: type[BaseModel] = AxSettings
    for name in table:
        annotation = model.model_fields[name].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def display_value(key: str, value: Any) -> Any:
    """``value`` as ``ax config show`` prints it: secrets masked, URL passwords too."""
    if isinstance(value, SecretStr):
        raw = value.get_secret_value()
        return redact_url(raw) if "://" in raw else MASK
    last = key.rsplit(".", 1)[-1].lower()
    if key.startswith("llm.") and any(word in last for word in _SECRET_WORDS) and value:
        return MASK
    if isinstance(value, str) and "://" in value:
        return redact_url(value)
    if isinstance(value, Path):
        return str(value)
    return value
