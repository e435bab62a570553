"""Every built-in technique in one search space, searched end to end on a real local Ray (Grid
and TPE) on a real Conv/Gemm model, and a search killed mid-way (SIGKILL, ``raysearch run``
as a real process) that resumes to every setting exactly once."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from raysearch.search import AutoSearch
from tests.models import make_conv_model
from tests.reliability.helpers import interrupt_after, journal, write_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

#: Each technique switched on in some settings; fine-tuning kept short.
SPACE: dict[str, Any] = {
    "calibrate_method": ["MinMax"],
    "per_channel": [True],
    "include_cle": [False, True],
    "include_sq": [False, True],
    "include_bias_correction": [False, True],
    "include_fast_ft": [False, True],
    "extra_options": {
        "ActivationSymmetric": [True],
        "PowerOfTwoMethod": ["MinMSE"],
        "sq": {"only_if": {"include_sq": True}, "SmoothQuantOpTypes": [["Gemm"]]},
        "ft": {
            "only_if": {"include_fast_ft": True},
            "OptimAlgorithm": ["adaquant"],
            "NumIterLR": [[20, 0.001]],
            "DataSize": [8],
        },
    },
}
SETTINGS = 16  # 2 x 2 x 2 x 2; power-of-two everywhere
#: The killed search's space: the techniques without fine-tuning (whose first trial in a
#: process imports PyTorch, and which the Grid above runs), 2 x 2 x 2 settings.
RESUMED_SPACE = {
    **SPACE,
    "include_fast_ft": [False],
    "extra_options": {k: v for k, v in SPACE["extra_options"].items() if k != "ft"},
}
RESUMED_SETTINGS = 8


def _config(folder: Path, **overrides: Any) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    model = make_conv_model(folder / "cnn.onnx")
    rng = np.random.default_rng(0)
    np.savez(folder / "images.npz", x=rng.random((16, 3, 16, 16), dtype=np.float32))
    return {
        "model": str(model),
        "calibration_data": str(folder / "images.npz"),
        "batch_size": 8,
        "search_space": SPACE,
        "search_algo": "Grid",
        "metric": "cos",
        "tolerance": 0.99,
        "seed": 0,
        "measure_latency": False,
        # One trial actor per search: each actor's first fine-tuning trial imports torch
        # (some 4 CPU-seconds, more than the rest of its trials together); no test here is
        # about trials running side by side.
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(folder / "out"),
        **overrides,
    }


def _is_power_of_two(model: onnx.ModelProto) -> bool:
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    scales = [
        inits[n.input[1]]
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in inits
    ]
    return bool(scales) and all(
        np.all(np.log2(s.astype(np.float64)) == np.round(np.log2(s.astype(np.float64))))
        for s in scales
    )


def test_a_grid_over_every_technique_runs_and_each_takes_effect(tmp_path):
    result = AutoSearch(_config(tmp_path)).run()
    rows = result.results.to_pylist()
    assert len(rows) == SETTINGS and {r["status"] for r in rows} == {"ok"}, [
        r.get("error") for r in rows
    ]
    assert len({r.key for r in result.records}) == SETTINGS  # no setting twice
    for row in rows:
        # Each technique that was on recorded its seconds, and only those.
        for switch, name in (
            ("include_cle", "cle"),
            ("include_sq", "smooth_quant"),
            ("include_bias_correction", "bias_correction"),
            ("include_fast_ft", "fast_finetune"),
        ):
            on = bool(row[f"params/{switch}"])
            assert (row.get(f"extra/{name}_s") is not None) is on, (switch, row)
        assert row["extra/power_of_two_s"] is not None
        assert row["metric"] > 0.9
    best = onnx.load(str(result.output_dir / "best" / "model.onnx"))
    assert _is_power_of_two(best)


def test_tpe_samples_only_active_technique_parameters(tmp_path):
    result = AutoSearch(_config(tmp_path, search_algo="TPE", stop={"iteration_limit": 6})).run()
    records = result.records
    assert len(records) == 6 and {r.status for r in records} == {"ok"}
    assert len({r.key for r in records}) == 6
    for record in records:
        settings = record.settings
        options = settings.get("extra_options", {})
        # A parameter of a group whose switch is off is never sampled.
        assert ("NumIterLR" in options) is bool(settings.get("include_fast_ft"))
        assert ("SmoothQuantOpTypes" in options) is bool(settings.get("include_sq"))


def test_a_killed_technique_search_resumes_to_every_setting_once(tmp_path):
    config = write_config(tmp_path / "config.yaml", _config(tmp_path, search_space=RESUMED_SPACE))
    interrupt_after(["run", str(config)], tmp_path, tmp_path / "out", 4, signal.SIGKILL, 300)
    before = journal(tmp_path / "out")
    assert 4 <= len(before) < RESUMED_SETTINGS
    result = AutoSearch.resume(tmp_path / "out")
    after = journal(tmp_path / "out")
    assert len(after) == len({r["key"] for r in after}) == RESUMED_SETTINGS
    assert [r["trial_id"] for r in after[: len(before)]] == [r["trial_id"] for r in before]
    assert result.summary["n_trials"] == RESUMED_SETTINGS
    assert {r["status"] for r in after} == {"ok"}
