"""Ray's usage tag of a run's callbacks, recorded without importing every logger integration.

When a run starts, Ray Tune records which callbacks it was given (``ray.air._internal.usage.
tag_callbacks``, called by ``tune.run``): each callback's class name if it is one of Ray's
built-in loggers, else ``CustomCallback`` or ``CustomLoggerCallback``. To know the built-in
names it imports the MLflow, Weights & Biases, Comet and Aim integrations, which import their
libraries where they are installed: seconds of CPU in every search's driver, for a telemetry
tag. raysearch gives Tune only callbacks of its own (the
user's callbacks and the config's loggers run inside :class:`~raysearch.search.tune._loggers.
TrialLoggers`), none of them a built-in, so :func:`own_callbacks_tagged` records the very tag
Ray would, counted without those imports; any other callback goes to Ray's own function.
``tests/test_library_contracts.py`` checks that Tune still calls that function and that both
record the same tag.

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
    """Within the block, a run given only raysearch's callbacks records Ray's callback tag
    without importing Ray's logger integrations; Ray's own function is back after it."""
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
