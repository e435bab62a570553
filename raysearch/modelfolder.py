"""A language model as its client loads it: an onnxruntime-genai or Optimum folder, kept with
the client's files (:data:`CLIENT_FILES`); its key/value cache's shape from the config
beside it, else the graph (:func:`cache_dims`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from raysearch.fileio import readable_mode
from raysearch.layout import CLIENT_FILES, GENAI_CONFIG, HF_CONFIG
from raysearch.modelfile import node_attribute

__all__ = [
    "CacheDims",
    "ModelFolder",
    "cache_dims",
    "find_model_file",
    "model_folder",
]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _genai_decoder(folder: Path) -> dict[str, Any] | None:
    config = _read_json(folder / GENAI_CONFIG)
    decoder = ((config or {}).get("model") or {}).get("decoder")
    return decoder if isinstance(decoder, dict) else None


def _is_hf_config(folder: Path) -> bool:
    config = _read_json(folder / HF_CONFIG)
    return config is not None and "model_type" in config


@dataclass(frozen=True)
class ModelFolder:
    """A model file in the folder of the client that loads it.

    Args:
        kind: ``"genai"`` (onnxruntime-genai) or ``"optimum"``.
        path: the folder.
        model_name: the model file's name in it.
    """

    kind: str
    path: Path
    model_name: str

    def client_files(self) -> list[Path]:
        """The files of :data:`CLIENT_FILES` the folder holds."""
        found: dict[str, Path] = {}
        for pattern in CLIENT_FILES:
            for item in sorted(self.path.glob(pattern)):
                if item.is_file():
                    found.setdefault(item.name, item)
        return list(found.values())

    def copy_into(self, target: Path, model_name: str | None = None) -> None:
        """Copy the client's files into ``target``, ``genai_config.json`` naming ``model_name``."""
        target.mkdir(parents=True, exist_ok=True)
        for source in self.client_files():
            dest = target / source.name
            shutil.copyfile(source, dest)
            os.chmod(dest, readable_mode())
        if model_name and model_name != self.model_name and self.kind == "genai":
            config = _read_json(target / GENAI_CONFIG) or {}
            config["model"]["decoder"]["filename"] = model_name
            (target / GENAI_CONFIG).write_text(json.dumps(config, indent=4), encoding="utf-8")

    def __str__(self) -> str:
        client = "onnxruntime-genai" if self.kind == "genai" else "Optimum"
        return f"{client} folder {self.path}"


def find_model_file(folder: str | os.PathLike) -> Path:
    """The model file of a genai or Optimum folder (ValueError, saying what it lacks)."""
    folder = Path(folder)
    decoder = _genai_decoder(folder)
    if decoder is not None:
        name = str(decoder.get("filename") or "model.onnx")
        if not (folder / name).is_file():
            raise ValueError(f"{folder / GENAI_CONFIG} names the decoder '{name}', not found")
        return folder / name
    if _is_hf_config(folder) and (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    raise ValueError(
        f"expected an .onnx file or a model folder (onnxruntime-genai's, with "
        f"{GENAI_CONFIG}; or Optimum's, with {HF_CONFIG} and model.onnx), got a directory "
        f"with neither: {folder}"
    )


def model_folder(model: str | os.PathLike) -> ModelFolder | None:
    """The onnxruntime-genai or Optimum client folder the model file ``model`` is in."""
    path = Path(model)
    folder = path.parent
    decoder = _genai_decoder(folder)
    if decoder is not None and str(decoder.get("filename") or "model.onnx") == path.name:
        return ModelFolder("genai", folder, path.name)
    if _is_hf_config(folder):
        return ModelFolder("optimum", folder, path.name)
    return None


@dataclass(frozen=True)
class CacheDims:
    """A decoder's key/value cache per layer: ``kv_heads`` heads of ``head_size``."""

    kv_heads: int
    head_size: int


def _from_genai(folder: Path) -> CacheDims | None:
    decoder = _genai_decoder(folder) or {}
    heads = decoder.get("num_key_value_heads") or decoder.get("num_attention_heads")
    size = decoder.get("head_size")
    if isinstance(heads, int) and isinstance(size, int) and heads > 0 and size > 0:
        return CacheDims(heads, size)
    return None


def _from_hf(folder: Path) -> CacheDims | None:
    config = _read_json(folder / HF_CONFIG) or {}
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    size = config.get("head_dim")
    if not isinstance(size, int) and isinstance(heads, int) and heads:
        hidden = config.get("hidden_size")
        size = hidden // heads if isinstance(hidden, int) else None
    if isinstance(kv_heads, int) and isinstance(size, int) and kv_heads > 0 and size > 0:
        return CacheDims(kv_heads, size)
    return None


def _output_width(graph: onnx.GraphProto, name: str) -> int | None:
    """The last axis of tensor ``name`` when a weight MatMul writes it (through a bias Add)."""
    producers = {out: node for node in graph.node for out in node.output}
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    node = producers.get(name)
    if node is not None and node.op_type == "Add":
        node = next((producers[i] for i in node.input if i in producers), None)
    if node is None:
        return None
    if node.op_type == "MatMulNBits":
        width = node_attribute(node, "N")
        return int(width) if width else None
    if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in shapes:
        dims = shapes[node.input[1]]
        return int(dims[-1]) if dims else None
    return None


def _from_graph(proto: onnx.ModelProto) -> CacheDims | None:
    graph = proto.graph
    for node in graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        heads, kv_heads = node_attribute(node, "num_heads"), node_attribute(node, "kv_num_heads")
        if not heads or not kv_heads:
            continue
        if len(node.input) > 1 and node.input[1]:  # separate key projection
            width, parts = _output_width(graph, node.input[1]), kv_heads
        else:  # packed q/k/v
            width, parts = _output_width(graph, node.input[0]), heads + 2 * kv_heads
        if width and width % parts == 0:
            return CacheDims(int(kv_heads), width // parts)
    return None


def cache_dims(
    model: str | os.PathLike | None, proto: onnx.ModelProto | None = None
) -> CacheDims | None:
    """The key/value cache's head count and size (client's config, else graph), or None."""
    if model is not None:
        folder = Path(model).parent
        dims = _from_genai(folder) or (_from_hf(folder) if _is_hf_config(folder) else None)
        if dims is not None:
            return dims
        if proto is None:
            proto = onnx.load(os.fspath(model), load_external_data=False)
    return _from_graph(proto) if proto is not None else None
