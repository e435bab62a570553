"""Calibration runs on the trial's execution providers: every ONNX Runtime session created for
calibration (raysearch's own passes and ONNX Runtime's calibrator) gets exactly the providers
the backend was given, CUDA provider options included (recorded by a wrapper around the real
``onnxruntime.InferenceSession``, see ``tests/quantize/recording.py``)."""

from __future__ import annotations

import pytest

from raysearch.data import DataSource
from raysearch.providers import cuda_available, session_providers
from raysearch.quantize.backends.ort import OrtBackend
from raysearch.quantize.calibration import CalibrationCache, CalibrationRequest
from tests.models import make_mlp_model, mlp_data
from tests.quantize.recording import GPU_PROVIDERS, normalized, record_sessions


@pytest.fixture
def sessions():
    with record_sessions() as created:
        yield created


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = make_mlp_model(tmp_path_factory.mktemp("devices") / "mlp.onnx")
    return path, DataSource.load(mlp_data(32), path, batch_size=8)


@pytest.mark.parametrize(
    "settings",
    [
        {"calibrate_method": "MinMax"},
        {"calibrate_method": "MinMax", "extra_options": {"CalibStridedMinMax": 2}},
        {"calibrate_method": "Percentile"},
        {"calibrate_method": "Entropy"},
    ],
    ids=["minmax", "strided", "percentile", "entropy"],
)
def test_calibration_sessions_get_the_backend_providers(mlp, tmp_path, sessions, settings):
    path, data = mlp
    with OrtBackend(path, data, CalibrationCache(), gpu_id=0, providers=GPU_PROVIDERS) as backend:
        info = backend.quantize(settings, tmp_path / "q.onnx")
    assert not info.calib_cache_hit and sessions
    assert all(created == normalized(GPU_PROVIDERS) for created in sessions), sessions


def test_a_backend_given_a_gpu_calibrates_on_that_gpu(mlp, tmp_path, sessions):
    """No providers given: the backend's GPU decides them (CPU where CUDA does not load)."""
    path, data = mlp
    with OrtBackend(path, data, gpu_id=0) as backend:
        backend.quantize({"calibrate_method": "Percentile"}, tmp_path / "q.onnx")
        assert backend.providers == session_providers(0)
        assert backend.cache.providers == session_providers(0)
    assert sessions and all(s == normalized(session_providers(0)) for s in sessions)
    if cuda_available():
        assert sessions[0][0] == ("CUDAExecutionProvider", {"device_id": "0"})


def test_cache_key_shares_within_a_device_kind_only(mlp):
    """The device's options (index, memory share) do not split the cache; CPU and CUDA do,
    since their kernels may round differently."""
    path, data = mlp
    cache = CalibrationCache()
    request = CalibrationRequest(method="Percentile")
    _, hit = cache.tensors_range(path, data, request, providers=GPU_PROVIDERS)
    assert not hit
    other_share = [
        ("CUDAExecutionProvider", {"device_id": 1, "gpu_mem_limit": 1 << 28}),
        "CPUExecutionProvider",
    ]
    _, hit = cache.tensors_range(path, data, request, providers=other_share)
    assert hit and cache.stats["calibrations"] == 1
    _, hit = cache.tensors_range(path, data, request, providers=["CPUExecutionProvider"])
    assert not hit and cache.stats["calibrations"] == 2
