"""Non-finite activations: which values calibration takes in, and the log of those it drops.

NaN, +-inf and +-the float type's largest value (what additive attention masks hold:
``-inf``, or ``torch.finfo(float32).min`` in Hugging Face models) are left out of ranges and
histograms, and their count is logged. Without that, a masked tensor's range is infinite:
MinMax gives infinite scales and every histogram method fails.

Example:
    >>> usable(np.array([1.0, np.inf, np.nan, np.finfo(np.float32).min], np.float32)).tolist()
    [True, False, False, False]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

__all__ = ["usable", "log_dropped"]

# The public module's logger: users (and tests) configure "raysearch.quantize.calibration._cache".
_logger = logging.getLogger("raysearch.quantize.calibration._cache")


def usable(values: np.ndarray) -> np.ndarray:
    """Which values calibration takes in: finite and below the type's largest magnitude (masks)."""
    return np.abs(values) < np.finfo(values.dtype).max  # False for NaN and +-inf too


def log_dropped(dropped: Mapping[str, int]) -> None:
    """Log how many values of which tensors calibration left out (nothing when none)."""
    counts = {name: n for name, n in dropped.items() if n}
    if not counts:
        return
    listed = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{name} ({n})" for name, n in listed[:5])
    more = f" and {len(listed) - 5} more" if len(listed) > 5 else ""
    _logger.info(
        "calibration left out %d non-finite values (NaN, inf or the float type's largest "
        "magnitude, as attention masks hold) of %d tensors: %s%s",
        sum(counts.values()),
        len(counts),
        shown,
        more,
    )
