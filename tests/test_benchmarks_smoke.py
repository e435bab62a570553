"""The benchmarks under ``benchmarks/`` run, with their smallest settings (``--smoke``), and
write their JSON result with the expected keys. Speed is not checked here: a loaded CI
machine gives other numbers; ``benchmarks/README.md`` holds the measured figures.
``scale.py``'s smoke size is the search of ``tests/scale/test_many_trials.py``, whose last
test checks the benchmark's figures of that run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.helpers import kill_group, stop_leftovers

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

pytestmark = pytest.mark.slow

MACHINE_KEYS = {"cpus", "cpu_model", "memory_gib", "load_average", "load_average_end", "versions"}


#: How long a benchmark's smoke may run at most (seconds): a bound for one that hangs, not a
#: speed check. The smokes that start several Ray instances (``batch``: three Ray starts and
#: four drivers) take minutes on a loaded 2-core machine; every wait inside them is on an
#: event (a node registered, a process ended) and fails on its own saying what did not happen.
#: Below pytest's 600 s per test, so that a smoke past it fails with what it printed rather
#: than pytest-timeout's stack dump.
SMOKE_TIMEOUT_S = 540


def run_benchmark(script: str, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / f"{script}.json"
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke", "--out", str(out)]
            + list(extra),
            cwd=tmp_path,
            stdout=stdout,
            stderr=err,
            start_new_session=True,  # so that a smoke past its time ends with what it started
        )
    try:
        status = proc.wait(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Ctrl-C first: a benchmark stops the Ray nodes it started (their own sessions) as it
        # unwinds; then whatever of its own session is left.
        kill_group(proc, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        stop_leftovers(proc)
        status = None
    printed = (tmp_path / "stdout.txt").read_text()[-3000:]
    printed += (tmp_path / "stderr.txt").read_text()[-3000:]
    assert status is not None, f"{script} --smoke ran past {SMOKE_TIMEOUT_S} s:\n{printed}"
    assert status == 0, printed
    report = json.loads(out.read_text())
    assert report["benchmark"] == script
    assert MACHINE_KEYS <= set(report["machine"])
    assert {"onnxruntime", "ray", "optuna", "raysearch"} <= set(report["machine"]["versions"])
    assert report["args"]["smoke"] is True
    return report


def _setting_key(setting: dict) -> str:
    """A setting with the defaults the two runs may leave out made explicit."""
    extra = {"ActivationSymmetric": False, **(setting.get("extra_options") or {})}
    full = {"per_channel": False, "weight_type": "QInt8", **setting, "extra_options": extra}
    return json.dumps(full, sort_keys=True)


def test_sequential_vs_raysearch(tmp_path: Path) -> None:
    report = run_benchmark("sequential_vs_raysearch", tmp_path)
    assert report["metric"] == "cos"
    (case,) = report["cases"]
    assert case["model"] == "encoder"
    assert case["settings"] == 12
    for key in ("sequential_wall_s", "raysearch_wall_s", "ratio", "ideal_s", "target_met"):
        assert key in case, key
    # --smoke runs one pair of (a) and (b): it is the median pair.
    (pair,) = case["repeats"]
    assert case["median_pair"] == 0 and pair["ratio"] == case["ratio"] == case["ratio_min"]
    assert pair["same_setting"] is True
    (floor,) = report["ray_floor"]
    assert 0 < floor["to_ray_initialised_s"] <= floor["to_first_actor_call_s"]
    (tune_floor,) = report["tune_floor"]
    assert tune_floor["to_first_trial_s"] > 0 and tune_floor["shutdown_s"] > 0
    # The fixed cost against Tune's floor of the same run (issue 37 item 1).
    fixed = case["fixed_cost"]
    timeline = case["raysearch"]["timeline"]
    assert fixed["before_first_trial_s"] == timeline["before_first_trial_s"]
    excess = timeline["before_first_trial_s"] - tune_floor["to_first_trial_s"]
    assert fixed["before_first_trial_excess_s"] == round(excess, 2)
    assert fixed["before_first_trial_target_met"] is (fixed["before_first_trial_excess_s"] <= 1.0)
    assert fixed["after_last_trial_target_met"] is (timeline["after_last_trial_s"] <= 0.7)
    # --smoke runs the cold case only
    assert report["warm"] == [] and report["grid48"] == [] and report["latency"] == []
    for run in (case["raysearch"], case["raysearch_every_row"]):
        assert run["trials"] == 12 and run["failed"] == 0
        assert set(run["timeline"]) == {
            "before_first_trial_s",
            "trial_phase_s",
            "after_last_trial_s",
        }
        # The claims, not only their keys: every fully evaluated setting scores exactly as
        # quantize_static's, and the best setting (and its metric) is the same.
        assert run["max_abs_metric_diff_per_setting"] == 0
        assert run["same_setting"] is True
        assert run["metric_abs_diff"] == 0
        assert run["summary_best_metric"] == run["best_metric"]
    # 100 evaluation rows are too few to split: both runs evaluate every row.
    assert case["raysearch"]["stopped_early"] == 0
    assert case["raysearch_every_row"]["settings_compared"] == 12
    # Checked again from the per-trial rows, without the benchmark's own comparison.
    trials = report["trials"]["encoder"]
    sequential = {_setting_key(r["setting"]): r["cos"] for r in trials["sequential"]}
    raysearch = {_setting_key(r["setting"]): r["cos"] for r in trials["every_row"]}
    assert len(sequential) == len(raysearch) == 12
    assert raysearch == sequential
    top = max(sequential.values())
    assert sequential[_setting_key(case["raysearch"]["best_setting"])] == top


def test_overhead(tmp_path: Path) -> None:
    report = run_benchmark("overhead", tmp_path)
    assert [r["case"] for r in report["rows"]] == ["0.1s", "1s"]
    for row in report["rows"]:
        for key in (
            "engine_s",
            "wall_per_trial_s",
            "overhead_s",
            "actor_gap_overhead_s",
            "actor_gap_overhead_pct",
            "startup_s",
            "target_met",
        ):
            assert key in row, key
        assert row["failed"] == 0


def test_scaling(tmp_path: Path) -> None:
    report = run_benchmark("scaling", tmp_path)
    concurrency = [r["concurrency"] for r in report["rows"]]
    assert concurrency[0] == 1
    assert report["same_settings_every_level"] is True
    for row in report["rows"]:
        assert {"trial_phase_s", "search_wall_s", "speedup", "trials_per_min"} <= set(row)
        assert row["trials"] == report["trials_per_search"]
        # The ceiling: the same trials in as many plain processes, measured in the same run.
        for key in ("plain_phase_s", "ceiling_speedup", "fraction_of_ceiling", "speedup"):
            assert isinstance(row[key], float) and row[key] > 0, (key, row[key])
    assert {"speedup_at_2", "target", "met"} <= set(report)
    plain = report["plain_processes"]
    assert [p["processes"] for p in plain] == concurrency
    for run in plain:
        assert run["trials"] == report["trials_per_search"] and run["failed"] == 0
        assert 1 <= run["workers"] <= run["processes"]
        assert run["trial_phase_s"] > 0 and run["engine_mean_s"] > 0
        assert len(run["load_average"]) == 2
    assert report["target_fraction_of_ceiling"] == 0.9
    if 2 in concurrency:  # speed is never checked here, only that the figures are there
        assert report["ceiling_speedup_at_2"] > 0 and report["fraction_of_ceiling_at_2"] > 0
        assert isinstance(report["target_met"], bool)


def test_search_efficiency(tmp_path: Path) -> None:
    report = run_benchmark("search_efficiency", tmp_path)
    algos = [r["algo"] for r in report["rows"]]
    assert algos[0] == "Random" and algos[-1] == "Grid"
    assert {"TPE (Optuna defaults)", "TPE (raysearch)"} <= set(algos)  # side by side
    assert report["candidates"] >= 1 and report["budget"] == 30
    assert {"space_size", "tolerance", "top_fraction"} <= set(report)
    for row in report["rows"]:
        assert row["median_trials"] is not None  # 30 trials cover the 24-setting space
        assert len(row["per_seed"]) == row["seeds"]
        assert row["never_found"] == 0


def test_memory(tmp_path: Path) -> None:
    report = run_benchmark("memory", tmp_path)
    processes = report["processes"]
    assert processes[0]["process"] == "driver"
    assert len(processes) >= 2  # the driver and at least one trial actor
    for row in processes:
        assert row["peak_rss_mib"] > 0
        assert "slope_mib_per_100_trials" in row
    assert {"write_mib_per_trial", "output_dir_bytes", "peak_tmp_bytes_all_actors"} <= set(
        report["disk"]
    )


def test_calibration_cache(tmp_path: Path) -> None:
    report = run_benchmark("calibration_cache", tmp_path)
    assert report["magika"]["source"] in ("shared", "package")
    assert report["n_settings"] == len(report["naive"]) == len(report["cached"]) == 6
    # The cache's claims: both Percentile values share one histogram, and the metrics and the
    # best setting are those of quantize_static.
    assert report["distinct_calibration_settings"] == 3 and report["calibrations_run"] == 2
    assert report["max_abs_metric_diff_per_setting"] == 0.0
    assert report["best_cos"]["same_setting"] is True
    # The ideal is a lower bound of the cached run's time.
    assert report["ideal_is_bound"] is True
    assert 0 < report["ideal_s"] <= report["cached_wall_s"]
    assert report["fraction_of_ideal"] <= 1.0
    assert report["ratio"] <= report["ideal_ratio"]


def test_op_types_top1(tmp_path: Path) -> None:
    report = run_benchmark("op_types_top1", tmp_path)
    assert report["float_top1_agreement"] == 1.0
    assert set(report["groups"]) == {"MatMul/Conv", "every op"}
    for row in report["rows"]:
        assert 0.0 <= row["top1_agreement"] <= 1.0


def test_magika_falls_back_to_the_packaged_model(tmp_path: Path) -> None:
    """Without ../shared/models/magika the benchmarks use the model that ships in the package
    and data made by the package's own builder."""
    from raysearch.demo import MAGIKA_DIR, build_demo_data

    code = (
        "import json, _common; "
        f"s = _common.magika_source(shared={str(tmp_path / 'absent')!r}); "
        "print(json.dumps({k: str(v) for k, v in s.items()}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAYSEARCH_MAGIKA_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = json.loads(proc.stdout.strip().splitlines()[-1])
    assert source["source"] == "package"
    assert Path(source["model"]) == MAGIKA_DIR / "model.onnx"
    assert Path(source["calib"]).is_relative_to(tmp_path / "cache")
    calib, evaluation = build_demo_data(tmp_path / "expected", n_calib=200, n_eval=500)
    for built, expected in ((source["calib"], calib), (source["eval"], evaluation)):
        with np.load(built) as got, np.load(expected) as want:
            np.testing.assert_array_equal(got["bytes"], want["bytes"])


def test_partial_eval(tmp_path: Path) -> None:
    report = run_benchmark("partial_eval", tmp_path)
    assert report["metric"] == "cos" and report["seed"] == 0
    (case,) = report["cases"]
    assert case["model"] == "encoder" and case["settings"] == 16 and case["eval_rows"] == 400
    for key in ("rows_ratio", "wall_whole_s", "wall_partial_s", "wall_ratio", "best_abs_diff"):
        assert key in case, key
    assert set(case["targets"]) == {"rows_cut_3x", "wall_2x", "best_within_1e-4_or_same"}
    # The claims, not only their keys: the same settings on both sides, every trial evaluated
    # on every row scores exactly as in the whole evaluation, fewer rows, a close best.
    assert case["unmatched_settings"] == 0 and case["metric_mismatches_when_whole"] == []
    assert case["rows_whole"] == 16 * 400 and case["rows_partial"] < case["rows_whole"]
    assert case["targets"]["best_within_1e-4_or_same"]
    runs = report["runs"]["encoder"]
    assert runs["whole"]["summary_early_stopping"]["enabled"] is False
    partial = runs["partial"]
    assert partial["summary_early_stopping"]["rung_rows"] == [40, 132, 400]
    for trial in partial["per_trial"]:
        if trial["stopped_at_rung"] is not None:
            assert trial["eval_rows"] in (40, 132) and not trial["is_candidate"]
        else:
            assert trial["eval_rows"] == 400
    assert partial["rows_evaluated"] == sum(t["eval_rows"] for t in partial["per_trial"])


def test_time_to_quality(tmp_path: Path) -> None:
    report = run_benchmark("time_to_quality", tmp_path)
    (row,) = report["results"]
    assert (row["model"], row["algo"], row["seed"]) == ("encoder", "Auto", 0)
    # The encoder's goal (cosine 0.999, every MatMul quantized) is within one stage's reach.
    assert row["time_to_goal_s"] is not None and row["goal_stage"] is not None
    assert row["time_to_goal_s"] <= row["wall_s"] + 1
    (summary,) = report["summary"]
    assert summary["reached"] == 1 and summary["seeds"] == 1


def test_batch(tmp_path: Path) -> None:
    report = run_benchmark("batch", tmp_path)
    assert report["space"] == "MATMUL_CONV_INT8_SEARCH"
    assert report["models"] == ["cnn_c4_s8"]  # --smoke: one model
    (pair,) = report["pairs"]  # --smoke runs one pair
    assert pair == report["median_pair"] and report["ratios"] == [pair["ratio"]]
    for side in ("sequential", "batch"):
        figures = pair[side]
        assert figures["wall_s"] > 0 and len(figures["load_average"]) == 2
        assert 0 < figures["trial_busy_share"] <= 1
    assert pair["ratio"] == round(pair["sequential"]["wall_s"] / pair["batch"]["wall_s"], 3)
    # The batch found every model's best setting, each setting scored as in its own search.
    assert report["every_best_same"] is pair["every_best_same"] is True
    for row in pair["models"]:
        assert row["seq_trials"] == row["batch_trials"] == 12 and row["settings_compared"] == 12
        assert row["same_best"] is True and row["max_abs_metric_diff"] == 0.0, row


def test_weight_only(tmp_path: Path) -> None:
    report = run_benchmark("weight_only", tmp_path, "--tolerance", "0.02")
    rows = {row["setting"]: row for row in report["rows"]}
    # the float model, three ONNX Runtime anchors, NNCF's two where it is installed, the search
    # --smoke's one-block decoder: 8 weight MatMuls probed under each choice of the menu: the
    # base's, 8 bits, and up to two more accurate uniform settings
    probes = report["trials_per_stage"]["sensitivity"]
    assert len(rows) in (5, 7) and probes % 8 == 0 and 16 <= probes <= 32
    assert all(row["decode_1_ms"] > 0 and row["prefill_ms"] > 0 for row in rows.values())
    del rows["float"]
    best = rows["raysearch WeightOnly (best/)"]
    assert best["kl"] <= 0.02 and best["matmuls_float"] == 0
    correlation = report["probe_subset_rank_correlation"]
    assert correlation["rows"] == 4 and -1.0 <= correlation["spearman"] <= 1.0
    assert best["matmuls_4bit"] + best["matmuls_8bit"] == 8
    nncf_int4 = rows.get("nncf_int4_sym (nncf_weight_only)")
    if nncf_int4 is not None:  # 4 bits but lm_head, at NNCF's 8-bit backup
        assert nncf_int4["matmuls_4bit"] == 7 and nncf_int4["matmuls_dequantized"] == 1
    for row in rows.values():
        low, high = row["kl_ci"]
        assert low <= row["kl"] <= high and 0 < row["top1_agreement"] <= 1


def test_large_decoder(tmp_path: Path) -> None:
    # --smoke: the tiny decoder with its weights in an external file (the 2.2 GiB one is
    # tests/search/test_large_decoder.py's)
    report = run_benchmark("large_decoder", tmp_path)
    assert [t["status"] for t in report["trials"]] == ["ok", "ok"]
    assert set(report["best_files"]) == {"model.onnx", "model.onnx.data", "config.yaml"}
    assert report["best_metric_after_move"] == pytest.approx(report["best_metric"], rel=1e-6)
    assert report["trial_process_peak_bytes"] and report["driver_peak_bytes"] > 0


def test_suite_cpu_counts_a_childs_cpu_and_passes_its_exit_status_on(tmp_path: Path) -> None:
    """``suite_cpu.py`` runs a command that spins 1.5 CPU-seconds in a child process of its
    own (then sleeps past two samples) and exits 3: the child's CPU is in the table under its
    kind, and the status is 3."""
    spin = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time\\nwhile time.process_time() < 1.5: pass\\ntime.sleep(1.2)']); "
        "sys.exit(3)"
    )
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "suite_cpu.py"), "--", sys.executable, "-c", spin],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    table = done.stdout.split("the processes that took most:")[0].splitlines()[2:]
    rows = [line.split(None, 2) for line in table]
    python = [float(cpu) for cpu, _, name in rows if name == "other: python"]
    assert python and python[0] >= 1.4, done.stdout
