"""ONNX Runtime execution providers and sessions for one trial: the CPU, or CUDA when the trial
has a GPU and the provider really loads (probed once, quietly).

Example:
    >>> providers, options, device = execution_providers(gpu_id=None)
    >>> providers, device
    (['CPUExecutionProvider'], 'cpu')
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort

__all__ = [
    "CPU",
    "CUDA",
    "cuda_available",
    "local_device_index",
    "execution_providers",
    "session_providers",
    "provider_names",
    "device_label",
    "session_options",
    "set_threads",
    "make_session",
    "gpu_memory_limit",
]

_logger = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
#: ONNX Runtime's default logger severity (warning), restored after the quiet probe.
_ORT_DEFAULT_SEVERITY = 2

_probe_lock = threading.Lock()
_cuda_ok: bool | None = None


def cuda_available() -> bool:
    """Whether the CUDA provider loads in this process (checked once)."""
    global _cuda_ok
    with _probe_lock:
        if _cuda_ok is None:
            _cuda_ok = _probe_cuda()
        return _cuda_ok


def _probe_cuda() -> bool:
    if CUDA not in ort.get_available_providers():
        return False
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    _preload_cuda_libraries()
    options = ort.SessionOptions()
    options.log_severity_level = 4
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=[CUDA, CPU])
        ok = CUDA in session.get_providers()
    except Exception as exc:  # a broken CUDA install must not break CPU runs
        _logger.debug("CUDA probe failed: %s", exc)
        ok = False
    finally:
        ort.set_default_logger_severity(_ORT_DEFAULT_SEVERITY)
    _logger.debug("CUDA execution provider %s", "loads" if ok else "does not load; using CPU")
    return ok


def _preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the ``nvidia-*`` pip packages, where installed."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:  # onnxruntime older than 1.21
        return
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            preload()
    except Exception as exc:  # a missing library is the probe's answer, not an error
        _logger.debug("onnxruntime.preload_dlls failed: %s", exc)
    if printed.getvalue().strip():
        _logger.debug("onnxruntime.preload_dlls: %s", printed.getvalue().strip())


def local_device_index(gpu_id: int | str) -> int:
    """The CUDA index this process sees for ``gpu_id`` (its place in ``CUDA_VISIBLE_DEVICES``)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    if str(gpu_id) in ids:
        return ids.index(str(gpu_id))
    return int(gpu_id)


def execution_providers(
    gpu_id: int | str | None = None, gpu_mem_limit: int | None = None
) -> tuple[list[str], list[dict[str, Any]], str]:
    """``(providers, provider_options, device_label)`` for GPU ``gpu_id`` (None: CPU)."""
    if gpu_id is None or not cuda_available():
        if gpu_id is not None:
            _logger.info("GPU %s was assigned but CUDA does not load here; running on CPU", gpu_id)
        return [CPU], [{}], "cpu"
    index = local_device_index(gpu_id)
    cuda_options: dict[str, Any] = {"device_id": index}
    if gpu_mem_limit:
        cuda_options["gpu_mem_limit"] = int(gpu_mem_limit)
        # Grow the arena by what is asked, not by doubling, so a trial stays in its share.
        cuda_options["arena_extend_strategy"] = "kSameAsRequested"
    return [CUDA, CPU], [cuda_options, {}], f"cuda:{index}"


def session_providers(
    gpu_id: int | str | None = None, gpu_mem_limit: int | None = None
) -> list[Any]:
    """ONNX Runtime's ``providers`` argument for a trial's sessions, options folded in."""
    providers, options, _ = execution_providers(gpu_id, gpu_mem_limit)
    return [(name, opts) if opts else name for name, opts in zip(providers, options)]


def provider_names(providers: Sequence[Any]) -> list[str]:
    """The names in an ONNX Runtime ``providers`` list."""
    return [p if isinstance(p, str) else str(p[0]) for p in providers]


def device_label(providers: Sequence[Any]) -> str:
    """``"cuda:<id>"``, ``"cpu"``, else the provider's short lower-case name."""
    if not providers:
        return "cpu"
    first = providers[0]
    name = first if isinstance(first, str) else str(first[0])
    if name == CUDA:
        options = {} if isinstance(first, str) else dict(first[1])
        return f"cuda:{int(options.get('device_id', 0))}"
    return name.removesuffix("ExecutionProvider").lower()


def set_threads(options: ort.SessionOptions, threads: int | None) -> None:
    """``threads`` intra-op threads (None: the default) that wait without spinning."""
    if not threads:
        return
    count = max(1, int(threads))
    options.intra_op_num_threads = count
    if count > 1:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")


def session_options(threads: int | None = 1) -> ort.SessionOptions:
    """Session options: ``threads`` intra-op threads, one inter-op, logging kept to errors."""
    options = ort.SessionOptions()
    set_threads(options, threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def make_session(
    model: str | os.PathLike | bytes,
    threads: int | None = 1,
    gpu_id: int | str | None = None,
    *,
    providers: Sequence[Any] | None = None,
) -> ort.InferenceSession:
    """An ``InferenceSession`` for ``model`` on ``providers``, else those of ``gpu_id``."""
    if providers is None:
        providers = session_providers(gpu_id)
    source = model if isinstance(model, bytes) else os.fspath(model)
    return ort.InferenceSession(source, session_options(threads), providers=list(providers))


def _gpu_total_bytes(index: int) -> int | None:
    """Total memory of GPU ``index`` as nvidia-smi reports it (None without nvidia-smi)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return int(float(out.strip().splitlines()[0])) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gpu_memory_limit(gpu_id: int | str | None, fraction: float) -> int | None:
    """The CUDA arena limit for ``fraction`` of a GPU; None when not shared or unknown."""
    if gpu_id is None or not 0 < fraction < 1 or not cuda_available():
        return None
    total = _gpu_total_bytes(local_device_index(gpu_id))
    return None if total is None else int(total * fraction)
