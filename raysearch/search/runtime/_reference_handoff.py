"""How a float reference still being computed on the driver reaches the trials on its node:
:func:`hand_over` (the driver, when its run ends) and :class:`WaitedReference` (a trial).

The search's first trials start while the driver still runs the float model over the
evaluation data (:mod:`raysearch.search._pending_reference`). When that run ends, the driver
saves the reference into the search's cache (``reference/<key>``, where ``raysearch resume``
reads it too) and then writes ``reference/pending.json`` naming it, or holding the one-line
error the run ended with. A trial waits for that file when it first evaluates (calibrating
and quantizing do not need the reference) and memory-maps the arrays, shared by every trial
on the node.

Files, not a Ray actor: an actor takes one of the workers Ray prestarts when the driver
connects (as many as the node's CPUs), and the first trials then wait for new worker
processes. So this is for trials on the driver's node only (a Ray the search started, with no
other node); elsewhere the driver waits for the reference before the trials start.

Example:
    >>> hand_over(cache / "reference", pending.future)  # the driver     # doctest: +SKIP
    >>> WaitedReference(str(cache / "reference"))().latency_ms  # a trial  # doctest: +SKIP
    0.84
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raysearch.errors import EvaluatorError
from raysearch.fileio import atomic_write_text

if TYPE_CHECKING:
    from raysearch.evaluate import FloatReference

__all__ = ["HANDOFF", "WaitedReference", "hand_over"]

#: The file, beside the saved references, that tells the trials where the reference is.
HANDOFF = "pending.json"
#: How often a waiting trial looks for it.
POLL_S = 0.05


@dataclass(frozen=True)
class WaitedReference:
    """What a trial calls for the float reference (``FloatBaseline.reference_source``): waits
    for :data:`HANDOFF` in ``folder`` and loads the reference it names, or raises the error it
    holds."""

    folder: str

    def __call__(self) -> FloatReference:
        from raysearch.evaluate import FloatReference

        handoff = Path(self.folder) / HANDOFF
        while not handoff.is_file():
            time.sleep(POLL_S)
        told = json.loads(handoff.read_text())
        if "error" in told:
            raise EvaluatorError(told["error"])
        return FloatReference.load(Path(self.folder) / told["key"])


def hand_over(folder: str | os.PathLike, future: Future) -> None:
    """Tell the trials what ``future`` (the driver's run of the float model) ended with: the
    reference saved in ``folder`` and named in :data:`HANDOFF`, or its error.

    Raises:
        OSError: the reference or the file could not be written (the caller ends the search).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    error = future.exception()
    if error is not None:
        told = {"error": str(error)}
    else:
        reference = future.result()
        reference.save(folder / reference.key)
        told = {"key": reference.key}
    atomic_write_text(folder / HANDOFF, json.dumps(told))
