"""The built-in metrics: one table of name, function and direction, and the metric maths.

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

Ranges (what bounds a tolerance, :attr:`BuiltinMetric.best` and :attr:`BuiltinMetric.worst`):
L1 and L2 lie in ``[0, inf)``, cos and SSIM in ``[-1, 1]``, PSNR is at most 100 dB (and
unbounded below).

:data:`METRICS` is the only list of built-in metrics: the config stage reads names, aliases and
directions from it (this module imports no stage), the evaluate stage its functions.

Example:
    >>> METRICS["cos"].higher_is_better, BUILTIN_METRICS["L2"]
    (True, False)
    >>> canonical_metric("cosine"), canonical_metric("COS"), canonical_metric("pkg.mod:fn")
    ('cos', 'cos', None)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raysearch.errors import canonical_name

__all__ = [
    "BuiltinMetric",
    "METRICS",
    "BUILTIN_METRICS",
    "METRIC_ALIASES",
    "LISTED",
    "PSNR_CAP_DB",
    "MetricError",
    "canonical_metric",
    "metric_l1",
    "metric_l2",
    "metric_cos",
    "metric_psnr",
    "metric_ssim",
    "compute_metric",
    "metric_per_sample",
    "mean_metric",
]

#: PSNR of a sample whose quantized output equals the float one.
PSNR_CAP_DB = 100.0
_SAMPLES_PER_CHUNK = 256


class MetricError(RuntimeError):
    """A score that cannot be computed for one quantized model (its outputs hold NaN, the
    custom evaluator returned something that is not a number...). The trial fails; the search
    goes on."""


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


@dataclass(frozen=True)
class BuiltinMetric:
    """One built-in metric: its name, its per-sample function of ``[S, D]`` arrays, its
    direction and ``best``, the best value one sample can score (an identical output): what
    bounds the mean over rows not yet evaluated (``raysearch.evaluate.subsets``); ``worst``
    is the other end of its range (infinite where it has none): ``best`` and ``worst`` bound
    the tolerances that mean something (``raysearch.config._metric``)."""

    name: str
    function: Callable[[np.ndarray, np.ndarray], np.ndarray]
    higher_is_better: bool
    best: float
    worst: float


#: The built-in metrics by name, in the order the messages list them.
METRICS: dict[str, BuiltinMetric] = {
    m.name: m
    for m in (
        BuiltinMetric("L1", metric_l1, higher_is_better=False, best=0.0, worst=math.inf),
        BuiltinMetric("L2", metric_l2, higher_is_better=False, best=0.0, worst=math.inf),
        BuiltinMetric("cos", metric_cos, higher_is_better=True, best=1.0, worst=-1.0),
        BuiltinMetric(
            "PSNR", metric_psnr, higher_is_better=True, best=PSNR_CAP_DB, worst=-math.inf
        ),
        BuiltinMetric("SSIM", metric_ssim, higher_is_better=True, best=1.0, worst=-1.0),
    )
}
#: Built-in metrics and whether higher is better (a view of :data:`METRICS`).
BUILTIN_METRICS: dict[str, bool] = {name: m.higher_is_better for name, m in METRICS.items()}
#: The built-in names as messages list them: ``"L1, L2, cos, PSNR, SSIM"``.
LISTED = ", ".join(METRICS)
#: Other spellings a config may use for a built-in metric (in any case, as the names).
METRIC_ALIASES = {"cosine": "cos", "cos_sim": "cos"}


def canonical_metric(name: str) -> str | None:
    """The built-in metric ``name`` stands for (itself or an alias, in any case:
    :func:`raysearch.errors.canonical_name`), or None when it names no built-in metric."""
    return canonical_name(name, METRICS, METRIC_ALIASES)


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
    return mean_metric(name, metric_per_sample(name, quantized, reference))


def mean_metric(name: str, values: np.ndarray) -> float:
    """The mean of the per-sample values of metric ``name`` (summed chunk by chunk, as
    :func:`compute_metric` always has).

    Raises:
        MetricError: the mean is not finite.
    """
    total = 0.0
    for start in range(0, len(values), _SAMPLES_PER_CHUNK):
        total += float(np.sum(values[start : start + _SAMPLES_PER_CHUNK]))
    value = total / len(values)
    if not math.isfinite(value):
        raise MetricError(f"{name} is {value}")
    return value


def metric_per_sample(
    name: str, quantized: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> np.ndarray:
    """The built-in metric ``name`` of each sample (float64, one value per sample: one in
    all when the outputs disagree on the number of samples).

    Raises:
        MetricError: missing outputs, shape mismatches, NaN or inf in the quantized outputs.

    Example:
        >>> f = {"y": np.array([[1.0, 0.0], [0.0, 2.0]])}
        >>> metric_per_sample("L1", {"y": np.array([[1.0, 1.0], [0.0, 2.0]])}, f).tolist()
        [0.5, 0.0]
    """
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; built-in metrics are {', '.join(METRICS)}")
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
    function = METRICS[name].function
    parts = []
    for start in range(0, samples, _SAMPLES_PER_CHUNK):
        stop = min(samples, start + _SAMPLES_PER_CHUNK)
        q = _rows(quantized, names, start, stop, per_sample)
        f = _rows(reference, names, start, stop, per_sample)
        parts.append(np.asarray(function(q, f), dtype=np.float64))
    return np.concatenate(parts)


def _rows(
    outputs: Mapping[str, np.ndarray], names: Sequence[str], start: int, stop: int, per: bool
) -> np.ndarray:
    if not per:
        return np.concatenate([np.asarray(outputs[n], np.float64).ravel() for n in names])[None]
    parts = [
        np.asarray(outputs[n][start:stop], np.float64).reshape(stop - start, -1) for n in names
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
