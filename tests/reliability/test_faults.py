"""Trials that raise, segfault, are killed, run out of memory or hang: each is recorded as failed
with a readable reason, the process it broke is replaced, and the search finishes every other
trial. Real local Ray, real ONNX Runtime, faults injected by ``tests.reliability.evaluators``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from raysearch.search import AutoSearch
from tests.reliability.helpers import calls, journal, probe_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

#: Six settings that quantize fine, then six whose signature selects a fault.
FAULT_SPACES = [
    {"calibrate_method": ["MinMax", "Percentile", "Entropy"], "per_channel": [True, False]},
    {
        "nodes_to_exclude": [["fc1"], ["fc2"], ["fc1", "fc2"]],
        "activation_type": ["QUInt8", "QInt8"],
    },
]
FAULTS = {
    "fc1/uint8": "raise",
    "fc1/int8": "segv",
    "fc2/uint8": "kill",
    "fc2/int8": "memory",
    "fc1+fc2/uint8": "hang",
}
#: What the recorded error of each fault says.
REASONS = {
    "raise": "injected failure for fc1/uint8",
    "segv": "the trial's process (pid {pid}) died: Segmentation fault",
    "kill": "the trial's process (pid {pid}) died unexpectedly: killed",
    "memory": "MemoryError: Unable to allocate 32.0 MiB",
    "hang": "timed out after 8 s (trial_timeout_s)",
}
TIMEOUT_S = 8


def _signature(row: dict[str, Any]) -> str:
    """The probe evaluator's signature of a results.parquet row's setting."""
    excluded = row.get("params/nodes_to_exclude")  # an Arrow list of node names
    names = "+".join(sorted(excluded)) if excluded else "-"
    act = {"QUInt8": "uint8", "QInt8": "int8", None: "int8"}[row.get("params/activation_type")]
    return f"{names}/{act}"


@pytest.fixture(scope="module")
def faulty_search(ray_cluster, tmp_path_factory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("faults")
    config = probe_config(
        folder,
        search_space=None,
        search_spaces=FAULT_SPACES,
        faults=FAULTS,
        plan={"hang_s": 300},
        trial_timeout_s=TIMEOUT_S,
    )
    config.pop("search_space")
    result = AutoSearch(config).run()
    return {"result": result, "folder": folder, "calls": calls(folder / "calls.jsonl")}


def test_every_fault_is_a_failed_trial_with_a_readable_reason(faulty_search):
    result = faulty_search["result"]
    rows = pq.read_table(result.output_dir / "results.parquet").to_pylist()
    assert len(rows) == len({r["trial_id"] for r in rows}) == 12
    by_sig = {_signature(r): r for r in rows if _signature(r) != "-/int8"}
    for sig, fault in FAULTS.items():
        row = by_sig[sig]
        assert row["status"] == "failed", (sig, row)
        assert row["metric"] is None and row["is_candidate"] is False
        (call,) = [c for c in faulty_search["calls"] if c["sig"] == sig]
        assert REASONS[fault].format(pid=call["pid"]) in row["error"], (fault, row["error"])
        assert "\n" not in row["error"] and len(row["error"]) < 2100
    assert result.summary["n_failed"] == len(FAULTS)


def test_the_search_finishes_every_other_trial(faulty_search):
    result = faulty_search["result"]
    rows = result.results.to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    assert result.summary["stop_reason"] == "space_exhausted"
    assert result.summary["n_trials"] == 12
    assert len(ok) == 12 - len(FAULTS)
    assert {_signature(r) for r in ok} == {"-/int8", "fc1+fc2/int8"}
    assert all(r["metric"] is not None and not r["error"] for r in ok)
    assert result.best_metric is not None and (result.output_dir / "best" / "model.onnx").is_file()
    assert not (result.output_dir / "trials_tmp").exists()


def test_a_process_that_crashed_ran_out_of_memory_or_hung_runs_no_later_trial(faulty_search):
    log = faulty_search["calls"]
    broken = {
        c["sig"]: c for c in log if FAULTS.get(c["sig"]) in ("segv", "kill", "memory", "hang")
    }
    assert set(broken) == {s for s, f in FAULTS.items() if f != "raise"}
    for sig, fault_call in broken.items():
        later = [c for c in log if c["t"] > fault_call["t"] and c["pid"] == fault_call["pid"]]
        assert not later, f"the process that broke on {sig} ran {len(later)} more trials"
    # The hung process was ended, not left sleeping (Tune stops a failed trial's actor
    # asynchronously: allow it a while after the search returns, on a loaded machine too;
    # left sleeping, it would live on for hang_s, 300 s).
    hung = broken["fc1+fc2/uint8"]["pid"]
    deadline = time.monotonic() + 120
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            os.kill(hung, 0)
            time.sleep(0.2)


def test_a_trial_that_raises_leaves_its_process_serving_later_trials(faulty_search):
    log = faulty_search["calls"]
    (raised,) = [c for c in log if c["sig"] == "fc1/uint8"]
    trials = {r["trial_id"]: r for r in journal(faulty_search["result"].output_dir)}
    assert trials[raised["trial"]]["status"] == "failed"
    # Each faulty setting ran once (no retries by default).
    for sig in FAULTS:
        assert sum(c["sig"] == sig for c in log) == 1, sig


def test_max_failures_retries_a_crashed_trial(ray_cluster, tmp_path: Path):
    space = {"nodes_to_exclude": [["fc1"], ["fc2"]]}
    config = probe_config(
        tmp_path,
        search_space=space,
        faults={"fc1/int8": "segv_once", "fc2/int8": "segv"},
        max_failures=1,
    )
    result = AutoSearch(config).run()
    rows = {_signature(r): r for r in result.results.to_pylist()}
    log = calls(tmp_path / "calls.jsonl")
    once = [c for c in log if c["sig"] == "fc1/int8"]
    always = [c for c in log if c["sig"] == "fc2/int8"]
    # Crashed once, retried in a new process, then succeeded: one trial, two runs.
    assert len(once) == 2 and once[0]["trial"] == once[1]["trial"]
    assert once[0]["pid"] != once[1]["pid"]
    assert rows["fc1/int8"]["status"] == "ok" and rows["fc1/int8"]["metric"] is not None
    # Crashing every time: retried once, then recorded as failed.
    assert len(always) == 2 and rows["fc2/int8"]["status"] == "failed"
    assert "Segmentation fault" in rows["fc2/int8"]["error"]
    assert result.summary["n_trials"] == 2 and result.summary["n_failed"] == 1
