"""The quantizer backend registry."""

from __future__ import annotations

import pytest

from raysearch.errors import ConfigError
from raysearch.quantize import registry
from raysearch.quantize.registry import (
    QuantizeInfo,
    QuantizerBackend,
    available_backends,
    get_backend,
    register_backend,
)


def test_ort_is_the_default_backend():
    assert "ort" in available_backends()
    backend = get_backend()
    assert backend.name == "ort" and get_backend("ort") is backend
    assert issubclass(backend, QuantizerBackend)


def test_unknown_backend_suggests_the_closest():
    with pytest.raises(ConfigError) as err:
        get_backend("orrt")
    assert (
        str(err.value)
        == "quantizer: unknown quantizer backend 'orrt' (did you mean 'ort'?); known: nncf, "
        "nncf_weight_only, ort, weight_only"
    )


def test_a_new_backend_is_one_class_and_a_registration(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register_backend("copy")
    class CopyBackend(QuantizerBackend):
        """Writes the float model unchanged: the smallest possible backend."""

        @classmethod
        def validate(cls, settings, model):
            if settings.get("bad"):
                raise ConfigError("bad", "not allowed")

        def quantize(self, settings, out_path):
            with open(self.model_path, "rb") as f, open(out_path, "wb") as g:
                g.write(f.read())
            return QuantizeInfo(0.0, 0.0, False)

    assert get_backend("copy") is CopyBackend and "copy" in available_backends()
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model")
    backend = CopyBackend(model, calibration=None)
    assert backend.quantize({}, tmp_path / "out.onnx").to_dict() == {
        "calibration_s": 0.0,
        "quantization_s": 0.0,
        "calib_cache_hit": False,
        "extra": {},
        "quantized_share": None,  # the graph tells what was quantized
    }
    assert CopyBackend.reject({}) is None
    with pytest.raises(TypeError):
        register_backend("nope")(object)
