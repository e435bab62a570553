"""Toy techniques registered from outside raysearch: one of each kind, each a real transform.

- ``toy_identity`` (float-model transform, switch ``include_toy_identity``): appends
  ``toy_identity_count`` Identity nodes before the model's first output (named
  ``toy_identity_<i>``), so the float model the quantizer sees is another file.
- ``toy_float_tail`` (tensor-override producer, switch ``include_toy_float_tail``): keeps the
  last MatMul of the graph in float (``nodes_to_exclude``).
- ``toy_stamp`` (quantized-model transform, switch ``include_toy_stamp``): writes
  ``toy_stamp`` into the quantized model's metadata.

Importing this module registers them; no ``raysearch/`` module names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx

from raysearch.plugins import (
    FloatModelTransform,
    OptionSpec,
    QuantizedModelTransform,
    TensorOverrideProducer,
    TensorOverrides,
    register_technique,
)

#: Calls per technique in this process (tests check that a transform ran once per key).
CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


@register_technique("toy_identity")
class ToyIdentity(FloatModelTransform):
    settings = {
        "include_toy_identity": OptionSpec("bool", "insert Identity nodes before the output"),
        "toy_identity_count": OptionSpec(
            "int", "how many Identity nodes", low=1, requires="include_toy_identity"
        ),
    }

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        if not settings.get("include_toy_identity"):
            return None
        return str(int(settings.get("toy_identity_count", 1)))

    def transform(self, model_path, out_path, settings, calibration) -> None:
        _count(self.name)
        model = onnx.load(model_path)
        output = model.graph.output[0].name
        producer = next(n for n in model.graph.node if output in n.output)
        count = int(settings.get("toy_identity_count", 1))
        previous = f"{output}_toy_0"
        producer.output[list(producer.output).index(output)] = previous
        for i in range(count):
            name = output if i == count - 1 else f"{output}_toy_{i + 1}"
            model.graph.node.append(
                onnx.helper.make_node("Identity", [previous], [name], name=f"toy_identity_{i}")
            )
            previous = name
        onnx.save(model, out_path)


@register_technique("toy_float_tail")
class ToyFloatTail(TensorOverrideProducer):
    settings = {"include_toy_float_tail": OptionSpec("bool", "keep the last MatMul in float")}

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        return "on" if settings.get("include_toy_float_tail") else None

    def overrides(self, model_path: str, settings: Mapping[str, Any]) -> TensorOverrides:
        _count(self.name)
        model = onnx.load(model_path, load_external_data=False)
        last = [n.name for n in model.graph.node if n.op_type == "MatMul"][-1]
        return TensorOverrides(nodes_to_exclude=[last])


@register_technique("toy_stamp")
class ToyStamp(QuantizedModelTransform):
    settings = {"include_toy_stamp": OptionSpec("bool", "stamp the quantized model")}

    def effect_key(self, settings: Mapping[str, Any]) -> str | None:
        return "on" if settings.get("include_toy_stamp") else None

    def transform(self, quantized_path, float_path, settings, calibration) -> None:
        _count(self.name)
        model = onnx.load(quantized_path)
        model.metadata_props.add(key="toy_stamp", value="stamped")
        onnx.save(model, quantized_path)
