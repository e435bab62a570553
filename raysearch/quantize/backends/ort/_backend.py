"""The ``"ort"`` backend: ONNX Runtime static quantization with shared calibration.

It does what ``onnxruntime.quantization.quantize_static`` does, split in two: the calibrated
ranges come from a :class:`~raysearch.quantize.calibration.CalibrationCache` (computed once per
distinct calibration), and the quantizer (``QDQQuantizer``, or ``ONNXQuantizer`` for
``quant_format: QOperator``) runs on copies of the shape-inferred model and of the ranges. The
opset is raised for 16-bit, 4-bit block and float8 types exactly as ``quantize_static`` does
(``update_opset_version``), once per process and target opset. The output is the same model
``quantize_static`` writes for the same settings and data.

Settings are ``quantize_static``'s arguments; ``extra_options`` keys that shape calibration
go to the calibrator (:data:`CALIBRATION_OPTIONS`), every other key to the quantizer's
``extra_options``. The refusal rules live in ``_rules``, the checks against a model in
``_checks``."""

from __future__ import annotations

import copy
import logging
import os
import shutil
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.quant_utils import (
    MODEL_SIZE_THRESHOLD,
    QuantizationMode,
    get_opset_version,
    load_model_with_shape_infer,
    save_and_reload_model_with_shape_infer,
    update_opset_version,
)
from onnxruntime.quantization.quantize import check_static_quant_arguments

from raysearch.modelfile import cached_file_hash, has_external_data
from raysearch.modelgraph import constants_to_initializers
from raysearch.providers import session_providers
from raysearch.quantize.backends.ort._checks import check_settings, enum_value
from raysearch.quantize.backends.ort._rules import reject_reason
from raysearch.quantize.backends.ort.options import ORT_CATALOGUE
from raysearch.quantize.calibration import (
    DEFAULT_OP_TYPES,
    CalibrationCache,
    CalibrationRequest,
)
from raysearch.quantize.calibration._request import calibration_catalogue
from raysearch.quantize.registry import QuantizeInfo, QuantizerBackend, register_backend
from raysearch.quantize.tempdirs import make_workdir

if TYPE_CHECKING:
    from raysearch.space.catalogue import Catalogue

__all__ = ["OrtBackend", "CALIBRATION_OPTIONS", "split_extra_options"]

_logger = logging.getLogger(__name__)

#: ``extra_options`` keys that configure calibration -> the calibrator's own (lower-case)
#: option name. They reach ONNX Runtime's calibrators, never the quantizer.
CALIBRATION_OPTIONS: dict[str, str] = {
    "CalibTensorRangeSymmetric": "symmetric",
    "CalibMovingAverage": "moving_average",
    "CalibMovingAverageConstant": "averaging_constant",
    "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
    "CalibStridedMinMax": "strided",
    "CalibPercentile": "percentile",
    "num_bins": "num_bins",
    "num_quantized_bins": "num_quantized_bins",
    "scenario": "scenario",
}


def split_extra_options(
    extra_options: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(calibrator options keyed by their lower-case names, quantizer extra_options)``.

    Example:
        >>> split_extra_options({"CalibPercentile": 99.9, "ActivationSymmetric": True})
        ({'percentile': 99.9}, {'ActivationSymmetric': True})
    """
    calibration: dict[str, Any] = {}
    quantizer: dict[str, Any] = {}
    for key, value in (extra_options or {}).items():
        if key in CALIBRATION_OPTIONS:
            calibration[CALIBRATION_OPTIONS[key]] = value
        else:
            quantizer[key] = value
    return calibration, quantizer


def static_quantizer_arguments(
    quant_format: QuantFormat,
    model: onnx.ModelProto,
    settings: Mapping[str, Any],
    types: tuple[QuantType, QuantType],
    ranges: Any,
) -> dict[str, Any]:
    """The static quantizer's keyword arguments for ``quant_format``, settings and ranges."""
    _, quantizer_options = split_extra_options(dict(settings.get("extra_options") or {}))
    arguments: dict[str, Any] = {
        "model": model,
        "per_channel": settings.get("per_channel", False),
        "reduce_range": settings.get("reduce_range", False),
        "weight_qType": types[0],
        "activation_qType": types[1],
        "tensors_range": ranges,
        "nodes_to_quantize": list(settings.get("nodes_to_quantize") or []),
        "nodes_to_exclude": list(settings.get("nodes_to_exclude") or []),
        "op_types_to_quantize": list(settings.get("op_types_to_quantize") or DEFAULT_OP_TYPES),
        "extra_options": quantizer_options,
    }
    if quant_format is QuantFormat.QOperator:
        arguments.update(mode=QuantizationMode.QLinearOps, static=True)
    return arguments


@register_backend("ort")
class OrtBackend(QuantizerBackend):
    """ONNX Runtime static quantization with cached calibration, on a private copy of the float
    model (ONNX Runtime writes beside the model it reads); :meth:`close` removes it.
    """

    #: The settings this backend takes (``raysearch.quantize.backends.ort.options``).
    catalogue: ClassVar[Catalogue | None] = ORT_CATALOGUE
    #: Checked against the model before a search: op types and node names it must have.
    model_settings: ClassVar[tuple[str, ...]] = (
        "op_types_to_quantize",
        "nodes_to_exclude",
        "nodes_to_quantize",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.providers = self.providers or session_providers(self.gpu_id)
        if self.cache is None:
            self.cache = CalibrationCache(threads=self.threads, providers=self.providers)
        self._workdir = str(make_workdir("raysearch-ort"))
        # Removed by close(), when the backend is garbage-collected, or at interpreter exit.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._workdir, True)
        self._model_hash = cached_file_hash(self.model_path)
        self._model_copy = _copy_model(self.model_path, Path(self._workdir))
        self._base = load_model_with_shape_infer(self._model_copy)
        self._base_opset = get_opset_version(self._base)
        self._variants: dict[tuple[Any, ...], tuple[onnx.ModelProto, Path, int]] = {}
        # External data as ONNX Runtime's StaticQuantConfig decides (ByteSize() raises over
        # 2 GB, so only a model in one file is measured).
        self._large = has_external_data(self._model_copy) or (
            self._base.ByteSize() >= MODEL_SIZE_THRESHOLD
        )

    @classmethod
    def validate(
        cls, settings: Mapping[str, Any], model: str | os.PathLike | onnx.ModelProto
    ) -> None:
        """Refuse values ONNX Runtime does not know, unknown op types and node names."""
        check_settings(settings, model)

    @classmethod
    def reject(cls, settings: Mapping[str, Any]) -> str | None:
        return reject_reason(settings)

    def quantize(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> QuantizeInfo:
        """Quantize with ``settings`` into ``out_path``; raises what ONNX Runtime raises."""
        reason = reject_reason(settings)
        if reason:
            raise ValueError(reason)
        if settings.get("quant_mode") == "dynamic":
            return self._quantize_dynamic(settings, out_path)
        quant_format = enum_value(settings, "quant_format", QuantFormat)
        enum_value(settings, "calibrate_method", CalibrationMethod)
        activation = enum_value(settings, "activation_type", QuantType)
        weight = enum_value(settings, "weight_type", QuantType)
        extra = dict(settings.get("extra_options") or {})

        start = time.perf_counter()
        per_channel_qdq = bool(settings.get("per_channel")) and quant_format is QuantFormat.QDQ
        model, calib_path, opset = self._variant(weight, activation, extra, per_channel_qdq)
        request = CalibrationRequest.from_settings(settings, calibration_catalogue(self.name))
        if request.method == "Entropy" and request.bins <= request.num_quantized_bins:
            _hint_once(
                "Entropy with num_bins <= num_quantized_bins (ONNX Runtime's defaults are 128 "
                "and 128) has one candidate threshold and gives MinMax's ranges; set "
                "extra_options.num_bins (e.g. 2048) for a real entropy search"
            )
        ranges, hit = self.cache.tensors_range(
            calib_path,
            self.calibration,
            request,
            model_hash=f"{self._model_hash}:opset{opset}",
            providers=self.providers,
        )
        calibration_s = time.perf_counter() - start

        start = time.perf_counter()
        check_static_quant_arguments(quant_format, activation, weight)
        quantizer_class = ONNXQuantizer if quant_format is QuantFormat.QOperator else QDQQuantizer
        quantizer = quantizer_class(
            **static_quantizer_arguments(
                quant_format, copy.deepcopy(model), settings, (weight, activation), ranges
            ),
        )
        quantizer.quantize_model()
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        quantizer.model.save_model_to_file(
            os.fspath(out_path), use_external_data_format=self._large
        )
        quantization_s = time.perf_counter() - start
        return QuantizeInfo(calibration_s, quantization_s, hit)

    def _quantize_dynamic(
        self, settings: Mapping[str, Any], out_path: str | os.PathLike
    ) -> QuantizeInfo:
        """ONNX Runtime's ``quantize_dynamic``: 8-bit weights, activation ranges at run time."""
        from onnxruntime.quantization import quantize_dynamic

        start = time.perf_counter()
        _, quantizer_options = split_extra_options(dict(settings.get("extra_options") or {}))
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        quantize_dynamic(
            self._model_copy,
            out_path,
            # None: every op type ONNX Runtime quantizes dynamically (MatMul, Attention, ...).
            op_types_to_quantize=settings.get("op_types_to_quantize") or None,
            per_channel=bool(settings.get("per_channel", False)),
            reduce_range=bool(settings.get("reduce_range", False)),
            weight_type=enum_value(settings, "weight_type", QuantType) or QuantType.QInt8,
            nodes_to_quantize=list(settings.get("nodes_to_quantize") or []),
            nodes_to_exclude=list(settings.get("nodes_to_exclude") or []),
            use_external_data_format=self._large,
            extra_options=quantizer_options,
        )
        return QuantizeInfo(0.0, time.perf_counter() - start, False)

    def _variant(
        self,
        weight: QuantType,
        activation: QuantType,
        extra: Mapping[str, Any],
        per_channel_qdq: bool = False,
    ) -> tuple[onnx.ModelProto, Path, int]:
        """The model ``quantize_static`` quantizes for these types: shape-inferred, opset raised
        where the types need it (16-bit, float8, block-wise; 13 for per-channel QDQ).
        """
        overrides = extra.get("TensorQuantOverrides")
        key = (
            weight == QuantType.QFLOAT8E4M3FN,
            weight in (QuantType.QInt16, QuantType.QUInt16)
            or activation in (QuantType.QInt16, QuantType.QUInt16)
            or _overrides_need_16bit(overrides),
            (extra.get("BlockSize") or 0) > 0,
            per_channel_qdq and self._base_opset < _PER_CHANNEL_OPSET,
        )
        if key not in self._variants:
            updated = update_opset_version(
                self._base,
                weight,
                activation,
                tensor_quant_overrides=overrides,
                block_size=extra.get("BlockSize", 0),
            )
            if key[-1] and get_opset_version(updated) < _PER_CHANNEL_OPSET:
                updated = save_and_reload_model_with_shape_infer(
                    onnx.version_converter.convert_version(updated, _PER_CHANNEL_OPSET)
                )
            if updated is self._base:
                self._variants[key] = (self._base, self._model_copy, self._base_opset)
            else:
                opset = get_opset_version(updated)
                path = Path(self._workdir) / f"model_opset{opset}.onnx"
                if not path.exists():
                    # quantize_static calibrates a copy saved with external data.
                    onnx.save_model(copy.deepcopy(updated), str(path), save_as_external_data=True)
                self._variants[key] = (updated, path, opset)
        return self._variants[key]

    def close(self) -> None:
        self._variants.clear()
        self._cleanup()


_HINTS: set[str] = set()


#: The first opset whose DequantizeLinear takes an ``axis`` (per-channel weights in QDQ).
_PER_CHANNEL_OPSET = 13


def _hint_once(message: str) -> None:
    if message not in _HINTS:
        _HINTS.add(message)
        _logger.info(message)


def _copy_model(source: str, folder: Path) -> Path:
    """Copy the model into ``folder`` in one file, ``Constant`` tensors made initializers."""
    target = folder / "model.onnx"
    full = onnx.load(source)
    # Weights held by Constant nodes would be quantized like activations: made initializers,
    # as ONNX Runtime's quant_pre_process does.
    moved = constants_to_initializers(full)
    if not has_external_data(source) and not moved:
        shutil.copyfile(source, target)
    elif has_external_data(source) or full.ByteSize() >= MODEL_SIZE_THRESHOLD:
        onnx.save_model(full, str(target), save_as_external_data=True)
    else:
        onnx.save_model(full, str(target))
    return target


def _overrides_need_16bit(overrides: Any) -> bool:
    if not isinstance(overrides, Mapping):
        return False
    sixteen = {QuantType.QInt16, QuantType.QUInt16}
    for entries in overrides.values():
        for override in entries if isinstance(entries, list) else []:
            if not isinstance(override, Mapping):
                continue
            if override.get("quant_type") in sixteen:
                return True
            convert = override.get("convert")
            if isinstance(convert, Mapping) and convert.get("quant_type") in sixteen:
                return True
    return False
