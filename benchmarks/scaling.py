"""Scaling: the same search with ``max_concurrent_trials`` 1, 2 (and more where more CPUs
exist), ``cpu_per_trial: 1`` (one ONNX Runtime intra-op thread per trial), measured against
the machine's own ceiling: the same trials in plain processes without Ray, in the same run.

The search: a Grid over settings that share one MinMax calibration (so the trials are alike),
on the benchmark encoder (``tests.models.make_encoder_model``, seq 64, dim 256, ffn 1024;
200 calibration rows, 1500 evaluation rows: about 1 s per trial on one core). Ray is started
once, before the first search (its start-up is in neither figure); the searches then run one
after another, with the same trials, ``stop.iteration_limit`` = the number of trials.

- ``trial_phase_s``: from the first trial's start to the last trial's end (actor clocks): the
  time the trials took, scheduling included. Outside it: Ray's and the actors' start-up, the
  trial engine's construction (in the actor's set-up) and the float reference (the driver's).
  Inside it: every trial's quantization and evaluation (latency included, the search's default
  ``measure_latency``), one MinMax calibration (the first trial's; at N >= 2 the other actors
  wait for it on the cache's lock and read it from disk), each actor's first-use costs in its
  first trial, and Tune handing out the trials. ``speedup`` is this time at 1 concurrent trial
  divided by this time at N. Absolute target: >= 1.7 at 2 on 2 cores.
- ``search_wall_s``: the whole ``AutoSearch(...).run()``, data loading and the float reference
  included (``end_to_end_speedup``).

The ceiling (after the searches, Ray shut down): the same work without Ray, with raysearch's
own trial engine. The settings are those the 1-concurrent search ran (read back from its
records, in trial order). For each level N, N plain processes (``multiprocessing``, "spawn")
each build a :class:`raysearch.trial.TrialRunner` the way an actor's engine is built: the same
config through ``SearchConfig.from_dict``, the same data and evaluator, the float reference,
``threads=1``, ``measure_latency`` as the search, a cold calibration cache of its own, and
``OMP_NUM_THREADS=1`` unless set (as Ray sets it for a 1-CPU actor). All of that happens
before a start event that the parent sets once every process is ready, so start-up and
imports are outside the timed part. The processes then take the settings from a shared
counter in trial order (as Tune hands the next trial to whichever actor is free) and run
each with ``TrialRunner.run``.

- ``plain_phase_s``: the same function as ``trial_phase_s`` on the processes' own clocks:
  first trial's start to last trial's end. Inside it: every trial, one MinMax calibration per
  process (its own cache: at N processes N calibrations at once, where the search runs one and
  the others wait for it: the same wall time on N free cores) and each process's first-use
  costs in its first trial; no scheduling.
- ``ceiling_speedup``: ``plain_phase_s`` at 1 process / at N processes: what the machine gives
  N trials at once at that moment. ``fraction_of_ceiling`` = ``speedup`` / ``ceiling_speedup``.
  Target (the issue's acceptance): >= 0.9 at 2 (``target_fraction_of_ceiling``,
  ``target_met``).
- ``warm_*``: the same with every worker's (actor's or process's) first trial left out, which
  holds the calibration (or the wait for it) and the process's first-use costs: rate = the
  remaining trials / (their first start to their last end); ``warm_speedup`` and
  ``warm_ceiling_speedup`` are rates at N / at 1 (the number of remaining trials depends on N),
  ``warm_fraction_of_ceiling`` their ratio. Reported beside the target, not in it.

The load average is recorded before and after every search and every plain run.

Usage::

    python benchmarks/scaling.py            # 32 trials per search
    python benchmarks/scaling.py --quick    # 16 trials per search
    python benchmarks/scaling.py --smoke    # 4 tiny trials per search (tests)

Writes ``benchmarks/results/scaling.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    encoder_arrays,
    encoder_model,
    init_ray,
    load_average,
    one_calibration_space,
    print_table,
    quiet,
    save_npz,
    shutdown_ray,
)

SPACE = one_calibration_space([["MatMul"]])
SPEEDUP_TARGET = 1.7
TARGET_FRACTION_OF_CEILING = 0.9
#: The search's default; the plain processes measure latency as its trials do.
MEASURE_LATENCY = True
#: Seconds a plain process may take to get ready, or to run its trials, before the run fails.
PLAIN_TIMEOUT_S = 1800.0


def levels(cpus: int) -> list[int]:
    out = [1]
    n = 2
    while n <= cpus:
        out.append(n)
        n *= 2
    if out[-1] != cpus:
        out.append(cpus)
    return out


def search_config(data: dict, trials: int, concurrency: int, folder: Path) -> dict[str, Any]:
    """The search's config; the plain processes read the same one (data, metric, batch)."""
    return {
        "model": str(data["model"]),
        "calibration_data": str(data["calib"]),
        "eval_data": str(data["eval"]),
        "batch_size": 50,
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 1.0,
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": concurrency},
        "stop": {"iteration_limit": trials},
        "output_dir": str(folder / f"out_{concurrency}"),
        # Alike trials on every row (evaluation on growing subsets is partial_eval.py's).
        "early_stopping": False,
        "measure_latency": MEASURE_LATENCY,
    }


def phase_figures(trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures both sides are compared on, from per-trial clocks (``started_at``,
    ``ended_at``: ``time.time()``), ``worker`` (the process), ``duration_s`` (the engine's
    time), ``calib_cache_hit`` and ``calibration_s``: one function, so that the search and the
    plain processes are measured the same way."""
    phase = max(t["ended_at"] for t in trials) - min(t["started_at"] for t in trials)
    engine = [float(t.get("duration_s") or 0.0) for t in trials]
    by_worker: dict[Any, list[Mapping[str, Any]]] = {}
    for t in sorted(trials, key=lambda t: t["started_at"]):
        by_worker.setdefault(t["worker"], []).append(t)
    warm = [t for own in by_worker.values() for t in own[1:]]
    warm_phase = (
        max(t["ended_at"] for t in warm) - min(t["started_at"] for t in warm) if warm else None
    )
    return {
        "trials": len(trials),
        "workers": len(by_worker),
        "engine_mean_s": round(statistics.fmean(engine), 4),
        "engine_sum_s": round(sum(engine), 3),
        "cache_misses": sum(1 for t in trials if not t.get("calib_cache_hit")),
        "calibration_s": round(sum(float(t.get("calibration_s") or 0.0) for t in trials), 3),
        "trial_phase_s": round(phase, 3),
        "trials_per_min": round(60 * len(trials) / phase, 2),
        "warm_trials": len(warm),
        "warm_phase_s": round(warm_phase, 3) if warm_phase else None,
        "warm_trials_per_min": round(60 * len(warm) / warm_phase, 2) if warm_phase else None,
    }


def run_level(
    concurrency: int, data: dict, trials: int, folder: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One search; its row and the settings its trials ran, in trial order."""
    from raysearch import AutoSearch  # here: the plain processes import this module, not Ray

    config = search_config(data, trials, concurrency, folder)
    load_before = load_average()
    started = time.perf_counter()
    result = AutoSearch(config).run(overwrite=True)
    wall = time.perf_counter() - started
    records = [r.to_dict() for r in result.records]
    figures = phase_figures([{**r, "worker": r.get("worker_pid")} for r in records])
    ordered = sorted(records, key=lambda r: (r.get("number") is None, r.get("number") or 0))
    row = {
        "concurrency": concurrency,
        "slots": result.summary.get("slots"),
        "trials": figures.pop("trials"),
        "failed": result.summary["n_failed"],
        "actors": figures.pop("workers"),
        **figures,
        "search_wall_s": round(wall, 3),
        "load_average": [load_before, load_average()],
    }
    return row, [dict(r["settings"]) for r in ordered]


# -- the ceiling: plain processes, no Ray --------------------------------------------------------
def _plain_worker(
    config: dict[str, Any],
    settings: list[dict[str, Any]],
    work: str,
    counter: Any,
    go: Any,
    messages: Any,
) -> None:
    """One plain process: a TrialRunner built as an actor's engine is, then, once ``go`` is
    set, the next setting from ``counter`` until none is left; sends its trials' clocks."""
    try:
        import gc

        from raysearch.config import SearchConfig
        from raysearch.data import DataSource, model_inputs
        from raysearch.evaluate import Evaluator, FloatReference
        from raysearch.trial import FloatBaseline, TrialDevice, TrialRunner, TrialSpec

        quiet()
        parsed = SearchConfig.from_dict(config)
        inputs = model_inputs(str(parsed.model))
        calibration = DataSource.load(parsed.calibration_data, inputs, parsed.batch_size)
        evaluation = DataSource.load(parsed.eval_data, inputs, parsed.batch_size)
        # The driver's work in the search (preflight, with its threads): the float reference,
        # before the clock.
        threads = max(1, min(os.cpu_count() or 1, 4))
        reference = FloatReference.compute(str(parsed.model), evaluation, threads=threads)
        runner = TrialRunner(
            TrialSpec(
                parsed.model,
                calibration,
                evaluation,
                Evaluator.from_config(parsed),
                cache_dir=Path(work) / "cache",
                device=TrialDevice(threads=1),
                baseline=FloatBaseline(reference=reference),
                measure_latency=parsed.measure_latency,
            )
        )
        out = Path(work) / "trials"
        out.mkdir(parents=True, exist_ok=True)
        gc.freeze()  # as the actor does after its set-up
        messages.put(("ready", os.getpid(), None))
        if not go.wait(PLAIN_TIMEOUT_S):
            return  # the parent gave up (or died)
        trials = []
        while True:
            with counter.get_lock():
                index = counter.value
                counter.value += 1
            if index >= len(settings):
                break
            started = time.time()
            result = runner.run(settings[index], out / f"trial_{index}.onnx")
            trials.append(
                {
                    "index": index,
                    "worker": os.getpid(),
                    "started_at": started,
                    "ended_at": time.time(),
                    "status": result.status,
                    "error": result.error,
                    "duration_s": result.duration_s,
                    "calibration_s": result.calibration_s,
                    "calib_cache_hit": result.calib_cache_hit,
                }
            )
        runner.close()
        messages.put(("done", os.getpid(), trials))
    except BaseException:  # noqa: BLE001 - the parent reports it
        messages.put(("error", os.getpid(), traceback.format_exc()))


def _collect(messages: Any, processes: list[Any], kind: str) -> list[Any]:
    """One ``kind`` message from every process; a process's error, or one that died or took
    longer than :data:`PLAIN_TIMEOUT_S`, fails the run."""
    out: list[Any] = []
    deadline = time.monotonic() + PLAIN_TIMEOUT_S
    while len(out) < len(processes):
        try:
            got, pid, payload = messages.get(timeout=2.0)
        except queue.Empty:
            dead = [p.pid for p in processes if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"plain processes: waiting for '{kind}'; exited: {dead}"
                ) from None
            continue
        if got == "error":
            raise RuntimeError(f"plain process {pid} failed:\n{payload}")
        if got != kind:
            raise RuntimeError(f"plain process {pid}: '{got}' while waiting for '{kind}'")
        out.append(payload)
    return out


@contextlib.contextmanager
def _one_thread_env() -> Iterator[None]:
    """``OMP_NUM_THREADS=1`` for the processes started inside, unless set: what Ray gives a
    1-CPU actor (NumPy's and OpenMP's pools then match the trial's one core)."""
    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


def plain_run(
    config: dict[str, Any], settings: list[dict[str, Any]], processes: int, folder: Path
) -> dict[str, Any]:
    """``settings`` shared out over ``processes`` plain processes started together (no Ray):
    the figures of :func:`phase_figures` on their trials."""
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("i", 0)
    go = ctx.Event()
    messages = ctx.Queue()
    workers = [
        ctx.Process(
            target=_plain_worker,
            args=(config, settings, str(folder / f"plain_{processes}_{k}"), counter, go, messages),
            daemon=True,
        )
        for k in range(processes)
    ]
    with _one_thread_env():
        for worker in workers:
            worker.start()
    try:
        _collect(messages, workers, "ready")
        load_before = load_average()
        go.set()
        trials = [t for own in _collect(messages, workers, "done") for t in own]
        load_after = load_average()
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=10)
    first_starts = [
        min(t["started_at"] for t in trials if t["worker"] == pid)
        for pid in {t["worker"] for t in trials}
    ]
    return {
        "processes": processes,
        **phase_figures(trials),
        "failed": sum(1 for t in trials if t["status"] != "ok"),
        # How far apart the processes' first trials began (the start event's spread).
        "start_spread_s": round(max(first_starts) - min(first_starts), 4),
        "load_average": [load_before, load_after],
    }


def _rate(row: Mapping[str, Any] | None) -> float | None:
    return row.get("warm_trials_per_min") if row else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def compare(rows: list[dict[str, Any]], plain: dict[int, dict[str, Any]]) -> None:
    """Speed-ups of the search and of the plain processes, and their ratio, into ``rows``."""
    base = rows[0]
    plain_base = plain.get(1)
    for r in rows:
        r["speedup"] = round(base["trial_phase_s"] / r["trial_phase_s"], 3)
        r["end_to_end_speedup"] = round(base["search_wall_s"] / r["search_wall_s"], 3)
        r["efficiency"] = round(r["speedup"] / r["concurrency"], 3)
        r["warm_speedup"] = _ratio(r["warm_trials_per_min"], base["warm_trials_per_min"])
        ceiling = plain.get(r["concurrency"])
        r["plain_phase_s"] = ceiling["trial_phase_s"] if ceiling else None
        r["plain_engine_mean_s"] = ceiling["engine_mean_s"] if ceiling else None
        r["ceiling_speedup"] = (
            _ratio(plain_base["trial_phase_s"], ceiling["trial_phase_s"])
            if ceiling and plain_base
            else None
        )
        r["fraction_of_ceiling"] = _ratio(r["speedup"], r["ceiling_speedup"])
        r["warm_ceiling_speedup"] = _ratio(_rate(ceiling), _rate(plain_base))
        r["warm_fraction_of_ceiling"] = _ratio(r["warm_speedup"], r["warm_ceiling_speedup"])


def main(argv: list[str] | None = None) -> int:
    from raysearch.space import settings_key

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 trials per search")
    parser.add_argument("--smoke", action="store_true", help="4 tiny trials per search (tests)")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument(
        "--no-ceiling", action="store_true", help="skip the plain processes (no Ray) ceiling"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    quiet()
    run = Run("scaling", args)
    trials = args.trials or (4 if args.smoke else (16 if args.quick else 32))
    size = {"seq": 8, "dim": 16, "ffn": 32} if args.smoke else {}
    eval_rows = 200 if args.smoke else 1500
    rows: list[dict[str, Any]] = []
    ran: list[list[dict[str, Any]]] = []
    plain: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="raysearch-bench-scaling-") as tmp:
        folder = Path(tmp)
        data = {
            "model": encoder_model(folder, **size),
            "calib": save_npz(folder / "calib.npz", encoder_arrays(200, seed=3, **size)),
            "eval": save_npz(folder / "eval.npz", encoder_arrays(eval_rows, seed=9, **size)),
        }
        init_ray(CPUS)
        try:
            for concurrency in levels(CPUS):
                print(f"max_concurrent_trials {concurrency}: {trials} trials")
                row, settings = run_level(concurrency, data, trials, folder)
                rows.append(row)
                ran.append(settings)
        finally:
            shutdown_ray()
        if not args.no_ceiling:
            config = search_config(data, trials, 1, folder)
            for processes in levels(CPUS):
                print(f"ceiling: {len(ran[0])} trials in {processes} plain process(es), no Ray")
                plain[processes] = plain_run(config, ran[0], processes, folder)
    compare(rows, plain)
    two = next((r for r in rows if r["concurrency"] == 2), None)
    fraction = two["fraction_of_ceiling"] if two else None
    summary = {
        "speedup_at_2": two["speedup"] if two else None,
        "target": SPEEDUP_TARGET,
        "met": bool(two and two["speedup"] >= SPEEDUP_TARGET),
        "ceiling_speedup_at_2": two["ceiling_speedup"] if two else None,
        "fraction_of_ceiling_at_2": fraction,
        "target_fraction_of_ceiling": TARGET_FRACTION_OF_CEILING,
        "target_met": None if fraction is None else fraction >= TARGET_FRACTION_OF_CEILING,
    }
    print_table(
        rows,
        [
            "concurrency",
            "trials",
            "actors",
            "engine_mean_s",
            "trial_phase_s",
            "search_wall_s",
            "trials_per_min",
            "speedup",
            "end_to_end_speedup",
            "efficiency",
        ],
        title=f"scaling on {CPUS} CPUs, cpu_per_trial 1 (target: speed-up >= 1.7 at 2)",
    )
    print()
    print_table(
        rows,
        [
            "concurrency",
            "trial_phase_s",
            "plain_phase_s",
            "plain_engine_mean_s",
            "speedup",
            "ceiling_speedup",
            "fraction_of_ceiling",
            "warm_speedup",
            "warm_ceiling_speedup",
            "warm_fraction_of_ceiling",
        ],
        title=(
            "against the ceiling: the same trials in plain processes, no Ray "
            f"(target: fraction_of_ceiling >= {TARGET_FRACTION_OF_CEILING} at 2)"
        ),
    )
    print(f"target: {summary}")
    run.write(
        {
            "trials_per_search": trials,
            "eval_rows": eval_rows,
            "measure_latency": MEASURE_LATENCY,
            "same_settings_every_level": all(
                sorted(map(settings_key, s)) == sorted(map(settings_key, ran[0])) for s in ran
            ),
            "rows": rows,
            "plain_processes": [plain[p] for p in sorted(plain)],
            **summary,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
