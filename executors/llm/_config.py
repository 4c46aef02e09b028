"""The ``[llm]`` configuration: which provider serves which model, with what key.

Handlers find it in ``ctx.settings["llm"]`` (the config layer fills it from the ``[llm]``
table of ``ax.toml`` and ``AX_LLM__…`` variables). While no such mapping is passed, it
is read from the environment here — ``AX_LLM__…`` variables, with ``__`` separating
levels (``AX_LLM__ENDPOINTS__LOCAL__BASE_URL``) — and the older flat handler settings
(``llm_provider``, ``llm_base_url``, ``llm_api_key``, ``llm_timeout``) fill what it
leaves unset.

Routing of one model (:meth:`LlmSettings.route`):

1. a model listed under ``endpoints.<name>.models`` is served by that endpoint (its
   ``provider``, default ``openai``);
2. any other model by the default endpoint — the top-level ``base_url`` / key fields,
   else ``$OPENAI_BASE_URL`` / ``$OPENAI_API_KEY`` — with the top-level ``provider``;
   unset, that is ``openai`` when a base URL or key is known and ``simulated`` (offline,
   the default) otherwise.

``$OPENAI_API_KEY`` is only ever sent to ``$OPENAI_BASE_URL`` or OpenAI itself: an
endpoint with a ``base_url`` of its own gets only the key configured for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

__all__ = [
    "BASE_URL_ENV",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT",
    "ENV_PREFIX",
    "KEY_ENV",
    "EndpointSettings",
    "LlmConfigError",
    "LlmSettings",
    "ProviderName",
    "Route",
    "llm_settings",
]

ProviderName = Literal["simulated", "openai"]

#: Seconds per model call (``llm.timeout``).
DEFAULT_TIMEOUT = 60.0
#: Retries inside the OpenAI client (``llm.max_retries``). 0: a throttled or failing call
#: comes back to ax at once, which keeps the node WAITING with the evidence instead of
#: sleeping invisibly inside an attempt.
DEFAULT_MAX_RETRIES = 0
#: Prefix of the interim environment reader.
ENV_PREFIX = "AX_LLM__"
#: The OpenAI client's own variables, honoured by the default endpoint.
BASE_URL_ENV = "OPENAI_BASE_URL"
KEY_ENV = "OPENAI_API_KEY"

_LEGACY = {"llm_provider": "provider", "llm_base_url": "base_url",
           "llm_api_key": "api_key", "llm_timeout": "timeout"}


class LlmConfigError(ValueError):
    """The ``llm`` configuration is invalid; the message names the field and the fix."""


def _names(value: Any) -> Any:
    # "a, b" from an environment variable means the list ["a", "b"].
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


class _KeySource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str | None = None
    api_key: SecretStr | None = None
    api_key_env: str | None = None
    api_key_file: Path | None = None
    default_headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value

    def _key(self, where: str, env: Mapping[str, str]) -> str | None:
        given = [n for n in ("api_key", "api_key_env", "api_key_file") if getattr(self, n)]
        if len(given) > 1:
            raise LlmConfigError(f"{where}: set only one of {', '.join(given)}")
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env:
            key = env.get(self.api_key_env, "").strip()
            if not key:
                raise LlmConfigError(
                    f"{where}.api_key_env names ${self.api_key_env}, which is not set"
                )
            return key
        if self.api_key_file:
            try:
                key = self.api_key_file.expanduser().read_text().strip()
            except OSError as exc:
                raise LlmConfigError(
                    f"{where}.api_key_file {self.api_key_file}: {exc.strerror or exc}"
                ) from None
            if not key:
                raise LlmConfigError(f"{where}.api_key_file {self.api_key_file} is empty")
            return key
        return None


class EndpointSettings(_KeySource):
    """One named endpoint (``llm.endpoints.<name>``).

    Attributes:
        base_url: Endpoint root, e.g. ``http://127.0.0.1:8000/v1`` (unset: OpenAI, or
            ``$OPENAI_BASE_URL``).
        api_key: The key itself; or ``api_key_env`` (a variable holding it) or
            ``api_key_file`` (a file holding it) — at most one of the three.
        provider: ``openai`` (any OpenAI-compatible endpoint) or ``simulated``.
        models: Model names this endpoint serves; they become valid DAG model names.
        default_headers: Extra HTTP headers on every request.
        timeout: Seconds per call (default: ``llm.timeout``).
        max_retries: Client retries (default: ``llm.max_retries``).
    """

    provider: ProviderName = "openai"
    models: tuple[str, ...] = ()
    timeout: float | None = Field(default=None, gt=0)
    max_retries: int | None = Field(default=None, ge=0)

    @field_validator("models", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _names(value)


class LlmSettings(_KeySource):
    """The ``llm`` table.

    Attributes:
        provider: Provider of models no endpoint lists: ``simulated`` or ``openai``
            (unset: ``openai`` when a base URL or key is configured or in
            ``$OPENAI_BASE_URL`` / ``$OPENAI_API_KEY``, else ``simulated``).
        base_url: The default endpoint's root (unset: ``$OPENAI_BASE_URL``, then OpenAI).
        api_key: The default endpoint's key (or ``api_key_env`` / ``api_key_file``;
            none of them: ``$OPENAI_API_KEY`` unless ``base_url`` is set here).
        endpoints: Named endpoints, each serving the models it lists.
        models: Extra model names (served by the default endpoint).
        system_prompt: System message sent before every prompt (OpenAI provider).
        timeout: Seconds per model call.
        max_retries: Retries inside the OpenAI client.
        json_mode: ``auto`` sends ``response_format={"type": "json_object"}`` when the
            prompt mentions JSON; ``off`` never does (for servers that reject it).
        usage_in_output: Add ``_llm: {model, endpoint, usage}`` to object outputs.
    """

    provider: ProviderName | None = None
    endpoints: dict[str, EndpointSettings] = Field(default_factory=dict)
    models: tuple[str, ...] = ()
    system_prompt: str | None = None
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0)
    max_retries: int = Field(default=DEFAULT_MAX_RETRIES, ge=0)
    json_mode: Literal["auto", "off"] = "auto"
    usage_in_output: bool = True

    @field_validator("models", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _names(value)

    def model_names(self) -> frozenset[str]:
        """Every model named here: ``models`` and each endpoint's ``models``."""
        names = set(self.models)
        for endpoint in self.endpoints.values():
            names.update(endpoint.models)
        return frozenset(names)

    def endpoint_of(self, model: str) -> str | None:
        """Name of the endpoint listing ``model`` (the first by name), or None."""
        for name in sorted(self.endpoints):
            if model in self.endpoints[name].models:
                return name
        return None

    def route(self, model: str, env: Mapping[str, str] | None = None) -> Route:
        """Where a call of ``model`` goes.

        Raises:
            LlmConfigError: A key source that cannot be read.
        """
        env = os.environ if env is None else env
        name = self.endpoint_of(model)
        if name is not None:
            endpoint = self.endpoints[name]
            where = f"llm.endpoints.{name}"
            base_url = endpoint.base_url or env.get(BASE_URL_ENV) or None
            key = endpoint._key(where, env)
            if key is None and endpoint.base_url is None:
                key = env.get(KEY_ENV) or None
            return Route(
                provider=endpoint.provider, model=model, endpoint=name, base_url=base_url,
                api_key=key, default_headers=dict(endpoint.default_headers),
                timeout=endpoint.timeout or self.timeout,
                max_retries=self.max_retries if endpoint.max_retries is None
                else endpoint.max_retries,
                key_source=_source(endpoint, where, env),
            )
        key = self._key("llm", env)
        if key is None and self.base_url is None:
            key = env.get(KEY_ENV) or None
        base_url = self.base_url or env.get(BASE_URL_ENV) or None
        provider = self.provider or ("openai" if base_url or key else "simulated")
        return Route(
            provider=provider, model=model, endpoint="default", base_url=base_url,
            api_key=key, default_headers=dict(self.default_headers), timeout=self.timeout,
            max_retries=self.max_retries, key_source=_source(self, "llm", env),
        )


def _source(where_from: _KeySource, where: str, env: Mapping[str, str]) -> str:
    # Named in error messages instead of the key itself.
    if where_from.api_key is not None:
        return f"{where}.api_key"
    if where_from.api_key_env:
        return f"${where_from.api_key_env}"
    if where_from.api_key_file:
        return f"{where}.api_key_file"
    return f"${KEY_ENV}" if env.get(KEY_ENV) else "no key"


@dataclass(frozen=True)
class Route:
    """The resolved destination of one model's calls.

    Attributes:
        provider: ``simulated`` or ``openai``.
        model: Model name.
        endpoint: Endpoint name (``default`` for the top-level one).
        base_url: Endpoint root (None: the OpenAI client's default).
        api_key: Bearer key (None: none configured). Never printed.
        default_headers: Extra headers.
        timeout: Seconds per call.
        max_retries: Client retries.
        key_source: Where the key came from, for error messages.
    """

    provider: ProviderName
    model: str
    endpoint: str
    base_url: str | None
    api_key: str | None = field(repr=False)
    default_headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES
    key_source: str = "no key"


def llm_settings(
    settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> LlmSettings:
    """The validated ``llm`` configuration of a handler's settings.

    Args:
        settings: ``ctx.settings``; its ``llm`` mapping wins, the legacy flat keys fill
            what it leaves unset. No ``llm`` mapping: ``AX_LLM__…`` from ``env``.
        env: Environment (default ``os.environ``).

    Raises:
        LlmConfigError: The configuration does not validate; the message names the field.
    """
    settings = settings or {}
    env = os.environ if env is None else env
    raw = settings.get("llm")
    if raw is None:
        table: dict[str, Any] = _from_env(env)
    elif isinstance(raw, Mapping):
        table = dict(raw)
    elif isinstance(raw, LlmSettings):
        table = raw.model_dump(exclude_unset=True)
    else:
        raise LlmConfigError(f"llm settings must be a table, got {type(raw).__name__}")
    legacy: dict[str, str] = {}
    for old, new in _LEGACY.items():
        if settings.get(old) is not None and new not in table:
            table[new] = settings[old]
            legacy[new] = old
    try:
        return LlmSettings.model_validate(table)
    except ValidationError as exc:
        raise LlmConfigError(_explain(exc, legacy)) from None


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or not env[name]:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__") if part]
        if not path:
            continue
        node = table
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise LlmConfigError(f"${name} conflicts with another AX_LLM__ variable")
            node = child
        node[path[-1]] = _env_value(env[name])
    return table


def _env_value(text: str) -> Any:
    if text.lstrip().startswith(("[", "{")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _explain(exc: ValidationError, legacy: Mapping[str, str]) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in ("llm", *error["loc"]))
        if error["loc"] and str(error["loc"][0]) in legacy:
            where = f"setting {legacy[str(error['loc'][0])]} ({where})"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown setting (see docs/executors.md, LLM configuration)"
        elif error["type"] == "literal_error":
            message = f"{message}, got {error.get('input')!r}"
        problems.append(f"{where}: {message}")
    return "invalid llm configuration: " + "; ".join(problems)
