"""Scoring quantized models: built-in metrics, custom evaluators, the tolerance.

Built-in metrics compare the quantized model's outputs with the float model's on the
evaluation data. Each sample's outputs are flattened and concatenated (in the float model's
output order) into one vector ``q`` (quantized) and ``f`` (float) of length ``D``; a metric is
computed per sample in float64 and averaged over the samples:

====== ============================================================================ ==========
metric per sample                                                                  better
====== ============================================================================ ==========
L1     ``mean_j |q_j - f_j|`` (mean absolute error)                                 lower
L2     ``sqrt(mean_j (q_j - f_j)^2)`` (root mean squared error)                      lower
cos    ``q.f / (|q| |f|)``; 1 when both are zero vectors, 0 when only one is          higher
PSNR   ``10 log10(peak^2 / mse)``, ``peak = max_j |f_j|`` (1 if 0), capped at 100 dB  higher
SSIM   global single-window SSIM (below)                                            higher
====== ============================================================================ ==========

SSIM is ``((2 mq mf + C1)(2 cov + C2)) / ((mq^2 + mf^2 + C1)(vq + vf + C2))`` over the whole
vector (means, population variances and covariance), with ``C1 = (0.01 L)^2``,
``C2 = (0.03 L)^2`` and ``L = max_j f_j - min_j f_j`` the float sample's dynamic range (1 if 0).
When the outputs disagree on the number of samples (their first axes differ), all outputs
together are one sample.

A custom evaluator is ``fn(model_path: str, providers: list) -> float | dict``, given as a
callable or as ``"package.module:function"``. A dict names its main metric by ``metric_key``,
else by the key ``"metric"``, else by being its only key; other numeric keys are recorded as
extra metrics. The float model is scored once with the same function.

The tolerance (SPEC.md): for a built-in metric it bounds the metric itself (``L2 <= tol``,
``cos >= tol``); for a custom metric it bounds the drop against the float score, ``absolute``
(``float - quant``) or ``relative`` (``(float - quant) / |float|``), the drop being measured in
the worse direction (``quant - float`` when lower is better).

Example:
    >>> from raysearch.evaluate import Evaluator
    >>> ev = Evaluator("cos", tolerance=0.999)
    >>> ev.higher_is_better, ev.is_candidate(0.9995), ev.is_candidate(0.99)
    (True, True, False)
    >>> top1 = Evaluator("my_pkg.evals:top1", tolerance=0.01,        # doctest: +SKIP
    ...                  tolerance_mode="relative", higher_is_better=True)
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysearch.errors import ConfigError, InputError, suggest

if TYPE_CHECKING:
    import onnxruntime as ort

    from raysearch.data import DataSource

__all__ = [
    "BUILTIN_METRICS",
    "PSNR_CAP_DB",
    "MetricError",
    "EvaluatorError",
    "Score",
    "Evaluator",
    "FloatReference",
    "metric_l1",
    "metric_l2",
    "metric_cos",
    "metric_psnr",
    "metric_ssim",
    "compute_metric",
    "load_custom_evaluator",
    "run_model",
    "measure_latency",
]

_logger = logging.getLogger(__name__)

#: Built-in metrics and whether higher is better.
BUILTIN_METRICS: dict[str, bool] = {
    "L1": False,
    "L2": False,
    "cos": True,
    "PSNR": True,
    "SSIM": True,
}
#: PSNR of a sample whose quantized output equals the float one.
PSNR_CAP_DB = 100.0
_SAMPLES_PER_CHUNK = 256


class MetricError(RuntimeError):
    """A score that cannot be computed for one quantized model (its outputs hold NaN, the
    custom evaluator returned something that is not a number...). The trial fails; the search
    goes on."""


class EvaluatorError(InputError):
    """The evaluator itself is unusable (it fails on the float model)."""


# --------------------------------------------------------------------------------------------
# Built-in metrics on [samples, features] arrays
# --------------------------------------------------------------------------------------------


def metric_l1(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample mean absolute error of ``[S, D]`` arrays."""
    return np.mean(np.abs(q - f), axis=1)


def metric_l2(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample root mean squared error of ``[S, D]`` arrays."""
    return np.sqrt(np.mean((q - f) ** 2, axis=1))


def metric_cos(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample cosine similarity of ``[S, D]`` arrays (1 for two zero vectors, 0 when only
    one is zero)."""
    nq = np.linalg.norm(q, axis=1)
    nf = np.linalg.norm(f, axis=1)
    dot = np.einsum("ij,ij->i", q, f)
    denominator = nq * nf
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(denominator > 0, dot / np.where(denominator > 0, denominator, 1), 0.0)
    cos = np.where((nq == 0) & (nf == 0), 1.0, cos)
    return np.clip(cos, -1.0, 1.0)


def metric_psnr(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample PSNR in dB of ``[S, D]`` arrays, peak = the float sample's ``max |f|`` (1 when
    zero), capped at :data:`PSNR_CAP_DB`."""
    mse = np.mean((q - f) ** 2, axis=1)
    peak = np.max(np.abs(f), axis=1)
    peak = np.where(peak > 0, peak, 1.0)
    with np.errstate(divide="ignore"):
        psnr = 10.0 * np.log10(peak**2 / np.where(mse > 0, mse, 1.0))
    return np.minimum(np.where(mse > 0, psnr, PSNR_CAP_DB), PSNR_CAP_DB)


def metric_ssim(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample global (single-window) SSIM of ``[S, D]`` arrays with ``C1 = (0.01 L)^2``,
    ``C2 = (0.03 L)^2``, ``L`` = the float sample's ``max - min`` (1 when zero)."""
    dynamic = np.max(f, axis=1) - np.min(f, axis=1)
    dynamic = np.where(dynamic > 0, dynamic, 1.0)
    c1 = (0.01 * dynamic) ** 2
    c2 = (0.03 * dynamic) ** 2
    mq = q.mean(axis=1)
    mf = f.mean(axis=1)
    vq = q.var(axis=1)
    vf = f.var(axis=1)
    cov = np.mean((q - mq[:, None]) * (f - mf[:, None]), axis=1)
    return ((2 * mq * mf + c1) * (2 * cov + c2)) / ((mq**2 + mf**2 + c1) * (vq + vf + c2))


_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "L1": metric_l1,
    "L2": metric_l2,
    "cos": metric_cos,
    "PSNR": metric_psnr,
    "SSIM": metric_ssim,
}


def compute_metric(
    name: str, quantized: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> float:
    """The built-in metric ``name`` of quantized outputs against float outputs (both
    ``{output name: array with samples on axis 0}``), averaged over samples.

    Raises:
        MetricError: missing outputs, shape mismatches, NaN or inf in the quantized outputs.

    Example:
        >>> f = {"y": np.array([[1.0, 0.0], [0.0, 2.0]])}
        >>> compute_metric("L1", {"y": np.array([[1.0, 1.0], [0.0, 2.0]])}, f)
        0.25
    """
    if name not in _METRICS:
        raise ValueError(f"unknown metric {name!r}; built-in metrics are {', '.join(_METRICS)}")
    names = list(reference)
    for out in names:
        if out not in quantized:
            raise MetricError(f"the quantized model has no output '{out}'")
        if quantized[out].shape != reference[out].shape:
            raise MetricError(
                f"output '{out}' has shape {tuple(quantized[out].shape)}, the float model's "
                f"has {tuple(reference[out].shape)}"
            )
    for out in names:
        bad = ~np.isfinite(np.asarray(quantized[out], dtype=np.float64))
        if bad.any():
            kind = "NaN" if np.isnan(np.asarray(quantized[out], dtype=np.float64)).any() else "inf"
            rows = bad.reshape(bad.shape[0], -1).any(axis=1).sum() if bad.ndim else 1
            total = bad.shape[0] if bad.ndim else 1
            raise MetricError(
                f"quantized model output '{out}' holds {kind} in {rows} of {total} samples"
            )
    counts = {reference[out].shape[0] if reference[out].ndim else 1 for out in names}
    per_sample = len(counts) == 1
    samples = counts.pop() if per_sample else 1
    function = _METRICS[name]
    total = 0.0
    for start in range(0, samples, _SAMPLES_PER_CHUNK):
        stop = min(samples, start + _SAMPLES_PER_CHUNK)
        q = _rows(quantized, names, start, stop, per_sample)
        f = _rows(reference, names, start, stop, per_sample)
        total += float(np.sum(function(q, f)))
    value = total / samples
    if not math.isfinite(value):
        raise MetricError(f"{name} is {value}")
    return value


def _rows(
    outputs: Mapping[str, np.ndarray], names: Sequence[str], start: int, stop: int, per: bool
) -> np.ndarray:
    if not per:
        return np.concatenate([np.asarray(outputs[n], np.float64).ravel() for n in names])[None]
    parts = [
        np.asarray(outputs[n][start:stop], np.float64).reshape(stop - start, -1) for n in names
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


# --------------------------------------------------------------------------------------------
# Running a model on data
# --------------------------------------------------------------------------------------------


def run_model(
    session: ort.InferenceSession, data: DataSource
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Run ``session`` over every batch of ``data``: ``({output name: outputs concatenated over
    samples}, per-batch latencies in ms)``. When each sample is one feed, outputs are stacked
    on a new first axis."""
    names = [o.name for o in session.get_outputs()]
    pieces: dict[str, list[np.ndarray]] = {n: [] for n in names}
    latencies: list[float] = []
    for feed in data.batches():
        start = time.perf_counter()
        results = session.run(None, feed)
        latencies.append((time.perf_counter() - start) * 1000.0)
        for name, value in zip(names, results):
            pieces[name].append(np.asarray(value))
    outputs = {}
    for name in names:
        parts = pieces[name]
        batched = (
            not data.sample_is_feed
            and all(p.ndim > 0 for p in parts)
            and sum(p.shape[0] for p in parts) == len(data)
        )
        outputs[name] = np.concatenate(parts, axis=0) if batched else np.stack(parts)
    return outputs, latencies


def measure_latency(
    session: ort.InferenceSession, feed: Mapping[str, np.ndarray], runs: int = 5
) -> float:
    """Median milliseconds of ``runs`` runs of one feed, after one warm-up run."""
    session.run(None, dict(feed))
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        session.run(None, dict(feed))
        times.append((time.perf_counter() - start) * 1000.0)
    return float(np.median(times))


# --------------------------------------------------------------------------------------------
# The float reference
# --------------------------------------------------------------------------------------------


@dataclass
class FloatReference:
    """The float model's outputs on the evaluation data, computed once per search.

    ``outputs`` maps each output name to its values concatenated over samples. Saved as one
    ``.npy`` per output (memory-mapped when loaded) plus ``meta.json`` in a folder.

    Example:
        >>> ref = FloatReference.compute("model.onnx", eval_data, threads=2)   # doctest: +SKIP
        >>> ref.save(cache_dir / "reference" / ref.key)                        # doctest: +SKIP
        >>> FloatReference.load(cache_dir / "reference" / ref.key).num_samples  # doctest: +SKIP
        500
    """

    outputs: dict[str, np.ndarray]
    key: str = ""
    device: str = "cpu"
    latency_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def output_names(self) -> list[str]:
        return list(self.outputs)

    @property
    def num_samples(self) -> int:
        first = next(iter(self.outputs.values()))
        return int(first.shape[0]) if first.ndim else 1

    @staticmethod
    def cache_key(model_hash: str, data: DataSource, device: str = "cpu") -> str:
        """The key of a reference: model, data, batching and device kind."""
        text = f"{model_hash}|{data.content_hash}|{data.batch_size}|{data.sample_is_feed}|"
        text += device.split(":")[0]
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @classmethod
    def compute(
        cls,
        model_path: str | os.PathLike,
        data: DataSource,
        *,
        threads: int = 1,
        gpu_id: int | None = None,
        model_hash: str | None = None,
        providers: Sequence[Any] | None = None,
    ) -> FloatReference:
        """Run the float model once over ``data``, on ``providers`` (a trial's
        ``session_providers``, options included) or else on ``gpu_id``'s device.

        Raises:
            EvaluatorError: the float model's own outputs hold NaN or inf.
        """
        from raysearch.modelfile import file_hash
        from raysearch.providers import make_session

        device = _device(gpu_id, providers)
        session = make_session(model_path, threads, gpu_id, providers=providers)
        try:
            outputs, latencies = run_model(session, data)
        finally:
            del session
        for name, value in outputs.items():
            if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
                raise EvaluatorError(
                    f"the float model's output '{name}' holds NaN or inf on the evaluation data"
                )
        key = cls.cache_key(model_hash or file_hash(model_path), data, device)
        latency = float(np.median(latencies[1:] or latencies)) if latencies else None
        return cls(outputs, key=key, device=device, latency_ms=latency)

    @classmethod
    def cached(
        cls,
        cache_dir: str | os.PathLike | None,
        model_path: str | os.PathLike,
        data: DataSource,
        *,
        threads: int = 1,
        gpu_id: int | None = None,
        providers: Sequence[Any] | None = None,
    ) -> FloatReference:
        """Load the reference from ``cache_dir/reference/<key>`` or compute and save it (on
        ``providers``, else on ``gpu_id``'s device, as :meth:`compute`)."""
        from raysearch.modelfile import file_hash

        model_hash = file_hash(model_path)
        options = {"threads": threads, "gpu_id": gpu_id, "providers": providers}
        if cache_dir is None:
            return cls.compute(model_path, data, model_hash=model_hash, **options)
        device = _device(gpu_id, providers)
        folder = Path(cache_dir) / "reference" / cls.cache_key(model_hash, data, device)
        if (folder / "meta.json").is_file():
            try:
                return cls.load(folder)
            except (OSError, ValueError, KeyError) as exc:
                _logger.warning("recomputing the float reference (%s unreadable: %s)", folder, exc)
        reference = cls.compute(model_path, data, model_hash=model_hash, **options)
        try:
            reference.save(folder)
        except OSError as exc:
            _logger.warning("could not save the float reference: %s", exc)
        return reference

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``meta.json`` and ``output_<i>.npy`` into ``folder`` (atomically: a temporary
        folder renamed into place; if another process got there first, its copy stays)."""
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
        try:
            files = []
            for i, (name, value) in enumerate(self.outputs.items()):
                file = f"output_{i}.npy"
                np.save(tmp / file, np.ascontiguousarray(value), allow_pickle=False)
                files.append({"name": name, "file": file})
            meta = {
                "version": 1,
                "key": self.key,
                "device": self.device,
                "latency_ms": self.latency_ms,
                "outputs": files,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            try:
                os.replace(tmp, folder)
            except OSError:
                if not (folder / "meta.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike, mmap: bool = True) -> FloatReference:
        """Read a reference written by :meth:`save` (arrays memory-mapped unless ``mmap`` is
        False)."""
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        outputs = {
            entry["name"]: np.load(
                folder / entry["file"], mmap_mode="r" if mmap else None, allow_pickle=False
            )
            for entry in meta["outputs"]
        }
        return cls(
            outputs,
            key=meta.get("key", ""),
            device=meta.get("device", "cpu"),
            latency_ms=meta.get("latency_ms"),
        )


def _device(gpu_id: int | None, providers: Sequence[Any] | None) -> str:
    """The device label of sessions made with ``providers``, else with ``gpu_id``'s."""
    from raysearch.providers import device_label, execution_providers

    return device_label(providers) if providers else execution_providers(gpu_id)[2]


# --------------------------------------------------------------------------------------------
# Custom evaluators
# --------------------------------------------------------------------------------------------


def load_custom_evaluator(
    spec: str | Callable[..., Any], key: str = "metric"
) -> Callable[..., Any]:
    """The function named by ``"package.module:function"`` (or ``spec`` itself when callable),
    checked to accept ``(model_path, providers)``.

    Raises:
        ConfigError: (at ``key``) the module cannot be imported, has no such function, or the
            function cannot be called with two arguments.
    """
    if callable(spec):
        func, label = spec, getattr(spec, "__qualname__", repr(spec))
    else:
        module_name, _, func_name = str(spec).partition(":")
        if not module_name or not func_name:
            raise ConfigError(key, f"expected 'package.module:function', got {spec!r}")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ConfigError(key, f"cannot import module '{module_name}': {exc}") from None
        except Exception as exc:
            raise ConfigError(
                key, f"importing '{module_name}' failed: {type(exc).__name__}: {exc}"
            ) from None
        func = getattr(module, func_name, None)
        if func is None:
            public = [n for n in dir(module) if not n.startswith("_")]
            raise ConfigError(
                key,
                f"module '{module_name}' has no function '{func_name}'"
                + suggest(func_name, public),
            )
        if not callable(func):
            raise ConfigError(key, f"'{spec}' is not callable")
        label = str(spec)
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return func  # a builtin without a signature: the call decides
    try:
        signature.bind("model.onnx", ["CPUExecutionProvider"])
    except TypeError:
        raise ConfigError(
            key,
            f"'{label}' must accept (model_path, providers); it accepts "
            f"({', '.join(signature.parameters)})",
        ) from None
    return func


@dataclass
class Score:
    """A model's main metric and any extra numbers the evaluator returned."""

    metric: float
    extra: dict[str, float] = field(default_factory=dict)


class Evaluator:
    """Scores a quantized model and decides whether it is a candidate.

    ``metric`` is a built-in name (``L1``, ``L2``, ``cos``, ``PSNR``, ``SSIM``), a callable or
    ``"package.module:function"``. ``higher_is_better`` is fixed for built-ins and defaults to
    True for custom metrics.

    Example:
        >>> ev = Evaluator("L2", tolerance=0.01)
        >>> ev.is_candidate(0.005), ev.better(0.004, 0.005)
        (True, True)
        >>> acc = Evaluator(lambda path, providers: 0.9, tolerance=0.02)
        >>> acc.is_candidate(0.89, float_score=0.9)
        True
    """

    def __init__(
        self,
        metric: str | Callable[..., Any] = "L2",
        tolerance: float | None = None,
        tolerance_mode: str = "absolute",
        higher_is_better: bool | None = None,
        metric_key: str | None = None,
    ) -> None:
        if tolerance_mode not in ("absolute", "relative"):
            raise ConfigError(
                "tolerance_mode", f"expected absolute or relative, got {tolerance_mode!r}"
            )
        self.tolerance = None if tolerance is None else float(tolerance)
        self.tolerance_mode = tolerance_mode
        self.metric_key = metric_key
        if isinstance(metric, str) and metric in BUILTIN_METRICS:
            if higher_is_better is not None and higher_is_better != BUILTIN_METRICS[metric]:
                raise ConfigError(
                    "higher_is_better",
                    f"{metric} is {'higher' if BUILTIN_METRICS[metric] else 'lower'}-is-better by "
                    "definition",
                )
            self.name = metric
            self.function: Callable[..., Any] | None = None
            self.higher_is_better = BUILTIN_METRICS[metric]
        else:
            if isinstance(metric, str) and ":" not in metric:
                raise ConfigError(
                    "metric",
                    f"unknown metric {metric!r}; expected L1, L2, cos, PSNR, SSIM or "
                    "'package.module:function'" + suggest(metric, BUILTIN_METRICS),
                )
            self.function = load_custom_evaluator(metric)
            self.name = metric if isinstance(metric, str) else getattr(metric, "__name__", "custom")
            self.higher_is_better = True if higher_is_better is None else bool(higher_is_better)

    @classmethod
    def from_config(cls, config: Any) -> Evaluator:
        """Build from a :class:`raysearch.config.SearchConfig` (its ``metric``, ``tolerance``,
        ``tolerance_mode``, ``higher_is_better`` and ``metric_key``)."""
        return cls(
            config.metric,
            config.tolerance,
            getattr(config, "tolerance_mode", "absolute"),
            getattr(config, "higher_is_better", None),
            getattr(config, "metric_key", None),
        )

    @property
    def is_custom(self) -> bool:
        return self.function is not None

    @property
    def needs_reference(self) -> bool:
        """Built-in metrics compare against the float model's outputs."""
        return not self.is_custom

    # -- scoring ---------------------------------------------------------------------------
    def score(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        outputs: Mapping[str, np.ndarray] | None = None,
        reference: FloatReference | Mapping[str, np.ndarray] | None = None,
        providers: Sequence[Any] | None = None,
    ) -> Score:
        """Score one model: built-ins from ``outputs`` against ``reference``; a custom
        evaluator by calling it with ``(model_path, providers)``.

        Raises:
            MetricError: the score cannot be computed (NaN outputs, a bad return value).
        """
        if self.function is None:
            if outputs is None or reference is None:
                raise ValueError(f"{self.name} needs the quantized outputs and the float reference")
            ref = reference.outputs if isinstance(reference, FloatReference) else reference
            return Score(compute_metric(self.name, outputs, ref))
        if model_path is None:
            raise ValueError("a custom evaluator needs the model path")
        return self.score_model(model_path, providers)

    def score_model(
        self, model_path: str | os.PathLike, providers: Sequence[Any] | None = None
    ) -> Score:
        """Call the custom evaluator on ``model_path`` and read its result."""
        if self.function is None:
            raise ValueError(f"{self.name} is a built-in metric; use score(outputs=...)")
        providers = list(providers) if providers else ["CPUExecutionProvider"]
        value = self.function(os.fspath(model_path), providers)
        return self._read(value)

    def score_float(
        self, model_path: str | os.PathLike, providers: Sequence[Any] | None = None
    ) -> float:
        """The custom evaluator's score of the float model (once per search).

        Raises:
            EvaluatorError: the evaluator fails or returns no usable number on the float model.
        """
        try:
            return self.score_model(model_path, providers).metric
        except MetricError as exc:
            raise EvaluatorError(f"evaluator '{self.name}' on the float model: {exc}") from None
        except Exception as exc:
            raise EvaluatorError(
                f"evaluator '{self.name}' failed on the float model: {type(exc).__name__}: {exc}"
            ) from exc

    def _read(self, value: Any) -> Score:
        where = f"evaluator '{self.name}'"
        if isinstance(value, Mapping):
            if not value:
                raise MetricError(f"{where} returned an empty dict")
            if self.metric_key is not None:
                if self.metric_key not in value:
                    raise MetricError(
                        f"{where} returned keys {', '.join(map(str, value))} but not metric_key "
                        f"'{self.metric_key}'" + suggest(self.metric_key, map(str, value))
                    )
                main_key = self.metric_key
            elif "metric" in value:
                main_key = "metric"
            elif len(value) == 1:
                main_key = next(iter(value))
            else:
                raise MetricError(
                    f"{where} returned keys {', '.join(map(str, value))}; set metric_key to name "
                    "the main metric (or return it under 'metric')"
                )
            main = _number(value[main_key], f"{where} key '{main_key}'")
            extra = {}
            for k, v in value.items():
                if k == main_key:
                    continue
                if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
                    extra[str(k)] = float(v)
            return Score(main, extra)
        return Score(_number(value, where))

    # -- decisions -------------------------------------------------------------------------
    def drop(self, score: float, float_score: float) -> float:
        """How much worse ``score`` is than ``float_score`` (negative when better), absolute
        or relative to ``|float_score|`` per ``tolerance_mode``."""
        diff = (float_score - score) if self.higher_is_better else (score - float_score)
        if self.tolerance_mode == "absolute":
            return diff
        if float_score == 0:
            return 0.0 if diff <= 0 else math.inf
        return diff / abs(float_score)

    def is_candidate(self, score: float | None, float_score: float | None = None) -> bool:
        """Whether ``score`` is within the tolerance (False without a tolerance or a score).

        Raises:
            ValueError: a custom metric without the float model's score.
        """
        if self.tolerance is None or score is None or not math.isfinite(score):
            return False
        if not self.is_custom:
            return score >= self.tolerance if self.higher_is_better else score <= self.tolerance
        if float_score is None:
            raise ValueError(f"{self.name}: a custom metric needs the float model's score")
        return self.drop(score, float_score) <= self.tolerance

    def better(self, a: float | None, b: float | None) -> bool:
        """Whether score ``a`` is strictly better than ``b`` (a missing score is worst)."""
        if a is None or (isinstance(a, float) and math.isnan(a)):
            return False
        if b is None or (isinstance(b, float) and math.isnan(b)):
            return True
        return a > b if self.higher_is_better else a < b

    def __repr__(self) -> str:
        return (
            f"Evaluator({self.name!r}, tolerance={self.tolerance}, mode={self.tolerance_mode}, "
            f"higher_is_better={self.higher_is_better})"
        )


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()
        else:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise MetricError(
                f"{where} returned {type(value).__name__} {shown}, expected a number or a dict "
                "of numbers"
            )
    result = float(value)
    if math.isnan(result):
        raise MetricError(f"{where} returned NaN")
    return result
