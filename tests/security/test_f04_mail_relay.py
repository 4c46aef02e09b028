"""Finding 4: mail relay — once ``smtp_url`` is set, every submit token could make
``send_email`` mail any address.

Replayed as ``submitter`` against an executor whose ``smtp_url`` points at a loopback
SMTP responder and whose ``mail_allowed_recipients`` is ``["@example.com"]``: a DAG
mailing ``victim@evil.test`` (as to, cc or bcc) fails without retry and the responder
sees no connection; mail to ``ok@example.com`` is delivered.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.security.attack import run_tool
from tests.topology import Topology

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class SmtpResponder:
    """Just enough SMTP to accept mail, counting connections and envelope recipients."""

    port: int = 0
    connections: int = 0
    recipients: list[str] = field(default_factory=list)
    messages: int = 0


def _handler(box: SmtpResponder) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        def reply(self, text: str) -> None:
            self.wfile.write(text.encode() + b"\r\n")

        def handle(self) -> None:
            box.connections += 1
            self.reply("220 responder ESMTP")
            while line := self.rfile.readline():
                verb = line.decode(errors="replace").strip().split(" ", 1)[0].upper()
                if verb == "EHLO":
                    self.reply("250-responder")
                    self.reply("250 8BITMIME")
                elif verb == "RCPT":
                    box.recipients.append(line.decode().split(":", 1)[1].strip().strip("<>"))
                    self.reply("250 OK")
                elif verb == "DATA":
                    self.reply("354 go ahead")
                    while self.rfile.readline() not in (b".\r\n", b""):
                        pass
                    box.messages += 1
                    self.reply("250 queued")
                elif verb == "QUIT":
                    self.reply("221 bye")
                    return
                else:  # HELO, MAIL, RSET, NOOP
                    self.reply("250 OK")

    return Handler


@pytest.fixture(scope="module")
def smtp() -> Iterator[SmtpResponder]:
    box = SmtpResponder()
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(box))
    server.daemon_threads = True
    box.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield box
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture(scope="module")
def topology(smtp: SmtpResponder) -> Iterator[Topology]:
    """One executor, mailing through the responder (api trust, the default)."""
    settings = {"smtp_url": f"smtp://127.0.0.1:{smtp.port}",
                "mail_allowed_recipients": ["@example.com"]}
    with Topology(executors=1, lease=5.0, executor_settings=settings) as topo:
        yield topo


def test_mail_to_other_domains_is_refused_before_connecting(topology: Topology,
                                                            smtp: SmtpResponder,
                                                            record_property: Any) -> None:
    base = {"subject": "invoice", "body": "pay here"}
    nodes = run_tool(topology, "send_email", [
        {**base, "to": "victim@evil.test"},
        {**base, "to": ["ok@example.com", "victim@evil.test"]},
        {**base, "to": "ok@example.com", "cc": "victim@evil.test"},
        {**base, "to": "ok@example.com", "bcc": ["victim@evil.test"]},
        {**base, "to": "ok@example.com.evil.test"},
        {**base, "to": "victim@evil.test(ok@example.com)"},
    ])
    for node in nodes:
        assert node["state"] in ("FAILED", "DEAD"), node
        assert "mail_allowed_recipients" in str(node["error"]), node
        assert node["attempt"] == 1, node  # not retried
    assert smtp.connections == 0
    record_property("summary", f"{len(nodes)} relay attempts refused ({nodes[0]['error']!r}); "
                    f"SMTP listener connections {smtp.connections}")


def test_mail_to_an_allowed_domain_is_delivered(topology: Topology,
                                                smtp: SmtpResponder) -> None:
    (node,) = run_tool(topology, "send_email",
                       [{"to": "ok@example.com", "subject": "report", "body": "fine"}])
    assert node["state"] == "SUCCEEDED", node
    assert node["output"]["status"] == "sent"
    assert smtp.recipients == ["ok@example.com"]
    assert smtp.messages == 1
