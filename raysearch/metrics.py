"""The built-in metrics (:data:`METRICS`: name, function, direction, range) and their maths.

Each sample's outputs are flattened into one vector, a metric is computed per sample in
float64 and averaged (outputs that disagree on the sample count are one sample). The
language-model metrics read the next-token logits (:func:`logits_output`).

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
    "LM_METRICS",
    "logits_output",
    "metric_kl",
    "metric_top1_agreement",
    "metric_nll",
    "metric_interval",
    "lm_scores",
]

#: PSNR of a sample whose quantized output equals the float one.
PSNR_CAP_DB = 100.0
_SAMPLES_PER_CHUNK = 256


class MetricError(RuntimeError):
    """A score that cannot be computed for one model: the trial fails, the search goes on."""


def metric_l1(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample mean absolute error of ``[S, D]`` arrays."""
    return np.mean(np.abs(q - f), axis=1)


def metric_l2(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample root mean squared error of ``[S, D]`` arrays."""
    return np.sqrt(np.mean((q - f) ** 2, axis=1))


def metric_cos(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample cosine similarity (1 for two zero vectors, 0 when only one is zero)."""
    nq = np.linalg.norm(q, axis=1)
    nf = np.linalg.norm(f, axis=1)
    dot = np.einsum("ij,ij->i", q, f)
    denominator = nq * nf
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(denominator > 0, dot / np.where(denominator > 0, denominator, 1), 0.0)
    cos = np.where((nq == 0) & (nf == 0), 1.0, cos)
    return np.clip(cos, -1.0, 1.0)


def metric_psnr(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample PSNR in dB, peak the float's ``max |f|``, capped at :data:`PSNR_CAP_DB`."""
    mse = np.mean((q - f) ** 2, axis=1)
    peak = np.max(np.abs(f), axis=1)
    peak = np.where(peak > 0, peak, 1.0)
    with np.errstate(divide="ignore"):
        psnr = 10.0 * np.log10(peak**2 / np.where(mse > 0, mse, 1.0))
    return np.minimum(np.where(mse > 0, psnr, PSNR_CAP_DB), PSNR_CAP_DB)


def metric_ssim(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample global SSIM, ``C1 = (0.01 L)^2``, ``C2 = (0.03 L)^2``, ``L`` the float
    sample's ``max - min`` (1 when zero).
    """
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


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def metric_kl(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample mean over positions of ``KL(softmax(f) || softmax(q))``."""
    lf, lq = _log_softmax(f), _log_softmax(q)
    return np.maximum((np.exp(lf) * (lf - lq)).sum(axis=-1), 0.0).mean(axis=1)


def metric_top1_agreement(q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Per-sample share of positions where ``q`` and ``f`` pick the same token."""
    return (np.argmax(q, axis=-1) == np.argmax(f, axis=-1)).mean(axis=1)


def metric_nll(q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per-sample mean negative log-likelihood of each next token (log perplexity)."""
    if ids.shape[1] < 2:
        raise MetricError("perplexity needs sequences of at least two tokens")
    lq = _log_softmax(q[:, :-1])
    picked = np.take_along_axis(lq, ids[:, 1:, None].astype(np.int64), axis=-1)[..., 0]
    return -picked.mean(axis=1)


def logits_output(outputs: Mapping[str, np.ndarray]) -> str:
    """The next-token logits among ``outputs``: ``logits``, else the float output of rank 3 (or
    higher) with the longest last axis (MetricError: none).

    Example:
        >>> logits_output({"present.0.key": np.zeros((1, 2, 3, 16)), "out": np.zeros((1, 3, 50))})
        'out'
    """
    if "logits" in outputs:
        return "logits"
    floating = [
        name
        for name, value in outputs.items()
        if np.ndim(value) >= 3 and np.issubdtype(np.asarray(value).dtype, np.floating)
    ]
    # [batch, seq, vocab] before any rank-4 output (a key/value cache's [batch, heads, seq, d])
    found = [name for name in floating if np.ndim(outputs[name]) == 3] or floating
    if not found:
        raise MetricError(
            "no output has a vocabulary axis ([batch, seq, vocab] logits): the language-model "
            "metrics need one"
        )
    return max(found, key=lambda name: np.shape(outputs[name])[-1])


def _lm_rows(value: np.ndarray, start: int, stop: int, vocab: bool = True) -> np.ndarray:
    rows = np.asarray(value[start:stop])
    return (
        rows.reshape(stop - start, -1, rows.shape[-1]) if vocab else rows.reshape(stop - start, -1)
    )


@dataclass(frozen=True)
class BuiltinMetric:
    """One built-in metric: name, per-sample function, direction, and ``best``/``worst`` range."""

    name: str
    function: Callable[[np.ndarray, np.ndarray], np.ndarray]
    higher_is_better: bool
    best: float
    worst: float
    #: A language-model metric: computed on the logits output alone, ``[S, T, V]``.
    lm: bool = False
    #: Turns the mean of the per-sample values into the metric (perplexity: ``exp``); None.
    finish: Callable[[float], float] | None = None
    #: The best value of one sample's value where it differs from ``best`` (the metric's).
    sample_best: float | None = None
    #: The function reads the next tokens from the data (``input_ids``), not the float logits.
    needs_input_ids: bool = False

    def of_mean(self, mean: float) -> float:
        """The metric from the mean of the per-sample values."""
        return self.finish(mean) if self.finish is not None else mean

    @property
    def best_sample(self) -> float:
        """The best value one sample's value can take (what could_reach assumes)."""
        return self.best if self.sample_best is None else self.sample_best


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
        BuiltinMetric("kl", metric_kl, False, best=0.0, worst=math.inf, lm=True),
        BuiltinMetric("top1_agreement", metric_top1_agreement, True, best=1.0, worst=0.0, lm=True),
        BuiltinMetric(
            "perplexity",
            metric_nll,
            False,
            best=1.0,
            worst=math.inf,
            lm=True,
            finish=math.exp,
            sample_best=0.0,
            needs_input_ids=True,
        ),
    )
}
#: The language-model metrics' names.
LM_METRICS = tuple(name for name, m in METRICS.items() if m.lm)
#: Built-in metrics and whether higher is better (a view of :data:`METRICS`).
BUILTIN_METRICS: dict[str, bool] = {name: m.higher_is_better for name, m in METRICS.items()}
#: The built-in names as messages list them: ``"L1, L2, cos, PSNR, SSIM"``.
LISTED = ", ".join(METRICS)
#: Other spellings a config may use for a built-in metric (in any case, as the names).
METRIC_ALIASES = {
    "cosine": "cos",
    "cos_sim": "cos",
    "kl_divergence": "kl",
    "top1": "top1_agreement",
    "agreement": "top1_agreement",
    "ppl": "perplexity",
}


def canonical_metric(name: str) -> str | None:
    """The built-in metric ``name`` stands for (any case, aliases), or None."""
    return canonical_name(name, METRICS, METRIC_ALIASES)


def compute_metric(
    name: str,
    quantized: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray] | None = None,
) -> float:
    """The built-in metric ``name`` of quantized against float outputs, averaged over samples
    (MetricError: missing outputs, mismatched shapes, NaN or inf).

    Example:
        >>> f = {"y": np.array([[1.0, 0.0], [0.0, 2.0]])}
        >>> compute_metric("L1", {"y": np.array([[1.0, 1.0], [0.0, 2.0]])}, f)
        0.25
    """
    return mean_metric(name, metric_per_sample(name, quantized, reference, inputs))


def mean_metric(name: str, values: np.ndarray) -> float:
    """The mean of the per-sample values of ``name``, chunk by chunk (MetricError: not finite)."""
    total = 0.0
    for start in range(0, len(values), _SAMPLES_PER_CHUNK):
        total += float(np.sum(values[start : start + _SAMPLES_PER_CHUNK]))
    value = total / len(values)
    if name in METRICS and math.isfinite(value):
        value = METRICS[name].of_mean(value)
    if not math.isfinite(value):
        raise MetricError(f"{name} is {value}")
    return value


def metric_per_sample(
    name: str,
    quantized: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """The built-in metric ``name`` of each sample, float64 (MetricError as
    :func:`compute_metric`).
    """
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; built-in metrics are {', '.join(METRICS)}")
    if METRICS[name].lm:
        return _lm_per_sample(METRICS[name], quantized, reference, inputs)
    names = list(reference)
    _check_outputs(names, quantized, reference)
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


def _check_outputs(
    names: Sequence[str], quantized: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
) -> None:
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


#: Sequences per chunk of the language-model metrics ([chunk, T, V] in float64 at a time).
_SEQUENCES_PER_CHUNK = 16


def _lm_per_sample(
    metric: BuiltinMetric,
    quantized: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray] | None,
) -> np.ndarray:
    """A language-model metric per sequence, on the logits output alone."""
    logits = logits_output(reference)
    _check_outputs([logits], quantized, reference)
    ids = None
    if metric.needs_input_ids:
        if not inputs or "input_ids" not in inputs:
            raise MetricError(f"{metric.name} reads the next tokens from an input 'input_ids'")
        ids = inputs["input_ids"]
    samples = reference[logits].shape[0]
    parts = []
    for start in range(0, samples, _SEQUENCES_PER_CHUNK):
        stop = min(samples, start + _SEQUENCES_PER_CHUNK)
        q = _lm_rows(quantized[logits], start, stop)
        other = _lm_rows(ids, start, stop, vocab=False) if ids is not None else None
        f = other if other is not None else _lm_rows(reference[logits], start, stop)
        parts.append(np.asarray(metric.function(q, f), dtype=np.float64))
    return np.concatenate(parts)


def metric_interval(
    name: str, values: np.ndarray, level: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """The ``level`` paired-bootstrap interval of ``name`` from per-sample ``values`` (the draws
    depend on the sample count and ``seed`` alone).

    Example:
        >>> low, high = metric_interval("kl", np.array([1.0, 2.0, 3.0, 4.0]))
        >>> 1.0 <= low < 2.5 < high <= 4.0
        True
    """
    values = np.asarray(values, np.float64)
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    means = values[draws].mean(axis=1)
    metric = METRICS[name]
    if metric.finish is not None:
        means = np.array([metric.finish(m) for m in means])
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def lm_scores(
    quantized: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """Every language-model metric with its 95 % interval (perplexity with ``input_ids``)."""
    out: dict[str, float] = {}
    for name in LM_METRICS:
        if METRICS[name].needs_input_ids and (not inputs or "input_ids" not in inputs):
            continue
        values = metric_per_sample(name, quantized, reference, inputs)
        out[name] = mean_metric(name, values)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = metric_interval(name, values)
    return out


def _rows(
    outputs: Mapping[str, np.ndarray], names: Sequence[str], start: int, stop: int, per: bool
) -> np.ndarray:
    if not per:
        return np.concatenate([np.asarray(outputs[n], np.float64).ravel() for n in names])[None]
    parts = [
        np.asarray(outputs[n][start:stop], np.float64).reshape(stop - start, -1) for n in names
    ]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
