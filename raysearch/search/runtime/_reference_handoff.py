"""How a float reference still being computed on the driver reaches the trials on its node:
:func:`hand_over` saves it into the search's cache and names it (or the run's error) in
:data:`HANDOFF`, which a trial's :class:`WaitedReference` waits for. Files, not an actor (one
more worker the first trials would wait for), so the driver's node only.
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
    """A trial's float reference: waits for :data:`HANDOFF` in ``folder`` and loads the
    reference it names, or raises the error it holds."""

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
    """Tell the trials what ``future`` (the driver's float run) ended with.

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
