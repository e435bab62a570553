"""The float reference past its first batch, computed in a thread while the search starts (a
trial needs it only once quantized): :class:`PendingReference`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from raysearch.data import DataSource
    from raysearch.evaluate import FloatReference

__all__ = ["PendingReference", "deferrable", "first_batch", "first_batch_range"]

_logger = logging.getLogger("raysearch.search")


def deferrable(evaluation: DataSource) -> bool:
    """Whether the rest of the reference can wait: more than one batch, every value finite (a
    float model turning NaN input into NaN is refused at once)."""
    if evaluation.num_batches < 2:
        return False
    for array in evaluation.arrays.values():
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            return False
    return True


def first_batch_range(evaluation: DataSource) -> tuple[int, int]:
    """The rows ``[first, last)`` of the evaluation data's first batch."""
    return next(evaluation.batch_ranges(0, 1))


def first_batch(evaluation: DataSource) -> DataSource:
    """The evaluation data's first batch, as a source of its own."""
    from raysearch.evaluate.subsets import subset

    return subset(evaluation, np.arange(*first_batch_range(evaluation)))


class PendingReference:
    """The float reference of ``model`` on ``evaluation``, computed in a daemon thread started
    now; ``future`` holds it, or the error ``to_error`` made of what the run raised."""

    def __init__(
        self,
        model: str | os.PathLike,
        evaluation: DataSource,
        *,
        threads: int,
        to_error: Callable[[Exception], Exception] = lambda exc: exc,
    ) -> None:
        self.future: Future[FloatReference] = Future()
        self.started = time.perf_counter()
        self.took_s: float | None = None
        #: Set by the search when the reference could not be handed to its trials.
        self.hand_over_error: OSError | None = None
        self._args = (model, evaluation, threads, to_error)
        threading.Thread(target=self._run, name="raysearch-reference", daemon=True).start()

    def stop_on_failure(self, stopper: Any) -> None:
        """End the search (``stopper.end``) once the run fails or its reference cannot be handed
        to the trials."""
        self.future.add_done_callback(
            lambda _: self._failure() is None or stopper.end("float_reference_failed")
        )

    def result(self) -> FloatReference:
        """The reference, once the run has ended; raises the error the search ends with."""
        error = self._failure()
        if error is not None:
            raise error
        return self.future.result()

    def _failure(self) -> BaseException | None:
        return self.future.exception() or self.hand_over_error

    def _run(self) -> None:
        from raysearch.errors import InputError
        from raysearch.evaluate import FloatReference

        model, evaluation, threads, to_error = self._args
        _lower_priority()
        try:
            reference = FloatReference.compute(model, evaluation, threads=threads)
        except InputError as exc:
            self.future.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits for it
            self.future.set_exception(to_error(exc))
        else:
            self.took_s = time.perf_counter() - self.started
            self.future.set_result(reference)


#: The niceness the rest of the float reference runs at (Linux: per thread, inherited).
NICENESS = 10


def _lower_priority() -> None:
    """Lower this thread's CPU priority below Ray's start and the first trials'."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed
        _logger.debug("float reference at normal priority: %s", exc)
