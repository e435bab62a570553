"""Calibration survives non-finite activations: an additive attention mask (-inf, or float32's
most negative value as Hugging Face models use) is left out of ranges and histograms, counted
in the log, and every calibration method quantizes every op type of the model."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from raysearch.data import DataSource
from raysearch.quantize.backends.ort import OrtBackend
from raysearch.quantize.calibration import CalibrationCache, CalibrationRequest
from tests.quantize.recording import GPU_PROVIDERS, normalized, record_sessions

SEQ, DIM = 4, 8
FLOAT32_MIN = float(np.finfo(np.float32).min)

METHODS = [
    {"calibrate_method": "MinMax"},
    {"calibrate_method": "MinMax", "extra_options": {"CalibTensorRangeSymmetric": True}},
    {
        "calibrate_method": "MinMax",
        "extra_options": {"CalibMovingAverage": True, "CalibStridedMinMax": 2},
    },
    {"calibrate_method": "Entropy"},
    {"calibrate_method": "Percentile"},  # symmetric: an |x| histogram
    {"calibrate_method": "Percentile", "extra_options": {"CalibTensorRangeSymmetric": False}},
    {"calibrate_method": "Distribution"},
]


def make_masked_attention(path: Path, fill: float) -> Path:
    """Single-head attention with an additive mask ``Where(keep, 0, fill)``: the intermediate
    ``masked = scores + mask`` holds ``fill`` at every padded key position."""
    rng = np.random.default_rng(0)
    weights = {
        name: rng.normal(0, 1 / np.sqrt(DIM), (DIM, DIM)).astype(np.float32)
        for name in ("wq", "wk", "wv")
    }
    constants = {"zero": np.array(0, np.float32), "fill": np.array(fill, np.float32)}
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        n("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        n("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        n("Transpose", ["k"], ["kt"], name="k_transpose", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["scores"], name="qk"),
        n("Cast", ["keep"], ["keep_b"], name="keep_cast", to=TensorProto.BOOL),
        n("Where", ["keep_b", "zero", "fill"], ["mask"], name="mask"),
        n("Add", ["scores", "mask"], ["masked"], name="apply_mask"),
        n("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        n("MatMul", ["probs", "v"], ["y"], name="attend"),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SEQ, DIM]),
            helper.make_tensor_value_info("keep", TensorProto.FLOAT, ["N", 1, SEQ]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", SEQ, DIM])],
        [numpy_helper.from_array(v, k) for k, v in {**weights, **constants}.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def masked_data(n: int = 32) -> dict[str, np.ndarray]:
    """Random queries; each sample attends to a random subset of keys (always key 0)."""
    rng = np.random.default_rng(1)
    keep = (rng.random((n, 1, SEQ)) > 0.4).astype(np.float32)
    keep[:, :, 0] = 1
    return {"x": rng.normal(0, 1, (n, SEQ, DIM)).astype(np.float32), "keep": keep}


@pytest.fixture(scope="module", params=[-np.inf, FLOAT32_MIN], ids=["-inf", "float32-min"])
def attention(request, tmp_path_factory):
    path = make_masked_attention(tmp_path_factory.mktemp("mask") / "attn.onnx", request.param)
    arrays = masked_data()
    padded = int((arrays["keep"] == 0).sum())
    # Left out per pass: the mask itself ([N, 1, SEQ]) and the masked scores ([N, SEQ, SEQ]).
    expected_dropped = padded + SEQ * padded
    return path, DataSource.load(arrays, path, batch_size=8), expected_dropped


def _dropped(records: list[logging.LogRecord]) -> list[int]:
    counts = []
    for record in records:
        found = re.search(r"left out (\d+) non-finite values", record.getMessage())
        if found:
            counts.append(int(found.group(1)))
    return counts


@pytest.mark.parametrize("settings", METHODS, ids=lambda s: repr(s)[1:70])
def test_every_method_calibrates_a_model_with_a_masked_tensor(
    attention, tmp_path, caplog, settings
):
    path, data, expected_dropped = attention
    with (
        caplog.at_level(logging.INFO, logger="raysearch.quantize.calibration._cache"),
        OrtBackend(path, data, CalibrationCache()) as backend,
    ):
        backend.quantize(settings, tmp_path / "q.onnx")  # every op type (the default)
    assert _dropped(caplog.records) == [expected_dropped]

    request = CalibrationRequest.from_settings(settings)
    ranges, _ = CalibrationCache().tensors_range(path, data, request)
    assert {"mask", "masked"} <= set(ranges.keys())
    for name, value in ranges.items():
        low, high = (np.asarray(v, np.float64) for v in value.range_value)
        # Finite, and not stretched to the mask's float32 extreme either.
        assert np.isfinite(low).all() and np.isfinite(high).all(), name
        assert np.abs(low).max() < 1e6 and np.abs(high).max() < 1e6, name

    quantized = onnx.load(str(tmp_path / "q.onnx"))
    scales = [
        numpy_helper.to_array(t)
        for t in quantized.graph.initializer
        if t.name.endswith("_scale") and t.data_type == TensorProto.FLOAT
    ]
    assert scales and all(np.isfinite(s).all() and (s > 0).all() for s in scales)
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, data.batch(0))[0]).all()


def test_a_tensor_with_no_finite_value_at_all_still_calibrates(tmp_path, caplog):
    """Every key padded in every sample: the masked scores hold nothing finite."""
    path = make_masked_attention(tmp_path / "attn.onnx", -np.inf)
    arrays = masked_data(16)
    arrays["keep"][:] = 0
    data = DataSource.load(arrays, path, batch_size=8)
    for settings in (METHODS[0], METHODS[4], METHODS[6]):
        cache = CalibrationCache()
        with caplog.at_level(logging.INFO, logger="raysearch.quantize.calibration._cache"):
            ranges, _ = cache.tensors_range(path, data, CalibrationRequest.from_settings(settings))
        low, high = (np.asarray(v, np.float64) for v in ranges["masked"].range_value)
        assert np.isfinite(low).all() and np.isfinite(high).all(), settings


def test_the_second_minmax_pass_runs_on_the_given_providers(attention):
    path, data, _ = attention
    with record_sessions() as sessions:
        ranges, _ = CalibrationCache().tensors_range(
            path, data, CalibrationRequest(), providers=GPU_PROVIDERS
        )
    assert np.isfinite(np.asarray(ranges["masked"].range_value, np.float64)).all()
    # ONNX Runtime's ReduceMin/ReduceMax pass, then the pass over the masked tensors
    assert sessions == [normalized(GPU_PROVIDERS)] * 2
