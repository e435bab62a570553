"""Scale-out on real Ray clusters: several nodes (a model with external data too), and nodes
that declare GPUs they lack."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from raysearch.layout import CACHE_DIR
from raysearch.search.runtime.transfer import node_folder
from tests.drivers import run_driver
from tests.external_models import check_whole
from tests.reliability.helpers import calls
from tests.scale._cluster_driver import phase_folder

# The module's searches run in the first test's setup (:func:`driven`): a bound for them that
# hang, over pytest's default 600 s, not a speed check.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


#: The GPUs each fake-GPU search declares, and the share of one each trial asks for.
GPU_CASES = [(1, 0.25), (2, 0.5)]


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> tuple[Path, dict, subprocess.CompletedProcess]:
    """Every search of this module, one after the other in one driver process, on a cluster
    per phase (the two-node one runs two searches): its folder, what each phase returned, the
    finished process."""
    work = tmp_path_factory.mktemp("clusters")
    phases = ["multinode", *(f"fakegpu:{gpus}:{share}" for gpus, share in GPU_CASES)]
    # Four searches on three Rays: on a loaded 2-core machine more than 300 s.
    result, proc = run_driver(
        work, "tests.scale._cluster_driver", str(work), *phases, timeout_s=840
    )
    return work, result, proc


def _phase(driven, phase: str) -> tuple[Path, dict, str]:
    """Phase ``phase`` of the driver: its folder, what it returned, what it wrote to stderr."""
    work, result, _ = driven
    folder = phase_folder(work, phase)
    assert "error" not in result[phase], result[phase]["error"]
    return folder, result[phase], (folder / "stderr.txt").read_text()


def _overlap(rows: list[dict]) -> int:
    """The most trials that ran at the same moment (one ending as another starts: not both)."""
    events = sorted([(r["started_at"], 1) for r in rows] + [(r["ended_at"], -1) for r in rows])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]


def _trial_calls(work: Path) -> dict[str, dict]:
    """The probe evaluator's call for each trial, logged while the trial ran (trial id ->
    call: ``node``, ``file`` and ``size`` of the model scored, ``cuda``)."""
    made = [c for c in calls(work / "calls.jsonl") if c["sig"] != "float"]
    by_trial = {c["trial"]: c for c in made}
    assert len(by_trial) == len(made)  # each trial scored once
    return by_trial


def test_trials_run_on_more_than_one_node_and_outputs_land_on_the_driver(driven):
    work, result, _ = _phase(driven, "multinode")
    out = work / "out"
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    assert len(result["nodes"]) == 2
    driver = result["driver_node"]
    assert {r["node_id"] for r in rows} == set(result["nodes"])
    # Every candidate model, wherever its trial ran, was brought to the driver's folder.
    candidates = [r for r in rows if r["is_candidate"]]
    assert len(candidates) == 8
    for row in candidates:
        assert (out / "candidates" / f"{row['trial_id']}.onnx").stat().st_size > 0
    assert (out / "best" / "model.onnx").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_trials"] == 8 and summary["stop_reason"] == "space_exhausted"
    # Where each trial wrote its model, seen while it ran: on the driver's node into the
    # output folder; on the other node into that node's temp folder, never the output folder.
    seen = _trial_calls(work)
    assert set(seen) == {r["trial_id"] for r in rows}
    for row in rows:
        call = seen[row["trial_id"]]
        assert call["node"] == row["node_id"] and call["size"] > 0
        written = Path(call["file"])
        if row["node_id"] == driver:
            assert written == out / "trials_tmp" / f"{row['trial_id']}.onnx"
        else:
            assert out not in written.parents, written
            assert written.parent.name == node_folder("trials", out), written
            assert not written.exists()  # fetched by the driver, then removed on its node
            # The search finished: its folders on that node (the trials' models, the
            # calibration cache) went with it; the float model stays for later searches.
            node_tmp = written.parent.parent
            assert not written.parent.exists(), written.parent
            assert not (node_tmp / node_folder("cache", out / CACHE_DIR)).exists()
            assert list(node_tmp.glob("raysearch-models/*/*.onnx"))
    assert driver in {c["node"] for c in seen.values()}
    assert {c["node"] for c in seen.values()} - {driver}


def test_trials_on_another_node_get_the_model_and_send_back_theirs_as_files(driven):
    """A model with external data, searched on the same two nodes after the search above."""
    _, result, _ = _phase(driven, "multinode")
    external = result["external"]
    out = phase_folder(driven[0], "multinode") / "external" / "out"
    journal = _journal(out)
    assert len(journal) == 4 and all(r["status"] == "ok" for r in journal)
    elsewhere = [r for r in journal if r["node_id"] != result["driver_node"]]
    assert elsewhere and len(result["nodes"]) == 2
    # The second node built the float model from its files in the object store.
    assert external["materialized"] == ["ext.onnx", "weights.bin"]
    # Its candidates came back with their data files.
    fetched = [r for r in elsewhere if r["is_candidate"]]
    assert fetched
    for r in fetched:
        check_whole(out / r["model_file"])
    assert not (out / "trials_tmp").exists()
    check_whole(out / "best" / "model.onnx")


@pytest.mark.parametrize(("gpus", "share"), GPU_CASES)
def test_fake_gpus_share_fractionally_record_ids_and_fall_back_to_cpu_quietly(driven, gpus, share):
    work, result, stderr = _phase(driven, f"fakegpu:{gpus}:{share}")
    out = work / "out"
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    ids = {str(i) for i in range(gpus)}
    assert {r["gpu_id"] for r in rows} == ids
    assert {r["device"] for r in rows} == {"cpu"}
    # Ray gave each trial's process its GPU: CUDA_VISIBLE_DEVICES as the trial recorded.
    seen = _trial_calls(work)
    assert {r["trial_id"]: r["gpu_id"] for r in rows} == {t: c["cuda"] for t, c in seen.items()}
    # 8 CPUs would run all 8 trials at once: the GPU share alone holds them to gpus / share,
    # and each GPU to 1 / share; and a GPU is shared: more than one trial on it at a time.
    per_gpu = round(1 / share)
    trials = _journal(out)
    assert _overlap(trials) <= gpus * per_gpu
    peaks = [_overlap([t for t in trials if t["gpu_id"] == gpu]) for gpu in ids]
    assert max(peaks) >= 2 and all(peak <= per_gpu for peak in peaks), peaks
    assert "ran on the CPU" in result["summary"]["gpu_note"]
    # Quietly: no CUDA loader error from ONNX Runtime on the console, while this search ran
    # or outside any search of the driver.
    for console in (stderr, driven[2].stderr):
        assert "CUDAExecutionProvider" not in console
        assert "libcudart" not in console and "libcublas" not in console
