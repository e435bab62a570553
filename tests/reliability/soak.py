"""A long search, measured: ``raysearch run`` of N trials on the test MLP in a process (and a
Ray) of its own, killed (SIGKILL) once N trials are journaled, then ``raysearch resume`` to
N + ``extra`` trials. Shared by ``benchmarks/soak.py`` (500 trials, the figures) and
``tests/reliability/test_soak.py`` (fewer trials, the behaviour).

From the probe evaluator's log (one line per call, in the process that runs the trial): the
resident memory, open file descriptors and raysearch temp-folder entries of each trial
process, fitted by least squares against the trial's index (slope per 100 trials, after the
first ``warmup`` calls of each process); the journal's bytes per line (a journal that grows
linearly has about the same size of line throughout); and the resume: seconds from starting
``raysearch resume`` to the first new trial journaled, and whether any trial ran twice.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from tests.reliability.evaluators import TEMP_PREFIXES
from tests.reliability.helpers import (
    calls,
    journal,
    kill_group,
    probe_config,
    start_raysearch,
    stop_leftovers,
    wait_until,
    write_config,
)

#: Unbounded distinct settings: a percentile drawn from a continuous range.
SPACE = {
    "calibrate_method": "Percentile",
    "per_channel": [True, False],
    "activation_type": ["QUInt8", "QInt8"],
    "extra_options": {"CalibPercentile": {"type": "float", "low": 99.0, "high": 99.9999}},
}


def _slope_per_100(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or len(set(xs)) < 2:
        return None
    return float(np.polyfit(np.asarray(xs), np.asarray(ys), 1)[0] * 100.0)


def _trends(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Per trial process: the slope (per 100 trials) of memory, descriptors, temp entries."""
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for index, row in enumerate(rows):
        by_pid[row["pid"]].append({**row, "index": index})
    processes = []
    for pid, own in by_pid.items():
        steady = own[warmup:]
        if len(steady) < 3:
            continue
        xs = [r["index"] for r in steady]
        processes.append(
            {
                "pid": pid,
                "trials": len(own),
                "rss_mib_first": round(steady[0]["rss_mib"], 1),
                "rss_mib_last": round(steady[-1]["rss_mib"], 1),
                "rss_mib_per_100": _slope_per_100(xs, [r["rss_mib"] for r in steady]),
                "fds_per_100": _slope_per_100(xs, [r["fds"] for r in steady]),
                "temp_entries_per_100": _slope_per_100(xs, [r["temp"] for r in steady]),
                "fds_max": max(r["fds"] for r in steady),
                "temp_entries_max": max(r["temp"] for r in steady),
            }
        )
    return {"processes": processes}


def _journal_lines(path: Path) -> dict[str, Any]:
    sizes = [len(line) for line in path.read_bytes().splitlines() if line.strip()]
    half = len(sizes) // 2
    return {
        "lines": len(sizes),
        "bytes": sum(sizes),
        "bytes_per_line_first_half": round(float(np.mean(sizes[:half])), 1) if half else None,
        "bytes_per_line_second_half": round(float(np.mean(sizes[half:])), 1) if half else None,
    }


def run_soak(
    folder: Path, trials: int, extra: int = 10, warmup: int = 10, timeout_s: float = 3600
) -> dict[str, Any]:
    """Run, kill at ``trials`` journaled, resume to ``trials + extra``; the measurements."""
    temp = Path(tempfile.mkdtemp(prefix="rss", dir="/tmp"))  # short: Ray's socket paths
    config = probe_config(
        folder,
        search_space=SPACE,
        search_algo="Random",
        stop={"iteration_limit": trials + extra},
        measure_latency=False,
        resources={"max_concurrent_trials": 2},
    )
    path = write_config(folder / "config.yaml", config)
    out = Path(config["output_dir"])
    started = time.monotonic()
    proc = start_raysearch(["run", str(path)], folder, TMPDIR=str(temp))
    try:
        wait_until(proc, lambda: len(journal(out)) >= trials, timeout=timeout_s)
        run_s = time.monotonic() - started
        kill_group(proc, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        stop_leftovers(proc)
    before = journal(out)
    resume_started = time.monotonic()
    resumed = start_raysearch(["resume", str(out)], folder, TMPDIR=str(temp))
    try:
        wait_until(resumed, lambda: len(journal(out)) > len(before), timeout=timeout_s)
        first_new_s = time.monotonic() - resume_started
        status = resumed.wait(timeout=timeout_s)
        resume_s = time.monotonic() - resume_started
    finally:
        stop_leftovers(resumed)
    after = journal(out)
    trial_calls = [c for c in calls(folder / "calls.jsonl") if c["trial"] != "float"]
    evaluations = defaultdict(int)
    for call in trial_calls:
        evaluations[call["trial"]] += 1
    left = sorted(p.name for p in temp.iterdir() if p.name.startswith(TEMP_PREFIXES))
    shutil.rmtree(temp, ignore_errors=True)
    return {
        "trials_before_kill": len(before),
        "trials_after_resume": len(after),
        "resume_status": status,
        "distinct_trials": len({r["trial_id"] for r in after}),
        "distinct_settings": len({r["key"] for r in after}),
        "trials_evaluated_twice": sorted(t for t, n in evaluations.items() if n > 1),
        "run_s_to_kill": round(run_s, 2),
        "resume_s_to_first_new_trial": round(first_new_s, 2),
        "resume_s_total": round(resume_s, 2),
        "journal": _journal_lines(out / "journal.jsonl"),
        "temp_entries_left": left,
        **_trends(trial_calls, warmup),
    }
