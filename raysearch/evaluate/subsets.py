"""Evaluation on growing subsets: rung ``k`` evaluates ``order[sizes[k-1]:sizes[k]]`` of one
seeded order (a custom evaluator with ``fraction`` gets the rung's), and whether a partly
evaluated setting can still be a candidate.

Example:
    >>> rungs = EvalRungs((0.1, 0.33, 1.0), sizes=(50, 165, 500),
    ...                   order=np.random.default_rng(0).permutation(500))
    >>> len(rungs), len(rungs.rows(1)), rungs.fraction(1)
    (3, 115, 0.33)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.evaluate._evaluator import Evaluator
    from raysearch.evaluate._reference import FloatReference

__all__ = [
    "EvalRungs",
    "plan_rungs",
    "could_reach",
    "CANDIDATE_Z",
    "TIE_Z",
    "mean_error",
    "subset",
    "sliced",
    "GrowingOutputs",
]


@dataclass(frozen=True)
class EvalRungs:
    """The rungs of a trial's evaluation: ``fractions`` of the rows, the rows after each rung
    (``sizes``) in a fixed ``order``, and ASHA's ``reduction_factor``.
    """

    fractions: tuple[float, ...]
    sizes: tuple[int, ...] | None = None
    order: np.ndarray | None = None
    reduction_factor: float = 3.0

    def __len__(self) -> int:
        return len(self.sizes) if self.sizes is not None else len(self.fractions)

    def rows(self, k: int) -> np.ndarray:
        """The rows (indices into the evaluation data) rung ``k`` adds."""
        assert self.sizes is not None and self.order is not None
        first = self.sizes[k - 1] if k else 0
        return self.order[first : self.sizes[k]]

    def fraction(self, k: int) -> float:
        """The share of the rows evaluated once rung ``k`` is done (in whole batches)."""
        if self.sizes is None:
            return self.fractions[k]
        return round(self.sizes[k] / self.sizes[-1], 6)

    def describe(self) -> dict[str, Any]:
        """What ``summary.json`` says of the rungs."""
        out: dict[str, Any] = {
            "rungs": list(self.fractions),
            "reduction_factor": self.reduction_factor,
        }
        if self.sizes is not None:
            out["rung_rows"] = list(self.sizes)
        return out


def _granularity(data: DataSource) -> int:
    """Rows a rung must be a multiple of: the model's static batch, else 1."""
    first = data.inputs[0]
    static = not data.sample_is_feed and bool(first.shape) and isinstance(first.shape[0], int)
    return data.samples_per_batch if static else 1


def _sizes(fractions: Sequence[float], n: int, granularity: int) -> tuple[int, ...]:
    sizes: list[int] = []
    for fraction in fractions[:-1]:
        size = max(granularity, round(fraction * n / granularity) * granularity)
        if size < n and (not sizes or size > sizes[-1]):
            sizes.append(size)
    return (*sizes, n)


def plan_rungs(
    fractions: Sequence[float],
    *,
    evaluator: Evaluator,
    evaluation: DataSource | None,
    reference: FloatReference | None,
    seed: int,
    min_rows: int,
    reduction_factor: float,
    reference_rows: int | None = None,
) -> tuple[EvalRungs | None, str | None]:
    """The rungs of this search's evaluation, or None and why every row is evaluated at once
    (built-in metrics: whole static batches in a seeded order; custom: with ``fraction``).
    """
    if evaluator.is_custom:
        if not evaluator.accepts_fraction:
            return None, "the custom evaluator takes no 'fraction' argument: evaluated whole"
        return EvalRungs(tuple(fractions), reduction_factor=reduction_factor), None
    if evaluation is None or reference is None:
        return None, "no evaluation data"
    n = len(evaluation)
    outputs = reference.outputs.values()
    rows = n if reference_rows is None else reference_rows
    if any(value.ndim == 0 or value.shape[0] != rows for value in outputs):
        return None, "the model's outputs have no axis of evaluation rows"
    sizes = _sizes(fractions, n, _granularity(evaluation))
    if len(sizes) < 2:
        return None, f"{n} evaluation rows are too few to split"
    if sizes[0] < min_rows:
        return None, (
            f"the first rung would evaluate {sizes[0]} of {n} rows, fewer than "
            f"early_stopping.min_rows ({min_rows})"
        )
    order = np.random.default_rng(seed).permutation(n)
    return EvalRungs(tuple(fractions), sizes, order, reduction_factor), None


#: How many standard errors from the tolerance a partly evaluated metric must be before its
#: setting no longer counts as one that could become a candidate (the rows seen are a
#: uniform sample, without replacement, of all the rows).
CANDIDATE_Z = 4.0
#: How many standard errors below a rung's cutoff a partly evaluated setting's mean must be
#: before early stopping stops it: a near-tie on a tenth of the rows is not a ranking.
TIE_Z = 2.0


def could_reach(
    values: np.ndarray,
    total: int,
    *,
    best: float,
    higher_is_better: bool,
    meets: Callable[[float], bool],
) -> bool:
    """Whether a metric whose first (uniformly sampled) rows of ``total`` score ``values`` could
    still meet the tolerance: not if the rest scoring ``best`` would not bring it there, or its
    mean is :data:`CANDIDATE_Z` standard errors on the wrong side.

    Example:
        >>> meets = lambda m: m >= 0.999
        >>> could_reach(np.full(50, 0.95), 500, best=1.0, higher_is_better=True, meets=meets)
        False
    """
    n = len(values)
    mean = float(np.mean(values)) if n else math.nan
    if not math.isfinite(mean):
        return False
    fraction = n / total
    if not meets(fraction * mean + (1.0 - fraction) * best):
        return False
    error = mean_error(values, total)
    return meets(mean + CANDIDATE_Z * error if higher_is_better else mean - CANDIDATE_Z * error)


def mean_error(values: np.ndarray, total: int) -> float:
    """The finite-population standard error of the mean of ``values`` out of ``total`` rows.

    Example:
        >>> round(mean_error(np.array([0.99, 1.0] * 25), 500), 6)
        0.000678
    """
    n = len(values)
    if n < 2:
        return math.inf
    spread = float(np.std(values, ddof=1))
    return spread / math.sqrt(n) * math.sqrt(max(0.0, 1.0 - n / total))


def subset(data: DataSource, rows: np.ndarray) -> DataSource:
    """The samples ``rows`` of ``data`` (in that order), batched as ``data``."""
    from raysearch.data import DataSource

    arrays = {name: np.asarray(array[rows]) for name, array in data.arrays.items()}
    return DataSource(arrays, data.inputs, data.batch_size, label=data.label)


class GrowingOutputs:
    """A model's outputs on the rows of each rung so far, in the rungs' order.

    Example:
        >>> grown = GrowingOutputs()
        >>> grown.add({"y": np.array([[3.0], [1.0]])}); grown.add({"y": np.array([[2.0]])})
        >>> grown.in_order(np.array([2, 0, 1]))["y"].ravel().tolist()
        [1.0, 2.0, 3.0]
    """

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, outputs: Mapping[str, np.ndarray]) -> None:
        for name, value in outputs.items():
            self._parts.setdefault(name, []).append(np.asarray(value))

    def prefix(self) -> dict[str, np.ndarray]:
        """Every output over the rows evaluated so far, in evaluation order."""
        joined = {name: np.concatenate(parts, axis=0) for name, parts in self._parts.items()}
        self._parts = {name: [value] for name, value in joined.items()}
        return joined

    def in_order(self, order: np.ndarray) -> dict[str, np.ndarray]:
        """Every output with its rows put back where ``order`` took them from (all rows)."""
        out = {}
        for name, value in self.prefix().items():
            placed = np.empty_like(value)
            placed[order] = value
            out[name] = placed
        return out


def sliced(reference: FloatReference, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The float reference's outputs on ``rows``, in that order."""
    return {name: np.asarray(value[rows]) for name, value in reference.outputs.items()}
