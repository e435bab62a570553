"""NNCF's own answers, as anchors for ``quality.py``: what a user gets from OpenVINO NNCF
without a search.

- :func:`nncf_one_shot`: one ``nncf.quantize`` call with ``model_type=TRANSFORMER`` and every
  other argument NNCF's default.
- :func:`nncf_accuracy_control`: ``nncf.quantize_with_accuracy_control``, which quantizes,
  then reverts the layers that cost the most back to float until the metric drop is at most
  ``max_drop`` (or gives up and returns the float model).

Both read the model and data as raysearch does (any path or mapping ``DataSource.load``
takes), import NNCF with its telemetry off, run NNCF's ONNX Runtime inference on
``providers`` with ``threads`` threads and write the model to ``out_path``, which they
return. ``prepared=False`` (the default) hands NNCF the model file as it is, as a user calling
NNCF would; ``prepared=True`` hands it the model as raysearch's ``quantizer: nncf`` does
(``Constant`` weights as initializers, opset raised to 13 for per-channel weights:
``raysearch.quantize.backends.nncf.prepare_model``).

Example (magika, as ``quality.py`` scores it: top-1 agreement with the float model)::

    from _nncf_anchors import nncf_accuracy_control, nncf_one_shot, top1_agreement

    one_shot = nncf_one_shot(model, calib_npz, work / "nncf_one_shot.onnx")
    controlled = nncf_accuracy_control(
        model, calib_npz, eval_npz, top1_agreement(model, eval_npz), work / "nncf_aac.onnx",
        max_drop=0.002,
    )
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: A per-sample metric: ``metric(outputs, i)`` scores the model's outputs on validation sample
#: ``i``; higher is better (NNCF's accuracy control assumes so).
SampleMetric = Callable[[list[np.ndarray], int], float]


def nncf_one_shot(
    model: str | os.PathLike,
    calibration: Any,
    out_path: str | os.PathLike,
    *,
    subset_size: int = 300,
    prepared: bool = False,
    providers: Sequence[Any] | None = None,
    threads: int = 1,
) -> Path:
    """``nncf.quantize(model, calibration, model_type=TRANSFORMER, subset_size=...)`` written
    to ``out_path``; returns ``out_path``. ``subset_size`` beyond the calibration data's
    samples uses them all (as NNCF does)."""
    nncf, onnx_model, dataset, providers = _inputs(model, calibration, prepared, providers)
    from raysearch.quantize.backends.nncf import nncf_session

    with nncf_session(providers, threads):
        quantized = nncf.quantize(
            onnx_model,
            dataset,
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=min(subset_size, dataset.get_length()),
        )
    return _save(quantized, out_path)


def nncf_accuracy_control(
    model: str | os.PathLike,
    calibration: Any,
    validation: Any,
    metric: SampleMetric,
    out_path: str | os.PathLike,
    *,
    max_drop: float = 0.01,
    drop_type: str = "absolute",
    subset_size: int = 300,
    prepared: bool = False,
    providers: Sequence[Any] | None = None,
    threads: int = 1,
) -> Path:
    """``nncf.quantize_with_accuracy_control`` with ``model_type=TRANSFORMER``, written to
    ``out_path``; returns ``out_path`` (the float model when NNCF gives up: check with
    ``raysearch.modelgraph.quantized_share``).

    ``validation``: the validation inputs (loaded like calibration data), one item per sample.
    ``metric(outputs, i)``: the score of validation sample ``i`` from the model's outputs on
    it (a list of arrays, ONNX Runtime's ``session.run``), higher is better; the validation
    metric is the mean over the samples NNCF asks for. NNCF's ONNX accuracy control ranks the
    layers to revert by this per-sample metric (its output-based ranking is OpenVINO only),
    so a whole-set evaluator cannot stand in for it: :func:`top1_agreement` builds magika's.
    ``drop_type``: ``absolute`` or ``relative``."""
    nncf, onnx_model, dataset, providers = _inputs(model, calibration, prepared, providers)
    from raysearch.providers import make_session
    from raysearch.quantize.backends.nncf import nncf_session

    feeds = _feeds(validation, model)
    # Each item carries its index, for the metric; NNCF infers on the feed alone.
    validation_set = nncf.Dataset(list(enumerate(feeds)), lambda item: item[1])

    def validate(candidate: Any, items: Any) -> tuple[float, list[float]]:
        session = make_session(candidate.SerializeToString(), threads, providers=providers)
        scores = [float(metric(session.run(None, feed), i)) for i, feed in items]
        return float(np.mean(scores)), scores

    with nncf_session(providers, threads):
        quantized = nncf.quantize_with_accuracy_control(
            onnx_model,
            dataset,
            validation_set,
            validate,
            max_drop=max_drop,
            drop_type=nncf.DropType(drop_type),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=min(subset_size, dataset.get_length()),
        )
    return _save(quantized, out_path)


def top1_agreement(
    model: str | os.PathLike, validation: Any, *, output: int = 0, threads: int = 1
) -> SampleMetric:
    """The per-sample metric "the quantized model's top-1 class is the float model's" (1.0 or
    0.0; output ``output``'s argmax over its last axis), the float model run once on the CPU
    over ``validation``: magika's metric in ``quality.py``, for
    :func:`nncf_accuracy_control`."""
    from raysearch.providers import make_session

    session = make_session(os.fspath(model), threads, providers=["CPUExecutionProvider"])
    reference = [
        session.run(None, feed)[output].argmax(axis=-1) for feed in _feeds(validation, model)
    ]

    def agreement(outputs: list[np.ndarray], i: int) -> float:
        return float(np.mean(outputs[output].argmax(axis=-1) == reference[i]))

    return agreement


def _feeds(spec: Any, model: str | os.PathLike) -> list[dict[str, np.ndarray]]:
    """One feed per sample of the data ``spec`` (as the backend calibrates NNCF)."""
    from raysearch.quantize.backends.nncf import nncf_dataset

    return list(nncf_dataset(_data(spec, model)).get_data())


def _data(spec: Any, model: str | os.PathLike) -> Any:
    from raysearch.data import DataSource

    return DataSource.load(spec, model)


def _inputs(
    model: str | os.PathLike, calibration: Any, prepared: bool, providers: Sequence[Any] | None
) -> tuple[Any, Any, Any, list[Any]]:
    """NNCF, the model as NNCF gets it, the calibration data as an ``nncf.Dataset`` and the
    providers (default: the CPU)."""
    import onnx

    from raysearch.quantize.backends.nncf import import_nncf, nncf_dataset, prepare_model

    nncf = import_nncf()
    onnx_model = prepare_model(model) if prepared else onnx.load(os.fspath(model))
    dataset = nncf_dataset(_data(calibration, model))
    return nncf, onnx_model, dataset, list(providers or ["CPUExecutionProvider"])


def _save(model: Any, out_path: str | os.PathLike) -> Path:
    import onnx

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out))
    return out
