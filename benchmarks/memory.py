"""Memory and disk: peak resident memory of the driver and of the trial actors during a search
on magika, whether it grows with the number of trials, and the bytes written per trial.

The search: magika (``_common.magika_source``; 200 calibration rows; 200 evaluation rows,
``--quick`` 100), Grid over 192 MinMax settings (activation type, per_channel, reduce_range,
ActivationSymmetric, WeightSymmetric, CalibTensorRangeSymmetric, op_types_to_quantize
[MatMul, Conv] / [MatMul] / [Conv]), ``stop.iteration_limit`` 100 (``--quick`` 30),
``cpu_per_trial: 1``, as many trials at once as CPUs, default outputs
(``keep_candidates``: its default, the 3 best candidates' models).

A sampler thread in the driver reads, every 0.25 s, ``/proc/<pid>/status`` (``VmRSS``,
``VmHWM``) and ``/proc/<pid>/io`` (``write_bytes``: bytes sent to the storage layer) of the
driver and of every ``ray::`` process, and the size of the quantizer's temporary folders
(``<tmp>/raysearch-*-<pid>-*``); afterwards only the trial actors (the ``worker_pid`` of the
results) are kept. Reported:

- driver: peak RSS (``VmHWM``, the whole process life, data loading included), RSS after
  trial 10 and after the last trial;
- each actor: peak RSS, RSS after trial 10 and after the last trial (global trial order), and
  the slope of RSS against trials finished from trial 10 on (MiB per 100 trials);
- disk: ``write_bytes`` of the actors and the driver during the search, per trial; the output
  folder's size at the end; the peak size of the temporary folders during the search.

Usage::

    python benchmarks/memory.py            # 100 trials
    python benchmarks/memory.py --quick    # 30 trials
    python benchmarks/memory.py --smoke    # 4 trials, 20 rows (tests)

Writes ``benchmarks/results/memory.json``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    du_bytes,
    magika_arrays,
    magika_model,
    one_calibration_space,
    print_table,
    proc_io,
    proc_status,
    quiet,
    save_npz,
    shutdown_ray,
)

from raysearch import AutoSearch  # noqa: E402

MIB = 2**20
SPACE = one_calibration_space([["MatMul", "Conv"], ["MatMul"], ["Conv"]])
_TMP_DIR = re.compile(r"^raysearch-[a-z]+-(\d+)-")


class Sampler(threading.Thread):
    """Samples memory, I/O counters and temporary-folder sizes every ``period_s``."""

    def __init__(self, period_s: float = 0.25) -> None:
        super().__init__(daemon=True, name="memory-sampler")
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self.peak_hwm: dict[int, int] = {}
        self.first_io: dict[int, int] = {}
        self.last_io: dict[int, int] = {}
        self.tmp_peak: dict[int, int] = {}
        self._halt = threading.Event()
        self.tmp_root = Path(tempfile.gettempdir())

    def _pids(self) -> list[int]:
        pids = [os.getpid()]
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::"):
                pids.append(int(entry.name))
        return pids

    def _tmp_sizes(self) -> dict[int, int]:
        sizes: dict[int, int] = {}
        try:
            entries = list(os.scandir(self.tmp_root))
        except OSError:
            return sizes
        for entry in entries:
            match = _TMP_DIR.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                pid = int(match.group(1))
                sizes[pid] = sizes.get(pid, 0) + du_bytes(Path(entry.path))
        return sizes

    def sample(self) -> None:
        now = time.time()
        tmp = self._tmp_sizes()
        for pid, size in tmp.items():
            self.tmp_peak[pid] = max(self.tmp_peak.get(pid, 0), size)
        for pid in self._pids():
            status = proc_status(pid)
            if not status:
                continue
            io = proc_io(pid).get("write_bytes")
            if io is not None:
                self.first_io.setdefault(pid, io)
                self.last_io[pid] = io
            self.peak_hwm[pid] = max(self.peak_hwm.get(pid, 0), status.get("VmHWM", 0))
            self.samples.append(
                {"t": now, "pid": pid, "rss": status.get("VmRSS", 0), "tmp": tmp.get(pid, 0)}
            )

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.period_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()


def rss_at(samples: list[dict], pid: int, t: float) -> int | None:
    """The first RSS sample of ``pid`` at or after ``t`` (else its last one before)."""
    own = [s for s in samples if s["pid"] == pid]
    after = [s for s in own if s["t"] >= t]
    if after:
        return after[0]["rss"]
    return own[-1]["rss"] if own else None


def slope_mib_per_100(samples: list[dict], pid: int, ends: list[float], start: int) -> float:
    """Least-squares slope of ``pid``'s RSS against the number of trials finished, from trial
    ``start`` on, in MiB per 100 trials."""
    xs, ys = [], []
    t0 = ends[start - 1] if len(ends) >= start else ends[0]
    for s in samples:
        if s["pid"] != pid or s["t"] < t0 or s["t"] > ends[-1]:
            continue
        xs.append(sum(1 for e in ends if e <= s["t"]))
        ys.append(s["rss"] / MIB)
    if len(set(xs)) < 2:
        return float("nan")
    return float(np.polyfit(xs, ys, 1)[0] * 100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 trials, 100 evaluation rows")
    parser.add_argument("--smoke", action="store_true", help="4 trials, 20 rows (tests)")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("memory", args)
    trials = args.trials or (4 if args.smoke else (30 if args.quick else 100))
    calib_rows, eval_rows = (20, 20) if args.smoke else (200, 100 if args.quick else 200)
    early = min(10, trials)
    with tempfile.TemporaryDirectory(prefix="raysearch-bench-mem-") as tmp:
        folder = Path(tmp)
        calib, evaluation = magika_arrays(calib_rows, eval_rows)
        config = {
            "model": str(magika_model(folder)),
            "calibration_data": str(save_npz(folder / "calib.npz", calib)),
            "eval_data": str(save_npz(folder / "eval.npz", evaluation)),
            "batch_size": 50,
            "search_space": SPACE,
            "search_algo": "Grid",
            "metric": "cos",
            "tolerance": 0.99,
            "resources": {"cpu_per_trial": 1, "max_concurrent_trials": CPUS},
            "stop": {"iteration_limit": trials},
            "output_dir": str(folder / "out"),
        }
        shutdown_ray()
        sampler = Sampler()
        sampler.start()
        driver_io0 = proc_io(os.getpid()).get("write_bytes", 0)
        started = time.perf_counter()
        try:
            result = AutoSearch(config).run(overwrite=True)
        finally:
            sampler.stop()
        wall = time.perf_counter() - started
        driver_io = proc_io(os.getpid()).get("write_bytes", 0) - driver_io0
        output_bytes = du_bytes(folder / "out")
        output_breakdown = {
            p.name: du_bytes(p) for p in sorted((folder / "out").iterdir()) if du_bytes(p)
        }
        driver_hwm = proc_status(os.getpid()).get("VmHWM", 0)
        shutdown_ray()

    records = sorted((r.to_dict() for r in result.records), key=lambda r: r["ended_at"])
    ends = [r["ended_at"] for r in records]
    n = len(records)
    actors = sorted({r["worker_pid"] for r in records if r.get("worker_pid")})
    samples = sampler.samples
    me = os.getpid()
    actor_rows = []
    for pid in actors:
        actor_rows.append(
            {
                "process": f"actor {pid}",
                "trials": sum(1 for r in records if r.get("worker_pid") == pid),
                "peak_rss_mib": round(sampler.peak_hwm.get(pid, 0) / MIB, 1),
                f"rss_after_trial_{early}_mib": round(
                    (rss_at(samples, pid, ends[early - 1]) or 0) / MIB, 1
                ),
                f"rss_after_trial_{n}_mib": round((rss_at(samples, pid, ends[-1]) or 0) / MIB, 1),
                "slope_mib_per_100_trials": round(slope_mib_per_100(samples, pid, ends, early), 2),
                "write_bytes": sampler.last_io.get(pid, 0) - sampler.first_io.get(pid, 0),
                "peak_tmp_bytes": sampler.tmp_peak.get(pid, 0),
            }
        )
    driver_row = {
        "process": "driver",
        "trials": n,
        "peak_rss_mib": round(driver_hwm / MIB, 1),
        f"rss_after_trial_{early}_mib": round((rss_at(samples, me, ends[early - 1]) or 0) / MIB, 1),
        f"rss_after_trial_{n}_mib": round((rss_at(samples, me, ends[-1]) or 0) / MIB, 1),
        "slope_mib_per_100_trials": round(slope_mib_per_100(samples, me, ends, early), 2),
        "write_bytes": driver_io,
        "peak_tmp_bytes": sampler.tmp_peak.get(me, 0),
    }
    rows = [driver_row, *actor_rows]
    written = sum(r["write_bytes"] for r in rows)
    disk = {
        "write_bytes_total": written,
        "write_mib_per_trial": round(written / n / MIB, 3),
        "output_dir_bytes": output_bytes,
        "output_dir_mib_per_trial": round(output_bytes / n / MIB, 3),
        "output_dir_breakdown": output_breakdown,
        "peak_tmp_bytes_all_actors": sum(r["peak_tmp_bytes"] for r in actor_rows),
    }
    print_table(
        rows,
        [
            "process",
            "trials",
            "peak_rss_mib",
            f"rss_after_trial_{early}_mib",
            f"rss_after_trial_{n}_mib",
            "slope_mib_per_100_trials",
            "write_bytes",
            "peak_tmp_bytes",
        ],
        title=f"memory during a {n}-trial search on magika ({CPUS} CPUs, {wall:.1f} s)",
    )
    print(
        f"disk: {disk['write_mib_per_trial']:.2f} MiB written per trial (driver + actors), "
        f"output folder {output_bytes / MIB:.1f} MiB ({disk['output_dir_mib_per_trial']:.3f} "
        f"MiB per trial), peak temporary folders {disk['peak_tmp_bytes_all_actors'] / MIB:.1f} MiB"
    )
    run.write(
        {
            "trials": n,
            "failed": result.summary["n_failed"],
            "eval_rows": eval_rows,
            "calib_rows": calib_rows,
            "search_wall_s": round(wall, 2),
            "processes": rows,
            "disk": disk,
            "samples": len(samples),
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
