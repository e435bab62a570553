"""ONNX Runtime's calibrators, wired as raysearch runs them.

:class:`Calibrators` builds a ``MinMaxCalibrater`` or ``PercentileCalibrater`` (whose
augmented model and session serve every histogram method) as ``create_calibrator`` would, but
with the cache's intra-op threads and the trial's providers, on a private copy of the model in
a temporary folder; it runs the calibration data through a session and counts passes and
batches. It also keeps each model's shape-inferred proto (what decides the calibrated tensors).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization.calibrate import (
    CalibrationMethod,
    MinMaxCalibrater,
    PercentileCalibrater,
)
from onnxruntime.quantization.quant_utils import add_infer_metadata

from raysearch.providers import set_threads
from raysearch.quantize.calibration._store import CacheStats
from raysearch.quantize.tempdirs import make_workdir

if TYPE_CHECKING:
    from raysearch.data import DataSource

__all__ = ["Calibrators", "CountingReader"]


class CountingReader:
    """A calibration data reader that counts the batches it hands out."""

    def __init__(self, reader: Any, stats: CacheStats) -> None:
        self._reader = reader
        self._stats = stats

    def get_next(self) -> dict[str, np.ndarray] | None:
        feed = self._reader.get_next()
        if feed is not None:
            self._stats.inference_batches += 1
        return feed

    def __len__(self) -> int:
        return len(self._reader)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._reader.set_range(start_index, end_index)


class Calibrators:
    """Calibrators and inference passes on ``threads`` intra-op threads, counted in ``stats``."""

    def __init__(self, threads: int | None, stats: CacheStats) -> None:
        self.threads = threads
        self.stats = stats
        self._inferred: dict[str, onnx.ModelProto] = {}

    def reader(self, data: DataSource) -> CountingReader:
        """``data``'s calibration reader, counting its batches."""
        return CountingReader(data.reader(), self.stats)

    def run_all(self, session: ort.InferenceSession, data: DataSource) -> Iterator[list[Any]]:
        """Every output of ``session`` for each batch of ``data`` (one counted pass)."""
        for feed in data.batches():
            outputs = session.run(None, feed)
            self.stats.inference_batches += 1
            yield outputs
        self.stats.inference_passes += 1

    @contextlib.contextmanager
    def open(
        self,
        model_path: str,
        op_types: Sequence[str],
        method: CalibrationMethod,
        options: dict[str, Any],
        providers: list[Any],
    ) -> Iterator[Any]:
        """ONNX Runtime's calibrator over ``model_path``, as ``create_calibrator`` builds it."""
        workdir = str(make_workdir("raysearch-calib"))
        try:
            source, external = self._private_source(model_path, Path(workdir))
            augmented = str(Path(workdir) / "augmented_model.onnx")
            if method == CalibrationMethod.MinMax:
                calibrator = MinMaxCalibrater(
                    source,
                    list(op_types),
                    augmented,
                    symmetric=options["symmetric"],
                    moving_average=options["moving_average"],
                    averaging_constant=options["averaging_constant"],
                    use_external_data_format=external,
                )
            else:  # only the augmented model and its session are used for histograms
                calibrator = PercentileCalibrater(
                    source, list(op_types), augmented, use_external_data_format=external
                )
            calibrator.augment_graph()
            calibrator.execution_providers = providers
            calibrator.infer_session = ort.InferenceSession(
                augmented, sess_options=self._session_options(), providers=providers
            )
            try:
                yield calibrator
            finally:
                calibrator.infer_session = None  # release the session before the files go
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _private_source(self, model_path: str, workdir: Path) -> tuple[Path, bool]:
        """The model path the calibrator reads, and whether the model has external data."""
        source = Path(model_path)
        # A model with external data makes an augmented model with external data too.
        external = self.has_external_data(model_path)
        if not external:
            # ONNX Runtime writes a shape-inferred copy next to the model it reads (and
            # deletes it): give it a private link or copy, safe from concurrent processes.
            private = workdir / "model.onnx"
            try:
                os.link(source, private)
            except OSError:
                shutil.copyfile(source, private)
            source = private
        return source, external

    def _session_options(self) -> ort.SessionOptions:
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        set_threads(session_options, self.threads)
        session_options.log_severity_level = 3
        return session_options

    def has_external_data(self, model_path: str) -> bool:
        model = self.inferred_model(model_path)
        return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)

    def inferred_model(self, model_path: str) -> onnx.ModelProto:
        """The shape-inferred model at ``model_path`` (weights not loaded), kept per file."""
        real = os.path.realpath(model_path)
        if real not in self._inferred:
            with tempfile.TemporaryDirectory(prefix="raysearch-infer-") as tmp:
                out = os.path.join(tmp, "inferred.onnx")
                onnx.shape_inference.infer_shapes_path(model_path, out)
                model = onnx.load(out, load_external_data=False)
            add_infer_metadata(model)
            self._inferred[real] = model
        return self._inferred[real]
