"""Scoring quantized models: built-in metrics, custom evaluators, the tolerance.

A custom evaluator (:class:`raysearch.CustomEvaluator`) returns a float or a dict, whose main
metric is ``metric_key``, else ``"metric"``, else its only key; other numeric keys are
recorded as extra metrics. The float model is scored once with the same function.

Example:
    >>> from raysearch.evaluate import Evaluator
    >>> ev = Evaluator("cos", tolerance=0.999)
    >>> ev.higher_is_better, ev.is_candidate(0.9995), ev.is_candidate(0.99)
    (True, True, False)
"""

from __future__ import annotations

from raysearch.errors import EvaluatorError
from raysearch.evaluate._custom import load_custom_evaluator, takes_providers
from raysearch.evaluate._evaluator import Evaluator, Score
from raysearch.evaluate._reference import FloatReference
from raysearch.evaluate._run import measure_decoder_latency, measure_latency, run_model
from raysearch.metrics import BUILTIN_METRICS, PSNR_CAP_DB, MetricError, compute_metric

__all__ = [
    "BUILTIN_METRICS",
    "PSNR_CAP_DB",
    "MetricError",
    "EvaluatorError",
    "Score",
    "Evaluator",
    "FloatReference",
    "compute_metric",
    "load_custom_evaluator",
    "takes_providers",
    "run_model",
    "measure_latency",
    "measure_decoder_latency",
]
