"""Where ONNX shape inference fails on a model (a model over protobuf's 2 GB, an op it cannot
read), SmoothQuant and the activation-noise ranking go on without its shapes and say so in
one warning each, instead of dropping the failure without a word. Shape inference is made to
fail here (protobuf's 2 GB limit cannot be reached on a test machine): the code around it is
the real one."""

from __future__ import annotations

import logging

import onnx
import pytest

from raysearch.quantize.techniques.mixed_precision._activation_noise import _static_shapes
from raysearch.quantize.techniques.smooth_quant._graph import Graph
from tests.models import make_mlp_model


@pytest.fixture
def no_shape_inference(monkeypatch):
    def fail(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] cannot read fc1")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fail)


@pytest.fixture
def model(tmp_path) -> onnx.ModelProto:
    return onnx.load(str(make_mlp_model(tmp_path / "mlp.onnx")))


def test_smooth_quant_says_when_shape_inference_fails(model, no_shape_inference, caplog):
    with caplog.at_level(logging.WARNING, logger="raysearch"):
        graph = Graph(model)
    assert graph.shapes["x"] == [None, 16]  # what the model declares
    assert [r.getMessage() for r in caplog.records] == [
        "smooth quant: ONNX shape inference failed (InferenceError: [ShapeInferenceError]"
        " cannot read fc1); the shapes the model declares are used"
    ]


def test_the_activation_noise_ranking_says_when_shape_inference_fails(
    model, no_shape_inference, caplog
):
    with caplog.at_level(logging.WARNING, logger="raysearch"):
        assert _static_shapes(model) == {}
    assert [r.getMessage() for r in caplog.records] == [
        "activation-noise ranking: ONNX shape inference failed (InferenceError:"
        " [ShapeInferenceError] cannot read fc1); the noise is measured over whole tensors"
    ]
