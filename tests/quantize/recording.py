"""Recording which execution providers ONNX Runtime sessions are created with.

:func:`record_sessions` wraps ``onnxruntime.InferenceSession``: the wrapper records the
providers (options included) and then creates the real session. Without a GPU, a session asked
for CUDA runs on the CPU (ONNX Runtime falls back), but what it was asked for is recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import onnxruntime as ort

from raysearch.providers import cuda_available

__all__ = ["GPU_PROVIDERS", "normalized", "record_sessions"]

#: What ``session_providers(gpu_id=0, gpu_mem_limit=1 GiB)`` gives where CUDA loads.
GPU_PROVIDERS: list[Any] = [
    (
        "CUDAExecutionProvider",
        {"device_id": 0, "gpu_mem_limit": 1 << 30, "arena_extend_strategy": "kSameAsRequested"},
    ),
    "CPUExecutionProvider",
]


def normalized(providers: Any, provider_options: Any = None) -> list[tuple[str, dict]] | None:
    """``providers`` (and ``provider_options``) as ONNX Runtime reads them: ``[(name, {option:
    str(value)})]``, so that the two ways of passing options compare equal."""
    if providers is None:
        return None
    result = []
    for i, entry in enumerate(providers):
        name, options = (entry, {}) if isinstance(entry, str) else (entry[0], dict(entry[1]))
        if provider_options:
            options.update(provider_options[i])
        result.append((name, {k: str(v) for k, v in options.items()}))
    return result


@contextmanager
def record_sessions() -> Iterator[list[Any]]:
    """The normalized providers of every ``InferenceSession`` created inside the block."""
    cuda_available()  # the process-wide CUDA probe, before recording starts
    created: list[Any] = []

    class Recording(ort.InferenceSession):
        def __init__(
            self,
            path_or_bytes: Any,
            sess_options: Any = None,
            providers: Any = None,
            provider_options: Any = None,
            **kwargs: Any,
        ) -> None:
            created.append(normalized(providers, provider_options))
            super().__init__(path_or_bytes, sess_options, providers, provider_options, **kwargs)

    original = ort.InferenceSession
    ort.InferenceSession = Recording  # what ONNX Runtime's calibrator and raysearch look up
    # Without CUDA, ONNX Runtime prints a loader error for each session that asks for it.
    ort.set_default_logger_severity(4)
    try:
        yield created
    finally:
        ort.InferenceSession = original
        ort.set_default_logger_severity(2)
