"""Ray's usage tag of a run's callbacks, recorded without the MLflow, W&B, Comet and Aim
imports of Ray Tune's ``tag_callbacks`` when every callback is raysearch's own.

Example:
    >>> with own_callbacks_tagged():
    ...     pass                        # tuner.fit() here records the tag without the imports
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["own_callbacks_tagged", "own_callback_counts"]


def own_callback_counts(callbacks: Sequence[Any]) -> dict[str, int] | None:
    """The tag's counts for ``callbacks`` when all are raysearch's own (None otherwise): what
    Ray's ``_count_callbacks`` gives a callback that is not one of its built-ins."""
    from ray.tune import Callback
    from ray.tune.logger import LoggerCallback

    if not all(
        isinstance(c, Callback) and type(c).__module__.startswith("raysearch.") for c in callbacks
    ):
        return None
    return dict(
        Counter(
            "CustomLoggerCallback" if isinstance(c, LoggerCallback) else "CustomCallback"
            for c in callbacks
        )
    )


@contextlib.contextmanager
def own_callbacks_tagged() -> Iterator[None]:
    """Within the block, a run given only raysearch's callbacks records Ray's tag so."""
    from ray.air._internal import usage

    ray_tag_callbacks = usage.tag_callbacks

    def tag_callbacks(callbacks: Sequence[Any] | None) -> bool:
        counts = own_callback_counts(callbacks or [])
        if not callbacks or counts is None:
            return ray_tag_callbacks(callbacks)
        usage.record_extra_usage_tag(usage.TagKey.AIR_CALLBACKS, json.dumps(counts))
        return True

    usage.tag_callbacks = tag_callbacks
    try:
        yield
    finally:
        usage.tag_callbacks = ray_tag_callbacks
