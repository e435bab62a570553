"""Mixed precision: the most sensitive tensors get 16-bit activations or stay in float.

The ``mixed_precision`` settings: ``top_k`` (the k most sensitive entries promoted to
``promote_to``: ``int16`` or ``float``), ``promote_weights`` (16-bit weights too; false),
``rank_by`` (``sqnr`` or ``metric``), ``rank_1`` ... ``rank_16`` (a per-entry choice over
``top_k``'s) and ``samples`` (of the SQNR pass; 32). The ranking is for the trial's base
setting (every technique removed); the trial records ``promoted`` and ``ranked``.

Example:
    >>> precisions({"top_k": 2, "rank_2": "float", "rank_3": "int16"}, 4)
    ['int16', 'float', 'int16', 'int8']
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any, ClassVar

from raysearch.modelfile import cached_file_hash
from raysearch.quantize.technique import (
    TensorOverrideProducer,
    TensorOverrides,
    register_technique,
    registered_techniques,
)
from raysearch.quantize.techniques.mixed_precision.sensitivity import (
    Ranking,
    SensitivityEntry,
    SensitivityStore,
    metric_ranking,
    sqnr_ranking,
)
from raysearch.space.catalogue import OptionSpec

__all__ = ["MixedPrecision", "precisions", "PER_RANK", "KEY"]

_logger = logging.getLogger(__name__)

#: The settings key.
KEY = "mixed_precision"
#: Ranks that take a per-entry choice (``rank_1`` ... ``rank_16``).
PER_RANK = 16
_PROMOTE = ("int16", "QUInt16", "QInt16", "float")
_PRECISIONS = ("int8", "int16", "float")
_SIXTEEN = {"QUInt8": "QUInt16", "QInt8": "QInt16", "QUInt16": "QUInt16", "QInt16": "QInt16"}
_DEFAULTS = {
    "top_k": 0,
    "promote_to": "int16",
    "promote_weights": False,
    "rank_by": "sqnr",
    "samples": 32,
    "candidates": 16,
}


def precisions(options: Mapping[str, Any], ranked: int) -> list[str]:
    """The precision of each of the ``ranked`` entries: ``int8``, ``int16`` or ``float``."""
    top_k = int(options.get("top_k") or 0)
    promote = str(options.get("promote_to") or "int16")
    out = [promote if i < top_k else "int8" for i in range(ranked)]
    for i in range(min(ranked, PER_RANK)):
        choice = options.get(f"rank_{i + 1}")
        if choice is not None:
            out[i] = str(choice)
    return out


@register_technique(KEY)
class MixedPrecision(TensorOverrideProducer):
    """Promotes the most sensitive tensors of the trial's base setting (see the module)."""

    settings: ClassVar[Mapping[str, OptionSpec]] = {
        KEY: OptionSpec("dict", "mixed precision: which sensitive tensors get more bits"),
    }
    containers: ClassVar[Mapping[str, Mapping[str, OptionSpec]]] = {
        KEY: {
            "top_k": OptionSpec("int", "promote the k most sensitive tensors", low=0),
            "promote_to": OptionSpec("enum", "precision of the top k", _PROMOTE),
            "promote_weights": OptionSpec(
                "bool", "16-bit promotions give the node's weight 16 bits too"
            ),
            "rank_by": OptionSpec("enum", "sensitivity ranking", ("sqnr", "metric")),
            "samples": OptionSpec("int", "calibration samples of the SQNR pass", low=1),
            "candidates": OptionSpec(
                "int", "rank_by metric: entries measured with the metric", low=1, high=256
            ),
            **{
                f"rank_{i}": OptionSpec("enum", f"precision of the rank-{i} tensor", _PRECISIONS)
                for i in range(1, PER_RANK + 1)
            },
        }
    }
    devices = frozenset({"cpu", "gpu"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._stores: dict[str | None, SensitivityStore] = {}
        self._sent: set[str] = set()

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        options = settings.get(KEY)
        if not isinstance(options, Mapping):
            return None
        ranks = max(PER_RANK, int(options.get("top_k") or 0))
        if all(p == "int8" for p in precisions(options, ranks)):
            return None
        return json.dumps({**_DEFAULTS, **options}, sort_keys=True)

    def overrides(self, model_path: str, settings: Mapping[str, Any]) -> TensorOverrides:
        if self.context is None:
            raise RuntimeError("mixed precision needs a trial's context (quantize and score)")
        options = {**_DEFAULTS, **settings[KEY]}
        base = _base_settings(settings)
        ranking = self.ranking(model_path, base, options)
        chosen = precisions(options, len(ranking.entries))
        sixteen = _sixteen_bit(base, options)
        promoted16 = [
            e for e, p in zip(ranking.entries, chosen, strict=True) if p not in ("int8", "float")
        ]
        int16 = [e.tensor for e in promoted16]
        floats = [
            node
            for e, p in zip(ranking.entries, chosen, strict=True)
            if p == "float"
            for node in (e.float_nodes or (e.node,))
        ]
        fixed = _fixed_overrides(model_path, base, int16, sixteen)
        weights = {}
        if options["promote_weights"]:
            weights = _weight_overrides(model_path, base, [e.node for e in promoted16])
        result = TensorOverrides(
            tensor_quant_overrides={**fixed, **weights},
            nodes_to_exclude=list(dict.fromkeys(floats)),
            report={
                "promoted": float(sum(p != "int8" for p in chosen)),
                "ranked": float(len(chosen)),
                **({"promoted_weights": float(len(weights))} if options["promote_weights"] else {}),
            },
        )
        if ranking.base_key not in self._sent:  # the search writes each ranking once
            self._sent.add(ranking.base_key)
            result.rankings = ranking.rows()
        return result

    def ranking(
        self, model_path: str, base: Mapping[str, Any], options: Mapping[str, Any]
    ) -> Ranking:
        """The ranking ``options`` ask for, of the base setting ``base`` on ``model_path``."""
        assert self.context is not None
        store = self._store()
        identity = {
            "model": cached_file_hash(model_path),
            "data": self.context.calibration.content_hash,
            "base": base,
            "samples": int(options["samples"]),
        }
        key = _digest(identity)
        ranking = store.get(key, lambda: self._sqnr(model_path, base, int(options["samples"]), key))
        if options["rank_by"] != "metric":
            return ranking
        promote = _sixteen_bit(base, options) if options["promote_to"] != "float" else "float"
        weights = bool(options["promote_weights"]) and promote != "float"
        identity = {**identity, "promote": promote, "candidates": options["candidates"]}
        metric_key = _digest({**identity, **({"promote_weights": True} if weights else {})})
        return store.get(
            metric_key,
            lambda: self._metric(
                model_path, base, ranking, promote, int(options["candidates"]), metric_key, weights
            ),
        )

    def _sqnr(self, model_path: str, base: Mapping[str, Any], samples: int, key: str) -> Ranking:
        assert self.context is not None
        with tempfile.TemporaryDirectory(prefix="raysearch-mp-") as folder:
            quantized = os.path.join(folder, "base.onnx")
            self.context.quantize(model_path, base, quantized)
            ranking = sqnr_ranking(
                model_path,
                quantized,
                self.context.calibration,
                base_key=key,
                samples=samples,
                providers=self.providers,
            )
        _logger.info("sensitivity: ranked %d tensors by SQNR", len(ranking.entries))
        return ranking

    def _metric(
        self,
        model_path: str,
        base: Mapping[str, Any],
        ranking: Ranking,
        promote: str,
        candidates: int,
        key: str,
        weights: bool = False,
    ) -> Ranking:
        from raysearch.quantize.pipeline import merge_overrides

        context = self.context
        assert context is not None

        def promoted(entry: SensitivityEntry) -> dict[str, Any]:
            if promote == "float":
                overrides = TensorOverrides(
                    nodes_to_exclude=list(entry.float_nodes or (entry.node,))
                )
            else:
                fixed = _fixed_overrides(model_path, base, [entry.tensor], promote)
                if weights:
                    fixed.update(_weight_overrides(model_path, base, [entry.node]))
                overrides = TensorOverrides(tensor_quant_overrides=fixed)
            return merge_overrides(base, overrides)

        ranked = metric_ranking(
            ranking,
            lambda head: context.score_each(model_path, [promoted(e) for e in head]),
            higher_is_better=context.higher_is_better,
            candidates=candidates,
        )
        ranked.base_key = key
        _logger.info(
            "sensitivity: measured %d tensors with the metric",
            min(candidates, len(ranking.entries)),
        )
        return ranked

    def _store(self) -> SensitivityStore:
        folder = self.context.cache_dir if self.context else None
        if folder not in self._stores:
            self._stores[folder] = SensitivityStore(folder)
        return self._stores[folder]


def _base_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    from raysearch.quantize.pipeline import strip_technique_settings

    return dict(strip_technique_settings(settings, registered_techniques()))


def _sixteen_bit(base: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The 16-bit type ``int16`` means for ``base``: that of the base activations' sign."""
    promote = str(options.get("promote_to") or "int16")
    if promote in ("QUInt16", "QInt16"):
        return promote
    return _SIXTEEN.get(_activation_type(base), "QInt16")


def _activation_type(base: Mapping[str, Any]) -> str:
    """The base's activation type (ONNX Runtime's ``quantize_static`` default: QInt8)."""
    return str(base.get("activation_type") or "QInt8")


def _fixed_overrides(
    model_path: str, base: Mapping[str, Any], tensors: list[str], sixteen: str
) -> dict[str, list[dict[str, Any]]]:
    """``TensorQuantOverrides`` giving ``tensors`` 16-bit type ``sixteen``, with conversions."""
    if not tensors:
        return {}
    import onnx
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn.mixed_precision_overrides_utils import (
        MixedPrecisionTensorQuantOverridesFixer,
    )
    from onnxruntime.quantization.tensor_quant_overrides import TensorQuantOverridesHelper

    default = QuantType[_activation_type(base)]
    symmetric = bool((base.get("extra_options") or {}).get("ActivationSymmetric", False))
    helper = TensorQuantOverridesHelper({t: [{"quant_type": QuantType[sixteen]}] for t in tensors})
    model = onnx.load(model_path, load_external_data=False)
    fixer = MixedPrecisionTensorQuantOverridesFixer.create_from_model(helper, model, default)
    fixer.apply(default, symmetric)
    return helper.get_dict()


def _weight_overrides(
    model_path: str, base: Mapping[str, Any], nodes: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """``TensorQuantOverrides`` giving the weights of ``nodes`` the 16-bit type."""
    if not nodes:
        return {}
    import onnx
    from onnxruntime.quantization import QuantType

    model = onnx.load(model_path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    wanted = set(nodes)
    weight_type = str(base.get("weight_type") or "QInt8")
    sixteen = QuantType[_SIXTEEN.get(weight_type, "QInt16")]
    out: dict[str, list[dict[str, Any]]] = {}
    for node in model.graph.node:
        if node.name not in wanted:
            continue
        # Bias inputs (index 2 of Conv/Gemm) are int32 from the scales, not a choice.
        for name in node.input[:2]:
            if name in initializers:
                out[name] = [{"quant_type": sixteen}]
    return out


def _digest(identity: Mapping[str, Any]) -> str:
    from raysearch.space import settings_key

    text = settings_key({"version": 1, **identity})
    return hashlib.sha256(text.encode()).hexdigest()[:24]
