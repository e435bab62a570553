"""raysearch.outputs on records: the Parquet table, the summary, best/, plots, atomic writes."""

from __future__ import annotations

import json
import shutil
import stat

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from raysearch.cli import main
from raysearch.config import SearchConfig
from raysearch.cpu import cpu_flags, cpu_info
from raysearch.evaluate import Evaluator
from raysearch.outputs import best_record, fixed_space, results_table, write_outputs
from raysearch.space import SearchSpace
from raysearch.trialrecord import TrialRecord
from tests.external_models import external_mlp_data, make_external_mlp
from tests.models import make_mlp_model

SPACE = {
    "calibrate_method": ["MinMax", "Percentile"],
    "op_types_to_quantize": [["MatMul"], None],
    "extra_options": {
        "pct": {"only_if": {"calibrate_method": "Percentile"}, "CalibPercentile": [99.9]}
    },
}


def record(i: int, metric, status="ok", candidate=False, **params) -> TrialRecord:
    return TrialRecord(
        trial_id=f"t{i}",
        number=i,
        phase=0,
        status=status,
        metric=metric,
        is_candidate=candidate,
        duration_s=0.1 * i,
        calibration_s=0.01,
        quantization_s=0.02,
        evaluation_s=0.03,
        calib_cache_hit=i > 1,
        model_size_bytes=1000 + i,
        node="127.0.0.1",
        device="cpu",
        error=None if status == "ok" else "InvalidGraph: bad",
        params=params,
    )


@pytest.fixture
def config(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    raw = {
        "model": str(model),
        "calibration_data": str(tmp_path / "calib.npz"),
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "L2",
        "tolerance": 0.05,
        "output_dir": str(tmp_path / "out"),
        "stop": {"iteration_limit": 10},
    }
    return SearchConfig.from_dict(raw, check_paths=False)


def test_results_table_types_and_json_for_mixed_columns():
    records = [
        record(2, 0.02, calibrate_method="MinMax", op_types_to_quantize=["MatMul"]),
        record(
            1,
            0.01,
            candidate=True,
            calibrate_method="Percentile",
            op_types_to_quantize=None,
            **{"extra_options.pct.CalibPercentile": 99.9},
        ),
        record(3, None, status="failed", calibrate_method="MinMax", op_types_to_quantize=None),
    ]
    table = results_table(records)
    assert table.column("trial_id").to_pylist() == ["t1", "t2", "t3"]  # start order
    assert table.schema.field("metric").type == pa.float64()
    assert table.schema.field("is_candidate").type == pa.bool_()
    assert table.schema.field("params/calibrate_method").type == pa.string()
    # A list setting is an Arrow list (pandas gets lists, not JSON text).
    assert table.column("params/op_types_to_quantize").to_pylist() == [None, ["MatMul"], None]
    assert table.schema.field("params/op_types_to_quantize").type == pa.list_(pa.string())
    assert table.column("params/extra_options.pct.CalibPercentile").to_pylist() == [
        99.9,
        None,
        None,
    ]
    assert table.column("status").to_pylist() == ["ok", "ok", "failed"]
    assert table.column("error").to_pylist()[2] == "InvalidGraph: bad"


def test_best_record_respects_direction_and_ignores_failures():
    records = [record(1, 0.3), record(2, 0.1), record(3, None, status="failed"), record(4, 0.1)]
    assert best_record(records, higher_is_better=False).trial_id == "t2"  # earliest on a tie
    assert best_record(records, higher_is_better=True).trial_id == "t1"
    assert best_record([record(1, None, status="failed")], False) is None


def test_fixed_space_reproduces_the_setting_of_a_point():
    space = SearchSpace.parse(SPACE)
    for point in space.expand().points:
        fixed = SearchSpace.parse(fixed_space(point))
        (only,) = fixed.expand().points
        assert fixed.to_settings(only) == space.to_settings(point)


def test_write_outputs_writes_every_file_atomically(config, tmp_path):
    out = tmp_path / "out"
    (out / "candidates").mkdir(parents=True)
    shutil.copy(config.model, out / "candidates" / "t2.onnx")
    records = [
        record(1, 0.04, candidate=True, calibrate_method="MinMax", op_types_to_quantize=None),
        record(
            2,
            0.01,
            candidate=True,
            calibrate_method="Percentile",
            op_types_to_quantize=["MatMul"],
            **{"extra_options.pct.CalibPercentile": 99.9},
        ).replace(model_file="candidates/t2.onnx"),
        record(
            3, None, status="failed", calibrate_method="MinMax", op_types_to_quantize=["MatMul"]
        ),
    ]
    summary = write_outputs(
        out, records, config=config, stop_reason="space_exhausted", wall_time_s=1.5
    )
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    for key in (
        "stop_reason",
        "n_trials",
        "n_failed",
        "n_candidates",
        "best_metric",
        "best_params",
        "best_model_path",
        "float_metric",
        "wall_time_s",
    ):
        assert key in on_disk
    assert (on_disk["n_trials"], on_disk["n_failed"], on_disk["n_candidates"]) == (3, 1, 2)
    assert on_disk["best_metric"] == 0.01 and on_disk["best_trial_id"] == "t2"
    assert on_disk["direction"] == "minimize" and on_disk["search_algo"] == "Grid"
    ort.InferenceSession(on_disk["best_model_path"])  # loadable
    best = yaml.safe_load((out / "best" / "config.yaml").read_text())
    assert best["search_algo"] == "Grid" and "stop" not in best and "output_dir" not in best
    assert best["search_space"]["extra_options"]["pct"]["CalibPercentile"] == [99.9]
    assert best["search_space"]["op_types_to_quantize"] == [["MatMul"]]
    assert pq.read_table(out / "results.parquet").num_rows == 3
    assert (out / "plots" / "metric_per_trial.png").stat().st_size > 1000
    # Two complete trials: too few for parameter importances (report.html's rule too).
    assert not (out / "plots" / "param_importance.png").exists()
    assert on_disk["param_importance"] is None and on_disk["param_importance_trials"] == 2
    assert any((out / "tensorboard").iterdir())
    leftovers = [p.name for p in out.rglob("*") if ".tmp" in p.name or p.name.endswith(".old")]
    assert leftovers == []
    # One mode for every file written, the model's (a plain write's: 0666 less the umask).
    model_mode = stat.S_IMODE((out / "best" / "model.onnx").stat().st_mode)
    modes = {
        p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in (out / "best" / "config.yaml", out / "plots" / "metric_per_trial.png")
    }
    modes.update({p.name: stat.S_IMODE(p.stat().st_mode) for p in out.glob("*.*")})
    assert modes == dict.fromkeys(modes, model_mode), modes


def test_a_best_timed_on_a_gpu_is_not_set_against_the_float_model_timed_on_the_cpu(
    config, tmp_path
):
    """The float model is timed on the driver's CPU: a best whose trial ran on cuda:0 keeps
    its latency, the float's moves to float_latency_cpu_ms, and no reader sets them against
    each other (the terminal said '1.7% of the float model's' for a CUDA trial against 80 ms
    on the CPU)."""
    from raysearch.cli import _against_float, _float_line

    on_gpu = [
        record(1, 0.01, candidate=True).replace(
            device="cuda:0", latency_ms=1.36, decode_latency_ms=40.5, prefill_latency_ms=0.8
        )
    ]
    decoder_floats = {"float_decode_latency_ms": 2.16, "float_prefill_latency_ms": 24.1}
    summary = write_outputs(
        tmp_path / "gpu",
        on_gpu,
        config=config,
        stop_reason="space_exhausted",
        wall_time_s=1.0,
        float_latency_ms=80.3,
        extra=decoder_floats,
    )
    assert summary["float_latency_ms"] is None and summary["float_latency_cpu_ms"] == 80.3
    assert summary["best_latency_ms"] == 1.36
    # A decoder's float decode step and prefill are timed on the driver's CPU too.
    assert summary["float_decode_latency_ms"] is None
    assert summary["float_decode_latency_cpu_ms"] == 2.16
    assert summary["float_prefill_latency_cpu_ms"] == 24.1
    assert _float_line(summary, "L2").endswith(
        ", 80.3 ms per batch, decode step 2.16 ms per token, prefill 24.1 ms per prompt on the "
        "driver's CPU"
    )
    assert not any("of the float model's" in line for line in _against_float(summary))
    on_cpu = write_outputs(
        tmp_path / "cpu",
        [record(1, 0.01, candidate=True).replace(latency_ms=40.0)],
        config=config,
        stop_reason="space_exhausted",
        wall_time_s=1.0,
        float_latency_ms=80.0,
    )
    assert on_cpu["float_latency_ms"] == 80.0 and "float_latency_cpu_ms" not in on_cpu


def test_write_outputs_with_no_complete_trial(config, tmp_path):
    out = tmp_path / "out"
    summary = write_outputs(
        out,
        [record(1, None, status="failed")],
        config=config,
        stop_reason="space_exhausted",
        wall_time_s=0.2,
    )
    assert summary["best_metric"] is None and summary["best_model_path"] is None
    # The CPU the summary was written on: int8 results depend on its instruction set.
    assert summary["cpu"] == cpu_info()
    assert json.loads((out / "summary.json").read_text())["cpu"]["flags"] == list(cpu_flags())
    assert not (out / "best").exists()
    assert not (out / "plots" / "param_importance.png").exists()


def test_best_model_keeps_its_external_data_and_loads_from_a_moved_copy(config, tmp_path):
    out = tmp_path / "out"
    # A trial's model with external data, as ONNX Runtime writes it (``<name>.data``).
    model = make_external_mlp(out / "candidates" / "t2.onnx", location="t2.onnx.data")
    data = external_mlp_data(8)
    expected = ort.InferenceSession(str(model)).run(None, data)[0]
    records = [
        record(1, 0.04, calibrate_method="MinMax"),
        record(2, 0.01, candidate=True, calibrate_method="Percentile").replace(
            model_file="candidates/t2.onnx"
        ),
    ]
    summary = write_outputs(
        out, records, config=config, stop_reason="space_exhausted", wall_time_s=1.0
    )
    best = out / "best"
    assert summary["best_model_path"] == str(best / "model.onnx")
    assert {p.name for p in best.iterdir()} == {"model.onnx", "model.onnx.data", "config.yaml"}
    # The candidate stays whole, and best/ loads from wherever it is moved.
    assert {p.name for p in (out / "candidates").iterdir()} == {"t2.onnx", "t2.onnx.data"}
    moved = shutil.move(str(best), str(tmp_path / "moved"))
    shutil.rmtree(out / "candidates")
    got = ort.InferenceSession(f"{moved}/model.onnx").run(None, data)[0]
    np.testing.assert_array_equal(got, expected)

    # A later best held in one file leaves no stale data file in best/.
    shutil.copy(config.model, out / "t3.onnx")
    records.append(
        record(3, 0.001, candidate=True, calibrate_method="MinMax").replace(model_file="t3.onnx")
    )
    write_outputs(out, records, config=config, stop_reason="space_exhausted", wall_time_s=1.0)
    assert {p.name for p in best.iterdir()} == {"model.onnx", "config.yaml"}


def test_best_is_the_most_quantized_candidate_else_the_best_metric():
    def trial(i, metric, candidate, share=None, promoted=None):
        extra = {k: v for k, v in (("quantized_share", share), ("promoted", promoted)) if v}
        return record(i, metric, candidate=candidate).replace(extra=extra)

    float_like = trial(1, 1.0, True, share=0.0, promoted=3)
    int16 = trial(2, 0.999, True, share=1.0, promoted=2)
    plain = trial(3, 0.998, True, share=1.0)
    far = trial(4, 0.95, False, share=1.0)
    # Within the tolerance the model with every node quantized and nothing promoted wins,
    # though float keeps the better metric.
    assert best_record([float_like, int16, plain, far], higher_is_better=True) is plain
    assert best_record([float_like, int16, far], higher_is_better=True) is int16
    # No candidate: the better metric, then fewer promoted.
    worse = trial(5, 0.95, False, share=1.0, promoted=4)
    assert best_record([worse, far, trial(6, 0.9, False)], higher_is_better=True) is far
    # A candidate beats any trial that is not one; lower-is-better metrics alike.
    near = trial(7, 0.2, True)
    assert best_record([trial(8, 0.1, False), near], higher_is_better=False) is near


def test_summary_says_when_only_settings_that_quantize_nothing_met_the_tolerance(
    config, tmp_path, capsys
):
    """The float model with extra nodes met the tolerance (L2 <= 0.05); no quantized setting
    did: best/ holds the best quantized one and the summary says by how much it missed."""
    out = tmp_path / "out"
    (out / "kept").mkdir(parents=True)
    shutil.copy(config.model, out / "kept" / "t3.onnx")

    def trial(i, metric, share, **extra):
        return record(i, metric).replace(extra={"quantized_share": share, **extra})

    records = [
        trial(1, 0.0, 0.0, quantizes_nothing=1.0),
        # Within the tolerance, but it quantizes nothing: no candidate (decide_complete).
        trial(2, 0.01, 0.0, quantizes_nothing=1.0, within_tolerance=1.0),
        trial(3, 0.08, 1.0).replace(model_file="kept/t3.onnx"),
        trial(4, 0.2, 0.5),
    ]
    summary = write_outputs(
        out,
        records,
        config=config,
        stop_reason="space_exhausted",
        wall_time_s=1.0,
        evaluator=Evaluator.from_config(config),
    )
    assert summary["best_trial_id"] == "t3" and summary["n_candidates"] == 0
    assert (out / "best" / "model.onnx").is_file()
    assert summary["unquantized_met_tolerance"] == 2
    assert summary["best_quantized_missed_by"] == pytest.approx(0.03)
    note = summary["tolerance_note"]
    assert note.startswith("2 trials that keep every MatMul/Gemm/Conv node float (never a ")
    assert "(L2 <= 0.05)" in note and "trial t3 (L2 = 0.08, in best/), missed it by 0.03" in note
    assert json.loads((out / "summary.json").read_text())["tolerance_note"] == note
    assert main(["show", str(out)]) == 0
    assert f"Note: {note}." in capsys.readouterr().out

    # A quantized candidate: nothing to say.
    records[3] = records[3].replace(metric=0.04, is_candidate=True)
    quiet = write_outputs(out, records, config=config, stop_reason="space_exhausted", wall_time_s=1)
    assert quiet["best_trial_id"] == "t4" and quiet["n_candidates"] == 1
    assert "tolerance_note" not in quiet and "unquantized_met_tolerance" not in quiet

    # Only settings that quantize nothing completed: best/ holds one, and the note says why.
    only = write_outputs(
        out, records[:2], config=config, stop_reason="space_exhausted", wall_time_s=1
    )
    assert only["best_trial_id"] == "t1" and only["best_quantized_missed_by"] is None
    assert "no setting that quantizes something completed" in only["tolerance_note"]


def test_summary_note_measures_a_custom_metric_against_the_float_score(tmp_path):
    """A custom metric's tolerance bounds the drop from the float score (relative here)."""
    model = make_mlp_model(tmp_path / "mlp.onnx")
    raw = {
        "model": str(model),
        "calibration_data": str(tmp_path / "calib.npz"),
        "search_space": SPACE,
        "metric": "tests.evaluators_fixture:mean_output",
        "tolerance": 0.01,
        "tolerance_mode": "relative",
        "output_dir": str(tmp_path / "out"),
    }
    config = SearchConfig.from_dict(raw, check_paths=False)
    records = [
        record(1, 0.9, candidate=False).replace(
            extra={"quantized_share": 0.0, "quantizes_nothing": 1.0}
        ),
        record(2, 0.85, candidate=False).replace(extra={"quantized_share": 1.0}),
    ]
    summary = write_outputs(
        tmp_path / "out",
        records,
        config=config,
        stop_reason="space_exhausted",
        wall_time_s=1.0,
        float_metric=0.9,
    )
    # The threshold: 0.9 less 1 % of 0.9; the best quantized setting is 0.041 below it.
    assert summary["best_trial_id"] == "t2"
    assert summary["best_quantized_missed_by"] == pytest.approx(0.9 * 0.99 - 0.85)
    assert "(mean_output >= 0.891)" in summary["tolerance_note"]


def test_preload_output_modules_imports_what_writing_the_outputs_needs() -> None:
    """A search imports the writers' modules while its trials run (not after the last one):
    in a fresh interpreter, none is imported before, every one after the thread ends."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from raysearch.outputs import preload_output_modules\n"
        "from raysearch.outputs._writer import _OUTPUT_MODULES\n"
        "before = [m for m in _OUTPUT_MODULES if m in sys.modules]\n"
        "thread = preload_output_modules()\n"
        "thread.join(timeout=120)\n"
        "after = [m for m in _OUTPUT_MODULES if m in sys.modules]\n"
        "print(thread.daemon, thread.is_alive(), before, len(after) == len(_OUTPUT_MODULES))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[-2] == "True False [] True"


def test_warming_the_reports_figures_up_builds_each_without_a_failure(caplog) -> None:
    """The warm-up a command's search runs while its trials run builds the report's figures
    for made-up trials: none of them fails (a failure is logged as a warning and skipped)."""
    import logging

    from raysearch.outputs._study import warm_up

    with caplog.at_level(logging.WARNING, logger="raysearch.outputs"):
        warm_up()
    assert [r.getMessage() for r in caplog.records] == []
