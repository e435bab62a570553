"""A long search stays flat: over 80 trials (``benchmarks/soak.py`` runs 500) the memory, open
files and temp-folder entries of each trial process do not grow with the trials, the journal
grows linearly, and a resume after a SIGKILL runs no trial twice and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.soak import run_soak

pytestmark = pytest.mark.slow

TRIALS = 80
EXTRA = 6


@pytest.fixture(scope="module")
def soak(tmp_path_factory) -> dict:
    return run_soak(tmp_path_factory.mktemp("soak"), TRIALS, extra=EXTRA, warmup=10)


def test_the_resume_completes_the_search_without_running_a_trial_twice(soak):
    assert soak["resume_status"] == 0
    assert soak["trials_before_kill"] >= TRIALS
    assert soak["trials_after_resume"] == soak["distinct_trials"] == TRIALS + EXTRA
    assert soak["distinct_settings"] == TRIALS + EXTRA
    assert soak["trials_evaluated_twice"] == []
    assert soak["temp_entries_left"] == []


def test_memory_descriptors_and_temp_entries_do_not_grow_with_the_trials(soak):
    steady = [p for p in soak["processes"] if p["trials"] >= 25]
    assert steady, soak["processes"]
    for process in steady:
        # A leak of one ONNX Runtime session or model per trial is megabytes per trial.
        assert process["rss_mib_per_100"] < 10, process
        assert abs(process["fds_per_100"]) < 1, process
        assert abs(process["temp_entries_per_100"]) < 1, process


def test_the_journal_grows_linearly(soak):
    journal = soak["journal"]
    assert journal["lines"] == TRIALS + EXTRA
    first, second = journal["bytes_per_line_first_half"], journal["bytes_per_line_second_half"]
    assert abs(second - first) / first < 0.2, journal


def test_the_benchmark_reports_the_same_figures(tmp_path: Path):
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "soak.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["trials"] == 12 and report["trials_evaluated_twice"] == []
    assert {"resume_s_to_first_new_trial", "journal", "processes"} <= set(report)
