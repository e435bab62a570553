"""What a search says when its output folder's disk is full: where, how much is free, about
how much more it needs there (a model per trial to run, the kept ones, the best, journal
lines, the outputs), and how to go on.

Example:
    >>> _size(3 * 1024 * 1024)
    '3.0 MiB'
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from raysearch.errors import DiskFullError
from raysearch.modelfile import model_size_bytes

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["disk_full_error"]

#: The outputs (summary, results table, plots, TensorBoard) and Ray Tune's experiment state.
_OUTPUTS = 2 * 1024 * 1024
_JOURNAL_LINE = 4 * 1024


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def disk_full_error(
    folder: Path, config: SearchConfig, finished: int, expected: int | None
) -> DiskFullError:
    """The one-line error for a search in ``folder`` stopped by a full disk after
    ``finished`` trials of ``expected`` (None: no fixed number)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = 0
    try:
        model = model_size_bytes(os.fspath(config.model)) or 0
    except (OSError, TypeError, ValueError):
        model = 0
    left = max(0, expected - finished) if expected else None
    limit = config.keep_candidates  # None: every candidate
    kept = (left or 1) if limit is None else max(1, min(limit, left or limit))
    need = model * (1 + kept) + _JOURNAL_LINE * (left or 1) + _OUTPUTS
    trials = "the outputs" if left == 0 else f"{left or 'the'} trials to run"
    return DiskFullError(
        f"{folder}: no space left on its disk ({_size(free)} free); the search stopped with "
        f"{finished} trials recorded, and needs about {_size(need)} more there ({trials}, "
        f"models of {_size(model)}): free space, then `raysearch resume {folder}`"
    )
