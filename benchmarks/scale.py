"""A thousand trials on four nodes (issue 37, item 6): overhead per trial, driver memory, records
complete, and one worker node lost at trial 500.

The cluster: one head and three workers, each ``ray start --block`` on loopback with one CPU
(:class:`tests.nodes.NodeCluster`, four trials at a time). The search: ``raysearch run`` in a
process of its own joining it, a Grid of 1,000 of 1,024 valid settings on the test MLP, metric
``cos`` on 640 rows with evaluation on growing subsets (the default ``early_stopping``: ASHA
over rungs of 10 %, 33 %, 100 %); :mod:`tests.scale.many_trials` runs it and samples the
driver. Once 500 trials are journaled, the last worker node is killed (SIGKILL of its
``ray start``, raylet, agents and trial processes); the driver and the other three nodes go on.

Measured:

- **Scheduler overhead per trial**, the *slot gap*: a node runs one trial at a time (one CPU,
  ``cpu_per_trial`` 1), so on each node, in the order its trials started, the gap is the
  time from one trial's last report (``ended_at``, taken in the trial's actor as it returns
  its last result to Tune) to the next trial's start on that node (``started_at``, taken in
  the actor as it begins quantizing): the time the slot sat idle while Tune took in the
  result, ASHA decided, raysearch's searcher, recorder (the journal line, fsynced) and stopper
  ran, the searcher proposed the next setting and Tune handed it to the reused actor. From
  the journal's ``started_at``/``ended_at`` and ``node_id`` (``results.parquet`` has no
  timestamps). Trials are numbered by start time; "around trial 100" is the gaps before
  trials 50-149, "around trial 1,000" those before the last 100 (900-999); their medians
  are compared (target: the latter at most 1.5x the former). The driver's CPU seconds per
  trial over the same windows (``/proc``, sampled) are reported beside it.
- **Driver memory**: the resident memory of the ``raysearch run`` process, sampled every
  0.1 s with the trials journaled; from trial 100 to the last trial journaled the range
  (max - min; target: at most 50 MiB) and the least-squares slope per 100 trials. The peak
  of the whole process (writing the outputs at the end included) is reported too.
- **Records**: the journal and ``results.parquet`` hold the same 1,000 distinct trials, each
  once; every trial journaled before the node was killed is among them.

Usage::

    python benchmarks/scale.py             # 1,000 trials, a worker node killed at 500
    python benchmarks/scale.py --quick     # 200 trials, killed at 100
    python benchmarks/scale.py --smoke     # 40 trials on three nodes, killed at 20 (the smoke test)

Writes ``benchmarks/results/scale.json`` (``scale.quick.json``, ``scale.smoke.json``).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _common import Run, print_table  # noqa: E402

from tests.reliability.helpers import journal  # noqa: E402
from tests.scale.many_trials import run_many_trials  # noqa: E402

#: Trials and the trial count at which a worker node is killed, per size.
SIZES = {"full": (1000, 500), "quick": (200, 100), "smoke": (40, 20)}
#: Worker nodes beside the head, per size: the smoke (``tests/scale/test_many_trials.py``'s
#: search) runs one fewer, which it needs not.
WORKERS = {"full": 3, "quick": 3, "smoke": 2}
OVERHEAD_TARGET = 1.5
MEMORY_TARGET_MIB = 50.0
MIB = 2**20


def slot_gaps(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """``(trial number, gap seconds)`` for every trial that followed another on its node:
    its ``started_at`` less the previous trial's ``ended_at`` there. Trials are numbered from
    0 by ``started_at``; a trial without timestamps (one its node took with it) has none."""
    timed = sorted(
        (r for r in records if r.get("started_at") and r.get("ended_at") and r.get("node_id")),
        key=lambda r: r["started_at"],
    )
    last_end: dict[str, float] = {}
    gaps = []
    for number, record in enumerate(timed):
        node = record["node_id"]
        if node in last_end:
            gaps.append((number, record["started_at"] - last_end[node]))
        last_end[node] = record["ended_at"]
    return gaps


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median_s": None, "mean_s": None, "p90_s": None}
    return {
        "n": len(values),
        "median_s": round(statistics.median(values), 4),
        "mean_s": round(statistics.fmean(values), 4),
        "p90_s": round(float(np.percentile(values, 90)), 4),
    }


def windows(trials: int) -> dict[str, tuple[int, int]]:
    """Trial numbers (0-based, end excluded) "around trial trials/10" and the last tenth."""
    width = max(2, trials // 10)
    centre = trials // 10
    return {
        "early": (max(0, centre - width // 2), centre + width // 2),
        "late": (trials - width, trials),
    }


def overhead(records: list[dict[str, Any]], samples: list[list[float]], trials: int) -> dict:
    """The slot gaps and the driver's CPU seconds per trial in the two windows."""
    gaps = slot_gaps(records)
    out: dict[str, Any] = {"windows": windows(trials)}
    for name, (lo, hi) in out["windows"].items():
        out[name] = _stats([g for n, g in gaps if lo <= n < hi])
        out[name]["driver_cpu_s_per_trial"] = _cpu_per_trial(samples, lo, hi)
    early, late = out["early"]["median_s"], out["late"]["median_s"]
    out["ratio"] = round(late / early, 3) if early and late is not None else None
    out["target"] = OVERHEAD_TARGET
    out["met"] = out["ratio"] is not None and out["ratio"] <= OVERHEAD_TARGET
    cpu_early = out["early"]["driver_cpu_s_per_trial"]
    cpu_late = out["late"]["driver_cpu_s_per_trial"]
    out["driver_cpu_ratio"] = round(cpu_late / cpu_early, 3) if cpu_early and cpu_late else None
    out["all_gaps"] = _stats([g for _, g in gaps])
    out["gaps"] = [[n, round(g, 4)] for n, g in gaps]  # [trial number, gap s]
    return out


def _at(samples: list[list[float]], trials: int) -> list[float] | None:
    """The first sample taken with at least ``trials`` journaled."""
    return next((s for s in samples if s[1] >= trials), None)


def _cpu_per_trial(samples: list[list[float]], lo: int, hi: int) -> float | None:
    first, last = _at(samples, lo), _at(samples, hi)
    if first is None or last is None or last[1] <= first[1]:
        return None
    return round((last[3] - first[3]) / (last[1] - first[1]), 5)


def driver_memory(samples: list[list[float]], trials: int) -> dict[str, Any]:
    """The driver's RSS from the 100th trial journaled (the tenth, for fewer than 1,000) to the
    last: range, slope per 100 trials; and the whole run's peak."""
    start = min(100, trials // 10)
    end = _at(samples, trials)
    steady = [s for s in samples if start <= s[1] < trials] + ([end] if end else [])
    out: dict[str, Any] = {
        "from_trial": start,
        "samples": len(steady),
        "target_mib": MEMORY_TARGET_MIB,
    }
    out["peak_mib_whole_run"] = round(max(s[2] for s in samples) / MIB, 1) if samples else None
    if len(steady) < 2:
        return {**out, "range_mib": None, "met": False}
    rss = [s[2] / MIB for s in steady]
    out["rss_mib_first"] = round(rss[0], 1)
    out["rss_mib_last"] = round(rss[-1], 1)
    out["rss_mib_min"] = round(min(rss), 1)
    out["rss_mib_max"] = round(max(rss), 1)
    out["range_mib"] = round(max(rss) - min(rss), 1)
    xs = [s[1] for s in steady]
    slope = np.polyfit(xs, rss, 1)[0] * 100 if len(set(xs)) > 1 else None
    out["slope_mib_per_100_trials"] = None if slope is None else round(float(slope), 3)
    out["met"] = out["range_mib"] <= MEMORY_TARGET_MIB
    return out


def records_check(run: dict[str, Any], trials: int) -> dict[str, Any]:
    """Whether the journal and results.parquet hold ``trials`` distinct trials, each once, and
    every trial journaled before the node was killed."""
    import pyarrow.parquet as pq

    out_dir = Path(run["out"])
    lines = journal(out_dir)
    rows = pq.read_table(out_dir / "results.parquet").to_pylist()
    summary = json.loads((out_dir / "summary.json").read_text())
    journal_ids = [r["trial_id"] for r in lines]
    row_ids = [r["trial_id"] for r in rows]
    twice = sorted(t for t, n in collections.Counter(journal_ids + row_ids).items() if n != 2)
    before = (run["killed"] or {}).get("journaled_ids") or []
    failed = [r for r in rows if r["status"] != "ok"]
    return {
        "journal_lines": len(lines),
        "journal_distinct": len(set(journal_ids)),
        "results_rows": len(rows),
        "results_distinct": len(set(row_ids)),
        "same_trials": set(journal_ids) == set(row_ids),
        "not_exactly_once": twice,
        "journaled_before_kill": len(before),
        "lost_after_kill": sorted(set(before) - set(row_ids)),
        "summary_n_trials": summary.get("n_trials"),
        "stop_reason": summary.get("stop_reason"),
        "ok": len(rows) - len(failed),
        "failed": len(failed),
        "failed_errors": sorted({str(r["error"])[:200] for r in failed}),
        "stopped_at_rung": sum(r["stopped_at_rung"] is not None for r in rows),
        "candidates": sum(bool(r["is_candidate"]) for r in rows),
        "nodes": dict(collections.Counter((r["node_id"] or "none")[:12] for r in rows)),
        "complete": (
            len(lines) == len(rows) == len(set(row_ids)) == trials
            and set(journal_ids) == set(row_ids)
            and not set(before) - set(row_ids)
        ),
        "early_stopping": summary.get("early_stopping"),
    }


def report_of(run: dict[str, Any], trials: int, kill_at: int | None) -> dict[str, Any]:
    """The benchmark's figures of one :func:`run_many_trials` run (its output folder still
    there): ``tests/scale/test_many_trials.py`` checks them on the run its tests share."""
    records = journal(Path(run["out"]))
    return {
        "trials": trials,
        "kill_at": kill_at,
        "nodes": run["nodes"],
        "status": run["status"],
        "wall_s": run["wall_s"],
        "overhead": overhead(records, run["samples"], trials),
        "driver_memory": driver_memory(run["samples"], trials),
        "records": records_check(run, trials),
        "killed": {k: v for k, v in (run["killed"] or {}).items() if k != "journaled_ids"},
        # Every 10th sample: [seconds, trials journaled, RSS MiB, driver CPU s].
        "samples": [[s[0], s[1], round(s[2] / MIB, 1), s[3]] for s in run["samples"][::10]],
    }


def measure(trials: int, kill_at: int | None, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rs-scale-") as folder:
        run = run_many_trials(Path(folder), trials, kill_at, workers=workers)
        if run["status"] != 0:
            raise SystemExit(f"the search exited with {run['status']}:\n{run['stderr_tail']}")
        return report_of(run, trials, kill_at)


def _print(report: dict[str, Any]) -> None:
    ov, mem, rec = report["overhead"], report["driver_memory"], report["records"]
    rows = [
        {"window": f"{name} {ov['windows'][name][0]}-{ov['windows'][name][1] - 1}", **ov[name]}
        for name in ("early", "late")
    ]
    columns = ["window", "n", "median_s", "mean_s", "p90_s", "driver_cpu_s_per_trial"]
    print_table(rows, columns, "slot gap (one trial's end to the next start on its node)")
    print(
        f"overhead ratio late/early (median): {ov['ratio']} (target <= {ov['target']}: "
        f"{'met' if ov['met'] else 'NOT met'}); driver CPU ratio {ov['driver_cpu_ratio']}"
    )
    print(
        f"driver RSS from trial {mem['from_trial']}: {mem.get('rss_mib_first')} -> "
        f"{mem.get('rss_mib_last')} MiB, range {mem['range_mib']} MiB "
        f"(target <= {mem['target_mib']}: {'met' if mem['met'] else 'NOT met'}), slope "
        f"{mem.get('slope_mib_per_100_trials')} MiB/100 trials, peak {mem['peak_mib_whole_run']}"
    )
    print(
        f"records: journal {rec['journal_lines']} ({rec['journal_distinct']} distinct), "
        f"results.parquet {rec['results_rows']} ({rec['results_distinct']} distinct), "
        f"complete: {rec['complete']}; killed {report['killed'].get('node')} at "
        f"{report['killed'].get('at_trials')} trials, lost after: {rec['lost_after_kill']}; "
        f"failed {rec['failed']} {rec['failed_errors']}; stopped at a rung "
        f"{rec['stopped_at_rung']}; wall {report['wall_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 trials, a node killed at 100")
    parser.add_argument(
        "--smoke", action="store_true", help="40 trials on three nodes, a node killed at 20"
    )
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--kill-at", type=int, default=None, help="0: no node killed")
    parser.add_argument(
        "--workers", type=int, default=None, help="worker nodes beside the head (default 3)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    trials, kill_at = SIZES[size]
    if args.trials:  # a node killed halfway unless --kill-at says otherwise
        trials, kill_at = args.trials, args.trials // 2
    kill_at = (args.kill_at if args.kill_at is not None else kill_at) or None
    run = Run("scale", args)
    report = measure(trials, kill_at, args.workers or WORKERS[size])
    _print(report)
    run.write(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
