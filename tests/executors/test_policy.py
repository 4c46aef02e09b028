"""The tools' egress, file and mail policy (``executors.policy``), without servers.

DNS is faked by monkeypatching ``socket.getaddrinfo``; connections to non-loopback
addresses are intercepted (the sandbox has no route out, and the point is *where* the
tool connects, not whether the internet answers).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from executors.contract import Failure, Success
from executors.policy import (
    EgressDenied,
    FileRefused,
    HostPatterns,
    MailRefused,
    Policy,
    PolicyError,
    address_class,
)
from executors.tools import tool_call
from tests.executors.fakes import FakeContext, make_request
from tests.executors.local_http import Reply, serve

DENIED = [
    # IPv4
    "0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.254",
    "127.0.0.1", "127.8.9.10", "169.254.169.254", "169.254.0.1", "172.16.0.1",
    "172.31.255.255", "192.0.0.8", "192.0.2.1", "192.88.99.1", "192.168.1.1",
    "198.18.0.1", "198.19.255.255", "198.51.100.7", "203.0.113.9", "224.0.0.1",
    "239.255.255.250", "240.0.0.1", "255.255.255.255",
    # IPv6
    "::", "::1", "::127.0.0.1", "64:ff9b:1::1", "100::1", "2001:db8::1", "2001::1",
    "fc00::1", "fd12:3456::1", "fe80::1", "febf::1", "fec0::1", "ff02::1", "ff0e::1",
    # IPv4 inside IPv6: mapped, NAT64, 6to4, Teredo
    "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:169.254.169.254", "::ffff:100.64.0.1",
    "::ffff:0.0.0.0", "::ffff:224.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe",
    "2002:7f00:1::1", "2002:c0a8:101::1", "2001:0:4136:e378:8000:63bf:80ff:fffe",
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111",
          "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"]


@pytest.mark.parametrize("address", DENIED)
def test_denied_ranges(address: str) -> None:
    assert address_class(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses(address: str) -> None:
    assert address_class(ipaddress.ip_address(address)) is None


# ---------------------------------------------------------------------- DNS and egress


def fake_dns(monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> list[str]:
    """Answer the n-th ``getaddrinfo`` with ``answers[n]`` (the last one repeats);
    return the list of names asked."""
    asked: list[str] = []

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        answer = answers[min(len(asked), len(answers)) - 1]
        out = []
        for ip in answer:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            sockaddr = (ip, int(port), 0, 0) if family == socket.AF_INET6 else (ip, int(port))
            out.append((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return out

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def record_connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every ``socket.connect``; refuse those that would leave loopback."""
    seen: list[Any] = []
    real = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        seen.append(address)
        if not ipaddress.ip_address(address[0]).is_loopback:
            raise ConnectionRefusedError(111, "intercepted by the test")
        real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return seen


@pytest.fixture
def listener() -> Iterator[tuple[int, list[int]]]:
    """A loopback listener that counts connections: ``(port, [count])``."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    count, stop = [0], threading.Event()

    def serve_forever() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            count[0] += 1
            conn.close()

    thread = threading.Thread(target=serve_forever, daemon=True)
    thread.start()
    yield server.getsockname()[1], count
    stop.set()
    thread.join(5)
    server.close()


def _http(url: str, **settings: Any) -> Any:
    request = make_request(config={"tool": "http_request"}, input=url)
    return tool_call(request, FakeContext(settings=settings))


@pytest.mark.parametrize("answer", [["127.0.0.1"], ["10.0.0.5"], ["169.254.169.254"],
                                    ["::1"], ["::ffff:127.0.0.1"], ["fd00::1"],
                                    ["8.8.8.8", "192.168.0.10"]])
def test_names_resolving_to_private_addresses_are_refused(
    monkeypatch: pytest.MonkeyPatch, answer: list[str]
) -> None:
    fake_dns(monkeypatch, answer)
    connects = record_connects(monkeypatch)
    with pytest.raises(EgressDenied, match="egress_private_allowed"):
        Policy().vet("http://innocent.example.com/")
    outcome = _http("http://innocent.example.com/x")
    assert isinstance(outcome, Failure) and outcome.retryable is False
    assert "egress_private_allowed" in outcome.message
    assert answer[-1] not in outcome.message  # no oracle of internal DNS
    assert connects == []


def test_metadata_names_refused_without_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_dns(monkeypatch, ["8.8.8.8"])
    for url in ("http://metadata.google.internal/computeMetadata/v1/",
                "http://METADATA.google.internal./", "http://instance-data/latest/"):
        with pytest.raises(EgressDenied, match="metadata"):
            Policy().vet(url)
    assert asked == []


def test_literal_and_odd_forms_of_loopback_are_refused() -> None:
    # Every spelling goes through getaddrinfo and is judged by the address it gives.
    for url in ("http://127.0.0.1/", "http://[::1]/", "http://[::ffff:127.0.0.1]/",
                "http://127.1/", "http://2130706433/", "http://0x7f000001/",
                "http://0.0.0.0/", "http://localhost/", "http://169.254.169.254/"):
        with pytest.raises(EgressDenied):
            Policy().vet(url)


def test_dns_rebinding_connects_only_to_the_vetted_address(
    monkeypatch: pytest.MonkeyPatch, listener: tuple[int, list[int]]
) -> None:
    port, count = listener
    # First answer public (passes the check), every later one loopback (the rebind).
    asked = fake_dns(monkeypatch, ["93.184.216.34"], ["127.0.0.1"])
    connects = record_connects(monkeypatch)
    outcome = _http(f"http://rebind.example.com:{port}/", http_timeout=2)
    assert isinstance(outcome, Failure) and outcome.retryable is True  # intercepted
    assert asked == ["rebind.example.com"]  # resolved once, never again
    assert connects == [("93.184.216.34", port)]
    assert count[0] == 0


def test_host_header_and_name_kept_while_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    with serve({"/v": lambda seen: Reply(200, seen.headers["Host"].encode())}) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        fake_dns(monkeypatch, ["127.0.0.1"], ["8.8.8.8"])
        outcome = _http(f"http://api.internal.test:{port}/v",
                        egress_private_allowed=["api.internal.test"])
    assert isinstance(outcome, Success), outcome
    assert outcome.output["body"] == f"api.internal.test:{port}"


def test_patterns() -> None:
    patterns = HostPatterns.parse(["api.example.com", "*.corp.test", "10.1.0.0/16",
                                   "[fd00::1]"], "x")
    assert patterns.matches_name("api.example.com")
    assert patterns.matches_name("a.b.corp.test")
    assert not patterns.matches_name("corp.test")
    assert not patterns.matches_name("evilcorp.test")
    assert patterns.matches_address(ipaddress.ip_address("10.1.200.3"))
    assert patterns.matches_address(ipaddress.ip_address("fd00::1"))
    assert not patterns.matches_address(ipaddress.ip_address("10.2.0.1"))
    assert HostPatterns.parse("*", "x").matches_name("anything")
    with pytest.raises(PolicyError, match="x setting"):
        HostPatterns.parse([3], "x")


def test_allowed_hosts_refuses_unlisted_names_before_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_dns(monkeypatch, ["8.8.8.8"])
    policy = Policy.from_settings({"egress_allowed_hosts": ["*.example.org"]})
    with pytest.raises(EgressDenied, match="egress_allowed_hosts"):
        policy.vet("https://example.com/")
    assert asked == []
    assert policy.vet("https://api.example.org/").addresses[0][1][0] == "8.8.8.8"


def test_per_tool_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    settings: dict[str, Any] = {
        "tool_policy": {"http_request": {"egress_private_allowed": ["127.0.0.1"]}}}
    with serve({"/r.pdf": lambda _: Reply(200, b"%PDF")}) as srv:
        allowed = _http(f"{srv.url}/r.pdf", **settings)
        pdf = tool_call(make_request(config={"tool": "pdf_parser"}, input=f"{srv.url}/r.pdf"),
                        FakeContext(settings=settings))
        assert len(srv.seen) == 1  # only http_request's request
    assert isinstance(allowed, Success) and allowed.output["status"] == 200
    assert isinstance(pdf, Success) and pdf.output["status"] == "failed"
    assert "egress_private_allowed" in pdf.output["error"]
    policy = Policy.from_settings({"tool_policy": {"pdf_parser": {"input_root": "/x"}}},
                                  "pdf_parser")
    with pytest.raises(FileRefused, match=r"tool_policy\.pdf_parser\.input_root"):
        policy.read_file("/etc/passwd", 100, limit_setting="pdf_max_bytes")


def test_local_trust_reaches_loopback() -> None:
    with serve({"/v": lambda _: Reply(200, b"ok")}) as srv:
        outcome = _http(f"{srv.url}/v", trust="local")
    assert isinstance(outcome, Success) and outcome.output["body"] == "ok"


@pytest.mark.parametrize("settings", [
    {"trust": "everyone"},
    {"http_allowed_hosts": ["*"]},
    {"egress_allowed_hosts": 5},
    {"tool_policy": {"x": {"egress": []}}},
    {"mail_allowed_recipients": [1]},
])
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        Policy.from_settings(settings, "x")


def test_opener_has_no_file_handler(tmp_path: Path) -> None:
    secret = tmp_path / "s.txt"
    secret.write_text("secret")
    with pytest.raises(OSError, match="unknown url type"):
        Policy(trust="local").opener().open(secret.as_uri())


# ---------------------------------------------------------------------- files


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """``root/`` (the input root) with a report, and ``outside/`` with a secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "report.pdf").write_bytes(b"%PDF-report")
    (outside / "secret.txt").write_text("AX-SECRET")
    return {"root": root, "outside": outside, "secret": outside / "secret.txt"}


def _read(policy: Policy, path: str | Path) -> bytes:
    return policy.read_file(str(path), 1 << 20, limit_setting="pdf_max_bytes")


def _refusal(policy: Policy, path: str | Path) -> str:
    with pytest.raises(FileRefused) as info:
        _read(policy, path)
    return str(info.value)


def test_api_trust_without_root_reads_nothing(tree: dict[str, Path]) -> None:
    policy = Policy()
    messages = {_refusal(policy, p) for p in
                (tree["root"] / "report.pdf", tree["secret"], "/nope/none", "/etc/passwd")}
    assert len(messages) == 1
    assert "input_root" in messages.pop()


def test_input_root_reads_inside_only(tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    policy = Policy.from_settings({"input_root": str(tree["root"])})
    assert _read(policy, tree["root"] / "report.pdf") == b"%PDF-report"
    monkeypatch.chdir(tree["root"])
    assert _read(policy, "report.pdf") == b"%PDF-report"
    (tree["root"] / "link.pdf").symlink_to(tree["secret"])
    (tree["root"] / "dir").symlink_to(tree["outside"])
    (tree["root"] / "inner.pdf").symlink_to(tree["root"] / "report.pdf")
    assert _read(policy, tree["root"] / "inner.pdf") == b"%PDF-report"  # stays inside
    refused: list[str | Path] = [
        tree["secret"],                                    # outside, exists
        tree["outside"] / "missing.txt",                   # outside, does not exist
        tree["root"] / "link.pdf",                         # symlink leading out
        tree["root"] / "dir" / "secret.txt",               # through a symlinked dir
        tree["root"] / ".." / "outside" / "secret.txt",    # ..
        "../outside/secret.txt",                           # .. relative to the cwd
        "~root/.bashrc", "~/.bashrc",                      # ~ resolved, then judged
        "/proc/self/environ", "/etc/passwd", "/dev/zero",
        tree["root"],                                      # a directory
        tree["root"] / "missing.pdf",                      # inside, missing
        "bad\0path",
    ]
    messages = {_refusal(policy, p) for p in refused}
    assert len(messages) == 1, messages  # nothing tells existing from missing
    message = messages.pop()
    assert "input_root" in message and "AX-SECRET" not in message
    assert str(tree["outside"]) not in message


def test_fifo_does_not_block(tree: dict[str, Path]) -> None:
    fifo = tree["root"] / "pipe.pdf"
    os.mkfifo(fifo)
    box: dict[str, Any] = {}

    def read() -> None:
        for trust in ("api", "local"):
            policy = Policy.from_settings({"trust": trust, "input_root": str(tree["root"])})
            try:
                _read(policy, fifo)
            except FileRefused as exc:
                box[trust] = str(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "reading a FIFO blocked"
    assert set(box) == {"api", "local"}


def test_proc_sys_dev_refused_even_with_root_at_slash() -> None:
    for trust in ("api", "local"):
        policy = Policy.from_settings({"trust": trust, "input_root": "/"})
        for path in ("/proc/self/environ", "/proc/self/cmdline", "/sys/kernel/hostname",
                     "/dev/null", "/dev/stdin"):
            with pytest.raises(FileRefused):
                _read(policy, path)


def test_local_trust_reads_any_regular_file(tree: dict[str, Path]) -> None:
    policy = Policy.from_settings({"trust": "local"})
    assert _read(policy, tree["secret"]) == b"AX-SECRET"
    assert "no such file" in _refusal(policy, tree["outside"] / "missing")
    with pytest.raises(FileRefused):
        _read(policy, "/proc/self/environ")


def test_size_bound_only_after_the_checks(tree: dict[str, Path]) -> None:
    policy = Policy.from_settings({"input_root": str(tree["root"])})
    with pytest.raises(FileRefused, match="pdf_max_bytes"):
        policy.read_file(str(tree["root"] / "report.pdf"), 4, limit_setting="pdf_max_bytes")
    big = tree["outside"] / "big.bin"
    big.write_bytes(b"x" * 100)
    assert "bytes" not in _refusal(policy, big)


# ---------------------------------------------------------------------- mail

MAIL_CASES: list[tuple[str, bool]] = [
    ("ok@example.com", True), ("OK@Example.COM", True), ("boss@partner.test", True),
    ("victim@evil.test", False), ("x@sub.example.com", False), ("other@partner.test", False),
    ("victim@evil.test(ok@example.com)", False), ("<victim@evil.test>", False),
    ("ok@example.com.evil.test", False), ('"x@example.com"@evil.test', False),
]


@pytest.mark.parametrize(("address", "allowed"), MAIL_CASES)
def test_recipient_matching(address: str, allowed: bool) -> None:
    policy = Policy.from_settings(
        {"mail_allowed_recipients": ["@example.com", "Boss@Partner.test"]})
    def check() -> None:
        policy.check_recipients([address], leaves_host=True)

    if allowed:
        check()
    else:
        with pytest.raises(MailRefused, match="mail_allowed_recipients"):
            check()
    # Nothing leaves the host, or local trust: not restricted.
    policy.check_recipients([address], leaves_host=False)
    Policy(trust="local").check_recipients([address], leaves_host=True)


def test_send_email_refuses_any_disallowed_recipient_before_connecting(
    listener: tuple[int, list[int]], tmp_path: Path
) -> None:
    port, count = listener
    settings = {"smtp_url": f"smtp://127.0.0.1:{port}",
                "mail_allowed_recipients": ["@example.com"]}
    for extra in ({"to": "victim@evil.test"}, {"cc": ["victim@evil.test"]},
                  {"bcc": "victim@evil.test"}):
        ctx = FakeContext(settings=settings)
        mail = {"to": "ok@example.com", "subject": "s", "body": "b", **extra}
        outcome = tool_call(make_request(config={"tool": "send_email"}, input=mail), ctx)
        assert isinstance(outcome, Failure) and outcome.retryable is False, extra
        assert "mail_allowed_recipients" in outcome.message
        assert ctx.effects == {}
    assert count[0] == 0
    # The local mailbox keeps mail on this host: any recipient.
    local = tool_call(make_request(config={"tool": "send_email"},
                                   input={"to": "victim@evil.test", "subject": "s"}),
                      FakeContext(settings={"mail_dir": str(tmp_path)}))
    assert isinstance(local, Success) and local.output["status"] == "sent"
