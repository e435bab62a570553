"""Long-run hygiene (issue 17, item 5): 500 trials of a small model, then a kill and a resume.

``raysearch run`` (Random search over an unbounded percentile range on the test MLP, 2 trials
at once) in a process and a Ray of its own is killed with SIGKILL once 500 trials are
journaled, and ``raysearch resume`` runs 20 more (``tests/reliability/soak.py``). Reported:

- per trial process, the slope per 100 trials (after 10 warm-up trials) of resident memory,
  open file descriptors and raysearch's temp-folder entries: flat is about 0;
- the journal's bytes per line in its first and second half (linear growth: about equal);
- the resume: seconds from starting ``raysearch resume`` to the first new trial journaled
  (target: under 10 s), and trials evaluated twice (must be none).

Usage::

    python benchmarks/soak.py              # 500 trials
    python benchmarks/soak.py --smoke      # 12 trials
    python benchmarks/soak.py --trials 100 --extra 20 --warmup 5  # tests/reliability/test_soak.py

Writes ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import Run  # noqa: E402

from tests.reliability.soak import run_soak  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--extra", type=int, default=20, help="trials the resume runs")
    parser.add_argument("--warmup", type=int, default=10, help="trials before the slopes")
    parser.add_argument("--smoke", action="store_true", help="12 trials")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    trials = 12 if args.smoke else args.trials
    run = Run("soak", args)
    with tempfile.TemporaryDirectory(prefix="raysearch-soak-") as folder:
        extra = 3 if args.smoke else args.extra
        report = run_soak(Path(folder), trials, extra=extra, warmup=args.warmup)
    report["trials"] = trials
    print(json.dumps({k: v for k, v in report.items() if k != "processes"}, indent=1))
    for process in report["processes"]:
        print(process)
    run.write(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
