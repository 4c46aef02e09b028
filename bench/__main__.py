"""``python -m bench``: measure ax's cost per node against the floor and against its
peers (LangGraph, DBOS), the SDK as users call it and the reconciler's pass, and write
``bench/results/results.{json,md}``.

::

    bench/run                      # full run (about ten minutes on two cores)
    bench/run --quick --out /tmp/b # tiny counts: checks the harness, not the engine
    bench/run --section floor --section embedded   # a subset
    bench/run --section embedded --section peer --shape chain   # one shape, with the peers

Every workload a target compares runs in 3 rounds (2 with ``--quick``) that take turns
with the workloads it is compared with; each ratio is the median of its per-round
ratios (see ``bench.runner`` and ``bench.report``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.common import Progress
from bench.runner import FULL, QUICK, ROOT, Runner, write

#: Where results go by default (committed with the README's copy of the table).
DEFAULT_OUT = ROOT / "bench" / "results"
README = ROOT / "bench" / "README.md"
_BEGIN, _END = "<!-- results:begin -->", "<!-- results:end -->"


def update_readme(markdown: str, readme: Path = README) -> bool:
    """Replace the results block of the README (between its markers) with the targets
    and engine tables of ``markdown``; False when the README has no markers."""
    if not readme.exists():
        return False
    text = readme.read_text()
    if _BEGIN not in text or _END not in text:
        return False
    head, rest = text.split(_BEGIN, 1)
    _, tail = rest.split(_END, 1)
    # The README keeps the run line, the targets and the engine tables.
    keep = markdown.split("\n## Scaling", 1)[0].split("\n", 1)[1].strip()
    keep = keep.replace("\n## ", "\n### ")
    readme.write_text(f"{head}{_BEGIN}\n{keep}\n\nScaling, validation and the profile: "
                      f"see [results/results.md](results/results.md).\n{_END}{tail}")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench", description="ax cost per node against the floor and its peers")
    parser.add_argument("--quick", action="store_true",
                        help="tiny counts, 2 rounds (about 90 s): checks that "
                        "every part runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"directory for results.json and results.md (default {DEFAULT_OUT})")
    parser.add_argument("--section", action="append", choices=Runner.SECTIONS,
                        help="run only this section (repeatable; default: all)")
    parser.add_argument("--shape", action="append", choices=Runner.ENGINE_SHAPES,
                        help="run only this shape's workloads in the sections that run "
                        "the shapes (repeatable; default: all; see bench/README.md)")
    parser.add_argument("--no-readme", action="store_true",
                        help="do not copy the tables into bench/README.md")
    args = parser.parse_args(argv)
    progress = Progress()
    sizes = QUICK if args.quick else FULL
    progress(f"ax bench: {'quick' if args.quick else 'full'} run, results to {args.out}")
    runner = Runner(sizes, progress, tuple(args.section) if args.section else None,
                    tuple(args.shape) if args.shape else None)
    results = runner.run()
    raw, md = write(results, args.out)
    progress(f"wrote {raw} and {md}")
    if (not args.no_readme and not args.quick and not args.section and not args.shape
            and args.out.resolve() == DEFAULT_OUT.resolve() and update_readme(md.read_text())):
        progress(f"copied the tables into {README}")
    for c in results["summary"]["comparisons"]:
        verdict = "" if c["met"] is None else (" met" if c["met"] else " MISSED")
        print(f"  {c['name']}: {c['value']} (target {c['target']}){verdict}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
