"""A provider for any OpenAI-compatible ``/chat/completions`` endpoint, on the official
``openai`` client.

Where a model's calls go (base URL, key, headers, timeout, client retries) is its
:class:`~executors.llm._config.Route`, resolved from the ``llm`` configuration (see
:mod:`executors.llm._config`). One request per call::

    messages = [{"role": "system", "content": llm.system_prompt}?,   # when configured
                {"role": "user", "content": <rendered prompt + input>}]
    temperature, max_tokens, response_format={"type": "json_object"} when the prompt's
    instructions mention JSON (``llm.json_mode = "auto"``, the default)

Error mapping: connection errors, timeouts, 5xx and 429 mean the model is unavailable
(the node waits, the circuit breaker counts it; ``Retry-After`` goes into the evidence
and :attr:`ProviderUnavailable.retry_after`); 408 is a retryable error; 401/403 and any
other 4xx are requests the endpoint will never accept, so they are not retried. The key
never appears in a message: an error body that echoes it is redacted.

Proxies from the environment are ignored: the endpoint is named explicitly, and a stray
``http_proxy`` must not reroute prompts through a third party.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first use: it costs ~0.3 s, and most runs never call it
    import openai

from executors.llm._config import LlmConfigError, LlmSettings, Route, llm_settings
from executors.llm._prompt import asks_for_json, split_prompt
from executors.llm._provider import Completion, ProviderError, ProviderUnavailable
from executors.metrics import observe_llm_request

__all__ = ["DEFAULT_OPENAI_URL", "OpenAICompatibleProvider", "retry_after_seconds"]

#: Where the OpenAI client goes when neither the configuration nor ``$OPENAI_BASE_URL``
#: names an endpoint.
DEFAULT_OPENAI_URL = "https://api.openai.com/v1"

_ERROR_SNIPPET = 300
_CLIENTS_MAX = 32
_clients: dict[str, openai.OpenAI] = {}
_clients_lock = threading.Lock()


class OpenAICompatibleProvider:
    """Calls an OpenAI-compatible chat completions endpoint.

    Args:
        config: The ``llm`` configuration (None: resolved from each call's settings).
        env: Environment for key and URL fallbacks (None: ``os.environ``).
        headers: Sent with every call besides the route's own (the node attempt's W3C
            ``traceparent``: :func:`executors.llm.default_provider` builds one provider
            per attempt).
    """

    def __init__(
        self, *, config: LlmSettings | None = None, env: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._env = env
        self._headers = dict(headers or {})

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        temperature: float,
        max_tokens: int | None,
        settings: Mapping[str, Any],
    ) -> Completion:
        """See :class:`executors.llm.Provider`."""
        try:
            config = self._config or llm_settings(settings, self._env)
            route = config.route(model, self._env)
        except LlmConfigError as exc:
            raise ProviderError(str(exc), retryable=False) from None
        import openai

        url = route.base_url or DEFAULT_OPENAI_URL
        messages: list[dict[str, str]] = []
        if config.system_prompt:
            messages.append({"role": "system", "content": config.system_prompt})
        messages.append({"role": "user", "content": prompt})
        extra: dict[str, Any] = {}
        if max_tokens is not None:
            extra["max_tokens"] = max_tokens
        headers: dict[str, Any] = dict(self._headers)
        if route.api_key is None:
            # No key configured (a local server without auth): send no Authorization
            # header rather than a made-up bearer token.
            headers["Authorization"] = openai.Omit()
        if headers:
            extra["extra_headers"] = headers
        if config.json_mode == "auto" and asks_for_json(split_prompt(prompt)[0]):
            extra["response_format"] = {"type": "json_object"}
        client = _client(route)
        started = time.monotonic()
        try:
            response = client.chat.completions.create(
                model=model, messages=messages,  # type: ignore[arg-type]
                temperature=temperature, **extra,
            )
        except openai.APIStatusError as exc:
            raise _status_error(exc, route, url) from None
        except openai.APIConnectionError as exc:
            # Timeouts are APIConnectionErrors too: the endpoint did not answer.
            raise ProviderUnavailable(
                f"model {model!r} endpoint {url} unreachable: {_redact(str(exc), route)}"
            ) from None
        except openai.OpenAIError as exc:
            raise ProviderError(
                f"model {model!r} endpoint {url}: {_redact(str(exc), route)}", retryable=True
            ) from None
        finally:
            observe_llm_request(model, time.monotonic() - started)
        return _completion(response, route)


def _client(route: Route) -> openai.OpenAI:
    # One client (one connection pool) per destination; the key is part of the identity
    # only as a hash.
    import openai

    ident = hashlib.sha256(repr((
        route.base_url, route.api_key, sorted(route.default_headers.items()),
        route.timeout, route.max_retries,
    )).encode()).hexdigest()
    with _clients_lock:
        client = _clients.get(ident)
        if client is None:
            if len(_clients) >= _CLIENTS_MAX:
                _clients.pop(next(iter(_clients))).close()
            client = openai.OpenAI(
                api_key=route.api_key or "unused",
                base_url=route.base_url or DEFAULT_OPENAI_URL,
                timeout=route.timeout,
                max_retries=route.max_retries,
                default_headers=dict(route.default_headers),
                http_client=openai.DefaultHttpxClient(trust_env=False),
            )
            _clients[ident] = client
        return client


def _status_error(exc: openai.APIStatusError, route: Route, url: str) -> Exception:
    status = exc.status_code
    detail = _redact(_body_snippet(exc), route)
    seen = f"model {route.model!r} endpoint {url} answered HTTP {status}: {detail}"
    if status == 429 or status >= 500:
        wait = retry_after_seconds(exc.response.headers)
        if wait is not None:
            seen += f" (Retry-After: {wait:g}s)"
        return ProviderUnavailable(seen, retry_after=wait)
    if status in (401, 403):
        return ProviderError(
            f"model {route.model!r} endpoint {url} refused the API key from "
            f"{route.key_source} (HTTP {status}): {detail}; fix the key in the llm "
            "configuration",
            retryable=False,
        )
    return ProviderError(seen, retryable=status == 408)


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds named by ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            value = float(raw_ms) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        value = when.timestamp() - time.time()
    return max(0.0, value) if math.isfinite(value) else None


def _body_snippet(exc: openai.APIStatusError) -> str:
    try:
        text = exc.response.text
    except Exception:  # a body that cannot be decoded says nothing useful
        text = ""
    return " ".join(text.split())[:_ERROR_SNIPPET] or exc.message[:_ERROR_SNIPPET]


def _redact(text: str, route: Route) -> str:
    if route.api_key:
        text = text.replace(route.api_key, "***")
    return text


def _completion(response: Any, route: Route) -> Completion:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, TypeError) as exc:
        raise ProviderError(
            f"model {route.model!r} returned a response without choices[0].message.content",
            retryable=True,
        ) from exc
    if not isinstance(content, str):
        raise ProviderError(
            f"model {route.model!r} returned non-text content {type(content).__name__}",
            retryable=True,
        )
    usage = None
    if response.usage is not None:
        usage = {
            "prompt_tokens": int(response.usage.prompt_tokens or 0),
            "completion_tokens": int(response.usage.completion_tokens or 0),
            "total_tokens": int(response.usage.total_tokens or 0),
        }
    return Completion(content, usage=usage, endpoint=route.endpoint)
