"""Fast fine-tuning (AdaRound/AdaQuant): the layer reconstruction error on real layers of the
magika model falls below nearest rounding's, weights stay on the integer grid, results are
deterministic, every parameter acts, and a trial with it switched on runs."""

from __future__ import annotations

import shutil
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnxruntime.quantization import QuantFormat, quantize_static

pytest.importorskip("torch")

from raysearch.data import DataSource  # noqa: E402
from raysearch.demo import MAGIKA_DIR, build_demo_data  # noqa: E402
from raysearch.errors import ConfigError  # noqa: E402
from raysearch.evaluate import Evaluator  # noqa: E402
from raysearch.providers import make_session  # noqa: E402
from raysearch.quantize.techniques.fast_finetune import (  # noqa: E402
    FastFinetune,
    FinetuneOptions,
    finetune_model,
    finetune_options,
)
from raysearch.trial import TrialRunner, TrialSpec  # noqa: E402
from tests.models import conv_data, make_conv_model, make_mlp_model, mlp_data  # noqa: E402

CONV = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/Conv_0/Conv2D"
DENSE = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/Dense_1/MatMul"


def _quantize(float_path, data, out, per_channel=False):
    quantize_static(
        str(float_path), str(out), data.reader(), quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
    )  # fmt: skip
    return out


def _node_output(path, node_name, data):
    """The output of ``node_name`` in the model at ``path`` on every sample (ONNX Runtime)."""
    model = onnx.load(str(path))
    name = next(n for n in model.graph.node if n.name == node_name).output[0]
    model.graph.output.append(onnx.ValueInfoProto(name=name))
    session = make_session(model.SerializeToString(), 2)
    return np.concatenate([session.run([name], feed)[0] for feed in data.batches()])


def _weights(path, node_name):
    """The integer weight initializer of ``node_name`` in a QDQ model."""
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    node = next(n for n in model.graph.node if n.name == node_name)
    return numpy_helper.to_array(inits[dq[node.input[1]].input[0]])


@pytest.fixture(scope="module")
def magika(tmp_path_factory):
    # magika's inputs as the demo builds them (files of the Python installation), so the
    # tests run in any clone: no data from outside the repository.
    folder = tmp_path_factory.mktemp("ft")
    calib, _ = build_demo_data(folder / "data", n_calib=32, n_eval=8)
    rows = np.load(calib)["bytes"]
    path = MAGIKA_DIR / "model.onnx"
    data = DataSource.load({"bytes": rows}, path, batch_size=8)
    quantized = _quantize(path, data, folder / "magika_q.onnx")
    reference = {n: _node_output(path, n, data) for n in (CONV, DENSE)}
    nearest = {n: _node_output(quantized, n, data) for n in (CONV, DENSE)}
    return path, data, quantized, (reference, nearest)


@pytest.mark.parametrize(
    ("node", "algorithm", "rate"),
    [(CONV, "adaround", 0.1), (CONV, "adaquant", 1e-3), (DENSE, "adaround", 0.1),
     (DENSE, "adaquant", 1e-3)],
)  # fmt: skip
def test_magika_layer_error_falls_below_nearest_rounding(magika, tmp_path, node, algorithm, rate):
    path, data, quantized, (reference, nearest_out) = magika
    tuned = shutil.copy(quantized, tmp_path / "tuned.onnx")
    options = FinetuneOptions(algorithm, iterations=12, learning_rate=rate, batch_size=4)
    start = time.perf_counter()
    (row,) = finetune_model(tuned, path, data, options, threads=2, nodes=[node])
    seconds = time.perf_counter() - start
    # Measured by ONNX Runtime on the models, independently of the torch code.
    nearest = float(np.mean((nearest_out[node] - reference[node]) ** 2))
    after = float(np.mean((_node_output(tuned, node, data) - reference[node]) ** 2))
    print(f"{node.split('/')[-2]} {algorithm}: MSE {nearest:.4g} -> {after:.4g} ({seconds:.1f} s)")
    assert row["changed"] and after < nearest
    assert row["mse_before"] == pytest.approx(nearest, rel=1e-3)
    assert row["mse_after"] == pytest.approx(after, rel=1e-3)
    old, new = _weights(quantized, node), _weights(tuned, node)
    assert new.dtype == old.dtype == np.int8 and new.shape == old.shape
    assert new.min() >= -127 and new.max() <= 127  # ONNX Runtime's symmetric int8 range
    if algorithm == "adaround":  # rounding up or down: at most one step from nearest
        assert np.abs(new.astype(int) - old).max() == 1
    # Nothing else in the model changed.
    a, b = onnx.load(str(quantized)), onnx.load(str(tuned))
    assert [n.SerializeToString() for n in a.graph.node] == [
        n.SerializeToString() for n in b.graph.node
    ]
    changed = {t.name for t, u in zip(a.graph.initializer, b.graph.initializer, strict=True)
               if t.SerializeToString() != u.SerializeToString()}  # fmt: skip
    assert len(changed) == 1


def test_same_seed_same_bytes_other_seed_other_weights(magika, tmp_path):
    path, data, quantized, _ = magika
    outputs = []
    for i, seed in enumerate((0, 0, 7)):
        out = shutil.copy(quantized, tmp_path / f"m{i}.onnx")
        options = FinetuneOptions("adaround", iterations=8, batch_size=2, data_size=8, seed=seed)
        finetune_model(out, path, data, options, threads=2, nodes=[DENSE])
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_float_activations_are_reused_across_trials_within_bounds(magika, tmp_path):
    """The second fine-tuning of the same float model on the same data reads the float
    layers' activations from the process's cache, and writes the same bytes as with the cache
    cleared; past its byte budget the cache keeps nothing."""
    from raysearch.quantize.techniques.fast_finetune._layers import FLOAT_ACTIVATIONS

    path, data, quantized, _ = magika
    options = FinetuneOptions("adaquant", iterations=4, batch_size=2, data_size=8, seed=0)
    budget = FLOAT_ACTIVATIONS.max_bytes
    outputs = []
    try:
        FLOAT_ACTIVATIONS.clear()
        for i in range(2):
            out = shutil.copy(quantized, tmp_path / f"m{i}.onnx")
            misses, hits = FLOAT_ACTIVATIONS.misses, FLOAT_ACTIVATIONS.hits
            finetune_model(out, path, data, options, threads=2, nodes=[CONV, DENSE])
            outputs.append(out.read_bytes())
            if i == 0:
                assert FLOAT_ACTIVATIONS.misses - misses == 2
            else:
                assert (FLOAT_ACTIVATIONS.hits - hits, FLOAT_ACTIVATIONS.misses - misses) == (2, 0)
        FLOAT_ACTIVATIONS.clear()
        FLOAT_ACTIVATIONS.max_bytes = 1024  # smaller than one layer's activations
        out = shutil.copy(quantized, tmp_path / "m2.onnx")
        finetune_model(out, path, data, options, threads=2, nodes=[CONV, DENSE])
        outputs.append(out.read_bytes())
        assert FLOAT_ACTIVATIONS.nbytes == 0
    finally:
        FLOAT_ACTIVATIONS.max_bytes = budget
        FLOAT_ACTIVATIONS.clear()
    assert outputs[0] == outputs[1] == outputs[2]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ft_mlp")
    path = make_mlp_model(folder / "mlp.onnx")
    data = DataSource.load(mlp_data(64, seed=1), path, batch_size=16)
    return path, data, _quantize(path, data, folder / "mlp_q.onnx", per_channel=True)


def test_every_parameter_changes_the_weights(mlp, tmp_path):
    path, data, quantized = mlp

    def adaquant(**kw):
        return FinetuneOptions(**{"algorithm": "adaquant", "iterations": 30,
                                  "learning_rate": 1e-4, "batch_size": 4, **kw})  # fmt: skip

    variants = {
        "base": adaquant(),
        "adaround": adaquant(algorithm="adaround", learning_rate=0.1),
        "iterations": adaquant(iterations=60),
        "rate": adaquant(learning_rate=5e-5),
        "batch": adaquant(batch_size=8),
        "data": adaquant(data_size=20),
        "seed": adaquant(seed=3),
    }
    weights = {}
    for name, options in variants.items():
        out = shutil.copy(quantized, tmp_path / f"{name}.onnx")
        rows = finetune_model(out, path, data, options, threads=1)
        assert all(r["changed"] and r["mse_after"] < r["mse_before"] for r in rows), rows
        weights[name] = b"".join(_weights(out, n).tobytes() for n in ("fc1", "fc2"))
    assert len(set(weights.values())) == len(variants)


def test_optim_device_acts():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the error path does not apply")
    with pytest.raises(ValueError, match="OptimDevice cuda:0: PyTorch sees no CUDA device"):
        finetune_model("unused.onnx", "unused.onnx", None, FinetuneOptions(device="cuda:0"))


def test_adaquant_requantizes_the_int32_bias(tmp_path):
    path = make_conv_model(tmp_path / "cnn.onnx")
    data = DataSource.load(conv_data(32), path, batch_size=8)
    quantized = _quantize(path, data, tmp_path / "cnn_q.onnx", per_channel=True)
    tuned = shutil.copy(quantized, tmp_path / "tuned.onnx")
    options = FinetuneOptions("adaquant", iterations=100, learning_rate=1e-5, batch_size=4)
    rows = finetune_model(tuned, path, data, options, threads=1)
    assert {r["node"] for r in rows if r.get("changed")} == {"conv1", "conv2", "fc"}
    before = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(quantized)).graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tuned)).graph.initializer}
    for bias in ("c2_quantized", "bf_quantized"):
        assert after[bias].dtype == np.int32 and not np.array_equal(after[bias], before[bias])
    for name in before:  # scales and zero points are the quantizer's
        if "scale" in name or "zero_point" in name:
            assert np.array_equal(before[name], after[name]), name


def test_settings_num_iter_lr_nested_group_and_errors():
    technique = FastFinetune()
    on = {"include_fast_ft": True}
    assert technique.effect_key({}) is None
    assert technique.effect_key({"include_fast_ft": False, "extra_options": {}}) is None
    joint = technique.effect_key({**on, "extra_options": {"NumIterLR": [100, 1e-4]}})
    split = technique.effect_key(
        {**on, "extra_options": {"NumIterations": 100, "LearningRate": 1e-4}}
    )
    nested = technique.effect_key(
        {**on, "extra_options": {"FastFinetune": {"NumIterLR": [100, 1e-4]}}}
    )
    assert joint == split == nested
    defaults = finetune_options(on)
    assert (defaults.algorithm, defaults.iterations, defaults.learning_rate) == (
        "adaround",
        1000,
        0.1,
    )
    assert (defaults.batch_size, defaults.data_size, defaults.seed, defaults.device) == (
        2,
        None,
        0,
        "cpu",
    )
    assert (
        finetune_options({**on, "extra_options": {"OptimAlgorithm": "adaquant"}}).learning_rate
        == 1e-5
    )
    keys = {
        technique.effect_key({**on, "extra_options": extra})
        for extra in (
            {}, {"OptimAlgorithm": "adaquant"}, {"NumIterations": 10}, {"LearningRate": 0.5},
            {"BatchSize": 4}, {"DataSize": 10}, {"OptimDevice": "cuda:1"}, {"FixedSeed": 42},
        )
    }  # fmt: skip
    assert len(keys) == 8
    with pytest.raises(ValueError, match=r"NumIterLR must be \[NumIterations, LearningRate\]"):
        technique.effect_key({**on, "extra_options": {"NumIterLR": [100]}})
    with pytest.raises(ValueError, match="contradicts NumIterations"):
        technique.effect_key({**on, "extra_options": {"NumIterLR": [100, 0.1], "NumIterations": 5}})
    with pytest.raises(ValueError, match="BatchSize must be an integer >= 1"):
        technique.effect_key({**on, "extra_options": {"BatchSize": 0}})


def test_search_space_accepts_quarks_spelling():
    from raysearch.space.parse import parse_space

    parsed = parse_space(
        {"include_fast_ft": [True], "extra_options": {"FastFinetune": {
            "NumIterLR": [[100, 1e-4], [200, 1e-5]], "OptimAlgorithm": ["adaround", "adaquant"]}}}
    )  # fmt: skip
    assert parsed.switches  # the parameters only act with include_fast_ft


def test_missing_torch_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ConfigError) as caught:
        FastFinetune().effect_key({"include_fast_ft": True})
    message = str(caught.value)
    assert "fine-tuning needs PyTorch: pip install 'raysearch[finetune]'" in message
    assert "\n" not in message
    assert FastFinetune().effect_key({"include_fast_ft": False}) is None


def test_trial_with_fast_finetune(tmp_path):
    path = make_conv_model(tmp_path / "cnn.onnx")
    calib = DataSource.load(conv_data(32, seed=1), path, batch_size=8, label="calibration data")
    evaluation = DataSource.load(conv_data(32, seed=2), path, batch_size=8)
    runner = TrialRunner(
        TrialSpec(
            path,
            calib,
            evaluation,
            Evaluator("cos", 0.9),
            cache_dir=tmp_path,
            measure_latency=False,
        )
    )
    base = {"calibrate_method": "MinMax", "per_channel": False}
    extra = {"OptimAlgorithm": "adaquant", "NumIterations": 100, "BatchSize": 4}
    with runner:
        plain = runner.run(base, tmp_path / "plain.onnx")
        tuned = runner.run(
            {**base, "include_fast_ft": True, "extra_options": extra}, tmp_path / "ft.onnx"
        )
    assert plain.status == "ok" and tuned.status == "ok", tuned.error
    print(f"trial cos: nearest {plain.metric:.6f} fine-tuned {tuned.metric:.6f}")
    assert tuned.metric >= plain.metric
    assert (tmp_path / "plain.onnx").read_bytes() != (tmp_path / "ft.onnx").read_bytes()


def test_a_config_switching_fine_tuning_on_without_pytorch_is_refused_before_running(
    monkeypatch,
):
    """The check runs when the config's spaces are parsed, naming the extra."""
    import importlib.util

    from raysearch.config._spaces import parse_spaces
    from raysearch.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(ConfigError) as error:
        parse_spaces({"search_space": {"include_fast_ft": [False, True]}})
    assert str(error.value) == (
        "search_space.include_fast_ft: fine-tuning needs PyTorch: pip install 'raysearch[finetune]'"
    )
    # Switched off only: nothing to refuse.
    assert parse_spaces({"search_space": {"include_fast_ft": [False]}})
    monkeypatch.undo()
    assert len(parse_spaces({"search_space": "FINETUNE_SEARCH"})[0].expand()) == 16


def test_a_preset_searching_fine_tuning_as_an_option_searches_it_off_without_pytorch(
    monkeypatch, caplog
):
    """A8W8_SEARCH searches include_fast_ft on and off: without PyTorch it searches it off
    (a warning names the extra); FINETUNE_SEARCH needs it and is refused."""
    import importlib.util

    from raysearch.config._spaces import parse_spaces
    from raysearch.errors import ConfigError

    with_torch = parse_spaces({"search_space": "A8W8_SEARCH"})[0]
    switch = next(p for p in with_torch.params if p.leaf == "include_fast_ft")
    assert list(switch.domain.choices) == [False, True]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with caplog.at_level("WARNING", logger="raysearch.config.narrowed"):
        lean = parse_spaces({"search_space": "A8W8_SEARCH"})[0]
    switch = next(p for p in lean.params if p.leaf == "include_fast_ft")
    assert list(switch.domain.choices) == [False]
    assert "A8W8_SEARCH: include_fast_ft searched as false only" in caplog.text
    assert "raysearch[finetune]" in caplog.text
    assert lean.grid_size() < with_torch.grid_size()
    with pytest.raises(ConfigError, match=r"raysearch\[finetune\]"):
        parse_spaces({"search_space": "FINETUNE_SEARCH"})
