"""The ``nncf`` backend: its catalogue in a space (alone and beside ``ort``), its refusals and
model checks, the arguments it gives NNCF, and real NNCF runs through the trial engine (magika,
the BiasCorrection failure as a failed trial, the trial's providers and threads, telemetry
off and no output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from raysearch.data import DataSource
from raysearch.demo import MAGIKA_DIR, magika_features
from raysearch.errors import ConfigError
from raysearch.evaluate import Evaluator
from raysearch.quantize.backends.nncf import NncfBackend, import_nncf, nncf_session
from raysearch.quantize.backends.nncf.options import (
    reject_mixed_precision,
    reject_reason,
    reject_transformer_bias_correction,
)
from raysearch.quantize.registry import backend_reject, get_backend
from raysearch.space import SearchSpace
from raysearch.trial import TrialDevice, TrialRunner, TrialSpec
from tests.models import attention_data, make_attention_model, make_mlp_model

REPO = Path(__file__).resolve().parents[2]

CROSS = {
    "quantizer": ["ort", "nncf"],
    "ort": {"only_if": {"quantizer": "ort"}, "per_channel": [True, False]},
    "nncf": {
        "only_if": {"quantizer": "nncf"},
        "model_type": ["transformer", "none"],
        "fast_bias_correction": [True, False],
        "smooth_quant_alphas": {"matmul": [0.5]},
    },
}


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    path = make_attention_model(tmp_path_factory.mktemp("nncf") / "attention.onnx")
    return path, DataSource.load(attention_data(16), path)


@pytest.fixture(scope="module")
def magika_rows():
    """magika's features of 48 of this Python's own source files (as the demo builds them)."""
    files = sorted(Path(os.__file__).parent.glob("*.py"))[:48]
    return np.stack([magika_features(f.read_bytes()) for f in files])


# -- the space --------------------------------------------------------------------------------


def test_a_cross_backend_space_gives_each_backend_its_own_keys():
    space = SearchSpace.parse(CROSS)
    settings = [space.to_settings(p) for p in space.expand(backend_reject).points]
    assert settings == [
        {"quantizer": "ort", "per_channel": True},
        {"quantizer": "ort", "per_channel": False},
        {
            "quantizer": "nncf",
            "model_type": "transformer",
            "fast_bias_correction": True,
            "smooth_quant_alphas": {"matmul": 0.5},
        },
        # fast_bias_correction: false with transformer is refused; without transformer the
        # SmoothQuant alphas act on nothing and are stripped.
        {"quantizer": "nncf", "model_type": "none", "fast_bias_correction": True},
        {"quantizer": "nncf", "model_type": "none", "fast_bias_correction": False},
    ]


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            {"quantizer": "ort", "preset": ["mixed"]},
            "search_space.preset: unknown key ('preset' is a setting of backend 'nncf': set "
            "quantizer to it, or put it in a group with only_if: {quantizer: nncf})",
        ),
        (
            {"quantizer": ["ort", "nncf"], "model_type": ["transformer"]},
            "search_space.model_type: 'model_type' is a setting of backend 'nncf', not of "
            "'ort': put it in a group with only_if: {quantizer: nncf}",
        ),
        (
            {"quantizer": "nncf", "calibrate_method": ["MinMax"]},
            "search_space.calibrate_method: unknown key ('calibrate_method' is a setting of "
            "backend 'ort'",
        ),
        ({"quantizer": "nncf", "prest": ["mixed"]}, "unknown key (did you mean 'preset'?)"),
        (
            {"quantizer": "nncf", "smooth_quant_alphas": {"matmull": [0.5]}},
            "search_space.smooth_quant_alphas.matmull: unknown key (did you mean 'matmul'?)",
        ),
        (
            {"quantizer": "nncf", "smooth_quant_alphas": {"matmul": [0.5, 1.5]}},
            "search_space.smooth_quant_alphas.matmul[1]: expected a value <= 1.0, got 1.5",
        ),
        (
            {"quantizer": "nncf", "activations_range_estimator": ["histogramm"]},
            "search_space.activations_range_estimator: expected one of minmax, mean_minmax, "
            "median_minmax, mean_no_outliers_minmax, mean_quantile, histogram, got 'histogramm'",
        ),
        (
            {"quantizer": "nncf", "ignored_scope": {"names": ["fc1"]}},
            "each choice of names is a list of names or null",
        ),
    ],
    ids=[
        "nncf key, ort",
        "nncf key, both",
        "ort key, nncf",
        "typo",
        "alpha typo",
        "alpha bound",
        "estimator",
        "names not a list",
    ],  # fmt: skip
)
def test_keys_of_the_wrong_backend_or_values_are_refused_naming_it(space, message):
    with pytest.raises(ConfigError) as info:
        SearchSpace.parse(space)
    assert message in str(info.value)


# -- refusals and checks ------------------------------------------------------------------------


def test_each_reject_rule():
    crash = {"model_type": "transformer", "fast_bias_correction": False}
    assert reject_transformer_bias_correction(crash).startswith(
        "NNCF 3.4's BiasCorrection (fast_bias_correction: false) fails on transformer models"
    )
    assert reject_transformer_bias_correction({**crash, "model_type": "none"}) is None
    assert reject_transformer_bias_correction({**crash, "disable_bias_correction": True}) is None
    assert reject_mixed_precision({"mixed_precision": {"top_k": 4, "promote_to": "float"}})
    assert reject_mixed_precision({"mixed_precision": {"top_k": 0, "rank_2": "int16"}})
    assert reject_mixed_precision({"mixed_precision": {"top_k": 0, "rank_2": "int8"}}) is None
    # The search's one check names the backend's refusal.
    assert backend_reject({"quantizer": "nncf", **crash}) == reject_reason(crash)
    assert backend_reject({"quantizer": "ort", **crash}) is None


def test_ignored_scope_is_checked_against_the_model_with_the_closest_name(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    names = {n.name for n in onnx.load(str(model)).graph.node}
    scope = {"names": sorted(names)[:1], "types": ["MatMul"], "patterns": ["fc.*"]}
    NncfBackend.validate({"ignored_scope": scope}, model)
    bad = [
        ({"names": ["fc11"]}, "ignored_scope.names: not in the model: 'fc11' (did you mean"),
        ({"types": ["Conv"]}, "ignored_scope.types: not in the model: 'Conv'"),
        ({"patterns": ["fc[1"]}, "ignored_scope.patterns: 'fc[1' is no regular expression"),
        ({"patterns": ["conv.*"]}, "ignored_scope.patterns: 'conv.*' matches no node name"),
    ]
    for scope, message in bad:
        with pytest.raises(ConfigError) as info:
            NncfBackend.validate({"ignored_scope": scope}, model)
        assert message in str(info.value)


def test_the_search_checks_every_ignored_scope_choice_before_it_starts(tmp_path):
    from raysearch.search.preflight import check_model

    model = make_mlp_model(tmp_path / "mlp.onnx")
    space = SearchSpace.parse(
        {
            "quantizer": ["ort", "nncf"],
            "n": {"only_if": {"quantizer": "nncf"}, "ignored_scope": {"names": [["fc1"], ["fc3"]]}},
        }
    )
    with pytest.raises(ConfigError) as info:
        check_model(model, [space])
    assert str(info.value) == "ignored_scope.names: not in the model: 'fc3' (did you mean 'fc2'?)"


def test_a_missing_nncf_is_one_line_before_anything_runs_and_presets_narrow_to_ort():
    """Without NNCF (hidden from this child process) a space that selects it is refused when
    the config is parsed, naming the extra; AUTO_INT8_SEARCH searches ONNX Runtime only."""
    code = """
import json, logging, sys
sys.modules["nncf"] = None  # NNCF is not installed, as far as this process can tell
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
from raysearch.config._spaces import parse_spaces
from raysearch.errors import ConfigError
(auto,) = parse_spaces({"search_space": "AUTO_INT8_SEARCH"})
backends = sorted({auto.to_settings(p)["quantizer"] for p in auto.expand().points})
try:
    parse_spaces({"search_space": {"quantizer": ["ort", "nncf"]}})
    refused = None
except ConfigError as exc:
    refused = str(exc)
print(json.dumps({"backends": backends, "refused": refused}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    *warnings, last = proc.stdout.strip().splitlines()
    result = json.loads(last)
    assert result["backends"] == ["ort"]
    assert result["refused"] == (
        "search_space.quantizer: quantizer nncf needs OpenVINO NNCF: pip install 'raysearch[nncf]'"
    )
    assert warnings == [
        "AUTO_INT8_SEARCH: quantizer searched as ort only: quantizer nncf needs OpenVINO NNCF: "
        "pip install 'raysearch[nncf]'"
    ]


# -- real NNCF runs -----------------------------------------------------------------------------


def test_an_nncf_trial_quantizes_magika_to_a_valid_qdq_model_that_evaluates(magika_rows, tmp_path):
    model = MAGIKA_DIR / "model.onnx"
    calibration = DataSource.load({"bytes": magika_rows[:32]}, model)
    evaluation = DataSource.load({"bytes": magika_rows[32:]}, model)
    runner = TrialRunner(
        TrialSpec(
            model, calibration, evaluation, Evaluator("cos", 0.99), device=TrialDevice(threads=1)
        )
    )
    result = runner.run({"quantizer": "nncf", "model_type": "transformer"}, tmp_path / "q.onnx")

    assert result.status == "ok", result.error
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    onnx.checker.check_model(quantized, full_check=True)
    ops = [n.op_type for n in quantized.graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > 0
    assert result.extra["quantized_share"] > 0
    assert result.metric > 0.9  # cosine to the float model on 16 files it was not calibrated on
    # NNCF's ONNX Runtime inference is calibration time, the rest is quantization.
    assert result.calibration_s > 0 and result.quantization_s > 0 and not result.calib_cache_hit


def test_the_bias_correction_failure_is_a_failed_trial_with_one_line(attention, tmp_path):
    path, data = attention
    runner = TrialRunner(TrialSpec(path, data, data, Evaluator("cos", 0.99)))
    failed = runner.run({"quantizer": "nncf", "fast_bias_correction": False}, tmp_path / "a.onnx")
    assert failed.status == "failed"
    assert failed.error == (
        f"NNCF {import_nncf().__version__} failed in bias_correction (Fail): Error: Duplicate "
        "definition-site for (ln1)."
    )
    assert not (tmp_path / "a.onnx").exists()
    # Where the combination is known to fail (transformer) it is refused before it runs.
    known = {"model_type": "transformer", "fast_bias_correction": False}
    rejected = runner.run({"quantizer": "nncf", **known}, tmp_path / "b.onnx")
    assert rejected.error == f"rejected: {reject_reason(known)}"
    # A technique the backend cannot honour is refused by the trial itself too.
    mixed = runner.run({"quantizer": "nncf", "mixed_precision": {"top_k": 1}}, tmp_path / "m.onnx")
    assert mixed.status == "failed" and mixed.error.startswith("rejected: ")
    assert "mixed_precision" in mixed.error and not (tmp_path / "m.onnx").exists()
    # The process goes on quantizing; NNCF's own figures reach the result.
    ok = runner.run({"quantizer": "nncf", "model_type": "transformer"}, tmp_path / "c.onnx")
    assert ok.status == "ok" and ok.metric > 0.99
    assert ok.extra["nncf_inferences"] > 0 and ok.extra["nncf_sessions"] >= 1


def test_settings_reach_nncf_and_change_the_model(attention, tmp_path):
    path, data = attention
    backend = get_backend("nncf")(path, data)
    default = tmp_path / "default.onnx"
    backend.quantize({}, default)
    changed = {
        "preset": {"preset": "mixed"},
        "estimator": {"activations_range_estimator": "minmax"},
        "per_tensor": {"weights_per_channel": False},
        "ignored": {"ignored_scope": {"names": ["q_proj", "k_proj"]}},
        "excluded": {"nodes_to_exclude": ["q_proj"]},  # what an override technique keeps float
    }
    for name, settings in changed.items():
        backend.quantize(settings, tmp_path / f"{name}.onnx")
        assert (tmp_path / f"{name}.onnx").read_bytes() != default.read_bytes(), name
    ignored = onnx.load(str(tmp_path / "ignored.onnx"))
    q_proj = next(n for n in ignored.graph.node if n.name == "q_proj")
    assert q_proj.input[1] == "wq"  # its weight stayed float
    with pytest.raises(ValueError, match="cannot apply extra_options TensorQuantOverrides"):
        backend.quantize({"extra_options": {"TensorQuantOverrides": {"x": []}}}, tmp_path / "x")


def test_calibration_runs_on_the_trials_providers_and_threads(attention):
    """NNCF's engine is swapped inside the block only; its sessions get the trial's
    providers and thread count, and are counted and timed."""
    from nncf.common.factory import EngineFactory
    from nncf.onnx import engine as engine_module

    original = engine_module.ONNXEngine
    model = onnx.load(str(attention[0]))
    with nncf_session(["CPUExecutionProvider"], threads=1) as timing:
        engine = EngineFactory.create(model)
        engine.infer(attention[1].batch(0))
    assert engine_module.ONNXEngine is original
    assert engine.sess.get_providers() == ["CPUExecutionProvider"]
    assert engine.sess.get_session_options().intra_op_num_threads == 1
    assert (timing.sessions, timing.inferences) == (1, 1) and timing.total_s > 0


def test_nncf_is_silent_and_sends_nothing(tmp_path):
    """Imported through raysearch, NNCF's telemetry is its no-op stub and NNCF writes nothing
    under the home folder (its client id would live in ~/intel), and a quantization prints
    nothing (no progress bars, no log lines on stdout). A child process: NNCF itself switches
    its telemetry off under pytest."""
    code = """
from raysearch.data._data import DataSource
from raysearch.quantize.backends.nncf._backend import NncfBackend
from raysearch.quantize.nncf_runtime import import_nncf
from tests.models import make_mlp_model, mlp_data
import_nncf()
from nncf.telemetry import decorator, wrapper
assert isinstance(wrapper.telemetry, wrapper.NNCFTelemetryStub)
assert decorator.telemetry is wrapper.telemetry
path = make_mlp_model("work/mlp.onnx")
NncfBackend(path, DataSource.load(mlp_data(8), path)).quantize({}, "work/q.onnx")
"""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_CURRENT_TEST", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    # ONNX Runtime keeps its own device id under ~/.cache/Microsoft; NNCF wrote nothing.
    written = [str(p.relative_to(home)) for p in home.rglob("*")]
    assert not [p for p in written if "intel" in p or "nncf" in p or "openvino" in p], written
    assert (tmp_path / "work" / "q.onnx").exists()
