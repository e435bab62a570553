"""CalibrationCache: identical output to quantize_static, one calibration per distinct
calibration, disk reuse, superset reuse, bounded-memory histograms."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from onnxruntime.quantization import (
    CalibrationMethod,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
)

from raysearch.data import DataSource
from raysearch.demo import MAGIKA_DIR, build_demo_data
from raysearch.quantize.backends.ort import OrtBackend
from raysearch.quantize.calibration import (
    DEFAULT_OP_TYPES,
    CalibrationCache,
    CalibrationRequest,
    tensors_to_calibrate,
)
from tests.models import (
    conv_data,
    encoder_data,
    make_conv_model,
    make_encoder_model,
    make_mlp_model,
    mlp_data,
)


@pytest.fixture(autouse=True)
def _quiet_ort():
    # quantize_static logs a pre-processing hint on every call.
    logging.getLogger().setLevel(logging.ERROR)
    yield


def reference_bytes(model: Path, data: DataSource, settings: dict, tmp: Path) -> bytes:
    """What ONNX Runtime's quantize_static writes for ``settings`` (on a copy of the model:
    ONNX Runtime writes a shape-inferred file next to it)."""
    work = tmp / "reference"
    work.mkdir(exist_ok=True)
    source = work / model.name
    shutil.copyfile(model, source)
    out = work / "quantize_static.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(
            source,
            out,
            data.reader(),
            quant_format=QuantFormat[settings.get("quant_format", "QDQ")],
            op_types_to_quantize=settings.get("op_types_to_quantize"),
            per_channel=settings.get("per_channel", False),
            reduce_range=settings.get("reduce_range", False),
            activation_type=QuantType[settings.get("activation_type", "QInt8")],
            weight_type=QuantType[settings.get("weight_type", "QInt8")],
            nodes_to_exclude=settings.get("nodes_to_exclude"),
            calibrate_method=CalibrationMethod[settings.get("calibrate_method", "MinMax")],
            extra_options=settings.get("extra_options"),
        )
    return out.read_bytes()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calib-mlp")
    path = make_mlp_model(folder / "mlp.onnx")
    return path, DataSource.load(mlp_data(64), path, batch_size=16)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calib-enc")
    path = make_encoder_model(folder / "encoder.onnx")
    return path, DataSource.load(encoder_data(32), path, batch_size=8)


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calib-conv")
    path = make_conv_model(folder / "cnn.onnx")
    return path, DataSource.load(conv_data(24), path, batch_size=8)


IDENTITY_SETTINGS = [
    {"calibrate_method": "MinMax"},
    {"calibrate_method": "MinMax", "activation_type": "QUInt8", "per_channel": True},
    {"calibrate_method": "MinMax", "extra_options": {"CalibTensorRangeSymmetric": True}},
    {
        "calibrate_method": "MinMax",
        "extra_options": {"CalibMovingAverage": True, "CalibMovingAverageConstant": 0.1},
    },
    {"calibrate_method": "Percentile"},
    {"calibrate_method": "Percentile", "extra_options": {"CalibPercentile": 99.9}},
    {
        "calibrate_method": "Percentile",
        "extra_options": {"CalibPercentile": 99.0, "CalibTensorRangeSymmetric": False},
    },
    {"calibrate_method": "Entropy"},
    {"calibrate_method": "Distribution"},
    {"calibrate_method": "MinMax", "activation_type": "QUInt16", "weight_type": "QUInt8"},
    {"calibrate_method": "MinMax", "quant_format": "QOperator", "activation_type": "QUInt8"},
]


@pytest.mark.parametrize("settings", IDENTITY_SETTINGS, ids=lambda s: repr(s)[1:60])
def test_same_model_bytes_as_quantize_static(mlp, tmp_path, settings):
    path, data = mlp
    with OrtBackend(path, data, CalibrationCache(memory_budget=1 << 12)) as backend:
        backend.quantize(settings, tmp_path / "ours.onnx")
    assert (tmp_path / "ours.onnx").read_bytes() == reference_bytes(path, data, settings, tmp_path)


@pytest.mark.parametrize(
    "settings",
    [
        {"calibrate_method": "MinMax", "op_types_to_quantize": ["MatMul", "Softmax"]},
        {"calibrate_method": "Percentile", "extra_options": {"CalibPercentile": 99.99}},
        {"calibrate_method": "Entropy", "activation_type": "QUInt8"},
    ],
    ids=["minmax", "percentile", "entropy"],
)
def test_same_model_bytes_on_the_two_input_encoder(encoder, tmp_path, settings):
    path, data = encoder
    with OrtBackend(path, data) as backend:
        backend.quantize(settings, tmp_path / "ours.onnx")
    assert (tmp_path / "ours.onnx").read_bytes() == reference_bytes(path, data, settings, tmp_path)


def test_same_model_bytes_on_the_cnn_per_channel(conv, tmp_path):
    path, data = conv
    settings = {
        "calibrate_method": "Percentile",
        "per_channel": True,
        "activation_type": "QUInt8",
        "extra_options": {"CalibPercentile": 99.9},
    }
    with OrtBackend(path, data) as backend:
        backend.quantize(settings, tmp_path / "ours.onnx")
    assert (tmp_path / "ours.onnx").read_bytes() == reference_bytes(path, data, settings, tmp_path)


def test_ten_settings_one_calibration_each_method(mlp, tmp_path):
    path, data = mlp
    cache = CalibrationCache()
    minmax = [
        {"activation_type": a, "per_channel": p, "extra_options": {"ActivationSymmetric": s}}
        for a in ("QUInt8", "QInt8")
        for p in (True, False)
        for s in (True, False)
    ] + [
        {"extra_options": {"CalibTensorRangeSymmetric": True}},
        {"nodes_to_exclude": ["fc2"], "reduce_range": True},
    ]
    assert len(minmax) == 10
    with OrtBackend(path, data, cache) as backend:
        hits = [backend.quantize(s, tmp_path / "m.onnx").calib_cache_hit for s in minmax]
        assert hits == [False] + [True] * 9
        assert cache.stats["calibrations"] == 1 and cache.stats["inference_passes"] == 1
        assert cache.stats["inference_batches"] == data.num_batches
        histogram = [
            {"calibrate_method": "Percentile", "extra_options": {"CalibPercentile": p}}
            for p in (99.0, 99.5, 99.9, 99.99, 99.999)
        ] + [
            {"calibrate_method": "Percentile", "activation_type": a, "per_channel": True}
            for a in ("QUInt8", "QInt8", "QInt16", "QUInt16")
        ]
        histogram.append({"calibrate_method": "Percentile", "weight_type": "QInt4"})
        hits = [backend.quantize(s, tmp_path / "p.onnx").calib_cache_hit for s in histogram]
    # 16-bit types raise the opset (a different calibrated model, as in quantize_static):
    # one more calibration for those two settings.
    assert hits == [False] + [True] * 6 + [False, True, True]
    assert cache.stats["calibrations"] == 3


def test_histogram_kinds_share_one_collection(mlp, tmp_path):
    path, data = mlp
    cache = CalibrationCache()
    signed = [
        {"calibrate_method": "Entropy", "extra_options": {"num_bins": 512}},
        {"calibrate_method": "Distribution", "extra_options": {"num_bins": 512}},
        {
            "calibrate_method": "Percentile",
            "extra_options": {"CalibTensorRangeSymmetric": False, "num_bins": 512},
        },
        {
            "calibrate_method": "Entropy",
            "extra_options": {"num_bins": 512, "num_quantized_bins": 256},
        },
    ]
    with OrtBackend(path, data, cache) as backend:
        hits = [backend.quantize(s, tmp_path / "q.onnx").calib_cache_hit for s in signed]
    assert hits == [False, True, True, True]
    # The range pass is one inference pass; the histogram fitted in memory: no second pass.
    assert cache.stats["calibrations"] == 1 and cache.stats["inference_passes"] == 1


def test_bounded_memory_histograms_equal_ort_single_collection(mlp, tmp_path):
    """Two passes over the data in small chunks give exactly ONNX Runtime's histograms."""
    path, data = mlp
    for symmetric in (True, False):
        request = CalibrationRequest(method="Percentile", symmetric=symmetric, percentile=99.9)
        cache = CalibrationCache(memory_budget=1024)  # forces two passes
        ours, _ = cache.tensors_range(path, data, request)
        assert cache.stats["inference_passes"] == 2
        with contextlib.redirect_stdout(io.StringIO()):
            calibrator = create_calibrator(
                path,
                list(DEFAULT_OP_TYPES),
                augmented_model_path=str(tmp_path / "aug.onnx"),
                calibrate_method=CalibrationMethod.Percentile,
                extra_options={"symmetric": symmetric, "percentile": 99.9},
            )
            calibrator.collect_data(data.reader())
            theirs = calibrator.compute_data()
        assert sorted(ours.keys()) == sorted(theirs.keys())
        for name in theirs.keys():
            assert ours[name].range_value == theirs[name].range_value, name


def test_superset_entry_serves_a_smaller_op_type_set(mlp, tmp_path):
    path, data = mlp
    cache = CalibrationCache()
    with OrtBackend(path, data, cache) as backend:
        backend.quantize({"op_types_to_quantize": None}, tmp_path / "all.onnx")
        settings = {"op_types_to_quantize": ["MatMul"]}
        info = backend.quantize(settings, tmp_path / "matmul.onnx")
    assert info.calib_cache_hit and cache.stats["calibrations"] == 1
    expected = reference_bytes(path, data, settings, tmp_path)
    assert (tmp_path / "matmul.onnx").read_bytes() == expected


def test_tensor_selection_matches_onnx_runtime(encoder, tmp_path):
    path, _ = encoder
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(path)
    for ops in (["MatMul"], ["MatMul", "Softmax", "LayerNormalization"], list(DEFAULT_OP_TYPES)):
        with contextlib.redirect_stdout(io.StringIO()):
            calibrator = create_calibrator(
                path,
                ops,
                augmented_model_path=str(tmp_path / "aug.onnx"),
                calibrate_method=CalibrationMethod.Percentile,
            )
        assert set(tensors_to_calibrate(model, ops)) == set(calibrator.tensors_to_calibrate)


def test_disk_cache_is_reused_by_another_process(mlp, tmp_path):
    path, data = mlp
    settings = [
        {"calibrate_method": "MinMax"},
        {"calibrate_method": "Percentile", "extra_options": {"CalibPercentile": 99.9}},
        {"calibrate_method": "Entropy"},
    ]
    first = CalibrationCache(tmp_path / "cache")
    with OrtBackend(path, data, first) as backend:
        for i, s in enumerate(settings):
            backend.quantize(s, tmp_path / f"first{i}.onnx")
    assert first.stats["calibrations"] == 3
    assert list((tmp_path / "cache" / "calibration").glob("*/*.tmp")) == []
    second = CalibrationCache(tmp_path / "cache")  # a fresh process: empty memory
    with OrtBackend(path, data, second) as backend:
        for i, s in enumerate(settings):
            info = backend.quantize(s, tmp_path / f"second{i}.onnx")
            assert info.calib_cache_hit
            first_bytes = (tmp_path / f"first{i}.onnx").read_bytes()
            assert (tmp_path / f"second{i}.onnx").read_bytes() == first_bytes
    assert second.stats["calibrations"] == 0 and second.stats["disk_hits"] == 3


def test_damaged_cache_file_is_recomputed(mlp, tmp_path):
    path, data = mlp
    request = CalibrationRequest(method="MinMax")
    CalibrationCache(tmp_path / "c").tensors_range(path, data, request)
    for file in (tmp_path / "c" / "calibration").glob("*/minmax-*.json"):
        file.write_text("{not json")
    cache = CalibrationCache(tmp_path / "c")
    ranges, hit = cache.tensors_range(path, data, request)
    assert not hit and cache.stats["calibrations"] == 1 and len(ranges.keys()) > 0


def test_a_planted_cache_entry_is_not_used(mlp, tmp_path, caplog):
    """Valid ranges of another calibration put in place of an entry (same file name) are not
    served: an entry is read only when its bytes hash to what its name says, and a key's
    folder only when its key.json names that key."""
    import json

    path, data = mlp
    request = CalibrationRequest(method="MinMax")
    first, _ = CalibrationCache(tmp_path / "c").tensors_range(path, data, request)
    (entry,) = (tmp_path / "c" / "calibration").glob("*/minmax-*.json")
    planted = json.loads(entry.read_bytes())
    for tensor in planted["data"].values():  # ONNX Runtime's TensorsData as JSON
        tensor["highest"]["data"] = [v * 10 for v in tensor["highest"]["data"]]
    entry.write_text(json.dumps(planted))
    cache = CalibrationCache(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="raysearch.quantize.calibration._cache"):
        ranges, hit = cache.tensors_range(path, data, request)
    assert not hit and cache.stats["calibrations"] == 1
    assert {k: ranges[k].range_value for k in ranges.keys()} == {
        k: first[k].range_value for k in first.keys()
    }
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring unreadable calibration cache file {entry}: its content is not the content"
        " its name was written for"
    ]

    folder = entry.parent
    (folder / "key.json").write_text(json.dumps(["another key"]))
    caplog.clear()
    cache = CalibrationCache(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="raysearch.quantize.calibration._cache"):
        _, hit = cache.tensors_range(path, data, request)
    assert not hit and cache.stats["calibrations"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring calibration cache folder {folder}: it holds another key"
    ]


def test_memory_is_bounded(mlp):
    path, data = mlp
    cache = CalibrationCache(max_entries=2)
    for constant in (0.1, 0.2, 0.3):
        request = CalibrationRequest(moving_average=True, averaging_constant=constant)
        cache.tensors_range(path, data, request)
    assert len(cache._entries) == 2
    _, hit = cache.tensors_range(
        path, data, CalibrationRequest(moving_average=True, averaging_constant=0.1)
    )
    assert not hit  # evicted


def test_request_from_settings():
    request = CalibrationRequest.from_settings(
        {
            "calibrate_method": "Percentile",
            "op_types_to_quantize": ["Conv", "MatMul", "Conv"],
            "extra_options": {"CalibPercentile": 99.9, "num_bins": 1024, "ActivationSymmetric": 1},
        }
    )
    assert request.op_types == ("Conv", "MatMul")
    assert request.bins == 1024 and request.percentile == 99.9
    assert request.histogram_kind == "abs"
    assert request.collection_key() == ("hist", "abs", 1024)
    assert CalibrationRequest.from_settings({}).op_types == DEFAULT_OP_TYPES
    assert CalibrationRequest(method="Entropy").collection_key() == ("hist", "value", 128)


# -- magika, the real model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def magika(tmp_path_factory):
    # The model that ships in the package, data from the package's own builder: nothing
    # outside the repository is needed.
    folder = tmp_path_factory.mktemp("magika")
    model = folder / "model.onnx"
    shutil.copyfile(MAGIKA_DIR / "model.onnx", model)
    calib, _ = build_demo_data(folder / "data", n_calib=40, n_eval=40)
    with np.load(calib, allow_pickle=False) as archive:
        rows = archive["bytes"]
    return model, DataSource.load({"bytes": rows}, model, batch_size=20)


@pytest.mark.parametrize(
    "settings",
    [
        {"calibrate_method": "MinMax", "activation_type": "QUInt8"},
        {"calibrate_method": "MinMax", "per_channel": True},
        {"calibrate_method": "Percentile", "extra_options": {"CalibPercentile": 99.99}},
        {"calibrate_method": "Percentile", "activation_type": "QUInt8"},
    ],
    ids=["minmax-u8", "minmax-perchannel", "percentile-99.99", "percentile-u8"],
)
def test_magika_same_model_bytes_as_quantize_static(magika, tmp_path, settings):
    model, data = magika
    settings = {**settings, "op_types_to_quantize": ["MatMul", "Conv"]}
    with OrtBackend(model, data) as backend:
        backend.quantize(settings, tmp_path / "ours.onnx")
    assert (tmp_path / "ours.onnx").read_bytes() == reference_bytes(model, data, settings, tmp_path)


def test_concurrent_caches_on_one_directory_calibrate_once(mlp, tmp_path):
    """Two caches (as two processes would) on one directory: the file lock makes the second
    wait for the first and read its result."""
    import threading

    path, data = mlp
    caches = [CalibrationCache(tmp_path / "shared") for _ in range(2)]
    request = CalibrationRequest(method="Percentile", percentile=99.9)
    results = {}

    def work(i):
        results[i] = caches[i].tensors_range(path, data, request)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.stats["calibrations"] for c in caches) == 1
    # The second either found the first's entry on disk (a hit) or waited on the lock while
    # the first calibrated: a wait, not a hit (its calibration time holds the wait).
    waits = sum(c.stats["lock_waits"] for c in caches)
    assert waits in (0, 1)
    assert sorted(hit for _, hit in results.values()) == (
        [False, False] if waits else [False, True]
    )
    a, b = (results[i][0] for i in range(2))
    assert all(a[n].range_value == b[n].range_value for n in a.keys())
