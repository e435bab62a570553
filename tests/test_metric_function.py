"""A function as the metric, given from Python (Quark's ``search_evaluator``): checked and
pickled when the config is read (one line naming the key when it cannot reach the trials),
named ``module:qualname`` in the outputs, shipped to the trial actors by value (a Ray worker
cannot import this test module), and resumed only from Python."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml

from raysearch.config import SearchConfig
from raysearch.errors import ConfigError
from raysearch.evaluate import Evaluator
from tests.models import make_mlp_model, mlp_data

SPACE = {"per_channel": [True, False], "activation_type": ["QUInt8"]}
REPO = Path(__file__).resolve().parents[1]
BASE = {"model": "model.onnx", "calibration_data": "calib.npz", "search_space": SPACE}


def mean_output(model_path: str, providers: list) -> dict:
    """The model's mean output on fixed inputs, and the process that computed it."""
    session = ort.InferenceSession(model_path, providers=providers)
    mean = float(session.run(None, mlp_data(8, seed=7))[0].mean())
    return {"metric": mean, "pid": float(os.getpid())}


def _config(metric, **extra) -> SearchConfig:
    return SearchConfig.from_dict({**BASE, "metric": metric, **extra}, check_paths=False)


def _local_function():
    def score(model_path, providers):
        return 1.0

    return score


def test_a_lambda_and_a_local_function_are_metrics_named_module_qualname():
    fn = lambda path, providers: 0.5  # noqa: E731
    config = _config(fn, tolerance=0.1)
    assert config.metric == f"{__name__}:{fn.__qualname__}"
    assert fn.__qualname__.endswith("<locals>.<lambda>")
    assert config.metric_function is fn and config.is_custom_metric
    assert config.code_modules() == []  # its code travels pickled, not as a module
    local = _local_function()
    config = _config(local)
    assert config.metric == f"{__name__}:_local_function.<locals>.score"
    assert config.load_evaluator() is local


def test_quarks_search_evaluator_function_is_the_metric():
    config = SearchConfig.from_dict(
        {**BASE, "search_evaluator": mean_output, "search_metric_tolerance": 0.01},
        check_paths=False,
    )
    assert config.metric == f"{__name__}:mean_output" and config.metric_function is mean_output
    assert config.tolerance == 0.01


def test_a_function_that_cannot_be_pickled_is_one_line_naming_the_key():
    lock = threading.Lock()
    with pytest.raises(ConfigError) as info:
        _config(lambda path, providers: lock.locked())
    message = str(info.value)
    assert message.startswith(f"metric: '{__name__}:test_a_function_that_cannot_be_pickled")
    assert "<lambda>' cannot be sent to the trials (TypeError: " in message
    assert "cannot pickle '_thread.lock' object" in message and "\n" not in message
    with pytest.raises(ConfigError, match="^metric: .* cannot be sent to the trials"):
        SearchConfig.from_dict(
            {**BASE, "search_evaluator": lambda path, providers: lock.locked()},
            check_paths=False,
        )


def test_a_callable_object_holding_a_lock_and_a_wrong_signature_are_refused():
    class Scorer:
        def __init__(self):
            self.lock = threading.Lock()

        def __call__(self, model_path, providers):
            return 1.0

    with pytest.raises(ConfigError, match=r"^metric: '.*Scorer' cannot be sent .*_thread\.lock"):
        _config(Scorer())
    for wrong, accepts in ((lambda: 1.0, "()"), (lambda path: 1.0, "(path)")):
        with pytest.raises(ConfigError) as info:
            _config(wrong)
        assert str(info.value).endswith(
            "must accept (model_path, providers), or (onnx_path, **args) as Quark's "
            f"search_evaluator does; it accepts {accepts}"
        )
    with pytest.raises(ConfigError, match="^search_evaluator: a int object"):
        SearchConfig.from_dict({**BASE, "search_evaluator": 3}, check_paths=False)


def quark_evaluator(onnx_path, **args):
    """Quark's custom evaluator as its documentation writes it: the model's path alone."""
    return {"metric": mean_output(onnx_path, ["CPUExecutionProvider"])["metric"], "n": len(args)}


def test_quarks_one_argument_evaluator_is_called_with_the_path_alone(tmp_path, caplog):
    import logging

    path = tmp_path / "mlp.onnx"
    make_mlp_model(path)
    raw = {**BASE, "search_evaluator": quark_evaluator, "search_metric_tolerance": 0.01}
    with caplog.at_level(logging.INFO, logger="raysearch.config.dialects"):
        config = SearchConfig.from_dict(raw, check_paths=False)
    assert any("takes the model's path alone" in r.getMessage() for r in caplog.records)
    evaluator = pickle.loads(pickle.dumps(Evaluator.from_config(config)))  # as the trials get it
    assert evaluator.takes_providers is False
    score = evaluator.score_model(path, ["CPUExecutionProvider"])
    expected = mean_output(str(path), ["CPUExecutionProvider"])["metric"]
    assert score.metric == pytest.approx(expected)
    assert score.extra == {"n": 0.0}  # told nothing beyond the path


def test_the_written_config_names_the_function():
    from raysearch.config import written_config

    raw, objects = written_config(_config(mean_output).raw)
    assert raw["metric"] == f"<python function: {__name__}:mean_output>"
    assert objects == ["metric"]
    yaml.safe_dump(raw)


def test_the_evaluator_reaches_a_process_that_cannot_import_this_module(tmp_path):
    """Pickled as the trials get it: this module's code by value, so a process that imports
    ``tests.models`` but not this module (a Ray worker of the test session) runs it."""
    path = tmp_path / "mlp.onnx"
    make_mlp_model(path)
    evaluator = Evaluator.from_config(_config(mean_output, higher_is_better=True))
    assert evaluator.name == f"{__name__}:mean_output"
    data = pickle.dumps(evaluator)
    code = (
        "import pickle, sys; ev = pickle.loads(sys.stdin.buffer.read()); "
        f"print(ev.name, ev.score_model({str(path)!r}).metric)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=data,
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        timeout=60,
    ).stdout.decode()
    name, metric = out.split()
    assert name == f"{__name__}:mean_output"
    expected = mean_output(str(path), ["CPUExecutionProvider"])["metric"]
    assert float(metric) == pytest.approx(expected)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_search_scores_every_trial_with_the_function(tmp_path):
    from raysearch.cli import main
    from raysearch.search import AutoSearch

    path = tmp_path / "mlp.onnx"
    make_mlp_model(path)
    out = tmp_path / "out"
    config = {
        "model": str(path),
        "calibration_data": mlp_data(16),
        "search_space": SPACE,
        "search_algo": "Grid",
        "search_evaluator": mean_output,  # Quark's name
        "tolerance": 1.0,
        "keep_candidates": True,
        "measure_latency": False,
        # One trial actor: trials side by side are not this test's subject.
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(out),
    }
    result = AutoSearch(config).run()
    name = f"{__name__}:mean_output"
    assert result.summary["metric"] == name
    assert [r.status for r in result.records] == ["ok", "ok"]
    for record in result.records:
        expected = mean_output(str(out / record.model_file), ["CPUExecutionProvider"])
        assert record.metric == pytest.approx(expected["metric"])
        assert record.extra["pid"] != os.getpid()  # computed in a trial actor
    best = yaml.safe_load((out / "best" / "config.yaml").read_text())
    assert best["metric"] == f"<python function: {name}>"
    # The command line cannot import the function again: one line pointing to Python.
    assert main(["resume", str(out)]) == 2
    resumed = AutoSearch.resume(out, config=config)
    assert len(resumed.records) == 2
