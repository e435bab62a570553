"""What one trial produced (:class:`TrialResult`): its status, metric, timings and figures."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["TrialResult"]


@dataclass
class TrialResult:
    """What one trial produced. ``status`` is ``"ok"`` or ``"failed"`` (then ``error`` says
    why, in one line, and ``metric`` is None)."""

    status: str
    metric: float | None = None
    is_candidate: bool = False
    #: What the search's sampler optimises (:meth:`Evaluator.sampler_objective`): the metric,
    #: moved past every non-candidate by the quantized share for a candidate.
    objective: float | None = None
    error: str | None = None
    duration_s: float = 0.0
    calibration_s: float = 0.0
    quantization_s: float = 0.0
    evaluation_s: float = 0.0
    calib_cache_hit: bool = False
    model_path: str | None = None
    model_size_bytes: int | None = None
    latency_ms: float | None = None
    #: A language-model metric's trial: the median latency of a one-token decode step
    #: (``input_ids [1, 1]``, empty past) and of a prefill of ``min(128, the data's sequence
    #: length)`` tokens; None otherwise, or when latency is not measured.
    decode_latency_ms: float | None = None
    prefill_latency_ms: float | None = None
    device: str = "cpu"
    extra: dict[str, float] = field(default_factory=dict)
    #: Rows of the sensitivity rankings computed for this trial (the search writes them to
    #: ``sensitivity.parquet``); None when none was.
    sensitivity: list[dict[str, Any]] | None = None
    #: Evaluation on growing subsets (:class:`StagedTrial`): the rows the metric is over
    #: (None when raysearch does not see them: a custom evaluator), their share of all rows,
    #: the rung reached (0-based) of ``rungs``, and whether a partial result could still
    #: become a candidate.
    eval_rows: int | None = None
    eval_fraction: float | None = None
    rung: int = 0
    rungs: int = 1
    could_be_candidate: bool = False
    #: The standard error of a partial metric (the per-row values' mean over the rows seen,
    #: finite-population corrected); None on the last rung and for a custom evaluator.
    rung_error: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (NaN and inf become None)."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None
        return data
