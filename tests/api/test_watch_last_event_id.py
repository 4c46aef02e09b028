"""``Last-Event-ID`` on ``GET /v1/tasks/{id}/watch``: a plain non-negative integer of at
most 20 digits resumes after that seq; anything else is ignored, as a browser's
``EventSource`` may send back whatever id it last saw (a 5,000-digit one was a 500)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import SEED_BODY, ServerFactory, wait_final


def _seqs(client: httpx.Client, task_id: str, last_event_id: bytes) -> list[int]:
    """The seqs the watch stream sends with this ``Last-Event-ID`` (the task is final)."""
    seqs = []
    with client.stream("GET", f"/v1/tasks/{task_id}/watch",
                       headers={"Last-Event-ID": last_event_id}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:") and "seq" in (data := json.loads(line[5:])):
                seqs.append(data["seq"])
    return seqs


def _finished_task(api_server: ServerFactory) -> tuple[httpx.Client, str]:
    client = api_server("embedded").client("submit")
    task_id = client.post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    wait_final(client, task_id)
    return client, task_id


def test_last_event_id_resumes_after_that_seq(api_server: ServerFactory) -> None:
    client, task_id = _finished_task(api_server)
    every = _seqs(client, task_id, b"0")
    assert len(set(every)) > 1

    assert _seqs(client, task_id, str(every[0]).encode()) == [
        seq for seq in every if seq > every[0]]
    assert _seqs(client, task_id, b"9" * 20) == []


@pytest.mark.parametrize("junk", [b"9" * 21, b"9" * 5000, b"abc", b"-1", b"+3", b"3.0",
                                  b"\xb2"],  # latin-1 superscript two: str.isdigit() holds
                         ids=["21-digits", "5000-digits", "letters", "negative", "plus",
                              "decimal", "superscript"])
def test_a_last_event_id_that_is_no_plain_seq_is_ignored(
        junk: bytes, api_server: ServerFactory) -> None:
    client, task_id = _finished_task(api_server)

    assert _seqs(client, task_id, junk) == _seqs(client, task_id, b"0")
