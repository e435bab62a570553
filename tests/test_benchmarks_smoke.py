"""The benchmarks under ``benchmarks/`` run, with their smallest settings (``--smoke``), and
write their JSON result with the expected keys. Speed is not checked here: a loaded CI
machine gives other numbers; ``benchmarks/README.md`` holds the measured figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MAGIKA = Path(os.environ.get("RAYSEARCH_MAGIKA_DIR", ROOT.parent / "shared" / "models" / "magika"))

pytestmark = pytest.mark.slow

MACHINE_KEYS = {"cpus", "cpu_model", "memory_gib", "load_average", "load_average_end", "versions"}


def run_benchmark(script: str, tmp_path: Path, *extra: str, timeout: int = 120) -> dict:
    out = tmp_path / f"{script}.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke", "--out", str(out), *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == script
    assert MACHINE_KEYS <= set(report["machine"])
    assert {"onnxruntime", "ray", "optuna", "raysearch"} <= set(report["machine"]["versions"])
    assert report["args"]["smoke"] is True
    return report


def test_sequential_vs_raysearch(tmp_path: Path) -> None:
    report = run_benchmark("sequential_vs_raysearch", tmp_path)
    assert report["metric"] == "cos"
    (case,) = report["cases"]
    assert case["model"] == "encoder"
    assert case["settings"] == 24
    assert case["raysearch_trials"] == 24
    assert case["raysearch_failed"] == 0
    assert case["unmatched_settings"] == 0
    for key in (
        "sequential_wall_s",
        "raysearch_wall_s",
        "ratio",
        "ideal_s",
        "ideal_ratio",
        "fraction_of_ideal",
        "sequential_trials_per_min",
        "raysearch_trials_per_min",
        "target_met",
        "max_abs_metric_diff_per_setting",
    ):
        assert key in case, key
    assert {"same_setting", "sequential_metric", "raysearch_metric"} <= set(case["best"])
    assert len(report["trials"]["encoder"]["sequential"]) == 24


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
    for row in report["rows"]:
        assert {"trial_phase_s", "search_wall_s", "speedup", "trials_per_min"} <= set(row)
        assert row["trials"] == report["trials_per_search"]
    assert {"speedup_at_2", "target", "met"} <= set(report)


def test_search_efficiency(tmp_path: Path) -> None:
    report = run_benchmark("search_efficiency", tmp_path)
    assert [r["algo"] for r in report["rows"]] == ["Random", "TPE", "Grid"]
    assert report["candidates"] >= 1
    assert {"space_size", "tolerance", "top_fraction"} <= set(report)
    for row in report["rows"]:
        assert row["median_trials"] is not None
        assert len(row["per_seed"]) == row["seeds"]


@pytest.mark.skipif(not (MAGIKA / "model.onnx").is_file(), reason="magika model not available")
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
