"""The embedded demo discriminates: its metric tells apart the settings that quantize only
MatMul and Conv (top-1 agreement alone tied them all at 1.0), and its config evaluates on
growing subsets (early stopping on)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)

from raysearch.config import load_config
from raysearch.demo import MAGIKA_DIR, build_demo_data
from raysearch.demo.evaluators import top1_agreement, top1_cos
from raysearch.evaluate import Evaluator

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
CPU = ["CPUExecutionProvider"]


class _Rows(CalibrationDataReader):
    def __init__(self, rows: np.ndarray) -> None:
        self.rows = iter(rows[i : i + 10] for i in range(0, len(rows), 10))

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self.rows, None)
        return None if batch is None else {"bytes": batch}


def _quantized(tmp_path: Path, activation: QuantType, per_channel: bool) -> str:
    calib, _ = build_demo_data()
    with np.load(calib) as data:
        rows = data["bytes"][:30]
    out = tmp_path / f"{activation.name}_{per_channel}.onnx"
    quantize_static(
        str(MAGIKA_DIR / "model.onnx"),
        str(out),
        _Rows(rows),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul", "Conv"],
        activation_type=activation,
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
    )
    return str(out)


def test_the_demo_config_evaluates_on_growing_subsets():
    config = load_config(QUICKSTART)
    assert config.early_stopping.enabled
    assert Evaluator.from_config(config).accepts_fraction


@pytest.mark.slow  # two quantizations of magika and three evaluations: 10-30 s on 2 cores
def test_the_demos_metric_tells_apart_settings_that_top1_agreement_ties(tmp_path):
    """Per-channel and per-tensor weights: both agree with the float model on (almost) every
    file; the cosine term ranks them, below one file's worth of agreement (1/400)."""
    float_score = top1_cos(str(MAGIKA_DIR / "model.onnx"), CPU)
    assert float_score["metric"] == pytest.approx(1.0)
    models = [_quantized(tmp_path, QuantType.QUInt8, per_channel) for per_channel in (True, False)]
    scores = [top1_cos(m, CPU) for m in models]
    assert scores[0]["metric"] != scores[1]["metric"], scores  # the demo's top is no tie
    for score in scores:
        assert 0.0 < 1.0 - score["cos"] < 1.0 / 400
        assert score["metric"] == pytest.approx(score["top1_agreement"] - (1 - score["cos"]))
    # A fraction scores the first rows of the fixed order: 40 of the 400.
    partial = top1_agreement(models[0], CPU, fraction=0.1)
    assert partial * 40 == pytest.approx(round(partial * 40))
