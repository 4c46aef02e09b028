"""A provider for any OpenAI-compatible ``/chat/completions`` endpoint, over urllib.

Settings it reads (all optional except the URL):

``llm_base_url``
    e.g. ``http://127.0.0.1:8000/v1``; the provider POSTs to ``{llm_base_url}/chat/completions``.
``llm_api_key``
    Sent as ``Authorization: Bearer …`` when set.
``llm_timeout``
    Seconds for connect + response (default :data:`DEFAULT_TIMEOUT`).
``llm_max_response_bytes``
    Larger responses are refused (default :data:`DEFAULT_MAX_RESPONSE_BYTES`).

Status mapping: connection errors, timeouts, 5xx and 429 mean the model is unavailable
(the node waits, the circuit breaker counts it); 408 is a retryable error; any other 4xx
is a request the endpoint will never accept, so it is not retried.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from executors.llm._provider import ProviderError, ProviderUnavailable

__all__ = ["DEFAULT_MAX_RESPONSE_BYTES", "DEFAULT_TIMEOUT", "OpenAICompatibleProvider"]

#: Seconds to wait for the endpoint (setting ``llm_timeout``).
DEFAULT_TIMEOUT = 60.0
#: Largest accepted response body (setting ``llm_max_response_bytes``).
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024

_ERROR_SNIPPET = 300


class OpenAICompatibleProvider:
    """Calls an OpenAI-compatible chat completions endpoint.

    Args:
        base_url: Endpoint root; None means "take ``llm_base_url`` from the settings".
        api_key: Bearer token; None means "take ``llm_api_key`` from the settings".
    """

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None) -> None:
        self._base_url = base_url
        self._api_key = api_key
        # Proxies from the environment are ignored: the endpoint is named explicitly,
        # and a stray http_proxy must not reroute prompts through a third party.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        temperature: float,
        max_tokens: int | None,
        settings: Mapping[str, Any],
    ) -> str:
        """See :class:`executors.llm.Provider`."""
        base_url = self._base_url or settings.get("llm_base_url")
        if not base_url:
            raise ProviderError(
                "no llm_base_url configured for the OpenAI-compatible provider: set the "
                "llm_base_url setting or use the simulated provider",
                retryable=False,
            )
        url = str(base_url).rstrip("/") + "/chat/completions"
        payload: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": temperature,
        }
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        api_key = self._api_key or settings.get("llm_api_key")
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        request = urllib.request.Request(
            url, data=json.dumps(payload).encode(), headers=headers, method="POST"
        )
        timeout = float(settings.get("llm_timeout", DEFAULT_TIMEOUT))
        limit = int(settings.get("llm_max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES))
        body = self._post(request, model, url, timeout, limit)
        return _content(body, model)

    def _post(
        self, request: urllib.request.Request, model: str, url: str, timeout: float, limit: int
    ) -> bytes:
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return _read_bounded(response, limit, model)
        except urllib.error.HTTPError as exc:
            detail = _snippet(exc)
            status = exc.code
            if status >= 500 or status == 429:
                raise ProviderUnavailable(
                    f"model {model!r} endpoint {url} answered HTTP {status}: {detail}"
                ) from exc
            raise ProviderError(
                f"model {model!r} endpoint {url} answered HTTP {status}: {detail}",
                retryable=status == 408,
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            # URLError, timeouts and resets are all OSErrors: the endpoint is unreachable.
            reason = getattr(exc, "reason", exc)
            raise ProviderUnavailable(
                f"model {model!r} endpoint {url} unreachable: {reason}"
            ) from exc


def _read_bounded(response: Any, limit: int, model: str) -> bytes:
    data = bytes(response.read(limit + 1))
    if len(data) > limit:
        raise ProviderError(
            f"model {model!r} response exceeds {limit} bytes: raise llm_max_response_bytes "
            "or lower max_tokens",
            retryable=False,
        )
    return data


def _snippet(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(_ERROR_SNIPPET).decode("utf-8", "replace")
    except OSError:
        text = ""
    return " ".join(text.split()) or str(exc.reason)


def _content(body: bytes, model: str) -> str:
    try:
        data = json.loads(body)
        content = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ProviderError(
            f"model {model!r} returned a response without choices[0].message.content: "
            f"{body[:_ERROR_SNIPPET]!r}",
            retryable=True,
        ) from exc
    if not isinstance(content, str):
        raise ProviderError(
            f"model {model!r} returned non-text content {type(content).__name__}",
            retryable=True,
        )
    return content
