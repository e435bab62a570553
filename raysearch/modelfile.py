"""An ONNX model as files on disk: its graph's tensors, the external-data files it references
(every model over 2 GB has them), its hash and size, and moving, copying or deleting it whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import uses_external_data

from raysearch.fileio import atomic_write_bytes, readable_mode, replacing

__all__ = [
    "load_header",
    "header_problem",
    "graph_nodes",
    "graph_tensors",
    "node_attribute",
    "has_external_data",
    "external_data_locations",
    "data_file_names",
    "model_files",
    "file_hash",
    "FileHashes",
    "cached_file_hash",
    "model_size_bytes",
    "write_model",
    "place_model",
    "remove_model",
]


def load_header(path: str | os.PathLike) -> onnx.ModelProto:
    """The model at ``path`` without its external data."""
    return onnx.load(os.fspath(path), load_external_data=False)


#: Protocol-buffer wire types: a varint, 8 bytes, length-delimited, 4 bytes.
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def header_problem(path: str | os.PathLike) -> str | None:
    """Why the file at ``path`` is not an ONNX model, or None, from its top-level fields' tags
    and lengths alone (a model of any size is checked in a few reads).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".npz") as fh:
        ...     _ = fh.write(b"PK\\x03\\x04 a zip archive")
        ...     fh.flush()
        ...     header_problem(fh.name)
        'it is a zip archive, as NumPy .npz data is'
    """
    fields = onnx.ModelProto.DESCRIPTOR.fields_by_number
    seen: set[int] = set()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if fh.read(4) == b"PK\x03\x04":
            return "it is a zip archive, as NumPy .npz data is"
        fh.seek(0)
        while fh.tell() < size:
            start = fh.tell()
            tag = _read_varint(fh)
            number, wire = (tag >> 3, tag & 7) if tag is not None else (0, -1)
            field = fields.get(number)
            varint = field is not None and field.type == field.TYPE_INT64
            expected = {_VARINT if varint else _LENGTH} if field else {0, 1, 2, 5}
            if number == 0 or wire not in expected:
                return f"no ONNX model field at byte {start}"
            end = _field_end(fh, wire, size)
            if end > size:
                name = field.name if field else f"field {number}"
                return f"the file ends inside its {name}: cut short?"
            fh.seek(end)
            seen.add(number)
    by_name = onnx.ModelProto.DESCRIPTOR.fields_by_name
    missing = [name for name in ("ir_version", "graph") if by_name[name].number not in seen]
    return f"it has no {missing[0]}" if missing else None


def _field_end(fh: Any, wire: int, size: int) -> int:
    """Where a field of wire type ``wire`` starting at ``fh``'s position ends."""
    if wire in (_FIXED64, _FIXED32):
        return fh.tell() + (8 if wire == _FIXED64 else 4)
    value = _read_varint(fh)
    if value is None:
        return size + 1
    return fh.tell() if wire == _VARINT else fh.tell() + value


def _read_varint(fh: Any) -> int | None:
    """A protocol-buffer varint read from ``fh`` (None: end of file, or past ten bytes)."""
    value = 0
    for shift in range(0, 70, 7):
        byte = fh.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
    return None


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The subgraphs of ``node``'s attributes (``If`` branches, ``Loop`` and ``Scan`` bodies)."""
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs, each node before its subgraphs' nodes."""
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from graph_nodes(sub)


def node_attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of ``node``'s attribute ``name``, or ``default`` where it has none."""
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``graph`` that may hold data, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from graph_tensors(attribute.g)
            for sub in attribute.graphs:
                yield from graph_tensors(sub)


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in graph_tensors(proto.graph) if uses_external_data(t)]


def _rename_locations(proto: onnx.ModelProto, renamed: dict[str, str]) -> None:
    """Rewrite ``proto``'s ``location`` entries named in ``renamed`` to their new names."""
    for tensor in _external_tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value in renamed:
                entry.value = renamed[entry.value]


def _locations(proto: onnx.ModelProto) -> list[str]:
    """The external-data files ``proto`` references, in order of first use."""
    found: list[str] = []
    for tensor in _external_tensors(proto):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if location and location not in found:
            found.append(location)
    return found


def has_external_data(model: str | os.PathLike | onnx.ModelProto) -> bool:
    """Whether the model keeps any tensor in an external-data file."""
    proto = model if isinstance(model, onnx.ModelProto) else load_header(model)
    return bool(_external_tensors(proto))


def external_data_locations(path: str | os.PathLike) -> list[str]:
    """The external-data files the model at ``path`` references, in order of first use."""
    return _locations(load_header(Path(path)))


def data_file_names(model_name: str, count: int) -> list[str]:
    """What the ``count`` external-data files of a model file named ``model_name`` are called
    once raysearch placed it: ``<model_name>.data``, then ``<model_name>.data.1``, ...

    Example:
        >>> data_file_names("model.onnx", 2)
        ['model.onnx.data', 'model.onnx.data.1']
    """
    return [f"{model_name}.data" + (f".{i}" if i else "") for i in range(count)]


def model_files(path: str | os.PathLike) -> list[Path]:
    """The model file ``path`` followed by the external-data files it references."""
    path = Path(path)
    return [path] + [path.parent / location for location in external_data_locations(path)]


def _inside(folder: Path, location: str) -> bool:
    target = (folder / location).resolve()
    return target.is_relative_to(folder.resolve())


def _data_siblings(path: Path) -> list[Path]:
    """Files named as the external data of ``path`` would be (``<name>.data[.N]``)."""
    pattern = re.compile(re.escape(path.name) + r"\.data(\.\d+)?")
    if not path.parent.is_dir():
        return []
    return [p for p in path.parent.iterdir() if pattern.fullmatch(p.name)]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _copy_file(source: Path, target: Path) -> None:
    """``target`` becomes a copy of ``source`` atomically (a hard link where allowed)."""
    if _same_file(source, target):
        return  # linked before; renaming a link onto its twin would do nothing at all
    with replacing(target) as tmp:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)


def _move_file(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if _same_file(source, target):
        source.unlink()  # two links of one file: os.replace would leave both
        return
    try:
        os.replace(source, target)
    except OSError:  # another file system
        _copy_file(source, target)
        source.unlink()


def _place_model_file(
    source: Path, target: Path, proto: onnx.ModelProto, renamed: dict[str, str], *, move: bool
) -> None:
    """Put the model file at ``target``, its ``location`` entries renamed where needed."""
    if all(old == new for old, new in renamed.items()):
        if source.resolve() != target.resolve():
            (_move_file if move else _copy_file)(source, target)
        return
    _rename_locations(proto, renamed)
    atomic_write_bytes(target, proto.SerializeToString())
    if move and source.resolve() != target.resolve():
        source.unlink()


def place_model(source: str | os.PathLike, target: str | os.PathLike, *, move: bool) -> Path:
    """Move (or copy) the model ``source`` with its data files (named by
    :func:`data_file_names`, each placed atomically before the model file) to ``target``.
    """
    source, target = Path(source), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    proto = load_header(source)
    locations = _locations(proto)
    names = data_file_names(target.name, len(locations))
    for location in locations:
        if not _inside(source.parent, location):
            raise ValueError(f"{source}: external data '{location}' is outside its folder")
    for location, name in zip(locations, names):
        data, dest = source.parent / location, target.parent / name
        if data.resolve() != dest.resolve():
            (_move_file if move else _copy_file)(data, dest)
    _place_model_file(source, target, proto, dict(zip(locations, names)), move=move)
    for placed in [target, *(target.parent / name for name in names)]:
        os.chmod(placed, readable_mode())
    for stale in _data_siblings(target):
        if stale.name not in names:
            stale.unlink(missing_ok=True)
    return target


def remove_model(path: str | os.PathLike) -> None:
    """Delete the model ``path`` and its external-data files."""
    path = Path(path)
    doomed = set(_data_siblings(path))
    if path.is_file():
        try:
            locations = external_data_locations(path)
        except Exception:  # a file cut short: what its name says is enough
            locations = []
        doomed |= {path.parent / loc for loc in locations if _inside(path.parent, loc)}
    for item in [path, *doomed]:
        with contextlib.suppress(FileNotFoundError):
            item.unlink()


def file_hash(path: str | os.PathLike) -> str:
    """sha256 of a model file and the external-data files it references."""
    path = Path(path)
    digest = hashlib.sha256()
    _hash_file(digest, path)
    for location in sorted(set(external_data_locations(path))):
        digest.update(f"\0{location}\0".encode())
        _hash_file(digest, path.parent / location)
    return digest.hexdigest()


class FileHashes:
    """:func:`file_hash` remembered per file (real path, mtime and size)."""

    def __init__(self) -> None:
        self._hashes: dict[tuple[str, int, int], str] = {}

    def __call__(self, path: str | os.PathLike) -> str:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
        if key not in self._hashes:
            self._hashes[key] = file_hash(path)
        return self._hashes[key]


_FILE_HASHES = FileHashes()


def cached_file_hash(path: str | os.PathLike) -> str:
    """:func:`file_hash` remembered for this process."""
    return _FILE_HASHES(path)


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def model_size_bytes(path: str | os.PathLike) -> int:
    """Bytes of the model file plus its external data, the data named as ``model.onnx`` names it
    (so a trial's file weighs what the same model in ``best/`` does).
    """
    files = model_files(path)
    data = sum(p.stat().st_size for p in files[1:])
    if not data:
        return files[0].stat().st_size
    proto = load_header(Path(path))
    locations = _locations(proto)
    _rename_locations(proto, dict(zip(locations, data_file_names("model.onnx", len(locations)))))
    return proto.ByteSize() + data


#: Bytes of initializers past which a written model keeps them in an external file (a
#: ModelProto cannot be serialized past 2 GB, and ``ByteSize()`` itself raises there).
EXTERNAL_DATA_BYTES = 1_800_000_000


def write_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Save ``model`` to ``path``, its weights in ``<file name>.data`` past the threshold."""
    path = os.fspath(path)
    if sum(t.ByteSize() for t in model.graph.initializer) > EXTERNAL_DATA_BYTES:
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=os.path.basename(path) + ".data",
        )
    else:
        onnx.save_model(model, path)
