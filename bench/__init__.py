"""ax's benchmark harness: cost per node against the floor and against a peer.

Run it with ``bench/run`` (or ``python -m bench``); see ``bench/README.md``.
"""

from __future__ import annotations

#: Version of the layout of ``results.json``. 2: a workload compared in rounds keeps its
#: median round's figures where 1 kept its only run, with every round under ``rounds``
#: (a section's floors under ``floors``); a reader of 1 still finds what it read.
RESULTS_SCHEMA = 2
