"""Dynamic quantization (``quant_mode: dynamic``): ONNX Runtime's ``quantize_dynamic`` as a
setting of the ``ort`` backend, on real models, with the validity rule that strips what it
does not read."""

from __future__ import annotations

import onnx

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator
from raysearch.quantize.backends.ort import reject_reason
from raysearch.space import SearchSpace
from raysearch.trial import TrialRunner, TrialSpec
from tests.models import encoder_data, make_encoder_model


def test_dynamic_trial_quantizes_matmuls_without_calibrating(tmp_path):
    model = make_encoder_model(tmp_path / "enc.onnx")
    data = DataSource.load(encoder_data(24), model, batch_size=8)
    runner = TrialRunner(
        TrialSpec(model, data, data, Evaluator("cos", 0.9), cache_dir=tmp_path / "c")
    )
    with runner:
        result = runner.run(
            {"quant_mode": "dynamic", "per_channel": True, "weight_type": "QInt8"},
            tmp_path / "d.onnx",
        )
        static = runner.run({"calibrate_method": "MinMax"}, tmp_path / "s.onnx")
    assert result.status == "ok" and result.metric > 0.9, result.error
    ops = {n.op_type for n in onnx.load(tmp_path / "d.onnx").graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "QuantizeLinear" not in ops
    assert result.calibration_s == 0.0 and not result.calib_cache_hit
    # Calibration ran for the static setting only (the cache folder holds its ranges).
    assert static.status == "ok" and not static.calib_cache_hit
    assert 0 < result.extra["quantized_share"] <= 1.0


def test_dynamic_refuses_16_bit_weights_and_ignores_static_rules():
    assert "QInt8 or QUInt8" in reject_reason({"quant_mode": "dynamic", "weight_type": "QInt16"})
    # QInt8 activations with QUInt8 weights is refused statically, not dynamically.
    assert reject_reason({"weight_type": "QUInt8"}) is not None
    assert reject_reason({"quant_mode": "dynamic", "weight_type": "QUInt8"}) is None


def test_a_grid_over_quant_mode_has_no_static_keys_in_its_dynamic_settings():
    space = SearchSpace.parse(
        {
            "quant_mode": ["static", "dynamic"],
            "calibrate_method": ["MinMax", "Entropy"],
            "per_channel": [True, False],
        }
    )
    expansion = space.expand(reject_reason)
    settings = [space.to_settings(p) for p in expansion.points]
    dynamic = [s for s in settings if s.get("quant_mode") == "dynamic"]
    assert len(settings) == 6 and len(dynamic) == 2
    assert all("calibrate_method" not in s for s in dynamic)
    assert expansion.dropped == {"static_settings_in_dynamic_mode": 2}
