"""NNCF in a trial's process: imported with telemetry off and logging routed
(:func:`import_nncf`); its ONNX inference, which hard-codes the CPU and every core, moved to
the trial's providers and threads (:func:`nncf_session`); the model and data as both NNCF
backends hand them to it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from raysearch.modelfile import has_external_data
from raysearch.providers import session_options, session_providers
from raysearch.quantize.registry import QuantizerBackend

if TYPE_CHECKING:
    import onnx

    from raysearch.data import DataSource
    from raysearch.quantize.calibration import CalibrationCache

__all__ = [
    "NncfModelBackend",
    "EngineTime",
    "NNCF_EXTRA",
    "import_nncf",
    "nncf_session",
    "missing_nncf",
    "prepare_model",
    "calibration_items",
    "nncf_dataset",
    "save_model",
]

_logger = logging.getLogger(__name__)
# One NNCF call at a time per process: the engine swap is process-wide.
_SESSION_LOCK = threading.Lock()
#: What installs NNCF with raysearch.
NNCF_EXTRA = "raysearch[nncf]"
#: The first opset whose DequantizeLinear takes an ``axis`` (per-channel weights).
_PER_CHANNEL_OPSET = 13


def missing_nncf(backend: str = "nncf") -> str | None:
    """Why ``quantizer: <backend>`` cannot run here (NNCF not installed), looked up unimported."""
    if importlib.util.find_spec("nncf") is not None:
        return None
    return f"quantizer {backend} needs OpenVINO NNCF: pip install '{NNCF_EXTRA}'"


@functools.cache
def import_nncf() -> ModuleType:
    """The ``nncf`` module, telemetry off, logging routed (ImportError names
    ``raysearch[nncf]``).
    """
    reason = missing_nncf()
    if reason:
        raise ImportError(reason)
    # A None entry makes ``import openvino_telemetry`` raise ImportError, so NNCF uses its
    # stub; an entry OpenVINO imported already is put back afterwards.
    previous = sys.modules.get("openvino_telemetry")
    sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]
    try:
        import nncf
        import nncf.telemetry
        from nncf.telemetry import decorator, wrapper
    finally:
        if previous is None:
            del sys.modules["openvino_telemetry"]
        else:
            sys.modules["openvino_telemetry"] = previous
    if not isinstance(wrapper.telemetry, wrapper.NNCFTelemetryStub):
        # NNCF was imported before raysearch, with its client: every name NNCF calls it by
        # gets the stub before a call could send an event.
        stub = wrapper.NNCFTelemetryStub()
        wrapper.telemetry = decorator.telemetry = nncf.telemetry.telemetry = stub
    nncf_log = logging.getLogger("nncf")
    for handler in list(nncf_log.handlers):
        nncf_log.removeHandler(handler)
    nncf_log.propagate = True
    # Its INFO notes (unknown edge shapes, per step) repeat on every trial of a search.
    nncf_log.setLevel(logging.WARNING)
    _logger.debug("imported NNCF %s with its telemetry off", nncf.__version__)
    return nncf


@dataclass
class EngineTime:
    """NNCF's ONNX Runtime time: ``sessions`` built and ``inferences`` run, with their seconds."""

    sessions: int = 0
    session_s: float = 0.0
    inferences: int = 0
    inference_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.session_s + self.inference_s


@contextlib.contextmanager
def nncf_session(providers: Sequence[Any], threads: int = 1) -> Iterator[EngineTime]:
    """Inside the block, NNCF's engine runs timed on ``providers`` and ``threads``, bars muted."""
    import_nncf()
    from nncf.onnx import engine as engine_module

    timing = EngineTime()
    original = engine_module.ONNXEngine
    trial_engine = _engine_class(original, list(providers), threads, timing)
    with _SESSION_LOCK, _quiet_progress():
        # NNCF's EngineFactory imports ONNXEngine from this module on every call.
        engine_module.ONNXEngine = trial_engine
        try:
            yield timing
        finally:
            engine_module.ONNXEngine = original


def _engine_class(base: type, providers: list[Any], threads: int, timing: EngineTime) -> type:
    """A subclass of NNCF's ``ONNXEngine`` whose sessions use ``providers`` and ``threads``."""
    import onnxruntime as ort
    from nncf.onnx.graph.model_metadata import MetadataKey, get_metadata

    class TrialSessionEngine(base):  # type: ignore[misc, valid-type]
        def __init__(self, model: Any, **_: Any) -> None:
            start = time.perf_counter()
            options = session_options(threads)
            folder = get_metadata(model, MetadataKey.EXTERNAL_DATA_DIR)
            if folder:
                options.add_session_config_entry(
                    "session.model_external_initializers_file_folder_path", folder
                )
            self.sess = ort.InferenceSession(
                model.SerializeToString(), options, providers=providers
            )
            self.input_names = {i.name for i in self.sess.get_inputs()}
            timing.sessions += 1
            timing.session_s += time.perf_counter() - start

        def infer(self, input_data: dict[str, Any]) -> dict[str, Any]:
            start = time.perf_counter()
            try:
                return super().infer(input_data)
            finally:
                timing.inferences += 1
                timing.inference_s += time.perf_counter() - start

    return TrialSessionEngine


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Mute rich's global console, where NNCF's ``track`` draws progress bars, for the call."""
    from rich import get_console

    console = get_console()
    before = console.quiet
    console.quiet = True
    try:
        yield
    finally:
        console.quiet = before


def prepare_model(path: str | os.PathLike) -> onnx.ModelProto:
    """The float model as NNCF gets it: ``Constant`` weights as initializers, opset 13 at least."""
    import onnx

    from raysearch.modelgraph import constants_to_initializers

    model = onnx.load(os.fspath(path), load_external_data=not has_external_data(path))
    # NNCF 3.4 reads the type of a Cast's input from the value infos, which an initializer
    # lacks (AttributeError): Constants read by a Cast stay nodes.
    constants_to_initializers(model, keep_inputs_of=("Cast",))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _PER_CHANNEL_OPSET:
        model = onnx.version_converter.convert_version(model, _PER_CHANNEL_OPSET)
        _logger.info("opset %d raised to %d for per-channel weights", opset, _PER_CHANNEL_OPSET)
    return model


def calibration_items(data: DataSource) -> list[dict[str, Any]]:
    """One feed per calibration sample (NNCF averages per-item ranges); views, not copies."""
    first = data.inputs[0]
    static = bool(first.shape) and isinstance(first.shape[0], int)
    if data.sample_is_feed or static:
        return list(data.batches())
    return [
        {name: array[i : i + 1] for name, array in data.arrays.items()} for i in range(len(data))
    ]


def nncf_dataset(data: DataSource) -> Any:
    """``data`` as an ``nncf.Dataset`` of per-sample feeds (views of its arrays)."""
    return import_nncf().Dataset(calibration_items(data))


def save_model(model: onnx.ModelProto, path: str | os.PathLike, external: bool) -> None:
    """Write NNCF's model to ``path``; with ``external``, its weights to ``<file name>.data``."""
    import onnx

    path = os.fspath(path)
    if external:
        location = os.path.basename(path) + ".data"
        onnx.save_model(model, path, save_as_external_data=True, location=location)
    else:
        onnx.save_model(model, path)


class NncfModelBackend(QuantizerBackend):
    """What both NNCF backends build once per process: NNCF, the providers and the model."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        calibration: DataSource | None,
        cache: CalibrationCache | None = None,
        **options: Any,
    ) -> None:
        # ``cache`` is ONNX Runtime's calibration cache: NNCF collects its own statistics.
        super().__init__(model_path, calibration, cache, **options)
        self._nncf = import_nncf()
        self.providers = self.providers or session_providers(self.gpu_id)
        self._external = has_external_data(self.model_path)
        self._model = prepare_model(self.model_path)

    @property
    def _data_dir(self) -> str | None:
        """The folder NNCF reads the float model's external data from (None: it has none)."""
        return str(Path(self.model_path).resolve().parent) if self._external else None

    def _save(self, model: onnx.ModelProto, out_path: str | os.PathLike) -> None:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        save_model(model, out_path, self._external)
