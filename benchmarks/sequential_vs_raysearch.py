"""Benchmark: the same 12-setting grid run the sequential way and by raysearch's command.

The grid (conditional dialect; 12 settings): calibrate_method MinMax, Percentile 99.99 and
Percentile 99.999 (three calibration settings) x activation type QUInt8 / QInt8 x per_channel
on/off; weight_type QInt8; op_types_to_quantize [MatMul, Conv] on magika, [MatMul, Gemm] on the
encoder (the encoder has MatMul only). Metric ``cos``, no tolerance: like the loop, the search
looks for the setting of the highest cosine.

Models: magika (``../shared/models/magika`` beside the repository, else the model that ships
in the package with data from the package's builder, see ``_common.magika_source``: 200
calibration rows, 500 evaluation rows) and a one-block transformer encoder
(``tests.models.make_encoder_model``: LayerNormalization, MatMul, Softmax, an int64 attention
mask; seq 64, dim 256, ffn 1024; 200 calibration rows, 1000 evaluation rows).

(a) sequential, the way existing tools do it: one setting after another, each a full
    ``onnxruntime.quantization.quantize_static`` call (calibration inference every time);
    the float model's outputs on the evaluation data are computed once and saved as ``.npy``,
    then loaded for every setting; the quantized model's outputs, ``cos`` and ``L2``. ONNX
    Runtime's default threads (every core). Timed from the float reference to the last metric.
(b) raysearch as a user runs it: the command ``raysearch run config.yaml`` in a new process,
    with the config's defaults (``early_stopping`` on: each trial is evaluated on 10 %, 33 %
    and 100 % of the rows, and ASHA stops the settings outside the best third),
    ``search_algo: Grid``, ``resources.max_concurrent_trials`` = CPUs, ``cpu_per_trial: 1``.
    Timed from starting the process to its exit: Python's start, the imports, Ray's start and
    shutdown, config validation, data loading, the float reference and the outputs (summary,
    table, best model, plots, TensorBoard) are all inside.
(c) the same command with ``early_stopping: false`` (every setting on every row, as (a)):
    what the fixed cost and the calibration sharing alone give, and every setting's metric to
    compare with (a)'s.

The timeline of (b) and (c): ``before_first_trial_s`` (process start to the first trial's
start, actor clock), ``trial_phase_s`` and ``after_last_trial_s`` (last trial's end to the
process's exit); the issue's targets are at most 3 s and 1 s. ``ray_floor`` measures, in the
same run, what Ray alone takes on this machine: a new Python process that imports Ray,
``ray.init``s a local Ray, runs one actor's first method, and shuts Ray down.
``tune_floor``, what Ray Tune alone takes: a new process that imports Ray Tune, starts a local
Ray and runs a ``Tuner`` of two trials of a class ``Trainable`` that does nothing, with the
resources of (b) (one CPU per trial, actors reused), to the first trial's ``step``
(``to_first_trial_s``), and shuts Ray down with ``ray.shutdown`` (``shutdown_s``). A search on
Ray Tune cannot start its first trial sooner.

(a) and (b) run as ``--repeat`` alternating pairs (3 unless ``--smoke``): a single pair on a
shared machine moves by 20 % from run to run, and alternating puts a quieter or busier stretch
on both sides. ``ratio`` is the median pair's (a) / (b), whose figures are reported in full;
``repeats`` holds every pair's, ``ratio_min`` and ``ratio_max`` their spread. (c), the
floors and the ideal run once, (c) compared with the median pair's loop.

Fixed cost against Ray Tune's floor (issue 37 item 1): each case's ``fixed_cost`` holds the
median pair's ``before_first_trial_s`` less ``tune_floor.to_first_trial_s`` (target at most
1.0 s) and ``after_last_trial_s`` beside the floor's ``shutdown_s`` (target at most 0.7 s),
each with ``target_met``.

``--cases`` (default ``cold,warm,grid48,latency``; ``cold`` with ``--smoke``) picks what runs:

cold    (a), (b) and (c) above: the 12-setting grid, each command starting a Ray of its own.
warm    a Ray started with ``ray start --head`` (loopback, free ports, a temp folder of its own;
        ``tests/nodes.py``; its processes killed at the end: ``ray stop`` would stop every Ray
        of the machine) and joined by ``raysearch run`` with ``address: auto``. The first
        search on it (``first_search``, reported apart) keeps the float reference on the
        cluster; then ``--repeat`` alternating pairs of the loop and the same search, which
        reuses it (``kept_warm``). Target: the median ratio >= 3.5, same best setting.
grid48  the 12-setting grid x ``extra_options.ActivationSymmetric`` [false, true] x
        ``extra_options.WeightSymmetric`` [false, true] (48 settings, the loop runs the same 48
        through ``quantize_static``), cold on a Ray of the command's own, ``--repeat``
        alternating pairs. Target: the median ratio >= 4, same best setting.
latency the 12-setting grid's command (early stopping on, cold) and the same with ``select:
        latency``, as ``--repeat`` alternating pairs: where latency decides, the models are
        timed again alone after the last trial (``latency_timing`` of the summary), and
        ``added_after_last_trial_s`` is what that adds to ``after_last_trial_s`` in each pair
        (the median pair's and every pair's). Issue 59: with nothing decided by latency, at
        most 1.0 s after the last trial.
spaces  the 12-setting grid's command written as one space (above) and as Quark's two-space
        form (``search_spaces:`` a MinMax space and a Percentile space, ``_spaces_forms.py``),
        cold, early stopping on, ``--repeat`` alternating pairs (one space, then two spaces):
        each run's wall time, calibrations (trials without a cache hit: each ran a calibration
        or waited for one in flight), the calibrations its cache computed and the trials
        stopped at a rung. Issue 57: the same calibration count, and the median wall times no
        further apart than the runs of one form are from each other.

The *ideal* time is ``(one calibration per distinct calibration + every trial's quantization
and evaluation) / cores`` from (c)'s records. Target: the median (a) / (b) >= 3, with the same
best setting in every pair.

Run::

    python benchmarks/sequential_vs_raysearch.py            # magika and the encoder
    python benchmarks/sequential_vs_raysearch.py --quick    # magika only
    python benchmarks/sequential_vs_raysearch.py --smoke    # tiny encoder only (tests)
    python benchmarks/sequential_vs_raysearch.py --quick --repeat 5   # more pairs
    python benchmarks/sequential_vs_raysearch.py --quick --cases warm  # one case alone

Writes ``benchmarks/results/sequential_vs_raysearch.json``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CPUS,
    Run,
    best_row,
    calibration_id,
    encoder_arrays,
    encoder_model,
    load_average,
    magika_arrays,
    magika_model,
    naive_loop,
    product_settings,
    quiet,
    save_npz,
    shutdown_ray,
)
from _floors import ray_floor, tune_floor  # noqa: E402
from _seq_compare import (  # noqa: E402
    METRIC,
    against_floor,
    against_loop,
    head_node,
    print_report,
    summarize_pairs,
    tied_best,
    whole,
)
from _spaces_forms import (  # noqa: E402
    FORMS,
    calibration_entries,
    form_figures,
    print_forms,
    summarize_forms,
    two_space_form,
)

CALIBRATIONS = [
    ("MinMax", {}),
    ("Percentile", {"CalibPercentile": 99.99}),
    ("Percentile", {"CalibPercentile": 99.999}),
]
#: (activation_type, ActivationSymmetric or None when not set)
ACTIVATIONS = [("QUInt8", None), ("QInt8", None)]
PER_CHANNEL = [True, False]
#: The 48-setting grid's ActivationSymmetric and WeightSymmetric.
SYMMETRIC = [False, True]
#: The cases ``--cases`` chooses from: the 12-setting grid on a Ray of the command's own, on a
#: Ray started before (``ray start --head``), the 48-setting grid, the latency case and the
#: grid as one space against two.
CASES = ("cold", "warm", "grid48", "latency", "spaces")


def search_space(op_types: list[str], symmetric: bool = False) -> dict[str, Any]:
    """The grid in raysearch's conditional dialect (12 settings; 48 with ``symmetric``:
    x ``ActivationSymmetric`` x ``WeightSymmetric``)."""
    space: dict[str, Any] = {
        "calibrate_method": ["MinMax", "Percentile"],
        "percentile": {
            "only_if": {"calibrate_method": "Percentile"},
            "extra_options": {"CalibPercentile": [99.99, 99.999]},
        },
        "activation_type": ["QUInt8", "QInt8"],
        "per_channel": PER_CHANNEL,
        "weight_type": ["QInt8"],
        "op_types_to_quantize": [op_types],
    }
    if symmetric:
        space["extra_options"] = {"ActivationSymmetric": SYMMETRIC, "WeightSymmetric": SYMMETRIC}
    return space


def settings_list(op_types: list[str], symmetric: bool = False) -> list[dict[str, Any]]:
    """The same 12 (or 48) settings for the sequential loop."""
    if not symmetric:
        return product_settings(CALIBRATIONS, ACTIVATIONS, PER_CHANNEL, op_types)
    activations = [(kind, sym) for kind, _ in ACTIVATIONS for sym in SYMMETRIC]
    settings = []
    for setting in product_settings(CALIBRATIONS, activations, PER_CHANNEL, op_types):
        for weight_symmetric in SYMMETRIC:
            extra = {**setting["extra_options"], "WeightSymmetric": weight_symmetric}
            settings.append({**setting, "extra_options": extra})
    return settings


def prepare(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Model file, data files and the case's parameters."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "magika":
        model = magika_model(folder)
        calib, evaluation = magika_arrays(200, args.magika_eval_rows)
        return {
            "name": name,
            "model": model,
            "calib": calib,
            "eval": evaluation,
            "op_types": ["MatMul", "Conv"],
            "tolerance": 0.99,
            "batch_size": 50,
        }
    size = {"seq": 8, "dim": 16, "ffn": 32} if args.smoke else {}
    model = encoder_model(folder, **size)
    return {
        "name": name,
        "model": model,
        "calib": encoder_arrays(200, seed=3, **size),
        "eval": encoder_arrays(args.encoder_eval_rows, seed=9, **size),
        "op_types": ["MatMul", "Gemm"],
        "tolerance": 0.9999,
        "batch_size": 50,
        "size": size or "default",
    }


def run_sequential(case: dict[str, Any], folder: Path, repeat: int | str = 0) -> dict[str, Any]:
    from raysearch.data import DataSource

    model = case["model"]
    calib = DataSource.load(case["calib"], model, batch_size=case["batch_size"])
    evaluation = DataSource.load(case["eval"], model, batch_size=case["batch_size"])
    work = folder / f"sequential_{repeat}"
    work.mkdir()
    load_before = load_average()
    result = naive_loop(
        model,
        settings_list(case["op_types"], case.get("symmetric", False)),
        calib,
        evaluation,
        work,
        threads=CPUS,
        reference="npy",
        metrics=(METRIC, "L2"),
    )
    result["load_average_before"] = load_before
    result["load_average_after"] = load_average()
    return result


def run_raysearch(
    case: dict[str, Any],
    folder: Path,
    early_stopping: bool,
    *,
    env: dict[str, str] | None = None,
    label: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``raysearch run config.yaml`` in a new process, timed from its start to its exit;
    with ``env`` (a running Ray's, :func:`head_node`) the config joins it (``address:
    auto``); ``extra``: keys added to the config (``search_spaces`` in place of the grid's
    ``search_space``)."""
    import json

    import yaml

    calib_file = folder / "calib.npz"
    eval_file = folder / "eval.npz"
    if not calib_file.exists():
        save_npz(calib_file, case["calib"])
        save_npz(eval_file, case["eval"])
    label = label or ("partial" if early_stopping else "every_row")
    out = folder / f"raysearch_{label}_out"
    config: dict[str, Any] = {
        "model": str(case["model"]),
        "calibration_data": str(calib_file),
        "eval_data": str(eval_file),
        "batch_size": case["batch_size"],
        "search_space": search_space(case["op_types"], case.get("symmetric", False)),
        "search_algo": "Grid",
        "metric": METRIC,
        "resources": {"cpu_per_trial": 1, "max_concurrent_trials": CPUS},
        "output_dir": str(out),
    }
    if not early_stopping:
        config["early_stopping"] = False
    if env is not None:
        config["address"] = "auto"
    config.update(extra or {})
    if "search_spaces" in config:
        del config["search_space"]
    config_file = folder / f"config_{label}.yaml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "raysearch", "run", str(config_file), "--overwrite"]
    shutdown_ray()
    load_before = load_average()
    started = time.perf_counter()
    started_at = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    ended_at = time.time()
    load_after = load_average()
    if done.returncode != 0:
        raise RuntimeError(f"raysearch run failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    rows = []
    for record in records:
        rows.append(
            {
                "trial_id": record["trial_id"],
                "status": record["status"],
                "error": record.get("error"),
                METRIC: record["metric"],
                "setting": record.get("settings"),
                "duration_s": record.get("duration_s"),
                "calibration_s": record.get("calibration_s"),
                "quantization_s": record.get("quantization_s"),
                "evaluation_s": record.get("evaluation_s"),
                "calib_cache_hit": record.get("calib_cache_hit"),
                "eval_rows": record.get("eval_rows"),
                "stopped_at_rung": record.get("stopped_at_rung"),
                "worker_pid": record.get("worker_pid"),
                "started_at": record.get("started_at"),
                "ended_at": record.get("ended_at"),
            }
        )
    return {
        "wall_s": wall,
        "search_started_at": started_at,
        "search_ended_at": ended_at,
        "summary": summary,
        "best_params": summary.get("best_params"),
        "best_metric": summary.get("best_metric"),
        "trials": rows,
        "calibration_entries": calibration_entries(out),
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def alternate(
    repeat: int, loop: Callable[[int], dict], search: Callable[[], dict], what: str
) -> list[tuple[dict, dict]]:
    """``repeat`` alternating pairs of the loop (``loop(number)``) and a raysearch command
    (``search()``), so that a quieter or busier stretch of a shared machine falls on both."""
    pairs = []
    for number in range(repeat):
        pair = f"pair {number + 1} of {repeat}"
        print(f"(a) sequential: quantize_static per setting, npy reference ({pair})")
        a = loop(number)
        print(f"    {a['wall_s']:.1f} s")
        print(f"(b) {what} ({pair})")
        b = search()
        print(f"    {b['wall_s']:.1f} s: {a['wall_s'] / b['wall_s']:.2f}x")
        pairs.append((a, b))
    return pairs


def run_pairs(
    case: dict[str, Any], folder: Path, repeat: int
) -> tuple[list[tuple[dict, dict]], dict[str, Any]]:
    """``repeat`` alternating pairs of (a) and (b), so that a quieter or busier stretch of a
    shared machine falls on both sides (the figures are the median pair's), then (c) once."""
    print(f"== {case['name']}: {len(settings_list(case['op_types']))} settings")
    pairs = alternate(
        repeat,
        lambda number: run_sequential(case, folder, number),
        lambda: run_raysearch(case, folder, early_stopping=True),
        "raysearch run (defaults: early stopping on), everything included",
    )
    print("(c) raysearch run, early_stopping: false")
    c = run_raysearch(case, folder, early_stopping=False)
    print(f"    {c['wall_s']:.1f} s")
    return pairs, c


def compare(
    name: str, case: dict, pairs: list[tuple[dict, dict]], c: dict, floor: dict[str, float]
) -> dict[str, Any]:
    """The median pair's figures in full, every pair's in ``repeats``, (c) against the median
    pair's loop, and the median pair's fixed cost against Ray Tune's ``floor``."""
    row = summarize_pairs(case, pairs, target=3.0)
    a = pairs[row["median_pair"]][0]
    partial = row["raysearch"]
    every_row = against_loop(case, a, c)
    whole_c = whole(c)
    calibration_s = sum(r["calibration_s"] or 0.0 for r in whole_c if not r["calib_cache_hit"])
    quantization_s = sum(r["quantization_s"] or 0.0 for r in whole_c)
    evaluation_s = sum(r["evaluation_s"] or 0.0 for r in whole_c)
    ideal_s = (calibration_s + quantization_s + evaluation_s) / CPUS
    best_a = best_row(a["trials"], METRIC, higher=True)
    return {
        "model": name,
        "settings": len(a["trials"]),
        **row,
        "fixed_cost": against_floor(partial["timeline"], floor),
        "raysearch_every_row": every_row,
        "distinct_calibrations": len({calibration_id(r["setting"]) for r in a["trials"]}),
        "ideal_parts_s": {
            "calibration_s(cache misses)": round(calibration_s, 3),
            "quantization_s": round(quantization_s, 3),
            "evaluation_s": round(evaluation_s, 3),
            "cores": CPUS,
        },
        "ideal_s": round(ideal_s, 3),
        "ideal_ratio_every_row": round(a["wall_s"] / ideal_s, 3) if ideal_s > 0 else math.nan,
        "sequential_time_in": {
            "quantize_static_s": round(sum(r["quantize_static_s"] for r in a["trials"]), 2),
            "float_reference_once_s": round(a["float_reference_once_s"], 2),
            "load_reference_npy_s": round(sum(r["float_reference_s"] for r in a["trials"]), 3),
            "evaluation_s": round(sum(r["evaluation_s"] for r in a["trials"]), 2),
        },
        "sequential_best": {
            "metric": best_a[METRIC],
            "tied_best": len(tied_best(a)),
            "setting": best_a["setting"],
        },
        "load_average_sequential": [a["load_average_before"], a["load_average_after"]],
        "eval_rows": len(next(iter(case["eval"].values()))),
        "calib_rows": len(next(iter(case["calib"].values()))),
    }


def run_warm(case: dict[str, Any], folder: Path, repeat: int, floor: dict) -> dict[str, Any]:
    """The warm case: a Ray started with ``ray start --head`` before the searches, joined by
    ``raysearch run`` with ``address: auto``. Its first search keeps the float reference on
    the cluster (``first_search``, reported apart: the model is new to the cluster); then
    ``repeat`` alternating pairs of the loop and the same search, which reuses it."""
    print(f"== {case['name']}: warm cluster (ray start --head, {CPUS} CPUs)")
    with head_node(CPUS) as env:
        print("    first search on the cluster")
        first = run_raysearch(case, folder, True, env=env, label="warm_first")
        print(f"    {first['wall_s']:.1f} s")
        pairs = alternate(
            repeat,
            lambda number: run_sequential(case, folder, f"warm_{number}"),
            lambda: run_raysearch(case, folder, True, env=env, label="warm"),
            "raysearch run, address: auto (warm)",
        )
    row = summarize_pairs(case, pairs, target=3.5)
    first_row = against_loop(case, pairs[row["median_pair"]][0], first)
    return {
        "model": case["name"],
        "settings": len(pairs[0][0]["trials"]),
        **row,
        "kept_warm": [b["summary"].get("kept_warm") for _, b in pairs],
        "fixed_cost": against_floor(row["raysearch"]["timeline"], floor),
        "first_search": {**first_row, "kept_warm": first["summary"].get("kept_warm")},
    }


def run_grid48(case: dict[str, Any], folder: Path, repeat: int) -> dict[str, Any]:
    """The 48-setting grid (the 12 x ActivationSymmetric x WeightSymmetric), cold on a local
    Ray, against the loop over the same 48 settings, as ``repeat`` alternating pairs."""
    grid = {**case, "symmetric": True}
    print(f"== {case['name']}: {len(settings_list(case['op_types'], True))} settings, cold")
    pairs = alternate(
        repeat,
        lambda number: run_sequential(grid, folder, f"grid48_{number}"),
        lambda: run_raysearch(grid, folder, True, label="grid48"),
        "raysearch run, 48 settings",
    )
    row = summarize_pairs(grid, pairs, target=4.0)
    a = pairs[row["median_pair"]][0]
    return {
        "model": case["name"],
        "settings": len(a["trials"]),
        **row,
        "distinct_calibrations": len({calibration_id(r["setting"]) for r in a["trials"]}),
        "calibrations_run": row["raysearch"]["calibrations_run"],
    }


def run_latency(case: dict[str, Any], folder: Path, repeat: int) -> dict[str, Any]:
    """The 12-setting grid's command with the default ``select`` (latency decides nothing)
    and with ``select: latency``, as ``repeat`` alternating pairs: what timing the models
    again alone after the last trial adds to the time after it."""
    from _seq_compare import median_index, timeline

    print(f"== {case['name']}: select metric vs select: latency, cold")
    pairs = []
    for _ in range(repeat):
        runs = []
        for select in ("metric", "latency"):
            run = run_raysearch(
                case, folder, True, label=f"select_{select}", extra={"select": select}
            )
            after = timeline(run)["after_last_trial_s"]
            timing = run["summary"].get("latency_timing")
            print(f"    select: {select}: {run['wall_s']:.1f} s, {after} s after the last trial")
            runs.append(
                {
                    "wall_s": round(run["wall_s"], 2),
                    "timeline": timeline(run),
                    "latency_timing": timing,
                    "rounds": (run["summary"].get("latency_retimed") or {}).get("rounds"),
                    "load_average": [run["load_average_before"], run["load_average_after"]],
                }
            )
        metric, latency = runs
        added = latency["timeline"]["after_last_trial_s"] - metric["timeline"]["after_last_trial_s"]
        pairs.append({"metric": metric, "latency": latency, "added_after_last_trial_s": added})
    added = [round(p["added_after_last_trial_s"], 2) for p in pairs]
    median = median_index(added)
    return {
        "model": case["name"],
        "added_after_last_trial_s": added[median],
        "added_min_s": min(added),
        "added_max_s": max(added),
        "after_last_trial_s_metric": [p["metric"]["timeline"]["after_last_trial_s"] for p in pairs],
        "after_last_trial_s_latency": [
            p["latency"]["timeline"]["after_last_trial_s"] for p in pairs
        ],
        "pairs": pairs,
    }


def run_spaces(case: dict[str, Any], folder: Path, repeat: int) -> dict[str, Any]:
    """The 12-setting grid's command as one space and as two (``search_spaces``), cold, as
    ``repeat`` alternating pairs (one space first in each)."""
    print(f"== {case['name']}: the 12-setting grid as one space and as two spaces, cold")
    spaces = two_space_form(case["op_types"], [kind for kind, _ in ACTIVATIONS], PER_CHANNEL)
    runs: dict[str, list[dict[str, Any]]] = {form: [] for form in FORMS}
    for _ in range(repeat):
        for form in FORMS:
            extra = {"search_spaces": spaces} if form == "two spaces" else None
            run = run_raysearch(case, folder, True, label=form.replace(" ", "_"), extra=extra)
            figures = form_figures(run)
            runs[form].append(figures)
            print(
                f"    {form}: {figures['wall_s']} s, {figures['calibrations']} calibrations, "
                f"{figures['stopped_at_rung']} stopped at a rung"
            )
    return summarize_forms(case["name"], runs)


def run_later_cases(
    case: dict[str, Any],
    folder: Path,
    args: argparse.Namespace,
    floor: dict[str, float],
    warm: list[dict],
    grid48: list[dict],
    latency: list[dict],
    spaces: list[dict],
) -> None:
    """The cases after ``cold`` that ``args.cases`` names, each appended to its list."""
    if "warm" in args.cases:
        warm.append(run_warm(case, folder, args.repeat, floor))
    if "grid48" in args.cases:
        grid48.append(run_grid48(case, folder, args.repeat))
    if "latency" in args.cases:
        latency.append(run_latency(case, folder, args.repeat))
    if "spaces" in args.cases:
        spaces.append(run_spaces(case, folder, args.repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="magika only")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny encoder only, 100 evaluation rows (tests)"
    )
    parser.add_argument(
        "--models", default=None, help="comma-separated: magika,encoder (default both)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="alternating pairs of (a) and (b) per model (default 3; 1 with --smoke)",
    )
    parser.add_argument(
        "--cases",
        default=None,
        help="comma-separated: cold (the 12-setting grid, its own Ray), warm (a Ray started "
        "before, joined with address: auto), grid48 (48 settings, cold), latency (the grid "
        "with select: latency against the default select), spaces (the grid as one space "
        "against Quark's two spaces); default all (cold only with --smoke)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.cases = (args.cases or ("cold" if args.smoke else ",".join(CASES))).split(",")
    if unknown := set(args.cases) - set(CASES):
        parser.error(f"--cases: unknown {sorted(unknown)}; choose from {', '.join(CASES)}")
    if args.repeat is None:
        args.repeat = 1 if args.smoke else 3
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    quiet()
    default = "encoder" if args.smoke else ("magika" if args.quick else "magika,encoder")
    models = (args.models or default).split(",")
    args.magika_eval_rows = 500
    args.encoder_eval_rows = 100 if args.smoke else 1000
    run = Run("sequential_vs_raysearch", args)

    cases, warm, grid48, latency, spaces = [], [], [], [], []
    details: dict[str, Any] = {}
    floors, tune_floors = [], []
    tmp = Path(tempfile.mkdtemp(prefix="raysearch-bench-seq-"))
    try:
        for name in models:
            folder = tmp / name
            case = prepare(name, folder, args)
            if "cold" in args.cases:
                pairs, c = run_pairs(case, folder, args.repeat)
                floors.append(ray_floor())
                print(f"Ray alone: {floors[-1]}")
            if {"cold", "warm"} & set(args.cases):  # the cases measured against Tune's floor
                tune_floors.append(tune_floor())
                print(f"Ray Tune alone: {tune_floors[-1]}")
            if "cold" in args.cases:
                row = compare(name, case, pairs, c, tune_floors[-1])
                cases.append(row)
                a, b = pairs[row["median_pair"]]
                details[name] = {
                    "sequential": a["trials"],
                    "raysearch": b["trials"],
                    "every_row": c["trials"],
                }
            floor = tune_floors[-1] if tune_floors else {}
            run_later_cases(case, folder, args, floor, warm, grid48, latency, spaces)
    finally:
        shutdown_ray()
        shutil.rmtree(tmp, ignore_errors=True)

    print_report(cases, warm, grid48, floors, tune_floors, latency)
    print_forms(spaces)
    report = {
        "metric": METRIC,
        "cases": cases,
        "warm": warm,
        "grid48": grid48,
        "latency": latency,
        "spaces": spaces,
        "ray_floor": floors,
        "tune_floor": tune_floors,
    }
    run.write({**report, "trials": details}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
