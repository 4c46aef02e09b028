"""Test helpers for users of ax: replay recorded snapshot fixtures.

    from axengine.testing import replay_fixture

    def test_report_path(tmp_path):
        replay = replay_fixture("tests/fixtures/financial_success.json", home=tmp_path)
        assert replay.result.path == [...]
        assert replay.rerun == []          # no committed node ran again

A fixture (``ax snapshot export TASK``) is restored into a fresh embedded store under
``home`` and resumed with the real handlers (or ``handler``); every node whose handler
runs is recorded, so a test can assert that nothing committed before the snapshot was
executed again.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from axengine.config import AxConfig
from axengine.fixtures import restore_task
from axengine.local import LocalSession, RunResult
from axengine.process import default_handler
from executors.contract import Handler, NodeContext, NodeRequest, Outcome

__all__ = ["Replay", "replay_fixture"]


@dataclass(frozen=True)
class Replay:
    """What resuming a fixture did.

    Attributes:
        result: The final result.
        executed: Nodes whose handler ran during the replay, in order.
        committed_before: Nodes already committed in the fixture.
        rerun: Nodes committed in the fixture that ran again (should be empty).
    """

    result: RunResult
    executed: list[str]
    committed_before: list[str]

    @property
    def rerun(self) -> list[str]:
        return [n for n in self.executed if n in self.committed_before]


def replay_fixture(fixture: str | os.PathLike[str] | Mapping[str, Any], *,
                   home: str | os.PathLike[str], handler: Handler | None = None,
                   decide: Mapping[str, str] | None = None,
                   timeout: float = 120.0) -> Replay:
    """Restore ``fixture`` into a fresh store under ``home``, resume it to the end (or a
    gate nobody decides) and report what ran."""
    data = fixture if isinstance(fixture, Mapping) else json.loads(Path(fixture).read_text())
    committed = [s["node_id"] for s in data["snapshots"]
                 if s["state"] in ("SUCCEEDED", "FAILED", "SKIPPED", "DEAD", "CANCELLED")]
    executed: list[str] = []
    inner = handler or default_handler()

    def recording(request: NodeRequest, ctx: NodeContext) -> Outcome:
        executed.append(request.node_id)
        return inner(request, ctx)

    async def main() -> RunResult:
        async with LocalSession(AxConfig(home=Path(home)), handler=recording) as session:
            task_id = await restore_task(session.engine, data)
            await session.process.reconcile_once()
            return await session.wait(task_id, decide=decide, decided_by="replay",
                                      timeout=timeout)

    result = asyncio.run(main())
    return Replay(result=result, executed=executed, committed_before=committed)
