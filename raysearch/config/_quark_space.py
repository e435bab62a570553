"""AMD Quark's search spaces read as raysearch's: Python spellings of values (and enum
objects) as names, ``PowerOfTwoMethod`` as ``extra_options.PowerOfTwoMethod``, and an
AutoSearchPro space as ONNX Runtime's settings.

Example:
    >>> from raysearch.errors import ErrorCollector
    >>> t = Translation({}, ErrorCollector())
    >>> quark_space(t, {"activation": ["Int8Spec"], "weight": ["Int8Spec"]}, "search_space")
    {'activation_type': ['QInt8'], 'weight_type': ['QInt8']}
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from raysearch.config._dialects import Translation
from raysearch.errors import ConfigError

__all__ = ["quark_space"]

#: Value prefixes of Quark's Python examples (the enum's class name).
_ENUMS = ("QuantType.", "ExtendedQuantType.", "CalibrationMethod.", "QuantFormat.")
_POT = "PowerOfTwoMethod"
_POT_METHODS = ("NonOverflow", "MinMSE")
#: Data types of Quark's that ONNX Runtime's quantizer cannot write.
_UNWRITABLE = {
    "QBFloat16": "bfloat16",
    "QFloat16": "float16",
    "QInt32": "int32",
    "QUInt32": "uint32",
    "QBFP": "block floating point",
    "QMX": "microscaling (MX)",
    "QMXINT8": "microscaling (MX)",
}
#: AutoSearchPro's data-type specs -> ONNX Runtime's types (None: refused, with the type).
_SPECS: dict[str, str | None] = {
    **{
        f"{t}{s}": f"Q{t}"
        for t in ("Int8", "UInt8", "Int16", "UInt16", "Int4", "UInt4")
        for s in ("Spec", "")
    },
    **{
        f"{t}{s}": None
        for t in ("BF16", "FP16", "BFP16", "MX", "MXINT8", "Int32", "UInt32")
        for s in ("Spec", "")
    },
}
#: AutoSearchPro's fine-tuning parameters -> raysearch's ``extra_options`` keys.
_FINETUNE = {
    "num_iterations": "NumIterations",
    "learning_rate": "LearningRate",
    "optim_device": "OptimDevice",
    "data_size": "DataSize",
    "batch_size": "BatchSize",
    "fixed_seed": "FixedSeed",
    "NumIterLR": "NumIterLR",
}
_LAYERWISE = (
    "LayerwisePercentile: Quark's percentile per layer; ONNX Runtime's Percentile takes one "
    "percentile for every tensor (extra_options.CalibPercentile)"
)
#: Quark's switches of its own presets, refused with what raysearch writes instead.
_PRESETS = {
    "enable_npu_cnn": "Quark's NPU CNN preset: write its settings, power-of-two scales "
    "(extra_options.PowerOfTwoMethod: [NonOverflow]) with ActivationSymmetric and "
    "WeightSymmetric: [true]",
    "enable_npu_transformer": "Quark's NPU transformer preset: write its settings "
    "(activation_type, weight_type, extra_options) in the space",
}
#: AutoSearchPro space entries whose only honest value is "nothing set" (None, False).
_NOTHING_SET = {
    "specific_layer_config": "per-layer types are raysearch's mixed_precision group or "
    "extra_options.TensorQuantOverrides",
    "layer_type_config": "types per op type are raysearch's op_types_to_quantize and "
    "extra_options.TensorQuantOverrides",
    "exclude": "nodes kept float are raysearch's nodes_to_exclude",
    "use_external_data_format": "raysearch keeps a model's tensors as the float model keeps "
    "them (external data or not)",
    "OptimizeModel": "ONNX Runtime's quantizer no longer optimizes the model",
}


_PRO_KEYS = {"activation", "weight", "activation_params", "weight_params", "algorithms"}


def quark_space(t: Translation, space: dict[str, Any], path: str) -> dict[str, Any]:
    """One space: Python spellings of values, power-of-two methods, AutoSearchPro's keys."""
    space = _spelled(t, space, path)
    _power_of_two(t, space, path)
    if _PRO_KEYS & space.keys():
        space = _pro_space(t, space, path)
    options = space.get("extra_options")
    fast_ft = options.get("FastFinetune") if isinstance(options, dict) else None
    if isinstance(fast_ft, dict) and "InferDevice" in fast_ft:  # AutoSearch's spelling
        where = f"{path}.extra_options.FastFinetune.InferDevice"
        _infer_device(t, fast_ft.pop("InferDevice"), where)
    for key in _PRESETS.keys() & space.keys():
        space.pop(key)
        t.errors.add(ConfigError(f"{path}.{key}", _PRESETS[key]))
    auto_mp = space.get("include_auto_mp")
    if isinstance(auto_mp, list) and auto_mp and not any(auto_mp):
        space.pop("include_auto_mp")
        t.notes.append(f"{path}.include_auto_mp: false: no automatic mixed precision")
    return space


def _name(value: Any) -> Any:
    """An enum object as its Python spelling (``QuantType.QInt8``), other values as given."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return value


def _spelled(t: Translation, node: Any, path: str) -> Any:
    """``node`` with ``QuantType.QInt8``-style values as names; unwritable types refused."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            where = f"{path}.{key}"
            try:
                out[key] = _spelled(t, value, where)
            except ConfigError as exc:
                t.errors.add(exc)
        return out
    if isinstance(node, (list, tuple)):
        return [_spelled(t, v, path) for v in node]
    value = _name(node)
    if not isinstance(value, str) or not value.startswith(_ENUMS):
        return value
    name = value.partition(".")[2]
    if name in _UNWRITABLE:
        raise ConfigError(
            path, f"{value}: ONNX Runtime's quantizer cannot write {_UNWRITABLE[name]} tensors"
        )
    t.notes.append(f"{value} -> {name}")
    return name


def _pot_method(value: Any) -> str | None:
    """The power-of-two method ``value`` spells (``PowerOfTwoMethod.MinMSE``, ``MinMSE``)."""
    value = _name(value)
    if not isinstance(value, str):
        return None
    name = value.removeprefix(f"{_POT}.")
    return name if name in _POT_METHODS else None


def _power_of_two(t: Translation, space: dict[str, Any], path: str) -> None:
    """Power-of-two ``calibrate_method``: MinMax with ``PowerOfTwoMethod`` (mixed: refused)."""
    written = space.get("calibrate_method")
    values = written if isinstance(written, list) else [written]
    methods = [_pot_method(v) for v in values]
    if not any(methods):
        return
    where = f"{path}.calibrate_method"
    extra = space.setdefault("extra_options", {})
    if not all(methods) or not isinstance(extra, dict) or _POT in extra:
        space.pop("calibrate_method")
        t.errors.add(
            ConfigError(
                where,
                f"{_name(values[methods.index(next(m for m in methods if m))])}: power-of-two "
                f"scales are extra_options.{_POT} ({', '.join(_POT_METHODS)}) in raysearch, "
                "with a calibrate_method such as MinMax; to search them beside other "
                "calibration methods give two spaces (search_spaces)",
            )
        )
        return
    space["calibrate_method"] = ["MinMax"]
    extra[_POT] = list(dict.fromkeys(methods))
    t.notes.append(
        f"{where}: {', '.join(f'{_POT}.{m}' for m in methods)} -> calibrate_method: [MinMax], "
        f"extra_options.{_POT}: {extra[_POT]}"
    )


def _pro_space(t: Translation, space: dict[str, Any], path: str) -> dict[str, Any]:
    """An AutoSearchPro space written as ONNX Runtime's settings (see the module)."""
    out: dict[str, Any] = {}
    extra: dict[str, Any] = dict(space.get("extra_options") or {})
    for key, value in space.items():
        where = f"{path}.{key}"
        if key in ("activation", "weight"):
            types = _types(t, value, where)
            if types is not None:
                out[f"{key}_type"] = types
                t.notes.append(f"{where} -> {path}.{key}_type")
        elif key in ("activation_params", "weight_params"):
            _tensor_params(t, key.partition("_")[0], value, where, out, extra)
        elif key == "algorithms":
            _algorithms(t, value, where, out, extra)
        elif key.endswith("_params") and key.partition("_")[0] in ("adaround", "adaquant"):
            group = _finetune_params(t, key.partition("_")[0], value, where)
            if group:
                out[key] = group
        elif key in _NOTHING_SET:
            choices = value if isinstance(value, list) else [value]
            if any(v not in (None, False) for v in choices):
                t.errors.add(ConfigError(where, f"not offered: {_NOTHING_SET[key]}"))
            else:
                t.notes.append(f"{where}: {choices}: nothing set")
        elif key != "extra_options":
            out[key] = value
    if extra:
        out["extra_options"] = extra
    return out


def _types(t: Translation, value: Any, where: str) -> list[str] | None:
    choices = value if isinstance(value, list) else [value]
    types = []
    for spec in choices:
        if not isinstance(spec, str) or spec not in _SPECS:
            t.errors.add(
                ConfigError(
                    where,
                    f"unknown data type {spec!r} (Int8Spec, UInt8Spec, Int16Spec, UInt16Spec, "
                    "Int4Spec, UInt4Spec)",
                )
            )
            return None
        mapped = _SPECS[spec]
        if mapped is None:
            t.errors.add(
                ConfigError(where, f"{spec}: ONNX Runtime's quantizer cannot write this data type")
            )
            return None
        types.append(mapped)
    return types


def _tensor_params(
    t: Translation, tensor: str, value: Any, where: str, out: dict[str, Any], extra: dict[str, Any]
) -> None:
    """``activation_params`` / ``weight_params``: ``symmetric`` and ``calibration_method``."""
    if not isinstance(value, Mapping):
        t.errors.add(ConfigError(where, f"expected a mapping, got {value!r}"))
        return
    condition = value.get("only_if", tensor)
    if condition != tensor:
        t.errors.add(
            ConfigError(f"{where}.only_if", f"expected {tensor!r} (the {tensor} spec is set)")
        )
    symmetric = "ActivationSymmetric" if tensor == "activation" else "WeightSymmetric"
    for key, choices in value.items():
        at = f"{where}.{key}"
        if key == "only_if":
            continue
        if key == "symmetric":
            extra[symmetric] = choices
            t.notes.append(f"{at} -> extra_options.{symmetric}")
        elif key == "calibration_method" and tensor == "activation":
            if "LayerwisePercentile" in (choices if isinstance(choices, list) else [choices]):
                t.errors.add(ConfigError(at, _LAYERWISE))
                continue
            out["calibrate_method"] = choices
            t.notes.append(f"{at} -> calibrate_method")
        elif key == "calibration_method":
            listed = choices if isinstance(choices, list) else [choices]
            if listed != ["MinMax"]:
                t.errors.add(
                    ConfigError(
                        at, "ONNX Runtime sets weight ranges by their min and max only: [MinMax]"
                    )
                )
            else:
                t.notes.append(f"{at}: [MinMax]: how ONNX Runtime quantizes weights")
        else:
            t.errors.add(
                ConfigError(at, "not offered (raysearch reads symmetric and calibration_method)")
            )


def _algorithms(
    t: Translation, value: Any, where: str, out: dict[str, Any], extra: dict[str, Any]
) -> None:
    """``algorithms``: AdaRound and AdaQuant are raysearch's fast fine-tuning."""
    choices = value if isinstance(value, list) else [value]
    wrong = [c for c in choices if c not in ("adaround", "adaquant")]
    if wrong:
        t.errors.add(
            ConfigError(
                where,
                f"{wrong[0]!r}: raysearch's fine-tuning algorithms are adaround and adaquant; "
                "CLE, SmoothQuant and bias correction are the switches include_cle, "
                "include_sq, include_bias_correction",
            )
        )
        return
    out["include_fast_ft"] = [True]
    extra["OptimAlgorithm"] = choices
    t.notes.append(f"{where} -> include_fast_ft: [true], extra_options.OptimAlgorithm")


def _infer_device(t: Translation, choices: Any, at: str) -> None:
    """``infer_device``: a device name is accepted (each trial's own decides); else refused."""
    values = choices if isinstance(choices, list) else [choices]
    wrong = [v for v in values if not _is_device(v)]
    if wrong:
        t.errors.add(ConfigError(at, f"{wrong[0]!r}: not a device (cpu, cuda or cuda:<index>)"))
        return
    t.notes.append(
        f"{at}: {', '.join(map(str, values))}: decided by raysearch, not by the config: "
        "fine-tuning infers on each trial's own device (optim_device chooses where it "
        "optimises)"
    )


def _is_device(value: Any) -> bool:
    """Whether ``value`` names a device as Quark writes one: ``cpu``, ``cuda``, ``cuda:<i>``."""
    if not isinstance(value, str):
        return False
    name, _, index = value.partition(":")
    return name in ("cpu", "cuda") and (not index or (name == "cuda" and index.isdigit()))


def _finetune_params(t: Translation, algorithm: str, value: Any, where: str) -> dict[str, Any]:
    """``adaquant_params``/``adaround_params``: a group active with its algorithm."""
    if not isinstance(value, Mapping):
        t.errors.add(ConfigError(where, f"expected a mapping, got {value!r}"))
        return {}
    condition = value.get("only_if")
    if condition not in (None, {"algorithms": algorithm}):
        t.errors.add(ConfigError(f"{where}.only_if", f"expected {{algorithms: {algorithm}}}"))
    options: dict[str, Any] = {}
    for key, choices in value.items():
        at = f"{where}.{key}"
        if key == "only_if":
            continue
        if key in _FINETUNE:
            options[_FINETUNE[key]] = choices
        elif key == "infer_device":
            _infer_device(t, choices, at)
        else:
            t.errors.add(ConfigError(at, f"not offered (raysearch reads {', '.join(_FINETUNE)})"))
    if not options:
        return {}
    t.notes.append(
        f"{where} -> extra_options {', '.join(options)} when OptimAlgorithm is {algorithm}"
    )
    return {"only_if": {"extra_options.OptimAlgorithm": algorithm}, "extra_options": options}
