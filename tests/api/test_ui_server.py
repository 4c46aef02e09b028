"""The web UI's server side through a real API server: pages and headers, the session
cookie, CSRF, task counts, approve-with-edits and the local API docs. (The browser
side is driven in a real Chromium by tests/ui/.)"""

from __future__ import annotations

import httpx
import pytest

from axengine.api._ui import CSP, csrf_token
from tests.api.conftest import AUTH, GATE_YAML, ServerFactory, eventually

ADMIN_TOKEN = "tok-admin-0123456789ab"
APPROVER_TOKEN = "tok-approve-0123456789"


def _sign_in(client: httpx.Client, token: str) -> str:
    """Sign ``client`` in with ``token`` (it keeps the session cookie); the CSRF token."""
    answer = client.post("/ui/login", json={"token": token})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["csrf"])


def _gated_task(server: object, client: httpx.Client) -> str:
    answer = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML, "input": {"text": "hi"}},
                         headers=AUTH["admin"])
    assert answer.status_code == 201, answer.text
    task_id = str(answer.json()["task_id"])
    eventually(lambda: client.get(f"/v1/tasks/{task_id}", headers=AUTH["admin"])
               .json()["status"] == "PAUSED", what="the gate waiting")
    return task_id


def test_pages_are_served_with_a_strict_policy(api_server: ServerFactory) -> None:
    server = api_server()
    with httpx.Client(base_url=server.url, timeout=15) as client:
        root = client.get("/")
        assert (root.status_code, root.headers["location"]) == (307, "/ui/")
        for path in ("/ui", "/ui/", "/ui/tasks/t-1", "/ui/approvals"):
            page = client.get(path)
            assert page.status_code == 200, path
            assert page.headers["content-type"].startswith("text/html")
            assert page.headers["content-security-policy"] == CSP
            assert page.headers["x-frame-options"] == "DENY"
            assert "'unsafe-inline'" not in page.headers["content-security-policy"]
        missing = client.get("/ui/static/no-such-file.js")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "NotFound"
        # The API docs: the page and Swagger UI come from this server, not a CDN.
        docs = client.get("/docs")
        assert docs.status_code == 200 and docs.headers["content-security-policy"] == CSP
        assert "cdn" not in docs.text.lower()
        for asset in ("/ui/vendor/swagger-ui/swagger-ui-bundle.js",
                      "/ui/vendor/swagger-ui/swagger-ui.css", "/ui/vendor/swagger-init.js"):
            assert client.get(asset).status_code == 200, asset
        assert client.get("/openapi.json").json()["info"]["title"] == "ax API"
        # JSON answers are not sniffed as pages either.
        assert client.get("/healthz").headers["x-content-type-options"] == "nosniff"


def test_login_sets_a_session_cookie_scripts_cannot_read(api_server: ServerFactory) -> None:
    server = api_server()
    with httpx.Client(base_url=server.url, timeout=15) as client:
        assert client.get("/ui/session").status_code == 401
        refused = client.post("/ui/login", json={"token": "not-a-token-of-the-file"})
        assert refused.status_code == 401
        assert "ax_session" not in refused.headers.get("set-cookie", "")
        answer = client.post("/ui/login", json={"token": APPROVER_TOKEN})
        assert answer.status_code == 200
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith("ax_session=")
        flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "samesite", "path", "max-age"} <= flags
        assert "samesite=strict" in cookie.lower()
        assert "secure" not in flags  # plain http here; https requests get Secure
        body = answer.json()
        assert body == {"name": "approver", "roles": ["approve"],
                        "csrf": csrf_token(APPROVER_TOKEN), "auth": True}
        # The cookie authenticates /v1 reads like the header does.
        assert client.get("/ui/session").json()["name"] == "approver"
        assert client.get("/v1/tasks").status_code == 200
        out = client.post("/ui/logout", headers={"X-CSRF-Token": body["csrf"]})
        assert out.status_code == 200
        assert client.get("/ui/session").status_code == 401
        assert client.get("/v1/tasks").status_code == 401


def test_cookie_requests_without_the_csrf_token_change_nothing(
        api_server: ServerFactory) -> None:
    server = api_server()
    with httpx.Client(base_url=server.url, timeout=15) as client:
        csrf = _sign_in(client, ADMIN_TOKEN)
        task_id = _gated_task(server, client)
        refusals = {
            "no header": client.post(f"/v1/tasks/{task_id}/cancel", json={}),
            "wrong header": client.post(f"/v1/tasks/{task_id}/cancel", json={},
                                        headers={"X-CSRF-Token": csrf_token("other")}),
            "other origin": client.post(f"/v1/tasks/{task_id}/cancel", json={},
                                        headers={"X-CSRF-Token": csrf,
                                                 "Origin": "https://evil.test"}),
            "cross-site fetch": client.post(f"/v1/tasks/{task_id}/cancel", json={},
                                            headers={"X-CSRF-Token": csrf,
                                                     "Sec-Fetch-Site": "cross-site"}),
            "logout": client.post("/ui/logout"),
        }
        for what, answer in refusals.items():
            assert answer.status_code == 403, what
            assert answer.json()["error"]["type"] == "Forbidden", what
        assert "CSRF" in refusals["no header"].json()["error"]["message"]
        assert client.get(f"/v1/tasks/{task_id}").json()["status"] == "PAUSED"
        assert client.get("/ui/session").status_code == 200  # still signed in
        # With the token, from this origin: done.
        ok = client.post(f"/v1/tasks/{task_id}/cancel", json={},
                         headers={"X-CSRF-Token": csrf, "Origin": server.url})
        assert ok.status_code == 200, ok.text
        assert ok.json()["task"]["status"] == "CANCELLED"
    # A bearer header is sent on purpose: no CSRF token needed (curl, SDKs).
    with httpx.Client(base_url=server.url, headers=AUTH["admin"], timeout=15) as bearer:
        task_id = _gated_task(server, bearer)
        assert bearer.post(f"/v1/tasks/{task_id}/cancel", json={}).status_code == 200


def test_without_tokens_other_sites_still_cannot_change_anything(
        api_server: ServerFactory) -> None:
    server = api_server(auth=False)
    with httpx.Client(base_url=server.url, timeout=15) as client:
        session = client.get("/ui/session").json()
        assert (session["name"], session["auth"]) == ("anonymous", False)
        task_id = _gated_task(server, client)
        forged = client.post(f"/v1/tasks/{task_id}/cancel", json={},
                             headers={"Origin": "http://attacker.test"})
        assert forged.status_code == 403
        assert client.get(f"/v1/tasks/{task_id}").json()["status"] == "PAUSED"
        assert client.post(f"/v1/tasks/{task_id}/cancel", json={}).status_code == 200


def test_task_counts_count_every_status(api_server: ServerFactory) -> None:
    server = api_server()
    with httpx.Client(base_url=server.url, headers=AUTH["admin"], timeout=15) as client:
        first = _gated_task(server, client)
        _gated_task(server, client)
        client.post(f"/v1/tasks/{first}/cancel", json={})
        counts = client.get("/v1/task-counts").json()["counts"]
        assert counts == {"RUNNING": 0, "PAUSED": 1, "SUCCEEDED": 0, "FAILED": 0,
                          "DEAD": 0, "CANCELLED": 1}
        reader = client.get("/v1/task-counts", headers=AUTH["executor"])
        assert reader.status_code == 200  # any role reads


@pytest.mark.parametrize("edits", [{"text": "corrected"}, []])
def test_approve_with_edits_passes_the_corrected_data_on(api_server: ServerFactory,
                                                         edits: object) -> None:
    server = api_server()
    with httpx.Client(base_url=server.url, headers=AUTH["admin"], timeout=15) as client:
        task_id = _gated_task(server, client)
        review = client.get(f"/v1/tasks/{task_id}").json()["nodes"]["review"]
        rejected = client.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                               json={"decision": "reject", "data": {"x": 1}},
                               headers=AUTH["approve"])
        assert rejected.status_code == 400
        assert "edits go with an approval" in rejected.json()["error"]["message"]
        answer = client.post(f"/v1/tasks/{task_id}/nodes/review/decision",
                             json={"decision": "approve", "comment": "fixed",
                                   "data": edits}, headers=AUTH["approve"])
        assert answer.status_code == 200, answer.text
        node = answer.json()["node"]
        assert node["output"]["data"] == edits != review["input"]
        assert node["decision"]["edited"] is True and node["decision"]["by"] == "approver"
        events = client.get(f"/v1/tasks/{task_id}/events").json()["events"]
        assert ("decided", "approve with edits by approver: fixed") in [
            (e["kind"], e["detail"]) for e in events]
