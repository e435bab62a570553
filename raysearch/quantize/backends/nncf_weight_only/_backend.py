"""The ``"nncf_weight_only"`` backend: NNCF's ``nncf.compress_weights`` on the ONNX model, with
the settings a point gives (``quantize_embeddings: false`` and ``nodes_float`` as its
``ignored_scope``; calibration data where a setting reads it), its output repaired
(``_repair``). A value info shaped unlike its initializer is dropped (NNCF refuses it).

Example:
    >>> NncfWeightOnlyBackend.reject({"gptq": True}).split(":")[0]
    'gptq is refused'
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from raysearch.errors import ConfigError, suggest
from raysearch.modelfile import load_header
from raysearch.modelgraph import WEIGHTED_OP_TYPES, embedding_gathers, weight_matmuls
from raysearch.quantize.backends.nncf_weight_only._repair import repair_matmul_nbits
from raysearch.quantize.backends.nncf_weight_only.options import (
    DEFAULT_GROUP_SIZE,
    INT8_MODES,
    NNCF_WEIGHT_ONLY_CATALOGUE,
    is_data_aware,
    mode,
    reject_reason,
)
from raysearch.quantize.nncf_runtime import (
    NncfModelBackend,
    missing_nncf,
    nncf_dataset,
    nncf_session,
)
from raysearch.quantize.registry import QuantizeInfo, register_backend

if TYPE_CHECKING:
    import onnx

    from raysearch.space.catalogue import Catalogue

__all__ = ["NncfWeightOnlyBackend", "compress_arguments"]

_logger = logging.getLogger(__name__)
#: ``compress_weights``' default ``subset_size``: the calibration samples its statistics read.
_NNCF_SUBSET = 128


@register_backend("nncf_weight_only")
class NncfWeightOnlyBackend(NncfModelBackend):
    """NNCF's ``compress_weights`` with the trial's settings (see the module)."""

    catalogue: ClassVar[Catalogue | None] = NNCF_WEIGHT_ONLY_CATALOGUE
    model_settings: ClassVar[tuple[str, ...]] = ("nodes_float",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        dropped = _drop_contradicting_value_infos(self._model)
        if dropped:
            _logger.info("value infos that contradict their initializers dropped: %s", dropped)
        self._gathers = embedding_gathers(self._model)
        self._weighted = sum(n.op_type in WEIGHTED_OP_TYPES for n in self._model.graph.node)
        self._dataset: Any = None  # built on the first setting that reads the data

    @classmethod
    def missing_requirement(cls) -> str | None:
        return missing_nncf("nncf_weight_only")

    @classmethod
    def validate(
        cls, settings: Mapping[str, Any], model: str | os.PathLike | onnx.ModelProto
    ) -> None:
        """Refuse a ``nodes_float`` name that is no weight MatMul or embedding Gather."""
        names = settings.get("nodes_float")
        if not names:
            return
        proto = model if not isinstance(model, (str, os.PathLike)) else load_header(model)
        known = weight_matmuls(proto) + embedding_gathers(proto)
        missing = [n for n in names if n not in known]
        if missing:
            described = ", ".join(f"'{v}'{suggest(v, known)}" for v in missing)
            raise ConfigError(
                "nodes_float", f"not a weight MatMul or embedding Gather of the model: {described}"
            )

    @classmethod
    def reject(cls, settings: Mapping[str, Any]) -> str | None:
        return reject_reason(settings)

    @classmethod
    def reject_on_model(
        cls, settings: Mapping[str, Any], weights: Mapping[str, Sequence[int]]
    ) -> str | None:
        """A 4-bit ``group_size`` not dividing a 4-bit weight's rows (NNCF refuses it)."""
        if mode(settings) in INT8_MODES or settings.get("group_size_fallback_mode") not in (
            None,
            "error",
        ):
            return None
        group = int(settings.get("group_size") or DEFAULT_GROUP_SIZE)
        names = list(weights)
        if not settings.get("all_layers"):
            names = names[:-1]
        kept = set(settings.get("nodes_float") or ())
        for name in names:
            rows = int(weights[name][0])
            if name not in kept and rows % group:
                return (
                    f"group_size {group} does not divide the {rows} rows of node {name}: NNCF "
                    "refuses it (set a smaller group_size, or group_size_fallback_mode "
                    "ignore or adjust)"
                )
        return None

    def quantize(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> QuantizeInfo:
        """Compress with ``settings`` into ``out_path``; NNCF's errors as one line naming NNCF."""
        reason = self.reject(settings)
        if reason:
            raise ValueError(reason)
        start = time.perf_counter()
        if is_data_aware(settings) and self._dataset is None:
            self._dataset = nncf_dataset(self.calibration)
        arguments = compress_arguments(self._nncf, settings, self._gathers, self._data_dir)
        if is_data_aware(settings):
            arguments["dataset"] = self._dataset
            # NNCF warns on every trial where the data holds fewer than subset_size
            items = self._dataset.get_length()
            arguments["subset_size"] = min(_NNCF_SUBSET, items or _NNCF_SUBSET)
        with nncf_session(self.providers, self.threads) as engine:
            try:
                compressed = self._nncf.compress_weights(self._model, **arguments)
            except Exception as exc:  # NNCF's own failures: one line, the search goes on
                first = (str(exc).strip().splitlines() or [""])[0]
                raise ValueError(
                    f"NNCF {self._nncf.__version__} compress_weights failed "
                    f"({type(exc).__name__}): {first}"
                ) from exc
        data_s = engine.total_s  # NNCF's ONNX Runtime sessions and inference on the data
        repaired = repair_matmul_nbits(compressed)
        _logger.debug("repaired NNCF's MatMulNBits: %s", repaired)
        self._save(compressed, out_path)
        share = _compressed(compressed) / self._weighted if self._weighted else None
        return QuantizeInfo(
            calibration_s=data_s,
            quantization_s=time.perf_counter() - start - data_s,
            calib_cache_hit=False,
            extra={k: float(v) for k, v in repaired.items()},
            quantized_share=share,
        )


def compress_arguments(
    nncf: Any,
    settings: Mapping[str, Any],
    embeddings: Sequence[str],
    external_data_dir: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``nncf.compress_weights`` for ``settings`` (calibration data aside)."""
    from nncf.onnx.quantization.backend_parameters import BackendParameters
    from nncf.quantization.advanced_parameters import (
        AdvancedCompressionParameters,
        GroupSizeFallbackMode,
    )

    arguments: dict[str, Any] = {}
    if settings.get("mode"):
        arguments["mode"] = nncf.CompressWeightsMode(settings["mode"])
    for key in ("group_size", "ratio", "all_layers", "awq", "scale_estimation"):
        if settings.get(key) is not None:
            arguments[key] = settings[key]
    if settings.get("sensitivity_metric"):
        arguments["sensitivity_metric"] = nncf.SensitivityMetric(settings["sensitivity_metric"])
    if settings.get("backup_mode"):
        arguments["backup_mode"] = nncf.BackupMode(settings["backup_mode"])
    ignored = list(settings.get("nodes_float") or ())
    if settings.get("quantize_embeddings") is False:
        ignored += [n for n in embeddings if n not in ignored]
    if ignored:
        arguments["ignored_scope"] = nncf.IgnoredScope(names=ignored)
    advanced: dict[str, Any] = {}
    if settings.get("group_size_fallback_mode"):
        advanced["group_size_fallback_mode"] = GroupSizeFallbackMode(
            settings["group_size_fallback_mode"]
        )
    if external_data_dir:
        advanced["backend_params"] = {BackendParameters.EXTERNAL_DATA_DIR: external_data_dir}
    if advanced:
        arguments["advanced_parameters"] = AdvancedCompressionParameters(**advanced)
    return arguments


def _drop_contradicting_value_infos(model: onnx.ModelProto) -> list[str]:
    """Drop, in place, value infos shaped or typed unlike their initializer; their names."""
    inits = {t.name: t for t in model.graph.initializer}
    dropped = []
    for info in list(model.graph.value_info):
        init = inits.get(info.name)
        if init is None or not info.type.HasField("tensor_type"):
            continue
        declared = info.type.tensor_type
        if declared.elem_type not in (0, init.data_type) or not _fits(declared, init.dims):
            model.graph.value_info.remove(info)
            dropped.append(info.name)
    return dropped


def _fits(declared: Any, dims: Sequence[int]) -> bool:
    """Whether a value info's tensor type allows the shape ``dims`` (no shape allows any)."""
    if not declared.HasField("shape"):
        return True
    given = declared.shape.dim
    return len(given) == len(dims) and all(
        not d.HasField("dim_value") or d.dim_value == n for d, n in zip(given, dims)
    )


def _compressed(model: onnx.ModelProto) -> int:
    """Weight MatMuls NNCF compressed: each ``MatMulNBits``, and each MatMul fed by a DQ weight."""
    nodes = list(model.graph.node)
    dequantized = {o for n in nodes if n.op_type == "DequantizeLinear" for o in n.output}
    return sum(
        n.op_type == "MatMulNBits"
        or (n.op_type in WEIGHTED_OP_TYPES and any(i in dequantized for i in n.input[1:2]))
        for n in nodes
    )
