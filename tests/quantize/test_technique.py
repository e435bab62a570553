"""Techniques in a trial, without Ray: each kind takes effect in the quantized model, a float
transform runs once per effect key, technique settings never reach the backend, and with no
technique active the model is byte-identical to the backend's own."""

from __future__ import annotations

import dataclasses

import onnx
import pytest

from raysearch.data import DataSource
from raysearch.evaluate import Evaluator
from raysearch.quantize.backends.ort import OrtBackend
from raysearch.quantize.calibration import CalibrationRequest, calibration_values
from raysearch.quantize.technique import (
    FLOAT,
    OVERRIDES,
    QUANTIZED,
    Technique,
    available_techniques,
    get_technique,
    register_technique,
)
from raysearch.space.catalogue import Catalogue, OptionSpec, get_catalogue
from raysearch.trial import TrialRunner, TrialSpec
from tests.models import make_mlp_model, mlp_data
from tests.plugins.technique_fixture import registered_toy_techniques


@pytest.fixture
def toys():
    with registered_toy_techniques() as module:
        module.CALLS.clear()
        yield module


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("technique")
    path = make_mlp_model(folder / "mlp.onnx")
    data = DataSource.load(mlp_data(32, seed=1), path, batch_size=16)
    return path, data


def _runner(mlp, tmp_path):
    path, data = mlp
    return TrialRunner(
        TrialSpec(
            path, data, data, Evaluator("L2", 10.0), cache_dir=tmp_path, measure_latency=False
        )
    )


def _fc2_weight(path):
    model = onnx.load(str(path))
    return next(n for n in model.graph.node if n.name == "fc2").input[1]


def test_with_no_technique_active_the_model_is_the_backends_own(toys, mlp, tmp_path):
    path, data = mlp
    settings = {"calibrate_method": "MinMax", "per_channel": True}
    with _runner(mlp, tmp_path / "a") as runner:
        result = runner.run(settings, tmp_path / "trial.onnx")
    assert result.ok, result.error
    with OrtBackend(path, data) as backend:
        backend.quantize(settings, tmp_path / "direct.onnx")
    assert (tmp_path / "trial.onnx").read_bytes() == (tmp_path / "direct.onnx").read_bytes()
    assert toys.CALLS == {}


def test_each_kind_takes_effect_and_its_settings_never_reach_the_backend(
    toys, mlp, tmp_path, monkeypatch
):
    seen = []
    original = OrtBackend.quantize

    def recording(self, settings, out_path):
        seen.append(dict(settings))
        return original(self, settings, out_path)

    monkeypatch.setattr(OrtBackend, "quantize", recording)
    switched = {
        "include_toy_identity": True,
        "toy_identity_count": 2,
        "include_toy_float_tail": True,
        "include_toy_stamp": True,
    }
    with _runner(mlp, tmp_path) as runner:
        plain = runner.run({"calibrate_method": "MinMax"}, tmp_path / "plain.onnx")
        toy = runner.run({"calibrate_method": "MinMax", **switched}, tmp_path / "toy.onnx")
    assert plain.ok and toy.ok, toy.error
    model = onnx.load(str(tmp_path / "toy.onnx"))
    # Float transform: the Identity nodes are in the quantized model.
    assert {"toy_identity_0", "toy_identity_1"} <= {n.name for n in model.graph.node}
    # Tensor overrides: the last MatMul kept its float weight; without the toy it did not.
    assert _fc2_weight(tmp_path / "toy.onnx") == "w2"
    assert _fc2_weight(tmp_path / "plain.onnx") != "w2"
    # Quantized transform: the stamp.
    assert {p.key: p.value for p in model.metadata_props}["toy_stamp"] == "stamped"
    # The backend got the override, never a toy key.
    assert seen[1]["nodes_to_exclude"] == ["fc2"]
    assert not any(key.startswith(("include_toy", "toy_")) for s in seen for key in s)
    # The transformed model is another file: its calibration is its own.
    assert not toy.calib_cache_hit


def test_a_float_transform_runs_once_per_effect_key_and_its_calibration_is_reused(
    toys, mlp, tmp_path
):
    with _runner(mlp, tmp_path) as runner:
        results = [
            runner.run(
                {"include_toy_identity": True, "toy_identity_count": count, "per_channel": pc},
                tmp_path / f"t{i}.onnx",
            )
            for i, (count, pc) in enumerate([(1, False), (1, True), (3, False), (1, False)])
        ]
    assert all(r.ok for r in results), [r.error for r in results]
    assert toys.CALLS == {"toy_identity": 2}  # counts 1 and 3
    assert [r.calib_cache_hit for r in results] == [False, True, False, True]
    assert "toy_identity_2" in {n.name for n in onnx.load(str(tmp_path / "t2.onnx")).graph.node}


def test_technique_settings_join_every_backends_catalogue(toys):
    ort = get_catalogue("ort")
    assert ort.spec("", "include_toy_identity").kind == "bool"
    assert ort.spec("", "toy_identity_count").requires == "include_toy_identity"
    assert {get_technique(n).kind for n in ("toy_identity", "toy_float_tail", "toy_stamp")} == {
        FLOAT,
        OVERRIDES,
        QUANTIZED,
    }
    assert {"toy_identity", "toy_float_tail", "toy_stamp"} <= set(available_techniques())


def test_registering_needs_a_technique_kind():
    class NoKind(Technique):
        def effect_key(self, settings):
            return None

    with pytest.raises(TypeError, match="technique kind"):
        register_technique("nokind")(NoKind)


def test_the_calibration_key_reads_exactly_the_catalogues_flagged_settings():
    ort = get_catalogue("ort")
    assert set(ort.calibration_keys()) == {
        ("", "calibrate_method"),
        ("", "op_types_to_quantize"),
        ("extra_options", "CalibTensorRangeSymmetric"),
        ("extra_options", "CalibMovingAverage"),
        ("extra_options", "CalibMovingAverageConstant"),
        ("extra_options", "CalibStridedMinMax"),
        ("extra_options", "num_bins"),
    }
    settings = {"calibrate_method": "Entropy", "extra_options": {"num_bins": 512}}
    assert calibration_values(settings) == {"calibrate_method": "Entropy", "num_bins": 512}
    assert CalibrationRequest.from_settings(settings).collection_key() == ("hist", "value", 512)
    # A catalogue that does not flag num_bins: the key cannot depend on it.
    unflagged = {
        **ort.containers["extra_options"],
        "num_bins": dataclasses.replace(
            ort.containers["extra_options"]["num_bins"], affects_calibration=False
        ),
    }
    other = Catalogue("ort", ort.settings, {"extra_options": unflagged}, ort.aliases)
    request = CalibrationRequest.from_settings(settings, other)
    assert request.collection_key() == ("hist", "value", 128)


def test_a_technique_gets_the_trials_gpu_only_when_it_can_use_one():
    class CpuOnly(Technique):
        kind = OVERRIDES

        def effect_key(self, settings):
            return None

    class GpuToo(CpuOnly):
        devices = frozenset({"cpu", "gpu"})

    cuda = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    assert CpuOnly(providers=cuda).providers == ["CPUExecutionProvider"]
    assert GpuToo(providers=cuda, threads=2).providers == cuda
    assert CpuOnly(providers=["CPUExecutionProvider"]).providers == ["CPUExecutionProvider"]


def test_stripping_removes_a_techniques_keys_at_the_top_and_inside_containers():
    from raysearch.quantize.pipeline import strip_technique_settings

    class InExtra(Technique):
        kind = OVERRIDES
        settings = {"include_x": OptionSpec("bool", "switch")}
        containers = {"extra_options": {"XAlpha": OptionSpec("float", "alpha")}}

        def effect_key(self, settings):
            return None

    settings = {"include_x": True, "extra_options": {"XAlpha": 0.5, "num_bins": 512}}
    assert strip_technique_settings(settings, [InExtra]) == {"extra_options": {"num_bins": 512}}
    untouched = {"per_channel": True, "extra_options": {"num_bins": 512}}
    assert strip_technique_settings(untouched, [InExtra]) is untouched


def test_a_technique_setting_whose_module_was_not_imported_fails_the_trial(mlp, tmp_path):
    with _runner(mlp, tmp_path) as runner:
        result = runner.run({"include_toy_identity": True}, tmp_path / "q.onnx")
    assert result.status == "failed" and not (tmp_path / "q.onnx").exists()
    assert result.error.startswith("include_toy_identity: not a setting of backend 'ort'")


@pytest.mark.parametrize(
    "switch",
    [
        {"include_bias_correction": True},
        {"include_fast_ft": True},
        {"extra_options": {"PowerOfTwoMethod": "MinMSE"}},
    ],
)
def test_a_qdq_technique_on_a_qoperator_setting_is_refused_before_it_runs(switch):
    """The search's refusal check (validate, spaces, every proposal) names the technique; the
    same technique on QDQ, or switched off, is not refused."""
    from raysearch.quantize.registry import backend_reject
    from raysearch.space import SearchSpace
    from raysearch.space.space import expand_spaces

    reason = backend_reject({"quant_format": "QOperator", **switch})
    assert reason is not None and reason.endswith("needs quant_format QDQ (it rewrites Q/DQ pairs)")
    assert backend_reject({"quant_format": "QDQ", **switch}) is None
    off = {k: False for k in switch if k.startswith("include_")} or {"extra_options": {}}
    assert backend_reject({"quant_format": "QOperator", **off}) is None
    listed = {k: [v] for k, v in switch.items() if k != "extra_options"}
    if "extra_options" in switch:
        listed["extra_options"] = {k: [v] for k, v in switch["extra_options"].items()}
    space = SearchSpace.parse({"quant_format": ["QDQ", "QOperator"], **listed})
    assert len(expand_spaces([space], backend_reject)) == 1
