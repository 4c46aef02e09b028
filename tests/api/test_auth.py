"""Tokens file, roles, and REST 401/403 (gRPC auth is in test_grpc.py)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from axengine.api import Authenticator, Principal, Role, load_tokens
from axengine.errors import Forbidden, InputError, Unauthorized
from tests.api.conftest import AUTH, GATE_YAML, ROOT, SEED_BODY, ServerFactory


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    path.chmod(0o600)  # a tokens file others can read is refused
    return path


def test_example_tokens_file_loads_and_matches_its_documented_tokens() -> None:
    # The example's tokens are public; a git checkout makes it 0644.
    auth = load_tokens(ROOT / "deploy" / "tokens.example.yaml", allow_insecure=True)
    assert auth.authenticate("Bearer change-me-submit") == Principal(
        "risk-app", frozenset({Role.SUBMIT}))
    assert auth.authenticate("bearer change-me-executor").roles == {Role.EXECUTOR}
    assert auth.authenticate("Bearer change-me-admin").name == "ops"
    with pytest.raises(Unauthorized):
        auth.authenticate("Bearer change-me")


def test_tokens_file_accepts_hash_or_token(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"s3cret-token-value-1").hexdigest()
    auth = load_tokens(write(tmp_path, f"""
tokens:
  - {{name: a, token_sha256: "{digest.upper()}", roles: [submit, approve]}}
  - {{name: b, token: "plain-token-value-22", roles: [admin]}}
"""))
    assert auth.authenticate("Bearer s3cret-token-value-1").name == "a"
    assert auth.authenticate("Bearer plain-token-value-22").roles == {Role.ADMIN}
    assert Authenticator.check(auth.authenticate("Bearer plain-token-value-22"), "approve")
    with pytest.raises(Forbidden, match="needs role admin"):
        auth.authorize("Bearer s3cret-token-value-1", "admin")
    for header in (None, "", "Basic abc", "Bearer", "Bearer  "):
        with pytest.raises(Unauthorized):
            auth.authenticate(header)


@pytest.mark.parametrize(("text", "message"), [
    ("tokens: []", "non-empty list"),
    ("tokens:\n  - {name: a, token: long-enough-token-1, roles: [root]}", "unknown role 'root'"),
    ("tokens:\n  - {name: a, token: long-enough-token-1, roles: []}", "non-empty list"),
    ("tokens:\n  - {name: a, token: short, roles: [admin]}", "16+ characters"),
    ("tokens:\n  - {name: a, token_sha256: abc, roles: [admin]}", "64 hex digits"),
    ("tokens:\n  - {name: a, roles: [admin]}", "exactly one of token_sha256 or token"),
    ("tokens:\n  - {name: a, token: long-enough-token-1, roles: [admin], ttl: 3}",
     "unknown field(s) ttl"),
    ("tokens:\n  - {name: a, token: long-enough-token-1, roles: [admin]}\n"
     "  - {name: a, token: long-enough-token-2, roles: [admin]}", "duplicate token name"),
    ("tokens:\n  - {name: a, token: long-enough-token-1, roles: [admin]}\n"
     "  - {name: b, token: long-enough-token-1, roles: [admin]}", "same token"),
    ("tokens:\n  - {name: local, token: long-enough-token-1, roles: [submit]}",
     "the name 'local' is reserved"),
    ("tokens: [\n", "not valid YAML"),
    ("users: []", "unknown top-level field"),
])
def test_malformed_tokens_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        load_tokens(write(tmp_path, text))


def test_missing_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read tokens file"):
        load_tokens(tmp_path / "nope.yaml")


def test_rest_401_and_403_store_nothing(api_server: ServerFactory) -> None:
    handle = api_server("embedded", worker=False, reconcile_interval=3600.0)
    task_id = handle.client("submit").post("/v1/tasks", json=SEED_BODY).json()["task_id"]
    before = handle.revision()
    anonymous = handle.client(None)
    missing = anonymous.post("/v1/tasks", json=SEED_BODY)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="ax"'
    assert missing.json()["error"]["type"] == "Unauthorized"
    wrong = anonymous.post("/v1/tasks", json=SEED_BODY,
                           headers={"Authorization": "Bearer guessed"})
    assert wrong.status_code == 401
    assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
    # Authentication comes before parsing: garbage from a stranger is still a 401.
    garbage = anonymous.post("/v1/tasks", content=b"{not json",
                             headers={"Content-Type": "application/json"})
    assert garbage.status_code == 401
    assert anonymous.get(f"/v1/tasks/{task_id}").status_code == 401
    cases = [
        ("approve", "POST", "/v1/tasks", SEED_BODY),
        ("executor", "POST", "/v1/tasks", SEED_BODY),
        ("approve", "POST", "/v1/dags/validate", {"dag_yaml": GATE_YAML}),
        ("submit", "POST", f"/v1/tasks/{task_id}/nodes/hello/decision",
         {"decision": "approve"}),
        ("submit", "POST", f"/v1/tasks/{task_id}/cancel", {}),
        ("approve", "POST", f"/v1/tasks/{task_id}/retry", {"from_node": "hello"}),
    ]
    for role, method, path, body in cases:
        response = handle.client(role).request(method, path, json=body)
        assert response.status_code == 403, (role, path, response.text)
        assert response.json()["error"]["type"] == "Forbidden"
    assert handle.revision() == before
    for role in AUTH:  # any role reads
        assert handle.client(role).get(f"/v1/tasks/{task_id}").status_code == 200
    # Health, readiness, metrics and the API description need no token.
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert anonymous.get(path).status_code == 200, path


def test_no_auth_mode_records_anonymous(api_server: ServerFactory) -> None:
    handle = api_server("embedded", auth=False)
    client = handle.client(None)
    task_id = client.post("/v1/tasks", json={"dag_yaml": GATE_YAML,
                                             "input": {"text": "a"}}).json()["task_id"]
    cancelled = client.post(f"/v1/tasks/{task_id}/cancel")
    assert cancelled.status_code == 200
    events = client.get(f"/v1/tasks/{task_id}/events").json()["events"]
    assert any(e["kind"] == "cancelled" and e["actor"] == "anonymous" for e in events)
