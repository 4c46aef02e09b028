"""send_email: outbox idempotency, SMTP against a local sink, the local mailbox."""

from __future__ import annotations

import email
import socketserver
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from executors.contract import Failure, Success
from executors.handlers import handle
from tests.executors.fakes import FakeContext, FakeEffect, make_request

KEY = "email:task-1:notify:rev-1"
#: Under api trust, mail through SMTP goes only to allowed recipients (MAIL's domain).
ALLOWED = {"mail_allowed_recipients": ["@example.test"]}
MAIL = {"to": ["risk@example.test", "cfo@example.test"], "subject": "High risk",
        "body": "ACME looks risky."}


@dataclass
class SmtpSink:
    """Enough SMTP (EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT) to count messages."""

    port: int = 0
    messages: list[Message] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    drop_during_data: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(sink: SmtpSink) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        def reply(self, text: str) -> None:
            self.wfile.write(text.encode() + b"\r\n")

        def handle(self) -> None:
            self.reply("220 sink ESMTP")
            sender, rcpts = "", list[str]()
            while line := self.rfile.readline():
                command = line.decode().strip()
                verb = command.split(" ", 1)[0].upper()
                if verb == "EHLO":
                    self.reply("250-sink")
                    self.reply("250 8BITMIME")
                elif verb in ("HELO", "NOOP"):
                    self.reply("250 sink")
                elif verb == "RSET":
                    sender, rcpts = "", []
                    self.reply("250 OK")
                elif verb == "MAIL":
                    sender = command.split(":", 1)[1].strip()
                    self.reply("250 OK")
                elif verb == "RCPT":
                    rcpts.append(command.split(":", 1)[1].strip().strip("<>"))
                    self.reply("250 OK")
                elif verb == "DATA":
                    self.reply("354 end with <CRLF>.<CRLF>")
                    if sink.drop_during_data:
                        return  # the server vanishes before confirming: outcome unknown
                    raw = bytearray()
                    while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                        raw += chunk[1:] if chunk.startswith(b"..") else chunk
                    with sink.lock:
                        sink.messages.append(email.message_from_bytes(bytes(raw)))
                        sink.envelopes.append((sender, list(rcpts)))
                    self.reply("250 OK queued")
                elif verb == "QUIT":
                    self.reply("221 bye")
                    return
                else:
                    self.reply("502 not implemented")

    return Handler


@pytest.fixture
def smtp_sink() -> Iterator[SmtpSink]:
    sink = SmtpSink()
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(sink))
    server.daemon_threads = True
    sink.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _request(spec: Any = None, revision: str = "rev-1") -> Any:
    return make_request(config={"tool": "send_email"}, input=MAIL if spec is None else spec,
                        node_id="notify", input_revision=revision)


def test_mailbox_send_then_already_sent(tmp_path: Path) -> None:
    ctx = FakeContext(settings={"mail_dir": str(tmp_path)})
    first = handle(_request(), ctx)
    assert isinstance(first, Success)
    assert first.output["status"] == "sent"
    assert first.output["idempotency_key"] == KEY
    assert first.output["transport"] == "mailbox"
    files = list(tmp_path.glob("*.eml"))
    assert len(files) == 1
    msg = email.message_from_bytes(files[0].read_bytes())
    assert msg["To"] == "risk@example.test, cfo@example.test"
    assert msg["X-Ax-Idempotency-Key"] == KEY
    assert msg["Message-ID"] == first.output["message_id"]
    assert ctx.effects[KEY].status == "DONE"

    again = handle(_request(), ctx)
    assert isinstance(again, Success)
    assert again.output["status"] == "already_sent"
    assert again.output["message_id"] == first.output["message_id"]
    assert len(list(tmp_path.glob("*.eml"))) == 1
    assert ctx.effects[KEY].begins == 1


def test_smtp_sends_once(smtp_sink: SmtpSink) -> None:
    ctx = FakeContext(settings={**ALLOWED, "smtp_url": f"smtp://127.0.0.1:{smtp_sink.port}",
                                "mail_from": "ax@bank.test"})
    first = handle(_request({**MAIL, "to": "risk@example.test", "body": {"risk": "high"}}), ctx)
    again = handle(_request({**MAIL, "to": "risk@example.test", "body": {"risk": "high"}}), ctx)
    assert isinstance(first, Success) and first.output["status"] == "sent"
    assert isinstance(again, Success) and again.output["status"] == "already_sent"
    assert len(smtp_sink.messages) == 1
    (msg,) = smtp_sink.messages
    assert smtp_sink.envelopes == [("<ax@bank.test>", ["risk@example.test"])]
    assert msg["Subject"] == "High risk"
    assert msg["Message-ID"] == first.output["message_id"]
    assert msg["Message-ID"].endswith("@bank.test>")
    assert '"risk": "high"' in msg.get_payload()


@pytest.mark.parametrize("prior", ["SENDING", "UNKNOWN"])
def test_interrupted_send_is_reported_not_repeated(smtp_sink: SmtpSink, prior: str) -> None:
    # SMTP cannot tell whether an earlier session delivered the message: a person decides.
    ctx = FakeContext(settings={**ALLOWED, "smtp_url": f"smtp://127.0.0.1:{smtp_sink.port}"})
    ctx.effects[KEY] = FakeEffect(KEY, status=prior)  # type: ignore[arg-type]
    outcome = handle(_request(), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert outcome.details["effect"] == "UNKNOWN"
    assert KEY in outcome.message
    assert "check" in outcome.message
    assert ctx.effects[KEY].status == "UNKNOWN"
    assert smtp_sink.messages == []


@pytest.mark.parametrize("prior", ["SENDING", "UNKNOWN"])
def test_interrupted_send_to_mailbox_is_settled_by_lookup(tmp_path: Path, prior: str) -> None:
    # The local mailbox stores a message under its Message-ID, so it can tell: not
    # delivered → deliver now; delivered → record DONE without delivering again.
    ctx = FakeContext(settings={"mail_dir": str(tmp_path)})
    ctx.effects[KEY] = FakeEffect(KEY, status=prior)  # type: ignore[arg-type]
    first = handle(_request(), ctx)
    assert isinstance(first, Success) and first.output["status"] == "sent"
    assert len(list(tmp_path.glob("*.eml"))) == 1
    again = FakeContext(settings={"mail_dir": str(tmp_path)})
    again.effects[KEY] = FakeEffect(KEY, status=prior)  # type: ignore[arg-type]
    second = handle(_request(), again)
    assert isinstance(second, Success) and second.output["status"] == "already_sent"
    assert second.output["verified"] is True
    assert again.effects[KEY].status == "DONE"
    assert len(list(tmp_path.glob("*.eml"))) == 1


def test_crash_between_send_and_done_never_sends_twice(smtp_sink: SmtpSink) -> None:
    class CrashingEffect(FakeEffect):
        def done(self, result: Mapping[str, Any]) -> None:
            raise ConnectionError("store went away before DONE was written")

    ctx = FakeContext(settings={**ALLOWED, "smtp_url": f"smtp://127.0.0.1:{smtp_sink.port}"})
    ctx.effects[KEY] = CrashingEffect(KEY)
    crashed = handle(_request(), ctx)
    assert isinstance(crashed, Failure)  # handle() turned the exception into a failure
    assert crashed.retryable is True
    retried = handle(_request(), ctx)
    assert isinstance(retried, Failure)
    assert retried.retryable is False
    assert retried.details["effect"] == "UNKNOWN"
    assert len(smtp_sink.messages) == 1


def test_server_gone_before_begin_retries_safely() -> None:
    with socketserver.TCPServer(("127.0.0.1", 0), socketserver.BaseRequestHandler) as s:
        port = s.server_address[1]  # closed when the block ends: nothing listens there
    ctx = FakeContext(settings={**ALLOWED, "smtp_url": f"smtp://127.0.0.1:{port}",
                                "smtp_timeout": 5})
    outcome = handle(_request(), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is True
    assert ctx.effects[KEY].status == "NEW"
    assert ctx.effects[KEY].begins == 0


def test_server_vanishing_during_data_is_unknown(smtp_sink: SmtpSink) -> None:
    smtp_sink.drop_during_data = True
    ctx = FakeContext(settings={**ALLOWED, "smtp_url": f"smtp://127.0.0.1:{smtp_sink.port}"})
    outcome = handle(_request(), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert outcome.details["effect"] == "UNKNOWN"
    assert smtp_sink.messages == []


def test_new_input_revision_is_a_new_email(tmp_path: Path) -> None:
    ctx = FakeContext(settings={"mail_dir": str(tmp_path)})
    a = handle(_request(revision="rev-1"), ctx)
    b = handle(_request(revision="rev-2"), ctx)
    assert isinstance(a, Success) and isinstance(b, Success)
    assert a.output["message_id"] != b.output["message_id"]
    assert len(list(tmp_path.glob("*.eml"))) == 2


@pytest.mark.parametrize(
    "spec",
    [
        "not a mapping",
        {"to": [], "subject": "s", "body": "b"},
        {"to": "no-at-sign", "subject": "s", "body": "b"},
        {"to": "a@b.test\r\nBcc: x@y.test", "subject": "s", "body": "b"},
        {"to": "a@b.test", "subject": "s\r\nBcc: x@y.test", "body": "b"},
    ],
)
def test_bad_input_fails_before_the_outbox(tmp_path: Path, spec: Any) -> None:
    ctx = FakeContext(settings={"mail_dir": str(tmp_path)})
    outcome = handle(_request(spec), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert ctx.effects == {}


def test_bad_smtp_url_is_not_retryable() -> None:
    ctx = FakeContext(settings={**ALLOWED, "smtp_url": "http://127.0.0.1:25"})
    outcome = handle(_request(), ctx)
    assert isinstance(outcome, Failure)
    assert outcome.retryable is False
    assert "smtp_url" in outcome.message
