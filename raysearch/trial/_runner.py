"""One trial, end to end, without Ray: quantize, evaluate, decide.

A :class:`TrialRunner` is built once per process (a Ray actor reuses it for many trials) and
keeps the quantizer backends, the calibration cache and the float reference between trials.
:meth:`TrialRunner.start` quantizes once and hands back a
:class:`~raysearch.trial._staged.StagedTrial` evaluated rung by rung; :meth:`TrialRunner.run`
evaluates every row at once. Neither raises for a bad setting: it becomes a ``failed``
:class:`~raysearch.trialrecord.TrialRecord` with a one-line error.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysearch.evaluate import (
    Evaluator,
    FloatReference,
    measure_decoder_latency,
    measure_latency,
    run_model,
)
from raysearch.modelfile import model_size_bytes
from raysearch.modelgraph import quantized_share, weighted_nodes
from raysearch.providers import (
    device_label,
    execution_providers,
    make_session,
    provider_names,
    session_providers,
)
from raysearch.quantize.pipeline import Plan, TechniquePipeline, unknown_settings
from raysearch.quantize.registry import DEFAULT_BACKEND, backend_reject, get_backend
from raysearch.quantize.technique import TechniqueContext, quantize_and_score
from raysearch.trial._staged import StagedTrial, guard
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.evaluate.subsets import EvalRungs
    from raysearch.quantize.calibration import CalibrationCache
    from raysearch.quantize.registry import QuantizeInfo, QuantizerBackend

__all__ = ["TrialSpec", "TrialDevice", "FloatBaseline", "TrialRunner"]

#: ``pool(runner, float_path, settings_list) -> scores`` (:attr:`TrialRunner.score_pool`).
ScorePoolFn = Callable[["TrialRunner", str, Sequence[Mapping[str, Any]]], list["float | None"]]

_logger = logging.getLogger(__name__)


def _same_kind(device: str, other: str) -> bool:
    """Whether two device labels (``"cpu"``, ``"cuda:1"``) name the same kind of device."""
    return device.split(":")[0] == other.split(":")[0]


@dataclass(frozen=True)
class TrialDevice:
    """Where a trial runs: ``threads``, ``gpu_id`` (None: CPU) with ``gpu_mem_limit``, or
    ``providers``.
    """

    threads: int = 1
    gpu_id: int | None = None
    gpu_mem_limit: int | None = None
    providers: Sequence[Any] | None = None


@dataclass(frozen=True)
class FloatBaseline:
    """The float model's known reference or score and its device kind (another kind's is
    computed again, so both models run on the same kernels).
    """

    reference: FloatReference | None = None
    score: float | None = None
    score_device: str = "cpu"
    #: Where a reference still being computed comes from (called at the first evaluation).
    reference_source: Callable[[], FloatReference] | None = None


@dataclass(frozen=True)
class TrialSpec:
    """Everything a :class:`TrialRunner` needs; ``cache``: a calibration cache shared with
    the caller instead of one in ``cache_dir``; ``rungs`` None: every row at once.

    Example:
        >>> spec = TrialSpec("model.onnx", None, None, Evaluator("cos", 0.999),
        ...                  device=TrialDevice(threads=2))
        >>> spec.device.threads, spec.baseline.reference is None, spec.measure_latency
        (2, True, True)
    """

    model_path: str | os.PathLike
    calibration: DataSource
    evaluation: DataSource | None
    evaluator: Evaluator
    cache_dir: str | os.PathLike | None = None
    device: TrialDevice = TrialDevice()
    baseline: FloatBaseline = FloatBaseline()
    measure_latency: bool = True
    cache: CalibrationCache | None = None
    rungs: EvalRungs | None = None
    #: A language model's candidates decode a step in at most this many ms (None: no bound).
    max_decode_latency_ms: float | None = None
    #: The model a candidate must decode at least as fast as, timed in turn with the trial's.
    decode_anchor_path: str | os.PathLike | None = None
    #: A candidate's model is at most this many bytes (``size_budget``; None: no bound).
    max_model_size_bytes: int | None = None


class TrialRunner:
    """Runs trials of one :class:`TrialSpec` in one process, on :attr:`session_providers`."""

    def __init__(self, spec: TrialSpec) -> None:
        from raysearch.quantize.calibration import CalibrationCache

        device, baseline = spec.device, spec.baseline
        self.model_path = os.fspath(spec.model_path)
        self._weighted_nodes: int | None = None
        self.calibration = spec.calibration
        self.evaluation = spec.evaluation
        self.evaluator = spec.evaluator
        self.cache_dir = Path(spec.cache_dir) if spec.cache_dir else None
        self.threads = max(1, int(device.threads))
        self.gpu_id = device.gpu_id
        self.gpu_mem_limit = device.gpu_mem_limit
        self.measure_latency = spec.measure_latency
        self.max_decode_latency_ms = spec.max_decode_latency_ms
        self.decode_anchor_path = spec.decode_anchor_path
        self._anchor_session: Any = None
        self.max_model_size_bytes = spec.max_model_size_bytes
        if device.providers:
            self.session_providers: list[Any] = list(device.providers)
            self.device = device_label(self.session_providers)
        else:
            self.session_providers = session_providers(device.gpu_id, device.gpu_mem_limit)
            self.device = execution_providers(device.gpu_id, device.gpu_mem_limit)[2]
        #: The providers' names, as custom evaluators receive them.
        self.providers = provider_names(self.session_providers)
        # A given cache may be another device's: each call passes this trial's providers.
        self.cache = spec.cache or CalibrationCache(
            self.cache_dir, threads=self.threads, providers=self.session_providers
        )
        float_reference, float_score = baseline.reference, baseline.score
        if float_reference is not None and not _same_kind(float_reference.device, self.device):
            _logger.info(
                "float reference computed on %s; computing it on %s",
                float_reference.device,
                self.device,
            )
            float_reference = None
        if float_score is not None and not _same_kind(baseline.score_device, self.device):
            float_score = None
        self._reference = float_reference
        # A reference on its way is computed on the driver's CPU: a GPU trial computes its own.
        waits = float_reference is None and _same_kind("cpu", self.device)
        self._reference_source = baseline.reference_source if waits else None
        self._float_score = float_score
        self._backends: dict[tuple[str, str], QuantizerBackend] = {}
        #: The techniques the settings switch on (``raysearch.quantize.technique``).
        self.techniques = TechniquePipeline(
            self.model_path,
            self.calibration,
            providers=self.session_providers,
            threads=self.threads,
        )
        self.techniques.context = TechniqueContext(
            quantize=self._quantize_plain,
            score=self._score_only,
            score_settings=self.score_settings,
            calibration=self.calibration,
            higher_is_better=self.evaluator.higher_is_better,
            cache_dir=os.fspath(self.cache_dir) if self.cache_dir else None,
        )
        self._float_latency: float | None = None
        #: Set by the Ray trainable: scores many settings at once with helper tasks.
        self.score_pool: ScorePoolFn | None = None
        self._helped = 0
        #: The rungs :meth:`start` evaluates on (None: every row at once).
        self.rungs = spec.rungs
        self._partial_float: dict[float, float] = {}
        if self.evaluator.needs_reference and self.evaluation is None:
            raise ValueError(f"{self.evaluator.name} compares outputs: it needs evaluation data")

    @property
    def float_reference(self) -> FloatReference:
        """The float model's outputs on the evaluation data, computed or loaded on first use."""
        if self._reference is None and self._reference_source is not None:
            source, self._reference_source = self._reference_source, None
            reference = source()
            if _same_kind(reference.device, self.device):
                self._reference = reference
        if self._reference is None:
            if self.evaluation is None:
                raise ValueError("no evaluation data to compute the float reference on")
            self._reference = FloatReference.cached(
                self.cache_dir,
                self.model_path,
                self.evaluation,
                threads=self.threads,
                providers=self.session_providers,
            )
        return self._reference

    @property
    def float_score(self) -> float | None:
        """The custom evaluator's score of the float model (None for built-in metrics)."""
        if self.evaluator.is_custom and self._float_score is None:
            self._float_score = self.evaluator.score_float(self.model_path, self.providers)
        return self._float_score

    def partial_float_score(self, fraction: float) -> float:
        """The custom evaluator's float score on the first ``fraction`` of its rows (cached)."""
        if fraction not in self._partial_float:
            score = self.evaluator.score_model(self.model_path, self.providers, fraction=fraction)
            self._partial_float[fraction] = score.metric
        return self._partial_float[fraction]

    @property
    def weighted_node_count(self) -> int:
        """The float model's MatMul/Gemm/Conv nodes (what ``quantized_share`` divides by)."""
        if self._weighted_nodes is None:
            self._weighted_nodes = weighted_nodes(self.model_path)
        return self._weighted_nodes

    def backend(self, name: str | None = None, model_path: str | None = None) -> QuantizerBackend:
        """The quantizer backend ``name`` for ``model_path``, created on first use."""
        name = name or DEFAULT_BACKEND
        model_path = model_path or self.model_path
        key = (name, model_path)
        if key not in self._backends:
            # The model asked for stays: a helper scores models its pipeline does not hold.
            live = self.techniques.live_models() | {model_path}
            for old in [k for k in self._backends if k[1] not in live]:
                with contextlib.suppress(Exception):
                    self._backends.pop(old).close()
            self._backends[key] = get_backend(name)(
                model_path,
                self.calibration,
                self.cache,
                threads=self.threads,
                gpu_id=self.gpu_id,
                providers=self.session_providers,
            )
        return self._backends[key]

    def run(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> TrialRecord:
        """Quantize and evaluate on every row; a failure is a ``failed`` record (not
        ``MemoryError``).
        """
        return self._start(settings, out_path, None).finish()

    def start(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> StagedTrial:
        """Quantize; the trial is evaluated rung by rung with ``step()``, failing as :meth:`run`."""
        return self._start(settings, out_path, self.rungs)

    def _start(
        self, settings: Mapping[str, Any], out_path: str | os.PathLike, rungs: EvalRungs | None
    ) -> StagedTrial:
        self._helped = 0
        start = TrialRecord(
            status="failed",
            device=self.device,
            duration_s=0.0,
            calibration_s=0.0,
            quantization_s=0.0,
            evaluation_s=0.0,
            calib_cache_hit=False,
        )
        trial = StagedTrial(self, start, Path(out_path), rungs)
        guard(trial, lambda: self._quantize_trial(settings, trial))
        return trial

    def _quantize_trial(self, settings: Mapping[str, Any], trial: StagedTrial) -> None:
        out_path = trial.out_path
        name = settings.get("quantizer") or DEFAULT_BACKEND
        backend_cls = get_backend(name)
        plan = self.techniques.plan(settings)
        unknown = unknown_settings(plan.backend_settings, backend_cls.catalogue)
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: not a setting of backend '{name}' nor of a technique "
                "registered in this process (was the module that registers it imported?)"
            )
        # The whole settings: a backend may refuse a technique it cannot honour.
        reason = backend_reject(dict(settings))
        if reason:
            trial.result = trial.result.replace(error=f"rejected: {reason}")
            return
        # The shared values first: their failures are not this setting's.
        if not self.evaluator.needs_reference:
            trial.float_score = self.float_score
        elif self._reference_source is None:
            trial.reference = self.float_reference
        try:
            info = self._quantize(name, plan, out_path)
        finally:
            trial.result = trial.result.replace(sensitivity=plan.rankings or None)
        if trial.reference is None and self.evaluator.needs_reference:  # it was on its way
            trial.reference = self.float_reference
        trial.result = trial.result.replace(
            calibration_s=info.calibration_s,
            quantization_s=info.quantization_s,
            calib_cache_hit=info.calib_cache_hit,
            model_path=str(out_path),
            model_size_bytes=model_size_bytes(out_path),
        )
        trial.share = (
            info.quantized_share
            if info.quantized_share is not None
            else quantized_share(out_path, self.weighted_node_count)
        )
        trial.extra = {**info.extra, **plan.report}
        trial.quantized = True

    def trial_extra(
        self, extra: dict[str, float], share: float | None, latency: float | None
    ) -> dict[str, float]:
        """The result's ``extra`` beside the metric's and the techniques' own figures."""
        if share is not None:
            extra["quantized_share"] = share
        if self._helped:  # settings a technique had scored by the pool's helper tasks
            extra["scored_by_helpers"] = float(self._helped)
        ratio = self._latency_vs_float(latency) if latency is not None else None
        if ratio is not None:
            extra["latency_vs_float"] = ratio
        data = self.evaluation or self.calibration
        if latency is not None and data is not None:  # the samples latency_ms times
            extra["latency_batch_size"] = float(min(len(data), data.samples_per_batch))
        return extra

    def _quantize(self, name: str, plan: Plan, out_path: Path) -> QuantizeInfo:
        """The backend's quantization with the plan's techniques around it, timed."""
        float_path, transform_s = self.techniques.float_model(plan)
        settings = self.techniques.backend_settings(plan, float_path)
        info = self.backend(name, float_path).quantize(settings, out_path)
        info.calibration_s += transform_s
        if plan.quantized_steps:
            info.quantization_s += self.techniques.finish(plan, out_path, float_path)
        return info

    # -- what techniques borrow (TechniqueContext) -------------------------------------------
    def _quantize_plain(self, float_path: str, settings: Mapping[str, Any], out_path: str) -> None:
        """Quantize ``float_path`` with backend ``settings`` (no technique applied)."""
        name = settings.get("quantizer") or DEFAULT_BACKEND
        self.backend(name, float_path).quantize(settings, out_path)

    def score_settings(
        self, float_path: str, settings_list: Sequence[Mapping[str, Any]]
    ) -> list[float | None]:
        """The metric of ``float_path`` quantized with each setting (through :attr:`score_pool`)."""
        if self.score_pool is not None and len(settings_list) > 1:
            scores = self.score_pool(self, float_path, settings_list)
            self._helped += getattr(self.score_pool, "last_helped", 0)
            return scores
        return self.score_here(float_path, settings_list)

    def score_here(
        self, float_path: str, settings_list: Sequence[Mapping[str, Any]]
    ) -> list[float | None]:
        """:meth:`score_settings` in this process, one after another."""
        context = self.techniques.context
        assert context is not None
        return [quantize_and_score(context, float_path, s) for s in settings_list]

    def _score_only(self, model_path: str) -> float | None:
        """The search's metric of the model at ``model_path`` (no latency)."""
        path = Path(model_path)
        if self.evaluator.needs_reference:
            session = make_session(path, self.threads, providers=self.session_providers)
            try:
                outputs, _ = run_model(session, self.evaluation)  # type: ignore[arg-type]
            finally:
                del session
            return self.evaluator.score(outputs=outputs, reference=self.float_reference).metric
        return self.evaluator.score_model(path, self.providers).metric

    def _latency_vs_float(self, latency: float) -> float | None:
        """``latency`` over the float model's, timed the same way."""
        if self.evaluator.needs_reference:
            base = self.float_reference.latency_ms
        else:
            if self._float_latency is None:
                self._float_latency = self.latency(self.model_path)
            base = self._float_latency
        return latency / base if base else None

    def latency(self, model_path: str | os.PathLike) -> float | None:
        """The median latency of one evaluation batch (after a warm-up) on the trial's device."""
        data = self.evaluation or self.calibration
        session = make_session(model_path, self.threads, providers=self.session_providers)
        try:
            return measure_latency(session, data.batch(0))
        except Exception as exc:  # latency is secondary: never fail a trial for it
            _logger.debug("latency measurement failed: %s", exc)
            return None
        finally:
            del session

    def decoder_latency(
        self, model_path: str | os.PathLike, session: Any = None
    ) -> dict[str, float]:
        """A language model's median decode step and prefill latency; empty when not measured or
        not a language model's.
        """
        data = self.evaluation
        if not self.measure_latency or not self.evaluator.is_lm or data is None:
            return {}
        anchor = self._anchor()
        if session is None or anchor is not None:
            # Against an anchor, a session as fresh as the anchor's (the evaluation session
            # is slower at one-token steps after whole batches).
            session = make_session(model_path, self.threads, providers=self.session_providers)
        try:
            return measure_decoder_latency(session, data, anchor=anchor)
        except Exception as exc:  # latency is secondary: never fail a trial for it
            _logger.debug("decoder latency measurement failed: %s", exc)
            return {}
        finally:
            del session

    def _anchor(self) -> Any:
        """The session of :attr:`TrialSpec.decode_anchor_path` (opened once), or None."""
        if self.decode_anchor_path is not None and self._anchor_session is None:
            self._anchor_session = make_session(
                self.decode_anchor_path, self.threads, providers=self.session_providers
            )
        return self._anchor_session

    def close(self) -> None:
        """Remove the backends' and the techniques' temporary files."""
        for backend in self._backends.values():
            with contextlib.suppress(Exception):
                backend.close()
        self._backends.clear()
        self.techniques.close()

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
