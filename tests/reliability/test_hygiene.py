"""Resource hygiene over 30 trials: ONNX Runtime sessions, quantized models and calibration's
augmented models are released and removed after each trial, so nothing grows with the number
of trials: temp-folder entries, files in the output folder's working folders, open file
descriptors and memory of the process that runs the trials."""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.reliability.evaluators import TEMP_PREFIXES
from tests.reliability.helpers import (
    GRID_24,
    calls,
    journal,
    probe_config,
    run_and_find_leftovers,
    write_config,
)

pytestmark = pytest.mark.slow

N_TRIALS = 30


@pytest.fixture(scope="module")
def long_search(tmp_path_factory) -> dict[str, Any]:
    """30 trials by ``raysearch run`` in a process (and a Ray) of its own, whose temp folder is
    private, so that its entries are all this search's."""
    folder = tmp_path_factory.mktemp("hygiene")
    temp = Path(tempfile.mkdtemp(prefix="rsh", dir="/tmp"))  # short: Ray's socket paths
    space = {**GRID_24, "extra_options": {"WeightSymmetric": [True, False]}}
    config = probe_config(
        folder,
        search_space=space,
        stop={"iteration_limit": N_TRIALS},
        measure_latency=True,
    )
    status, left_processes = run_and_find_leftovers(
        ["run", str(write_config(folder / "config.yaml", config))], folder, TMPDIR=str(temp)
    )
    left = sorted(p.name for p in temp.iterdir() if p.name.startswith(TEMP_PREFIXES))
    shutil.rmtree(temp, ignore_errors=True)
    return {
        "status": status,
        "folder": folder,
        "out": folder / "out",
        "calls": [c for c in calls(folder / "calls.jsonl") if c["trial"] != "float"],
        "left": left,
        "left_processes": left_processes,
        "stderr": (folder / "stderr.txt").read_text(),
    }


def test_thirty_trials_ran(long_search):
    assert long_search["status"] == 0, long_search["stderr"]
    records = journal(long_search["out"])
    assert len(records) == N_TRIALS and all(r["status"] == "ok" for r in records)
    assert len(long_search["calls"]) == N_TRIALS


def test_the_command_leaves_no_process_behind(long_search):
    # The command shuts its Ray down itself before its fast exit (``cli.console_main``).
    assert long_search["left_processes"] == {}, long_search["left_processes"]


def test_the_temp_folder_does_not_grow_with_the_trials(long_search):
    counts = [c["temp"] for c in long_search["calls"]]
    # Each running actor keeps one working folder; nothing accumulates per trial.
    assert max(counts) <= 3, counts
    assert max(counts[-10:]) <= max(counts[:10]), counts
    assert long_search["left"] == [], long_search["left"]


def test_the_working_folders_hold_only_what_is_kept(long_search):
    out = long_search["out"]
    # While trials ran, the trials' folder held the running trials' models only.
    assert max(c["siblings"] for c in long_search["calls"]) <= 3
    assert not (out / "trials_tmp").exists()
    records = journal(out)
    candidates = {r["trial_id"] for r in records if r["is_candidate"]}
    # The best candidates' models (keep_candidates: 3 by default), as results.parquet says.
    rows = pq.read_table(out / "results.parquet").to_pylist()
    kept = {r["trial_id"] for r in rows if (r["model_file"] or "").startswith("candidates/")}
    assert {p.stem for p in (out / "candidates").glob("*.onnx")} == kept
    assert kept <= candidates and len(kept) == min(3, len(candidates))
    assert len(list((out / "kept").glob("*"))) <= 1 if (out / "kept").exists() else True
    # A few calibration cache entries per distinct calibration method, not one per trial.
    methods = {r["settings"].get("calibrate_method") for r in records}
    entries = [p for p in (out / "cache" / "calibration").iterdir() if p.is_dir()]
    files = [p for p in (out / "cache").rglob("*") if p.is_file()]
    assert len(entries) <= 2 * len(methods) and len(files) <= 4 * len(entries), files


def test_file_descriptors_and_memory_of_a_trial_process_do_not_grow(long_search):
    by_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for call in long_search["calls"]:
        by_pid[call["pid"]].append(call)
    long_lived = [seq for seq in by_pid.values() if len(seq) >= 8]
    assert long_lived, {pid: len(seq) for pid, seq in by_pid.items()}
    for seq in long_lived:
        fds = [c["fds"] for c in seq]
        assert max(fds[2:]) <= fds[2] + 2, fds
        rss = [c["rss_mib"] for c in seq]
        assert rss[-1] - rss[2] < 64, rss
