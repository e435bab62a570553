"""The internals of Ray Tune, Optuna, ONNX Runtime, NNCF and NumPy that raysearch relies on,
checked on real objects, each failure naming the internal and the library's version.

pyproject.toml bounds these libraries below their next minor release; before raising a bound,
run this file on the new version: a failure says which internal changed and where raysearch
uses it. What each test checks is exactly what that code relies on:

- Ray Tune's ``AsyncHyperBandScheduler``: ``_trial_info`` (trial id -> bracket) and
  ``_brackets`` (``raysearch/search/tune/_rungs.py``: ``RungScheduler`` completes and removes trials
  Tune's class never saw, and seeds its rungs through Tune's methods with a stand-in trial
  that has only a ``trial_id`` and no controller; a near-tie reads the bracket's ``_rungs``
  and ``cutoff`` and takes its STOP back out of ``_num_stopped``);
- Ray Tune's ``Trial.run_metadata.metric_n_steps`` (``raysearch/search/tune/_compact.py``
  empties a finished trial's windows);
- Ray Tune's ``Trial.temporary_state.ray_actor``, set before callbacks hear
  ``on_trial_start``, and the ``Failure # n (occurred at ...)`` entries of a trial's error file
  (``raysearch/search/record/retries.py`` asks a trial's actor for its node;
  ``recorder.py`` reads a trial's last failure);
- Ray Tune's ``OptunaSearch._ot_study``, the Optuna study it asks (``raysearch/search/
  _samplers.py``: a trial queued with ``enqueue_trial`` is the next one suggested);
- private names: raysearch's subclasses of Tune's classes set no private name that Tune's
  class uses itself (a later Tune adding one would be overwritten silently);
- ONNX Runtime's quantization package: the keyword arguments raysearch gives its static
  quantizers, and every call into it with its positional parameters in raysearch's order
  (the calls are read from raysearch's source), the calibrators' ``infer_session`` and
  ``execution_providers``, ``HistogramCollector.histogram_dict`` and its layout;
  ``MatMulNBitsQuantizer``'s node quantizer, called through ``node_quantizer.quantize(node,
  graph_stack)``, and weights looked up innermost graph first (``raysearch/quantize/backends/
  weight_only/_external.py`` reads a weight of a model with external data into a graph of its
  own put innermost on that stack);
- NNCF: its telemetry stub, and ``nncf.onnx.engine.ONNXEngine`` as the engine its factory
  builds (``raysearch/quantize/nncf_runtime.py`` swaps it for one on the trial's
  providers);
- NumPy's ``numpy._core._multiarray_umath.__cpu_features__`` (``raysearch/cpu.py``);
- Ray's ``ray.experimental.internal_kv`` put, list by prefix and delete by prefix, with a
  namespace (``raysearch/search/runtime/_start_barrier.py``);
- Ray's ``prestart_worker_first_driver`` system setting: off, the search's own Ray starts no
  idle worker (``raysearch/search/runtime/cluster.py``);
- Ray Tune's callback usage tag: ``tune.run`` calls ``ray.air._internal.usage.tag_callbacks``,
  which counts callbacks as ``_count_callbacks`` does and records them with
  ``record_extra_usage_tag`` (``raysearch/search/tune/_usage_tag.py`` records the same tag
  without importing Ray's logger integrations).
"""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization.calibrate import (
    HistogramCollector,
    MinMaxCalibrater,
    PercentileCalibrater,
    TensorsData,
)
from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

from raysearch.quantize.backends.ort._backend import static_quantizer_arguments
from tests.models import make_mlp_model, mlp_data

ROOT = Path(__file__).resolve().parents[1]
ORT = f"ONNX Runtime {onnxruntime.__version__}"


def _version(distribution: str) -> str:
    return f"{distribution} {metadata.version(distribution)}"


def _changed(library: str, internal: str, where: str, detail: str) -> str:
    """The one message of a broken contract."""
    return (
        f"{library}: {internal} changed ({detail}); raysearch relies on it in {where}. Adapt "
        "raysearch to it before raising the library's upper bound in pyproject.toml."
    )


# -- Ray Tune: ASHA's bookkeeping --------------------------------------------------------------


@dataclass
class _Trial:
    """What ASHA reads of a trial (raysearch's stand-in in ``RungScheduler.seed`` is one)."""

    trial_id: str


def _scheduler() -> Any:
    from raysearch.evaluate.subsets import EvalRungs
    from raysearch.search.tune._rungs import RungScheduler

    rungs = EvalRungs((0.1, 0.33, 1.0), (40, 132, 400), np.arange(400), reduction_factor=3.0)
    return RungScheduler(rungs)


def test_asha_keeps_one_bracket_per_trial_in_trial_info():
    from ray.tune.schedulers import AsyncHyperBandScheduler

    ray = _version("ray")
    where = "raysearch/search/tune/_rungs.py (RungScheduler.on_trial_complete, on_trial_remove)"
    scheduler = _scheduler()
    brackets = getattr(scheduler, "_brackets", None)
    assert isinstance(brackets, list) and len(brackets) == 1, _changed(
        ray, "AsyncHyperBandScheduler._brackets", where, f"a list of one bracket; got {brackets!r}"
    )
    on_result = getattr(brackets[0], "on_result", None)
    params = list(inspect.signature(on_result).parameters) if callable(on_result) else None
    assert params == ["trial", "cur_iter", "cur_rew"], _changed(
        ray, "_Bracket.on_result", where, f"(trial, cur_iter, cur_rew); got {params}"
    )
    info = getattr(scheduler, "_trial_info", None)
    assert isinstance(info, dict) and not info, _changed(
        ray, "AsyncHyperBandScheduler._trial_info", where, f"an empty dict; got {info!r}"
    )
    # Added as raysearch's seed adds its stand-ins: Tune's method, no controller.
    AsyncHyperBandScheduler.on_trial_add(scheduler, None, _Trial("added"))
    assert scheduler._trial_info == {"added": brackets[0]}, _changed(
        ray,
        "AsyncHyperBandScheduler._trial_info",
        where,
        f"trial id -> its bracket after on_trial_add; got {scheduler._trial_info!r}",
    )
    AsyncHyperBandScheduler.on_trial_remove(scheduler, None, _Trial("added"))
    assert scheduler._trial_info == {}, _changed(
        ray, "AsyncHyperBandScheduler.on_trial_remove", where, "no longer drops _trial_info's entry"
    )


def test_asha_ranks_seeded_and_unseen_trials_through_those_internals():
    from ray.tune.schedulers import TrialScheduler

    from raysearch.search.tune._rungs import RUNG_CLOCK, RUNG_SCORE, rung_clock
    from raysearch.trialrecord import TrialRecord

    ray = _version("ray")
    scheduler = _scheduler()
    # Seeded from the journal: Tune's on_trial_add/on_trial_result/on_trial_remove on stand-ins.
    records = [
        TrialRecord(trial_id=f"old{i}", rung_scores=[0.9 + i / 100], rung_ended_at=[float(i)])
        for i in range(3)
    ]
    assert scheduler.seed(records) == 3
    assert scheduler._trial_info == {}, _changed(
        ray, "AsyncHyperBandScheduler._trial_info", "RungScheduler.seed", "stand-ins left behind"
    )
    # A trial completing that Tune's class never added (restored, or added before a restart).
    first = {RUNG_CLOCK: rung_clock(0, 3.0), RUNG_SCORE: 0.95}
    scheduler.on_trial_complete(None, _Trial("never-added"), first)
    scheduler.on_trial_remove(None, _Trial("never-added"))
    assert scheduler._trial_info == {}
    # The rung holds what was put in it: a poor trial is stopped there, a good one goes on.
    for trial_id, score, action in (("poor", 0.1, TrialScheduler.STOP), ("good", 0.99, "")):
        scheduler.on_trial_add(None, _Trial(trial_id))
        result = {RUNG_CLOCK: rung_clock(0, 3.0), RUNG_SCORE: score}
        got = scheduler.on_trial_result(None, _Trial(trial_id), result)
        assert got == (action or TrialScheduler.CONTINUE), _changed(
            ray,
            "AsyncHyperBandScheduler's rungs",
            "raysearch/search/tune/_rungs.py (RungScheduler.seed)",
            f"{trial_id} ({score}) at rung 0 after 4 scores of 0.90 to 0.95: expected "
            f"{action or 'CONTINUE'}, got {got}",
        )


def test_asha_bracket_rungs_cutoff_and_stop_count_are_what_a_near_tie_reads():
    from ray.tune.schedulers import TrialScheduler

    from raysearch.search.tune._rungs import RUNG_CLOCK, RUNG_ERROR, RUNG_SCORE, rung_clock

    ray = _version("ray")
    scheduler = _scheduler()
    where = "raysearch/search/tune/_rungs.py (RungScheduler.on_trial_result, _cutoff)"
    bracket = scheduler._brackets[0]
    milestones = [m for m, recorded in bracket._rungs if isinstance(recorded, dict)]
    assert milestones == sorted(milestones, reverse=True) and len(milestones) >= 2, _changed(
        ray, "_Bracket._rungs", where, f"(milestone, dict) pairs, largest first; got {milestones}"
    )
    for i, score in enumerate((0.9, 0.8, 0.7)):
        scheduler.on_trial_add(None, _Trial(f"t{i}"))
        result = {RUNG_CLOCK: rung_clock(0, 3.0), RUNG_SCORE: score, RUNG_ERROR: None}
        scheduler.on_trial_result(None, _Trial(f"t{i}"), result)
    cutoff = bracket.cutoff(bracket._rungs[-1][1])
    before = scheduler._num_stopped
    scheduler.on_trial_add(None, _Trial("poor"))
    poor = {RUNG_CLOCK: rung_clock(0, 3.0), RUNG_SCORE: 0.1, RUNG_ERROR: None}
    assert scheduler.on_trial_result(None, _Trial("poor"), poor) == TrialScheduler.STOP
    assert isinstance(cutoff, float) and 0.7 < cutoff < 0.9, _changed(
        ray, "_Bracket.cutoff", where, f"a percentile of the rung's scores; got {cutoff!r}"
    )
    assert scheduler._num_stopped == before + 1, _changed(
        ray, "AsyncHyperBandScheduler._num_stopped", where, "no longer counts a STOP"
    )


# -- Ray Tune: a trial's run metadata ------------------------------------------------------------


def test_a_trials_last_n_windows_are_what_the_compactor_empties():
    """``FinishedTrialCompactor`` (``raysearch/search/tune/_compact.py``) assigns ``{}`` to a
    finished trial's ``run_metadata.metric_n_steps``: the windows must live there (one per
    number reported), the assignment must drop the cached JSON Tune's experiment checkpoint
    writes, and the analysis must stay."""
    from ray.tune.experiment import Trial

    ray, where = _version("ray"), "raysearch/search/tune/_compact.py"
    trial = Trial("__fake", stub=True)
    trial.update_last_result({"metric": 0.5, "training_iteration": 1})
    metadata = trial.run_metadata
    windows = getattr(metadata, "metric_n_steps", None)
    assert isinstance(windows, dict) and "metric" in windows, _changed(
        ray, "_TrainingRunMetadata.metric_n_steps", where, "no per-metric windows"
    )
    before = metadata.get_json_state()
    trial.run_metadata.metric_n_steps = {}
    after = json.loads(metadata.get_json_state())
    assert after["metric_n_steps"] == {} and len(metadata.get_json_state()) < len(before), _changed(
        ray, "_TrainingRunMetadata's cached JSON", where, "kept after an assignment"
    )
    assert after["metric_analysis"]["metric"]["last"] == 0.5


def test_a_started_trials_actor_and_its_failures_are_where_the_recorder_reads_them():
    """``RetryLog.started`` reads ``trial.temporary_state.ray_actor`` in ``on_trial_start``
    (the actor must be set before the callbacks run); the recorder splits a trial's error
    file on Tune's ``Failure # n (occurred at ...)`` headers."""
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    ray, where = _version("ray"), "raysearch/search/record/retries.py"

    class _Actor:
        class get_auto_filled_metrics:  # noqa: N801 - Ray's method name
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> None:
                return None

    trial = Trial("__fake", stub=True)
    actor = _Actor()
    trial.set_ray_actor(actor)
    assert getattr(trial.temporary_state, "ray_actor", None) is actor, _changed(
        ray, "Trial.temporary_state.ray_actor", where, "not where set_ray_actor puts the actor"
    )
    started = inspect.getsource(TuneController._actor_started)
    assert 0 <= started.find("set_ray_actor") < started.find("on_trial_start"), _changed(
        ray, "TuneController._actor_started", where, "callbacks hear of a trial before its actor"
    )
    assert '"Failure # {} (occurred at {})' in inspect.getsource(Trial.handle_error), _changed(
        ray, "Trial.handle_error's error file", "raysearch/search/record/recorder.py", "format"
    )


# -- Ray Tune: OptunaSearch's study ------------------------------------------------------------


def test_optuna_search_asks_the_study_raysearch_queues_trials_in():
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    from raysearch.space import SearchSpace
    from raysearch.strategies.samplers import OptunaPhase, quiet_optuna

    where = "raysearch/strategies/samplers.py (OptunaPhase._queue_unseen)"
    library = f"{_version('ray')} with {_version('optuna')}"
    space = SearchSpace.parse({"calibrate_method": ["MinMax", "Entropy"], "per_channel": [True]})
    with quiet_optuna():
        phase = OptunaPhase(space, 0, "TPE", 0, "max", None, None)
        assert isinstance(phase.optuna, OptunaSearch)
        study = getattr(phase.optuna, "_ot_study", None)
        assert isinstance(study, optuna.Study), _changed(
            library,
            "OptunaSearch._ot_study",
            where,
            f"an optuna.Study made by __init__ for a define-by-run space; got {study!r}",
        )
        phase._queue_unseen()  # raysearch's own use: study.enqueue_trial
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        assert len(waiting) == 1, _changed(library, "Study.enqueue_trial", where, "no trial waits")
        point = phase.optuna.suggest("t0")
    assert phase._labels(point) == waiting[0].params, _changed(
        library,
        "OptunaSearch._ot_study",
        where,
        f"the queued trial {waiting[0].params} is not the one suggested next ({point})",
    )


# -- Ray Tune: private names of the classes raysearch subclasses --------------------------------


def _self_attributes(tree: ast.AST) -> set[str]:
    """Private names (``_x``, not dunders) a class body reads or sets on ``self``, and its
    private methods; docstrings are not code."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "self":
                names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _library_private_names(base: type) -> set[str]:
    names: set[str] = set()
    for cls in base.__mro__:
        if cls is object:
            continue
        names |= {n for n in vars(cls) if n.startswith("_") and not n.startswith("__")}
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        names |= _self_attributes(ast.parse(inspect.cleandoc("\n" + source)))
    return names


def _class_tree(path: Path, name: str) -> ast.ClassDef:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"no class {name} in {path}")


def _tune_subclasses() -> Iterator[tuple[str, str, type, set[str]]]:
    """(module, class, Tune's base, the base's internals raysearch uses on purpose)."""
    from ray import tune
    from ray.tune.schedulers import AsyncHyperBandScheduler
    from ray.tune.search import Searcher
    from ray.tune.stopper import Stopper

    yield "search/tune/trainable.py", "QuantTrainable", tune.Trainable, set()
    yield (
        "search/tune/_rungs.py",
        "RungScheduler",
        AsyncHyperBandScheduler,
        {"_brackets", "_trial_info", "_num_stopped"},
    )
    yield "search/tune/searchers.py", "SettingSearcher", Searcher, set()
    yield "search/tune/progress.py", "ProgressCallback", tune.Callback, set()
    yield "search/record/recorder.py", "TrialRecorder", tune.Callback, set()
    yield "search/tune/session.py", "SessionCallback", tune.Callback, set()
    yield "search/tune/session.py", "SessionStopper", Stopper, set()
    yield "search/tune/stopper.py", "CandidateStopper", Stopper, set()
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.air.integrations.wandb import WandbLoggerCallback

    yield "search/tune/_ray_loggers.py", "MLflowTrialLogger", MLflowLoggerCallback, {"_trial_runs"}
    yield (
        "search/tune/_ray_loggers.py",
        "WandbTrialLogger",
        WandbLoggerCallback,
        {"_exclude_results", "_start_logging_actor", "_logger_actor_cls"},
    )


def test_raysearchs_tune_subclasses_set_no_private_name_tune_uses():
    ray = _version("ray")
    for module, name, base, on_purpose in _tune_subclasses():
        ours = _self_attributes(_class_tree(ROOT / "raysearch" / module, name))
        shared = (ours & _library_private_names(base)) - on_purpose
        assert not shared, _changed(
            ray,
            f"{base.__name__}'s private names",
            f"raysearch/{module} ({name})",
            f"{sorted(shared)} now Tune's too: rename raysearch's",
        )


def test_rays_logger_callbacks_have_the_internals_raysearchs_loggers_call():
    """``raysearch/search/tune/_ray_loggers.py``: W&B's ``_start_logging_actor(trial,
    exclude_results, **wandb_init_kwargs)``, which makes its actor of ``_logger_actor_cls``
    (``_WandbLoggingActor``, whose ``run`` raysearch's actor extends), and
    ``_exclude_results``; MLflow's
    ``_trial_runs`` (trial -> run id, made in ``setup``) and ``mlflow_util``."""
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.air.integrations.wandb import WandbLoggerCallback

    ray = _version("ray")
    start = inspect.signature(WandbLoggerCallback._start_logging_actor)
    kinds = [(p.name, p.kind) for p in start.parameters.values()]
    assert kinds == [
        ("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("trial", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("exclude_results", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("wandb_init_kwargs", inspect.Parameter.VAR_KEYWORD),
    ], _changed(ray, "WandbLoggerCallback._start_logging_actor", "_ray_loggers.py", str(kinds))
    from ray.air.integrations.wandb import _WandbLoggingActor

    assert WandbLoggerCallback._logger_actor_cls is _WandbLoggingActor, _changed(
        ray, "WandbLoggerCallback._logger_actor_cls", "_ray_loggers.py", "another class"
    )
    assert "self._logger_actor_cls" in inspect.getsource(
        WandbLoggerCallback._start_logging_actor
    ), _changed(ray, "WandbLoggerCallback._logger_actor_cls", "_ray_loggers.py", "not used")
    assert callable(_WandbLoggingActor.run), _changed(
        ray, "_WandbLoggingActor.run", "_ray_loggers.py", "gone"
    )
    assert "done" in WandbLoggerCallback._exclude_results, _changed(
        ray, "WandbLoggerCallback._exclude_results", "_ray_loggers.py", "gone"
    )
    mlflow = MLflowLoggerCallback(tracking_uri="sqlite:///:memory:")
    assert hasattr(mlflow, "mlflow_util"), _changed(
        ray, "MLflowLoggerCallback.mlflow_util", "_ray_loggers.py", "gone"
    )
    setup = inspect.getsource(MLflowLoggerCallback.setup)
    assert "self._trial_runs = {}" in setup, _changed(
        ray, "MLflowLoggerCallback._trial_runs", "_ray_loggers.py", "no longer made in setup"
    )


# -- ONNX Runtime: the static quantizers ---------------------------------------------------------


def _minmax_ranges(model: onnx.ModelProto) -> TensorsData:
    """A range for every float tensor of ``model`` (what calibration would hand over)."""
    names = {i.name for i in model.graph.input} | {o for n in model.graph.node for o in n.output}
    low, high = np.float32(-4.0), np.float32(4.0)
    return TensorsData(CalibrationMethod.MinMax, {name: (low, high) for name in names})


@pytest.mark.parametrize(
    "quant_format, quantizer_class",
    [(QuantFormat.QDQ, QDQQuantizer), (QuantFormat.QOperator, ONNXQuantizer)],
    ids=["QDQQuantizer", "ONNXQuantizer"],
)
def test_onnx_runtime_static_quantizers_take_raysearchs_arguments(
    tmp_path: Path, quant_format: QuantFormat, quantizer_class: type
):
    """raysearch/quantize/backends/ort/_backend.py passes these by keyword: each name must be one
    of the quantizer's parameters, every parameter without a default must be given, and the values
    must land where meant (int8 weights, uint8 activations in the model written)."""
    model = load_model_with_shape_infer(make_mlp_model(tmp_path / "mlp.onnx"))
    settings = {"per_channel": False, "op_types_to_quantize": ["MatMul"], "extra_options": {}}
    types = (QuantType.QInt8, QuantType.QUInt8)
    arguments = static_quantizer_arguments(
        quant_format, model, settings, types, _minmax_ranges(model)
    )
    signature = inspect.signature(quantizer_class)
    where = "raysearch/quantize/backends/ort/_backend.py (static_quantizer_arguments)"
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        pytest.fail(
            _changed(ORT, f"{quantizer_class.__name__}{signature}", where, f"{exc}"),
            pytrace=False,
        )
    quantizer = quantizer_class(**arguments)
    quantizer.quantize_model()
    save = quantizer.model.save_model_to_file
    assert "use_external_data_format" in inspect.signature(save).parameters, _changed(
        ORT, f"ONNXModel.save_model_to_file{inspect.signature(save)}", "OrtBackend.quantize", ""
    )
    out = tmp_path / "quantized.onnx"
    save(str(out), use_external_data_format=False)
    written = onnx.load(str(out))
    initializers = {i.name: i.data_type for i in written.graph.initializer}
    quantize = [n for n in written.graph.node if n.op_type == "QuantizeLinear"]
    zero_points = {initializers[n.input[2]] for n in quantize if len(n.input) > 2}
    assert zero_points == {onnx.TensorProto.UINT8}, _changed(
        ORT, f"{quantizer_class.__name__}'s activation_qType", where, f"zero points {zero_points}"
    )
    assert onnx.TensorProto.INT8 in initializers.values(), _changed(
        ORT, f"{quantizer_class.__name__}'s weight_qType", where, "no int8 weight"
    )


# -- ONNX Runtime: every call raysearch makes into onnxruntime.quantization ------------------

#: ONNX Runtime's parameters raysearch passes by position, in order, per function it calls with
#: two or more positional arguments. A call whose function is missing here fails the test: add
#: it after checking the order.
POSITIONAL_ORDER: dict[str, tuple[str, ...]] = {
    "calibrate.MinMaxCalibrater": ("model_path", "op_types_to_calibrate", "augmented_model_path"),
    "calibrate.PercentileCalibrater": (
        "model_path",
        "op_types_to_calibrate",
        "augmented_model_path",
    ),
    "calibrate.TensorsData": ("calibration_method", "data"),
    "calibrate.save_tensors_data": ("tensors_data", "path"),
    "quantize.check_static_quant_arguments": ("quant_format", "activation_type", "weight_type"),
    "quantize.quantize_dynamic": ("model_input", "model_output"),
    "quant_utils.update_opset_version": ("model", "weight_type", "activation_type"),
    "qdq_loss_debug.modify_model_output_intermediate_tensors": (
        "input_model_path",
        "output_model_path",
    ),
    "qdq_loss_debug.create_activation_matching": ("qdq_activations", "float_activations"),
    "qdq_loss_debug.create_weight_matching": ("float_model_path", "qdq_model_path"),
    "qdq_loss_debug.compute_weight_error": ("weights_match", "err_func"),
    "qdq_loss_debug.compute_signal_to_quantization_noice_ratio": ("x", "y"),
    "mixed_precision_overrides_utils.MixedPrecisionTensorQuantOverridesFixer.create_from_model": (
        "overrides",
        "model",
        "default_activation_qtype",
    ),
}
_PACKAGE = "onnxruntime.quantization"


@dataclass(frozen=True)
class _Call:
    where: str
    key: str  # module tail and qualified name: "calibrate.MinMaxCalibrater"
    target: Callable[..., Any]
    positional: int
    keywords: tuple[str, ...]
    open_ended: bool  # *args or **kwargs: only the named part can be checked


def _imported(tree: ast.AST) -> dict[str, Any]:
    """Local name -> the object it names, for every ``from onnxruntime.quantization... import``
    of a module (function-level imports included)."""
    bound: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_PACKAGE):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:  # a submodule: ``from onnxruntime.quantization import x``
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = value
    return bound


def _resolve(func: ast.expr, bound: dict[str, Any]) -> Any:
    chain: list[str] = []
    while isinstance(func, ast.Attribute):
        chain.insert(0, func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in bound:
        return None
    value = bound[func.id]
    for attr in chain:
        value = getattr(value, attr, None)
    return value


def _key(target: Any) -> str:
    module = getattr(target, "__module__", "") or ""
    return f"{module.rsplit('.', 1)[-1]}.{target.__qualname__}"


def _library_calls() -> list[_Call]:
    calls = []
    for path in sorted((ROOT / "raysearch").rglob("*.py")):
        tree = ast.parse(path.read_text())
        bound = _imported(tree)
        if not bound:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            target = _resolve(node.func, bound)
            if not callable(target) or isinstance(target, ModuleType):
                continue
            if inspect.isclass(target) and issubclass(target, enum.Enum):
                continue  # an enum's value lookup
            calls.append(
                _Call(
                    where=f"{path.relative_to(ROOT)}:{node.lineno}",
                    key=_key(target),
                    target=target,
                    positional=sum(not isinstance(a, ast.Starred) for a in node.args),
                    keywords=tuple(k.arg for k in node.keywords if k.arg is not None),
                    open_ended=any(isinstance(a, ast.Starred) for a in node.args)
                    or any(k.arg is None for k in node.keywords),
                )
            )
    return calls


def test_every_call_into_onnx_runtime_quantization_matches_its_signature():
    calls = _library_calls()
    found = {call.key for call in calls}
    # The scan sees raysearch's calls (a refactor must not leave this test checking nothing).
    assert {"calibrate.MinMaxCalibrater", "quantize.check_static_quant_arguments"} <= found
    failures = []
    for call in calls:
        signature = inspect.signature(call.target)
        names = list(signature.parameters)
        dummies = [object()] * call.positional
        try:
            if call.open_ended:
                signature.bind_partial(*dummies, **dict.fromkeys(call.keywords))
            else:
                signature.bind(*dummies, **dict.fromkeys(call.keywords))
        except TypeError as exc:
            failures.append(f"{call.where}: {call.key}{signature}: {exc}")
            continue
        if call.positional >= 2:
            expected = POSITIONAL_ORDER.get(call.key)
            if expected is None:
                failures.append(f"{call.where}: {call.key}: add its positional order to the test")
            elif tuple(names[: call.positional]) != expected[: call.positional]:
                failures.append(
                    f"{call.where}: {call.key}{signature}: raysearch passes "
                    f"{expected[: call.positional]} by position"
                )
    assert not failures, _changed(
        ORT, "the signatures raysearch calls", "the places listed", "\n  " + "\n  ".join(failures)
    )


def test_the_mixed_precision_fixer_applies_with_raysearchs_positional_order():
    """``fixer.apply(default, symmetric)``
    (raysearch/quantize/techniques/mixed_precision/_mixed_precision.py) is a call on
    an instance, which the scan above cannot resolve."""
    from onnxruntime.quantization.execution_providers.qnn.mixed_precision_overrides_utils import (
        MixedPrecisionTensorQuantOverridesFixer as Fixer,
    )

    names = list(inspect.signature(Fixer.apply).parameters)
    assert names == ["self", "default_activation_qtype", "default_activation_symmetric"], _changed(
        ORT,
        f"MixedPrecisionTensorQuantOverridesFixer.apply{inspect.signature(Fixer.apply)}",
        "raysearch/quantize/techniques/mixed_precision/_mixed_precision.py (_fixed_overrides)",
        "raysearch passes (default activation type, symmetric) by position",
    )


# -- ONNX Runtime: calibrators and the histogram collector --------------------------------------


@pytest.mark.parametrize("calibrator_class", [MinMaxCalibrater, PercentileCalibrater])
def test_calibrators_read_the_session_raysearch_gives_them(tmp_path: Path, calibrator_class: type):
    """raysearch/quantize/calibration/_calibrator.py builds the session itself and sets
    ``infer_session`` and ``execution_providers`` on the calibrator: both must be the
    calibrator's own."""
    model = make_mlp_model(tmp_path / "mlp.onnx")
    calibrator = calibrator_class(
        model, ["MatMul"], str(tmp_path / "augmented.onnx"), use_external_data_format=False
    )
    missing = {"infer_session", "execution_providers"} - set(vars(calibrator))
    assert not missing, _changed(
        ORT,
        f"{calibrator_class.__name__}'s {sorted(missing)}",
        "raysearch/quantize/calibration/_calibrator.py (Calibrators.open)",
        f"attributes now {sorted(vars(calibrator))}",
    )
    assert callable(getattr(calibrator, "augment_graph", None))


@pytest.mark.parametrize(
    "method, symmetric, layout",
    [("percentile", True, 4), ("percentile", False, 5), ("entropy", False, 5)],
)
def test_histogram_collector_reads_the_histograms_raysearch_sets(
    method: str, symmetric: bool, layout: int
):
    """raysearch/quantize/calibration/_histogram.py bins values itself, in
    ``HistogramCollector``'s layout (hist, edges, min, max[, threshold]), sets
    ``histogram_dict`` and asks for the ranges."""
    where = "raysearch/quantize/calibration/_histogram.py (compute_ranges, _finish)"
    options = {
        "method": method,
        "symmetric": symmetric,
        "num_bins": 128,
        "num_quantized_bins": 128,
        "percentile": 99.9,
        "scenario": "same",
    }
    collected = HistogramCollector(**options)
    collected.collect({"x": mlp_data(64)["x"]})
    histograms = getattr(collected, "histogram_dict", None)
    shapes = {k: len(v) for k, v in (histograms or {}).items()}
    assert shapes == {"x": layout}, _changed(
        ORT, "HistogramCollector.histogram_dict", where, f"{{'x': {layout}}}; got {shapes}"
    )
    given = HistogramCollector(**options)
    given.histogram_dict = histograms
    # As raysearch hands the result on: ONNX Runtime's TensorsData of the method.
    kind = CalibrationMethod[method.capitalize()]
    got = TensorsData(kind, given.compute_collection_result())
    expected = TensorsData(kind, collected.compute_collection_result())
    assert np.allclose(got["x"].range_value, expected["x"].range_value), _changed(
        ORT, "HistogramCollector.histogram_dict", where, "not what compute_collection_result reads"
    )


# -- NNCF -----------------------------------------------------------------------------------------


def test_nncf_telemetry_stub_and_onnx_engine(tmp_path: Path):
    pytest.importorskip("nncf")
    from raysearch.quantize.nncf_runtime import import_nncf, nncf_session

    nncf = f"NNCF {import_nncf().__version__}"
    from nncf.common.factory import EngineFactory
    from nncf.onnx import engine as engine_module
    from nncf.telemetry import decorator, wrapper

    where = "raysearch/quantize/nncf_runtime.py"
    stub = getattr(wrapper, "NNCFTelemetryStub", None)
    assert stub is not None and isinstance(wrapper.telemetry, stub), _changed(
        nncf, "nncf.telemetry.wrapper.NNCFTelemetryStub", where, "telemetry is not the stub"
    )
    assert hasattr(decorator, "telemetry"), _changed(
        nncf, "nncf.telemetry.decorator.telemetry", where, "gone"
    )
    model = onnx.load(str(make_mlp_model(tmp_path / "mlp.onnx")))
    base = engine_module.ONNXEngine(model)
    assert set(vars(base)) == {"sess", "input_names"}, _changed(
        nncf,
        "ONNXEngine's attributes",
        f"{where} (TrialSessionEngine sets sess and input_names)",
        f"now {sorted(vars(base))}",
    )
    feed = mlp_data(4)
    with nncf_session(["CPUExecutionProvider"], threads=1) as timing:
        engine = EngineFactory.create(model)
        outputs = engine.infer(feed)
    assert type(engine) is not engine_module.ONNXEngine and timing.sessions == 1, _changed(
        nncf,
        "EngineFactory.create",
        f"{where} (nncf_session)",
        "no longer builds nncf.onnx.engine.ONNXEngine as looked up at each call",
    )
    assert set(outputs) == {"y"} and timing.inferences == 1


# -- NumPy ----------------------------------------------------------------------------------------


def test_numpy_cpu_features():
    where = "raysearch/cpu.py (cpu_flags)"
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError as exc:
        pytest.fail(
            _changed(f"NumPy {np.__version__}", "numpy._core._multiarray_umath", where, f"{exc}")
        )
    assert isinstance(__cpu_features__, dict) and __cpu_features__, _changed(
        f"NumPy {np.__version__}", "__cpu_features__", where, "not a dict of CPU features"
    )
    assert all(isinstance(v, bool) for v in __cpu_features__.values())


def test_rays_package_walk_is_what_the_shipping_size_check_calls(tmp_path: Path):
    """raysearch.usercode.shipped_bytes counts a code folder with the walk Ray zips it with
    (``packaging._dir_travel`` over ``_get_excludes``), so that the size check and Ray's
    upload agree on what a ``.gitignore`` or ``excludes`` leaves out."""
    import inspect

    from ray._private.runtime_env import packaging

    params = list(inspect.signature(packaging._dir_travel).parameters)
    assert params[:3] == ["path", "excludes", "handler"], params
    assert "include_gitignore" in params and "logger" in params, params
    assert list(inspect.signature(packaging._get_excludes).parameters) == ["path", "excludes"]
    (tmp_path / "kept.py").write_text("x = 1\n")
    (tmp_path / "model.onnx").write_bytes(b"\0" * 100)
    seen: list[str] = []
    packaging._dir_travel(
        tmp_path,
        [packaging._get_excludes(tmp_path, ["/model.onnx"])],
        lambda p: seen.append(p.name) if p.is_file() else None,
        include_gitignore=True,
    )
    assert seen == ["kept.py"]


def test_rays_key_value_store_takes_the_start_barriers_calls(ray_cluster):
    """raysearch/search/runtime/_start_barrier.py keeps a search's start barrier in the
    cluster's key-value store through ``ray.experimental.internal_kv``: put with a namespace,
    list the keys under a prefix, delete by prefix. Called here with those keywords on the
    suite's Ray (the barrier's own tests run them too)."""
    import ray
    from ray.experimental import internal_kv

    library = f"Ray {ray.__version__}"
    where = "raysearch/search/runtime/_start_barrier.py"
    for name, keywords in (
        ("_internal_kv_put", {"namespace"}),
        ("_internal_kv_list", {"namespace"}),
        ("_internal_kv_del", {"namespace", "del_by_prefix"}),
    ):
        function = getattr(internal_kv, name, None)
        assert function is not None, _changed(library, f"internal_kv.{name}", where, "gone")
        params = set(inspect.signature(function).parameters)
        assert keywords <= params, _changed(
            library, f"internal_kv.{name}", where, f"no {sorted(keywords - params)}"
        )
    prefix, namespace = "raysearch-contract/", "raysearch-contract"
    internal_kv._internal_kv_put(prefix + "a", b"", namespace=namespace)
    internal_kv._internal_kv_put(prefix + "b", b"", namespace=namespace)
    listed = sorted(internal_kv._internal_kv_list(prefix, namespace=namespace))
    assert listed == [b"raysearch-contract/a", b"raysearch-contract/b"], _changed(
        library, "internal_kv._internal_kv_list", where, f"listed {listed}"
    )
    internal_kv._internal_kv_del(prefix, del_by_prefix=True, namespace=namespace)
    assert internal_kv._internal_kv_list(prefix, namespace=namespace) == []


def test_matmul_nbits_quantizer_calls_its_node_quantizer_with_the_graph_stack():
    """``weights_on_demand`` replaces ``MatMulNBitsQuantizer.node_quantizer.quantize`` on the
    instance and puts a graph holding the node's weight innermost on ``graph_stack``: the
    quantizer must call its node quantizer through that attribute, and its node quantizers look
    weights up innermost first, adding the quantized ones to the graph the weight is in."""
    from onnx import helper, numpy_helper

    from raysearch.quantize.backends.weight_only import import_quantizer

    mnq = import_quantizer()
    library = f"ONNX Runtime {onnxruntime.__version__}"
    where = "raysearch/quantize/backends/weight_only/_external.py"
    process = inspect.getsource(mnq.MatMulNBitsQuantizer._process_subgraph)
    assert "self.node_quantizer.quantize(node, graph_stack)" in process, _changed(
        library, "MatMulNBitsQuantizer._process_subgraph", where, "no node_quantizer.quantize call"
    )
    outer = helper.make_graph([], "outer", [], [], [numpy_helper.from_array(np.ones(1), "w")])
    inner = helper.make_graph([], "inner", [], [], [numpy_helper.from_array(np.zeros(1), "w")])
    assert mnq.get_initializer("w", [outer, inner])[1] is inner, _changed(
        library, "matmul_nbits_quantizer.get_initializer", where, "not innermost first"
    )
    for method in (
        mnq.DefaultWeightOnlyQuantizer.quantize_matmul,
        mnq.DefaultWeightOnlyQuantizer.quantize_gather,
        mnq.HQQWeightOnlyQuantizer.quantize,
    ):
        assert "get_initializer(" in inspect.getsource(method), _changed(
            library, method.__qualname__, where, "reads its weight without get_initializer"
        )


#: Run in a child process (the suite's process has a Ray already): start the search's own Ray
#: as ``raysearch run`` does and print the Python worker processes under this process (the
#: raylet is its child; every worker, idle or not, is the raylet's).
_OWN_RAY_WORKERS = """
import json, psutil
from raysearch.search.runtime.cluster import shutdown_ray, start_ray

start_ray(None)  # returns once the raylet has registered the driver
workers = []
for process in psutil.Process().children(recursive=True):
    try:
        title = (process.cmdline() or [""])[0]
    except psutil.Error:  # ended meanwhile
        continue
    agent = title.startswith("ray::") and title.endswith("Agent")
    if (title.startswith("ray::") and not agent) or "default_worker.py" in title:
        workers.append(title)
print(json.dumps(workers))
shutdown_ray()
"""


def test_the_searchs_own_ray_prestarts_no_idle_worker():
    """raysearch/search/runtime/cluster.py starts its own Ray with
    ``prestart_worker_first_driver`` off: Ray's prestarted workers have no ``runtime_env`` and
    Tune's trial actors all have one, so none would ever run a trial. With the setting honoured
    no Python worker runs before the first task; where it is not, Ray has forked one per CPU by
    the time the driver is registered (the raylet starts them as it registers it)."""
    import subprocess
    import sys

    import ray

    from raysearch.search.runtime.cluster import OWN_RAY_SYSTEM_CONFIG

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", _OWN_RAY_WORKERS],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    where = "raysearch/search/runtime/cluster.py (OWN_RAY_SYSTEM_CONFIG)"
    assert proc.returncode == 0, _changed(
        f"Ray {ray.__version__}",
        f"_system_config {OWN_RAY_SYSTEM_CONFIG}",
        where,
        proc.stderr[-2000:],
    )
    workers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert workers == [], _changed(
        f"Ray {ray.__version__}", "prestart_worker_first_driver", where, f"workers {workers}"
    )


def test_tunes_callback_tag_is_recorded_alike_without_the_logger_integrations():
    """raysearch/search/tune/_usage_tag.py replaces ``usage.tag_callbacks``, the function
    ``tune.run`` calls, within a search's run: for raysearch's callbacks it records the tag
    Ray's own counting gives them, and Ray's function is back after the block."""
    import ray
    import ray.tune.tune
    from ray.air._internal import usage

    from raysearch.search.tune._compact import FinishedTrialCompactor
    from raysearch.search.tune._loggers import TrialLoggers
    from raysearch.search.tune._usage_tag import own_callback_counts, own_callbacks_tagged
    from raysearch.search.tune.session import SessionCallback

    library, where = f"Ray {ray.__version__}", "raysearch/search/tune/_usage_tag.py"
    assert ray.tune.tune.air_usage is usage, _changed(
        library, "ray.tune.tune.air_usage", where, "not ray.air._internal.usage"
    )
    assert "air_usage.tag_callbacks(callbacks)" in inspect.getsource(ray.tune.tune.run), _changed(
        library, "tune.run", where, "no longer calls air_usage.tag_callbacks(callbacks)"
    )
    source = inspect.getsource(usage.tag_callbacks)
    assert "_count_callbacks(callbacks)" in source, _changed(
        library, "usage.tag_callbacks", where, "does not count with _count_callbacks"
    )
    assert "record_extra_usage_tag(TagKey.AIR_CALLBACKS" in source, _changed(
        library, "usage.tag_callbacks", where, "records another tag"
    )
    callbacks = [SessionCallback("k"), TrialLoggers("k"), FinishedTrialCompactor()]
    assert own_callback_counts(callbacks) == dict(usage._count_callbacks(callbacks)), _changed(
        library, "usage._count_callbacks", where, "counts raysearch's callbacks otherwise"
    )
    before = usage.tag_callbacks
    with own_callbacks_tagged():
        assert usage.tag_callbacks is not before
    assert usage.tag_callbacks is before


#: Run in a child process (the suite's process has imported MLflow already): a search's run,
#: then whether the driver imported MLflow or wandb (neither is configured).
_SEARCH_IMPORTS = """
import json, sys
from raysearch.config import load_config
from raysearch.search import AutoSearch

result = AutoSearch(load_config(sys.argv[1])).run()
print(json.dumps([result.summary["n_trials"], "mlflow" in sys.modules, "wandb" in sys.modules]))
"""


def test_a_search_without_loggers_imports_neither_mlflow_nor_wandb(tmp_path):
    """Ray Tune's callback tag imports both (1.1-1.4 s of CPU in each driver) where raysearch
    does not record it itself (raysearch/search/tune/_usage_tag.py)."""
    import subprocess
    import sys

    import yaml

    make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "mlp.npz", **mlp_data(16))
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": str(tmp_path / "mlp.onnx"),
                "calibration_data": str(tmp_path / "mlp.npz"),
                "search_algo": "Grid",
                "search_space": {"per_channel": [False]},
                "metric": "cos",
                "measure_latency": False,
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-c", _SEARCH_IMPORTS, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [1, False, False]
