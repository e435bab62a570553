"""What the terminal says at the end of a search and in ``raysearch show``: the float model's
metric, size and latency whatever the metric, in words when nothing met the tolerance, and
settings as a person reads them (lists as lists, not escaped JSON)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysearch.cli import _print_summary, main
from raysearch.config import SearchConfig
from raysearch.search.preflight import preflight
from tests.models import make_mlp_model, mlp_data

CUSTOM = {
    "stop_reason": "space_exhausted",
    "n_trials": 4,
    "n_failed": 0,
    "n_candidates": 0,
    "best_metric": 0.91,
    "best_params": {"op_types_to_quantize": ["MatMul", "Conv"], "per_channel": True},
    "best_model_path": "/out/best/model.onnx",
    "float_metric": 0.98,
    "wall_time_s": 12.5,
    "metric": "mypkg.evals:top1",
    "higher_is_better": True,
    "tolerance": 0.02,
    "tolerance_mode": "absolute",
    "best_model_size_bytes": 1_000_000,
    "float_model_size_bytes": 4_000_000,
    "best_latency_ms": 2.0,
    "float_latency_ms": 4.0,
    "best_missed_by": 0.05,
}


def test_the_end_summary_shows_the_float_model_and_by_how_much_the_best_missed(tmp_path, capsys):
    _print_summary(CUSTOM, tmp_path)
    out = capsys.readouterr().out
    assert "Float model: top1 = 0.98, 4 MB, 4 ms per batch" in out
    assert "  op_types_to_quantize: [MatMul, Conv]" in out
    assert "  per_channel: true" in out
    assert "  size: 1 MB (25.0% of the float model's)" in out
    assert "  latency: 2 ms per batch (50.0% of the float model's)" in out
    assert (
        "No setting met the tolerance (a drop in top1 of at most 0.02): the best missed it by "
        "0.05." in out
    )


def test_the_end_summary_says_the_latency_was_timed_during_the_search(tmp_path, capsys):
    timing = "timed during the search, beside other trials"
    _print_summary({**CUSTOM, "latency_timing": timing}, tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert f"  latency: 2 ms per batch (50.0% of the float model's), {timing}" in out


def test_a_built_in_metric_shows_the_float_model_as_its_own_reference(tmp_path, capsys):
    summary = {
        **CUSTOM,
        "metric": "cos",
        "float_metric": None,
        "tolerance": 0.999,
        "tolerance_mode": None,
        "best_metric": 0.996,
        "best_missed_by": 0.003,
    }
    _print_summary(summary, tmp_path)
    out = capsys.readouterr().out
    assert "Float model: cos = 1 (the reference: its own outputs), 4 MB, 4 ms per batch" in out
    assert "No setting met the tolerance (cos >= 0.999): the best missed it by 0.003." in out
    _print_summary({**summary, "n_candidates": 2}, tmp_path)
    assert "No setting met" not in capsys.readouterr().out


def test_a_custom_evaluators_float_latency_is_measured(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", **mlp_data(64))
    config = SearchConfig.from_dict(
        {
            "model": str(model),
            "calibration_data": str(tmp_path / "calib.npz"),
            "search_space": {"calibrate_method": ["MinMax"]},
            "metric": "tests.evaluators_fixture:mean_output",
            "higher_is_better": True,
            "tolerance": 0.1,
            "output_dir": str(tmp_path / "out"),
        }
    )
    info = preflight(config).info
    assert info["float_metric"] is not None
    assert info["float_latency_ms"] > 0


def test_show_prints_lists_as_lists(tmp_path, capsys):
    rows = [
        {
            "trial_id": "t1",
            "status": "ok",
            "metric": 0.97,
            "is_candidate": True,
            "stopped_at_rung": None,
            # results.parquet holds a column of lists and nulls as JSON text.
            "params/op_types_to_quantize": json.dumps(["Conv", "MatMul"]),
            "params/calibrate_method": "MinMax",
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "results.parquet")
    (tmp_path / "summary.json").write_text(json.dumps({**CUSTOM, "n_candidates": 1}))
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "{op_types_to_quantize: [Conv, MatMul], calibrate_method: MinMax}" in out
    assert '\\"' not in out


def test_the_end_summary_says_where_the_report_is(tmp_path, capsys):
    _print_summary(CUSTOM, tmp_path)
    assert "Report:" not in capsys.readouterr().out
    (tmp_path / "report.html").write_text("<html></html>")
    _print_summary(CUSTOM, tmp_path)
    assert f"Report: {tmp_path.resolve() / 'report.html'}" in capsys.readouterr().out


def test_show_of_a_copied_folder_prints_the_best_model_where_it_is_now(tmp_path, capsys):
    # A finished search's folder, copied elsewhere and the original removed (issue 57, 7).
    original = tmp_path / "original"
    make_mlp_model(original / "best" / "model.onnx")
    summary = {**CUSTOM, "best_model_path": str(original / "best" / "model.onnx")}
    (original / "summary.json").write_text(json.dumps(summary))
    copied = tmp_path / "elsewhere" / "copied"
    shutil.copytree(original, copied)
    shutil.rmtree(original)
    assert main(["show", str(copied)]) == 0
    out = capsys.readouterr().out
    assert f"Best model: {copied.resolve() / 'best' / 'model.onnx'}\n" in out
    assert str(original) not in out
