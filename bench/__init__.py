"""ax's benchmark harness: cost per node against the floor and against a peer.

Run it with ``bench/run`` (or ``python -m bench``); see ``bench/README.md``.
"""

from __future__ import annotations

#: Version of the layout of ``results.json``.
RESULTS_SCHEMA = 1
