"""Submit bodies edited at random, field by field: each is accepted (201, or 200 for an
idempotent repeat) or refused with a 4xx error body naming what is wrong — never a 500,
and the server answers the next request. A seeded sample, not every field times every
value."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx

from tests.api.conftest import SEED_BODY, ServerFactory

#: A valid body with every top-level field the submit takes.
BASE: dict[str, Any] = {
    **copy.deepcopy(SEED_BODY),
    "input": {"name": "Alice", "items": [1, 2, {"deep": True}]},
    "labels": {"team": "risk"},
    "priority": 0,  # (above 0 needs the expedite role)
    "deadline_seconds": 600,
    "idempotency_key": "base",
}
#: Values no field expects, or expects only at its edge (as JSON can carry them).
HOSTILE: list[Any] = [
    None, True, -1, 0, 2**31, 2**63, 10**30, 1e308, -1e308, "", "x" * 5000, "\ud800",
    "{{ 7 * 7 }}", "{{ ''.__class__ }}", [], {}, {"a": 1}, [[[[[[[[]]]]]]]],
]
EDITS = 160


def _places(body: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value in ``body`` (the body itself excluded)."""
    items = body.items() if isinstance(body, dict) else \
        enumerate(body) if isinstance(body, list) else ()
    for key, value in items:
        yield (*path, key)
        yield from _places(value, (*path, key))


def _set(body: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        body = body[key]
    body[path[-1]] = value


def test_an_edited_submit_is_accepted_or_refused_by_name(api_server: ServerFactory) -> None:
    server = api_server("embedded", worker=False, reconcile_interval=3600.0)
    client = server.client("submit")
    rng = random.Random("ax-submit-mutations")
    places = list(_places(BASE))
    outcomes: dict[int, int] = {}
    for i in range(EDITS):
        body = copy.deepcopy(BASE)
        body["idempotency_key"] = f"edit-{i}"
        path = rng.choice(places)
        if path[-1] == "idempotency_key":
            path = ("idempotency_key",)
        value = rng.choice(HOSTILE)
        try:
            _set(body, path, value)
        except (KeyError, IndexError, TypeError):  # (a place an earlier edit removed)
            continue
        what = f"{'.'.join(map(str, path))} = {value!r:.40}"
        # As ASCII JSON: a lone surrogate travels as its escape.
        response = client.post("/v1/tasks", content=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
        outcomes[response.status_code] = outcomes.get(response.status_code, 0) + 1
        assert response.status_code in (200, 201) or 400 <= response.status_code < 500, \
            (what, response.status_code, response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["type"] and error["message"], (what, error)
    assert outcomes.get(201, 0) > 0 and sum(v for k, v in outcomes.items() if k >= 400) > 0
    assert httpx.get(f"{server.url}/healthz").status_code == 200
