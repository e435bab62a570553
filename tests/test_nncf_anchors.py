"""``benchmarks/_nncf_anchors.py``, the NNCF anchors ``quality.py`` calls: each writes a model
NNCF made, on a small real model (the figures on magika are in ``benchmarks/README.md``)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

from raysearch.modelgraph import quantized_share
from raysearch.providers import make_session
from tests.models import make_mlp_model, mlp_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _nncf_anchors import nncf_accuracy_control, nncf_one_shot, top1_agreement  # noqa: E402

pytestmark = pytest.mark.slow


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_the_one_shot_writes_a_qdq_model(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    for prepared in (False, True):
        out = nncf_one_shot(model, mlp_data(16), tmp_path / f"one_shot_{prepared}.onnx",
                            prepared=prepared)  # fmt: skip
        assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(out)
        assert quantized_share(out, model) == 1.0


def test_accuracy_control_keeps_the_quantized_model_within_the_drop(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    validation = mlp_data(16, seed=5)
    metric = top1_agreement(model, validation)
    session = make_session(model)
    assert metric(session.run(None, {"x": validation["x"][3:4]}), 3) == 1.0  # float vs itself
    out = nncf_accuracy_control(
        model, mlp_data(16), validation, metric, tmp_path / "aac.onnx", max_drop=1.0
    )
    assert quantized_share(out, model) == 1.0
