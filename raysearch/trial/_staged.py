"""One trial's quantized model, evaluated rung by rung: :class:`StagedTrial`.

Each :meth:`StagedTrial.step` evaluates the next rung (a growing prefix of a fixed shuffled
order of the evaluation rows, :mod:`raysearch.evaluate.subsets`) with the session of the rungs
before, and returns the result so far; without rungs, one step over every row. A result before
the last rung has the metric over the rows seen, is never a candidate, and says whether it
could still become one (``could_be_candidate``). A setting that keeps every MatMul/Gemm/Conv
float is never a candidate (``extra`` ``quantizes_nothing``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from raysearch.errors import is_disk_full
from raysearch.evaluate import MetricError, Score, run_model
from raysearch.evaluate.subsets import GrowingOutputs, could_reach, mean_error, sliced, subset
from raysearch.metrics import METRICS, mean_metric, metric_per_sample
from raysearch.modelgraph import quantizes_nothing
from raysearch.providers import make_session
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    import numpy as np

    from raysearch.evaluate import FloatReference
    from raysearch.evaluate.subsets import EvalRungs

__all__ = ["StagedTrial", "TrialEngine", "decide_complete", "guard", "one_line"]

# The trial engine's logger, the name users filter on.
_logger = logging.getLogger("raysearch.trial._runner")


def decide_complete(
    evaluator: Any, metric: float, float_score: float | None, share: float | None, weighted: int
) -> tuple[bool, dict[str, float]]:
    """Whether a trial evaluated on every row is a candidate, and its ``extra`` flags: the one
    rule. A setting that quantizes nothing is never one (``within_tolerance`` says the rest).

    Example:
        >>> from raysearch.evaluate import Evaluator
        >>> ev = Evaluator("L2", tolerance=0.01)
        >>> decide_complete(ev, 0.005, None, 0.5, 4), decide_complete(ev, 0.005, None, 0.0, 4)
        ((True, {}), (False, {'quantizes_nothing': 1.0, 'within_tolerance': 1.0}))
    """
    met = bool(evaluator.is_candidate(metric, float_score))
    if quantizes_nothing(share, weighted):
        return False, {"quantizes_nothing": 1.0, "within_tolerance": float(met)}
    return met, {}


class TrialEngine(Protocol):
    """The trial engine as the Ray trainable and a :class:`StagedTrial` use it."""

    evaluator: Any
    evaluation: Any
    providers: list[str]
    session_providers: list[Any]
    threads: int
    measure_latency: bool
    #: The slowest decode step, in ms, a candidate may take (None: no bound).
    max_decode_latency_ms: float | None
    #: A candidate's model is at most this many bytes (``size_budget``; None: no bound).
    max_model_size_bytes: int | None
    #: The rungs a trial is evaluated on (None: every row at once).
    rungs: EvalRungs | None
    #: Scores a technique's settings with helper processes (None: the trial alone).
    score_pool: Callable[..., list[float | None]] | None

    @property
    def weighted_node_count(self) -> int: ...

    def start(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> StagedTrial:
        """Quantize; the trial, evaluated rung by rung by ``step()``; never raises for a setting."""
        ...

    def latency(self, model_path: Any) -> float | None: ...

    def decoder_latency(self, model_path: Any, session: Any = None) -> dict[str, float]: ...

    def trial_extra(
        self, extra: dict[str, float], share: float | None, latency: float | None
    ) -> dict[str, float]: ...

    def partial_float_score(self, fraction: float) -> float: ...

    def close(self) -> None:
        """Release what the engine holds (the actor is going away)."""
        ...


class StagedTrial:
    """A quantized model and its evaluation so far."""

    def __init__(
        self, runner: TrialEngine, result: TrialRecord, out_path: Path, rungs: EvalRungs | None
    ) -> None:
        self.runner = runner
        self.result = result
        self.out_path = out_path
        self.rungs = rungs
        self.quantized = False
        self.done = False
        self.reference: FloatReference | None = None
        self.float_score: float | None = None
        self.share: float | None = None
        self.extra: dict[str, float] = {}
        self.started = time.perf_counter()
        #: The next rung to evaluate.
        self.rung = 0
        self._session: Any = None
        self._outputs = GrowingOutputs()
        self._closed = False
        self._latencies: list[float] = []
        #: A built-in metric's value on each row seen, at the last partial rung.
        self._values: np.ndarray | None = None

    @property
    def n_rungs(self) -> int:
        return 1 if self.rungs is None else len(self.rungs)

    def step(self) -> TrialRecord:
        """Evaluate the next rung; the result so far (complete once :attr:`done`)."""
        if not self.quantized:
            self.done = True
        if not self.done:
            guard(self, self._evaluate)
            if self.result.status != "ok":
                self.done = True
        if self.done:
            self.close()
        return self.result

    def finish(self) -> TrialRecord:
        """Every rung left; the trial's complete result."""
        while not self.done:
            self.step()
        return self.result

    def close(self) -> None:
        """Let go of the session and outputs at the trial's end and collect their garbage."""
        if self._closed:
            return
        self._closed = True
        self._session = None
        self._outputs = GrowingOutputs()
        gc.collect()

    def _evaluate(self) -> None:
        runner = self.runner
        evaluator = runner.evaluator
        k, last = self.rung, self.rung == self.n_rungs - 1
        fraction = 1.0 if last or self.rungs is None else self.rungs.fraction(k)
        started = time.perf_counter()
        try:
            if evaluator.needs_reference:
                score, latency = self._builtin(k, last), self._batch_latency()
            else:
                fraction_arg = None if last else fraction
                score = evaluator.score_model(
                    self.out_path, runner.providers, fraction=fraction_arg
                )
                latency = runner.latency(self.out_path) if last and runner.measure_latency else None
            # A language model's decode step and prefill, timed once, on the whole trial.
            decoder = runner.decoder_latency(self.out_path, self._session) if last else {}
        finally:
            spent = time.perf_counter() - started
            self.result = self.result.replace(evaluation_s=(self.result.evaluation_s or 0) + spent)
        float_score = self.float_score if last else self._partial_float_score(fraction)
        extra = runner.trial_extra({**self.extra, **score.extra}, self.share, latency)
        if "anchor_decode_latency_ms" in decoder:  # the bound's model, timed in turn with it
            extra["builder_decode_latency_ms"] = decoder["anchor_decode_latency_ms"]
        self.result = self.result.replace(
            metric=score.metric,
            extra=extra,
            latency_ms=latency,
            decode_latency_ms=decoder.get("decode_latency_ms"),
            prefill_latency_ms=decoder.get("prefill_latency_ms"),
            rung=k,
            rungs=self.n_rungs,
            eval_fraction=fraction,
            eval_rows=self._rows(k, last),
            objective=evaluator.sampler_objective(
                score.metric, float_score, self.share, runner.weighted_node_count
            ),
        )
        self._decide(score.metric, float_score, last)
        self.result = self.result.replace(status="ok")
        self.rung += 1
        self.done = last

    def _builtin(self, k: int, last: bool) -> Score:
        runner = self.runner
        evaluator, data = runner.evaluator, runner.evaluation
        assert data is not None and self.reference is not None
        if self._session is None:
            self._session = make_session(
                self.out_path, runner.threads, providers=runner.session_providers
            )
        rungs = self.rungs
        if rungs is None or rungs.order is None:  # every row at once, in the data's order
            outputs, latencies = run_model(self._session, data)
            self._latencies += latencies
            return evaluator.score(outputs=outputs, reference=self.reference, inputs=data.arrays)
        outputs, latencies = run_model(self._session, subset(data, rungs.rows(k)))
        self._outputs.add(outputs)
        self._latencies += latencies
        if last:  # every row back in the data's order: the metric of a trial evaluated whole
            full = self._outputs.in_order(rungs.order)
            return evaluator.score(outputs=full, reference=self.reference, inputs=data.arrays)
        assert rungs.sizes is not None
        rows = rungs.order[: rungs.sizes[k]]
        seen = sliced(self.reference, rows)
        inputs = {name: array[rows] for name, array in data.arrays.items()}
        self._values = metric_per_sample(evaluator.name, self._outputs.prefix(), seen, inputs)
        return Score(mean_metric(evaluator.name, self._values))

    def _batch_latency(self) -> float | None:
        """The median batch latency so far (without the first, warm-up, batch)."""
        if not self.runner.measure_latency or not self._latencies:
            return None
        timed = self._latencies[1:] if len(self._latencies) > 2 else self._latencies
        return float(sorted(timed)[len(timed) // 2])

    def _rows(self, k: int, last: bool) -> int | None:
        if self.rungs is not None and self.rungs.sizes is not None:
            return self.rungs.sizes[k]
        data = self.runner.evaluation
        if not last or data is None or not self.runner.evaluator.needs_reference:
            return None  # a custom evaluator's rows are its own
        return len(data)

    def _partial_float_score(self, fraction: float) -> float | None:
        """A custom evaluator's float score on the same rows (None for built-ins)."""
        if not self.runner.evaluator.is_custom:
            return None
        return self.runner.partial_float_score(fraction)

    def _decide(self, metric: float, float_score: float | None, last: bool) -> None:
        """Whether the result so far is a candidate and could become one (the one place,
        each rung).
        """
        result, evaluator = self.result, self.runner.evaluator
        extra, rung_error = dict(result.extra), None
        weighted = self.runner.weighted_node_count
        if last:
            candidate, flags = decide_complete(evaluator, metric, float_score, self.share, weighted)
            bound = extra.get("builder_decode_latency_ms", self.runner.max_decode_latency_ms)
            decode = result.decode_latency_ms
            if bound is not None and decode is not None and decode > bound:
                flags["decode_over_bound"] = 1.0  # within the tolerance, too slow to decode
                candidate = False
            budget, size = self.runner.max_model_size_bytes, result.model_size_bytes
            if budget is not None and size is not None and size > budget:
                flags["size_over_budget"] = 1.0  # within the tolerance, larger than allowed
                candidate = False
            extra.update(flags)
            could = candidate
        elif quantizes_nothing(self.share, weighted):
            extra["quantizes_nothing"] = 1.0
            candidate = could = False
        else:
            candidate = False  # decided on every row, never on some
            could = self._could_be_candidate(metric, float_score)
            rung_error = self._rung_error()
        self.result = result.replace(
            is_candidate=candidate, could_be_candidate=could, extra=extra, rung_error=rung_error
        )

    def _rung_error(self) -> float | None:
        """The standard error of the metric on the rows seen (None for a custom evaluator)."""
        rungs = self.rungs
        if self.runner.evaluator.is_custom or rungs is None or rungs.sizes is None:
            return None
        if self._values is None:
            return None
        error = mean_error(self._values, rungs.sizes[-1])
        return error if math.isfinite(error) else None

    def _could_be_candidate(self, metric: float, float_score: float | None) -> bool:
        evaluator = self.runner.evaluator
        if evaluator.tolerance is None:
            return False
        if evaluator.is_custom:
            # No bound on a custom metric: a setting within the tolerance on the rows seen.
            return evaluator.is_candidate(metric, float_score)
        rungs = self.rungs
        assert rungs is not None and rungs.sizes is not None and self._values is not None
        metric = METRICS[evaluator.name]
        return could_reach(
            self._values,
            rungs.sizes[-1],
            best=metric.best_sample,
            higher_is_better=evaluator.higher_is_better,
            # the per-sample values' mean is the metric once finished (perplexity: exp)
            meets=lambda mean: evaluator.is_candidate(metric.of_mean(mean)),
        )


def one_line(exc: BaseException) -> str:
    """``"Type: first line of the message"`` in at most 300 characters."""
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    if isinstance(exc, (MetricError, ValueError)) and message:
        line = message
    else:
        line = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def guard(trial: StagedTrial, work: Callable[[], None]) -> None:
    """Run one part of ``trial``; what it raises (but ``MemoryError``, a full disk) fails it
    in one line. The duration is brought up to date either way.
    """
    try:
        work()
    except MemoryError:
        raise
    except Exception as exc:  # a trial reports its failure; the search goes on
        if is_disk_full(exc):  # the disk's fault, not the setting's: the search stops
            raise
        trial.done = True
        trial.close()
        if trial.result.model_path is not None:  # keep no half-useful model on disk
            with contextlib.suppress(OSError):
                trial.out_path.unlink()
        trial.result = trial.result.replace(
            status="failed",
            metric=None,
            objective=None,
            is_candidate=False,
            could_be_candidate=False,
            error=one_line(exc),
            model_path=None,
        )
        _logger.info("trial failed: %s", trial.result.error)
        _logger.debug("trial failure", exc_info=True)
    finally:
        trial.result = trial.result.replace(duration_s=time.perf_counter() - trial.started)
