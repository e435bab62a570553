"""The ``"weight_only"`` backend: ONNX Runtime's ``MatMulNBitsQuantizer`` (blocked 4/8-bit
weights, float activations), with every setting of ``weight_only.options``.

RTN and HQQ quantize every selected node at one choice, so nodes that differ are one pass per
distinct choice, each excluding the nodes of other choices and those kept float. k-quant reads
``bits`` and the block from a per-node configuration only: its nodes are one pass. The nodes
at ``algorithm: source`` are copied from ``weight_source`` after the passes (``_source``); the
nodes at ``algorithm: gptq`` are rounded by raysearch's GPTQ (``_gptq``) against the Hessians
of their inputs over the calibration data, computed once per backend (one float-model run for
the nodes not yet measured) and kept for the next settings of the trial process. The other
algorithms read the weights alone.

A float model with external data is never held whole: RTN, HQQ and GPTQ read each weight as
they rewrite its node (``_external``); k-quant reads the weights in for its pass.

Example:
    >>> from raysearch.quantize.backends.weight_only._backend import WeightOnlyBackend
    >>> WeightOnlyBackend.reject({"algorithm": "gptq", "symmetric": False}) is None
    True
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from raysearch.errors import ConfigError, suggest
from raysearch.modelfile import has_external_data, load_header
from raysearch.modelgraph import embedding_gathers, weight_matmuls  # re-exported
from raysearch.quantize.backends.weight_only._external import load_remaining, weights_on_demand
from raysearch.quantize.backends.weight_only._gptq import (
    gptq_codes,
    hessians,
    inverse_factor,
    pack,
)
from raysearch.quantize.backends.weight_only._nbits import loaded_tensor, replace_matmuls
from raysearch.quantize.backends.weight_only._source import (
    source_model_file,
    source_nodes,
    source_refusal,
    write_from_source,
)
from raysearch.quantize.backends.weight_only.options import (
    DEFAULTS,
    FLOAT,
    NODE_KEYS,
    WEIGHT_ONLY_CATALOGUE,
    NodeChoice,
    names_nodes,
    node_choices,
    reject_reason,
    top_choice,
)
from raysearch.quantize.registry import QuantizeInfo, QuantizerBackend, register_backend

if TYPE_CHECKING:
    import onnx

    from raysearch.data import DataSource
    from raysearch.quantize.calibration import CalibrationCache
    from raysearch.space.catalogue import Catalogue


__all__ = ["WeightOnlyBackend", "weight_matmuls", "embedding_gathers", "import_quantizer"]

_logger = logging.getLogger(__name__)


def import_quantizer() -> Any:
    """ONNX Runtime's ``matmul_nbits_quantizer`` imported without its root ``basicConfig``, its
    logger at WARNING.
    """
    import sys

    name = "onnxruntime.quantization.matmul_nbits_quantizer"
    if name not in sys.modules:
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        try:
            importlib.import_module(name)
        finally:
            for handler in [h for h in root.handlers if h not in handlers]:
                root.removeHandler(handler)
            root.setLevel(level)
        for logger in (name, "neural_compressor"):
            logging.getLogger(logger).setLevel(logging.WARNING)
    return sys.modules[name]


@register_backend("weight_only")
class WeightOnlyBackend(QuantizerBackend):
    """ONNX Runtime's ``MatMulNBitsQuantizer`` with the trial's settings (see the module)."""

    catalogue: ClassVar[Catalogue | None] = WEIGHT_ONLY_CATALOGUE
    model_settings: ClassVar[tuple[str, ...]] = (*NODE_KEYS, "weight_source")

    def __init__(
        self,
        model_path: str | os.PathLike,
        calibration: DataSource,
        cache: CalibrationCache | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model_path, calibration, cache, **options)
        import onnx

        self._external = has_external_data(self.model_path)
        # With external data, the graph alone: the weights are read node by node as passes
        # rewrite them (see the module); a model in one file is small enough to hold.
        self._model = load_header(self.model_path) if self._external else onnx.load(self.model_path)
        self._weights = weight_matmuls(self._model)
        self._gathers = embedding_gathers(self._model)
        self._weighted = sum(
            n.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") for n in self._model.graph.node
        )
        #: GPTQ's inverse-Hessian factor of each weight MatMul's input over the calibration
        #: data, by input name (made when a setting first rounds a node reading it by GPTQ;
        #: K x K float64 each, shared by the nodes of one input).
        self._factors: dict[str, Any] = {}

    # -- checks ----------------------------------------------------------------------------
    @classmethod
    def validate(
        cls, settings: Mapping[str, Any], model: str | os.PathLike | onnx.ModelProto
    ) -> None:
        """Refuse node names that are no weight MatMul of ``model`` and an unusable
        ``weight_source``.
        """
        source = settings.get("weight_source")
        if not names_nodes(settings) and not source:
            return
        import onnx

        proto = (
            onnx.load(os.fspath(model), load_external_data=False)
            if isinstance(model, (str, os.PathLike))
            else model
        )
        names = weight_matmuls(proto) if proto.graph.initializer else []
        if not names:  # weights not loaded: read the names of every MatMul
            names = [n.name for n in proto.graph.node if n.op_type == "MatMul"]
        if source:
            try:
                given = source_nodes(source)
            except ValueError as exc:
                message = str(exc).removeprefix("weight_source: ").removeprefix("weight_source ")
                raise ConfigError("weight_source", message) from None
            if not set(given) & set(names):
                raise ConfigError(
                    "weight_source",
                    f"{source_model_file(source)} has no MatMulNBits named as a weight MatMul "
                    f"of the model (its first: {next(iter(given.values())).name}; the "
                    f"model's: {names[0] if names else 'none'})",
                )
        for key in NODE_KEYS:
            missing = [n for n in settings.get(key) or () if n not in names]
            if missing:
                described = ", ".join(f"'{v}'{suggest(v, names)}" for v in missing)
                raise ConfigError(key, f"not a weight MatMul of the model: {described}")

    @classmethod
    def reject(cls, settings: Mapping[str, Any]) -> str | None:
        reason = reject_reason(settings)
        if reason is None and settings.get("algorithm") == "hqq":
            if importlib.util.find_spec("torch") is None:
                return "algorithm hqq needs PyTorch: pip install 'raysearch[gp]'"
        return reason

    @classmethod
    def reject_on_model(
        cls, settings: Mapping[str, Any], weights: Mapping[str, Sequence[int]]
    ) -> str | None:
        """4-bit k-quant with an odd block count per column, and a source node with no match."""
        choices = node_choices(settings, weights)
        nodes: Mapping[str, Any] = {}
        if any(isinstance(c, NodeChoice) and c.algorithm == "source" for c in choices.values()):
            try:
                nodes = source_nodes(settings["weight_source"])  # read once per setting
            except ValueError as exc:
                return str(exc)
        for name, choice in choices.items():
            if not isinstance(choice, NodeChoice):
                continue
            if choice.algorithm == "k_quant":
                reason = _k_quant_refusal(choice, int(weights[name][0]), name)
            elif choice.algorithm == "source":
                reason = source_refusal(choice, name, weights[name], nodes)
            else:
                reason = None
            if reason:
                return reason
        return None

    @property
    def _folder(self) -> str:
        """The folder of the float model, where its external-data files are."""
        return os.path.dirname(os.path.abspath(self.model_path))

    # -- quantization ----------------------------------------------------------------------
    def choices(self, settings: Mapping[str, Any]) -> dict[str, NodeChoice | str]:
        """Every weight MatMul's choice under ``settings`` (``"float"`` for one kept float)."""
        return node_choices(settings, self._weights)

    def quantize(self, settings: Mapping[str, Any], out_path: str | os.PathLike) -> QuantizeInfo:
        """Write the model quantized with ``settings`` to ``out_path``."""
        import onnx

        reason = self.reject(settings)
        if reason:
            raise ValueError(reason)
        start = time.perf_counter()
        options = {k: settings.get(k, v) for k, v in DEFAULTS.items()}
        choices = self.choices(settings)
        model = onnx.ModelProto()
        model.CopyFrom(self._model)
        k_quant = {n: c for n, c in choices.items() if isinstance(c, NodeChoice)
                   and c.algorithm == "k_quant"}  # fmt: skip
        if k_quant:
            if self._external:  # its pass reads the whole model at once
                load_remaining(model, self._folder)
            model = self._k_quant(model, options, k_quant)
        groups: dict[NodeChoice, list[str]] = {}
        for name, choice in choices.items():
            if isinstance(choice, NodeChoice) and choice.algorithm not in (
                "k_quant",
                "source",
                "gptq",
            ):
                groups.setdefault(choice, []).append(name)
        embeddings = bool(options["quantize_embeddings"])
        if embeddings:  # with the top level's choice (rtn, 4 bits: options), nodes or none
            groups.setdefault(top_choice(options), [])
        for choice, names in sorted(groups.items(), key=lambda item: -item[0].bits):
            top = embeddings and choice == top_choice(options)
            model = self._pass(model, options, choice, set(names), top)
        sourced = {n: c for n, c in choices.items() if isinstance(c, NodeChoice)
                   and c.algorithm == "source"}  # fmt: skip
        write_from_source(model, sourced, settings.get("weight_source") or "")
        gptq = {n: c for n, c in choices.items() if isinstance(c, NodeChoice)
                and c.algorithm == "gptq"}  # fmt: skip
        measured_s = self._gptq(model, gptq) if gptq else 0.0
        level = int(options["accuracy_level"])
        if level:
            _set_accuracy_level(model, level)
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        if self._external:
            load_remaining(model, self._folder)  # the weights no pass rewrote
            location = Path(out_path).name + ".data"
            onnx.save_model(
                model, os.fspath(out_path), save_as_external_data=True, location=location
            )
        else:
            onnx.save_model(model, os.fspath(out_path))
        quantized = sum(c != FLOAT for c in choices.values())
        share = quantized / self._weighted if self._weighted else None
        seconds = time.perf_counter() - start
        return QuantizeInfo(measured_s, seconds - measured_s, False, quantized_share=share)

    def _pass(
        self,
        model: onnx.ModelProto,
        options: Mapping[str, Any],
        choice: NodeChoice,
        chosen: set[str],
        embeddings: bool,
    ) -> onnx.ModelProto:
        """One RTN or HQQ pass over the nodes of ``chosen`` at ``choice`` (and ``embeddings``)."""
        from onnxruntime.quantization.quant_utils import QuantFormat

        mnq = import_quantizer()

        if not chosen and not embeddings:
            return model
        exclude = [n for n in self._weights if n not in chosen]
        op_types: tuple[str, ...] = ("MatMul", "Gather") if embeddings else ("MatMul",)
        if embeddings:  # only the embedding Gathers: others read indices or shapes
            gathers = set(self._gathers)
            exclude += [
                n.name for n in model.graph.node if n.op_type == "Gather" and n.name not in gathers
            ]
        bits, block, symmetric = choice.bits, choice.block_size, choice.symmetric
        fmt = QuantFormat[options["quant_format"]]
        level = int(options["accuracy_level"]) or None
        hqq = choice.algorithm == "hqq"
        if hqq:
            config: Any = mnq.HQQWeightOnlyQuantConfig(
                block_size=block, bits=bits, op_types_to_quantize=op_types
            )
        else:
            config = mnq.DefaultWeightOnlyQuantConfig(
                block_size=block,
                is_symmetric=symmetric,
                accuracy_level=level,
                quant_format=fmt,
                op_types_to_quantize=op_types,
                bits=bits,
            )
        quantizer = mnq.MatMulNBitsQuantizer(
            model,
            bits=bits,
            block_size=block,
            is_symmetric=symmetric,
            accuracy_level=level,
            nodes_to_exclude=exclude,
            quant_format=fmt,
            op_types_to_quantize=op_types,
            algo_config=config,
        )
        with contextlib.ExitStack() as stack:
            stack.enter_context(_quiet(self.threads if hqq else None))
            if self._external:
                stack.enter_context(weights_on_demand(quantizer, self._folder))
            quantizer.process()
        return quantizer.model.model

    def _gptq(self, model: onnx.ModelProto, chosen: Mapping[str, NodeChoice]) -> float:
        """Replace each MatMul of ``chosen`` by the ``MatMulNBits`` GPTQ rounds (``_gptq``);
        the seconds spent measuring Hessians not measured before (the trial's calibration)."""
        from onnx import numpy_helper

        from raysearch.providers import session_providers

        if self.calibration is None:
            raise ValueError("algorithm gptq reads the calibration data: the backend has none")
        graph = model.graph
        inputs = {n.name: n.input[0] for n in graph.node if n.name in chosen}
        missing = sorted({i for i in inputs.values() if i not in self._factors})
        measured_s = 0.0
        if missing:
            start = time.perf_counter()
            measured = hessians(
                self._model,
                self._folder if self._external else None,
                missing,
                self.calibration,
                threads=self.threads,
                providers=self.providers or session_providers(self.gpu_id),
            )
            for name in missing:
                self._factors[name] = inverse_factor(measured.pop(name))
            measured_s = time.perf_counter() - start
            _logger.info(
                "weight_only: Hessians of %d MatMul inputs over %d calibration samples in %.1f s",
                len(missing), len(self.calibration), measured_s,
            )  # fmt: skip

        def tensors_of(
            node: onnx.NodeProto, choice: NodeChoice, weight: onnx.TensorProto
        ) -> list[onnx.TensorProto]:
            array = numpy_helper.to_array(loaded_tensor(weight, self._folder))
            codes = gptq_codes(
                array,
                self._factors[node.input[0]],
                bits=choice.bits,
                block_size=choice.block_size,
                symmetric=choice.symmetric,
            )
            packed, zero_points = pack(codes)
            tensors = [
                numpy_helper.from_array(packed, f"{weight.name}_Q{choice.bits}"),
                numpy_helper.from_array(codes.scales.astype(array.dtype), f"{weight.name}_scales"),
            ]
            if zero_points is not None:
                tensors.append(numpy_helper.from_array(zero_points, f"{weight.name}_zero_points"))
            return tensors

        replace_matmuls(graph, chosen, tensors_of, lambda c: (c.bits, c.block_size))
        return measured_s

    def _k_quant(
        self,
        model: onnx.ModelProto,
        options: Mapping[str, Any],
        chosen: Mapping[str, NodeChoice],
    ) -> onnx.ModelProto:
        """k-quant in one pass over ``chosen``, each node through ONNX Runtime's per-node config."""
        mnq = import_quantizer()
        inits = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            if node.name in chosen:
                rows = int(inits[node.input[1]].dims[0])
                reason = _k_quant_refusal(chosen[node.name], rows, node.name)
                if reason:
                    raise ValueError(reason)
        per_node = {
            n: {"bits": c.bits, "group_size": c.block_size, "scheme": "asym"}
            for n, c in chosen.items()
        }
        config = mnq.KQuantWeightOnlyQuantConfig(customized_weight_config=per_node)
        quantizer = mnq.MatMulNBitsQuantizer(
            model,
            block_size=int(options["block_size"]),
            is_symmetric=False,
            accuracy_level=int(options["accuracy_level"]) or None,
            nodes_to_exclude=[n for n in self._weights if n not in chosen],
            algo_config=config,
        )
        with _quiet(None):  # its neural-compressor path prints a progress bar
            quantizer.process()
        result = quantizer.model
        return result.model if hasattr(result, "model") else result


@contextlib.contextmanager
def _quiet(torch_threads: int | None) -> Iterator[None]:
    """The quantizer without its progress bar and HQQ's read-only warning, on ``torch_threads``."""
    previous = None
    if torch_threads:
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(torch_threads)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            yield
    finally:
        if previous is not None:
            import torch

            torch.set_num_threads(previous)


def _set_accuracy_level(model: onnx.ModelProto, level: int) -> None:
    from onnx import helper

    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("accuracy_level", level)])


def _k_quant_refusal(choice: NodeChoice, rows: int, node: str) -> str | None:
    """Why ONNX Runtime's k-quant fails on a ``rows``-row weight at ``choice`` (at 4 bits a
    column needs an even number of blocks), or None.
    """
    block = choice.block_size
    blocks = -(-rows // block)
    if choice.bits != 4 or blocks % 2 == 0:
        return None
    return (
        f"ONNX Runtime's 4-bit k_quant fails where a weight's rows are not an even number of "
        f"blocks (node {node}: {rows} rows, {blocks} of block_size {block}): use another "
        f"block_size"
    )
