"""Reading data files: ``.npz``, ``.npy``, folders of either, and (through ``_parquet``)
``.parquet``. Pickles are never loaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raysearch.data._checks import PICKLE_MESSAGE
from raysearch.data._inputs import ModelInput
from raysearch.data._parquet import read_parquet
from raysearch.errors import DataError

__all__ = ["read_path"]


def read_path(path: Path, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    """The arrays in the file or folder ``path`` (by its suffix), ``{name: array}``."""
    if not path.exists():
        raise DataError(f"{where}: file not found: {path}")
    if path.is_dir():
        return _read_directory(path, inputs, where)
    if path.stat().st_size == 0:
        raise DataError(f"{where}: file is empty")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path, where)
    if suffix == ".npy":
        if len(inputs) != 1:
            names = ", ".join(i.name for i in inputs)
            raise DataError(
                f"{where}: a .npy file holds one array but the model has {len(inputs)} inputs "
                f"({names}); use an .npz file or a directory of .npy files named after them"
            )
        return {inputs[0].name: _read_npy(path, inputs[0].name, where)}
    if suffix in (".parquet", ".pq"):
        return read_parquet(path, inputs, where)
    raise DataError(
        f"{where}: unsupported file type '{path.suffix or path.name}'; expected .npz, .npy, "
        ".parquet or a directory of .npy/.npz files"
    )


def _read_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DataError(f"{where}: file is not a NumPy .npz archive") from None
        raise DataError(f"{where}: cannot read the file: {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{where}: cannot read the file: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{where}: file is not a NumPy .npz archive")
    arrays: dict[str, np.ndarray] = {}
    with archive:
        if not archive.files:
            raise DataError(f"{where}: holds no arrays")
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except ValueError as exc:
                if "bject" in str(exc) or "pickle" in str(exc):
                    raise DataError(f"{where}: array '{name}' {PICKLE_MESSAGE}") from None
                raise DataError(f"{where}: cannot read array '{name}': {exc}") from None
    return arrays


def _read_npy(path: Path, name: str, where: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:
        if "bject" in str(exc) or "pickle" in str(exc):
            raise DataError(f"{where}: array '{name}' {PICKLE_MESSAGE}") from None
        raise DataError(f"{where}: cannot read '{path.name}': {exc}") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{where}: cannot read '{path.name}': {exc}") from None


def _read_directory(path: Path, inputs: Sequence[ModelInput], where: str) -> dict[str, np.ndarray]:
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    npy = [p for p in files if p.suffix.lower() == ".npy"]
    npz = [p for p in files if p.suffix.lower() == ".npz"]
    if not npy and not npz:
        raise DataError(f"{where}: directory holds no .npy or .npz files")
    if npy and npz:
        raise DataError(
            f"{where}: directory mixes .npy and .npz files; use .npy files named after the "
            "inputs or .npz files holding every input"
        )
    for p in npy + npz:
        if p.stat().st_size == 0:
            raise DataError(f"{where}: file '{p.name}' is empty")
    if npy:
        return {p.stem: _read_npy(p, p.stem, where) for p in npy}
    parts = [_read_npz(p, f"{where} file '{p.name}'") for p in npz]
    names = list(parts[0])
    for p, part in zip(npz, parts):
        if sorted(part) != sorted(names):
            raise DataError(
                f"{where}: '{p.name}' holds arrays {sorted(part)}, '{npz[0].name}' holds "
                f"{sorted(names)}; every file must hold the same inputs"
            )
    arrays = {}
    for name in names:
        pieces = [part[name] for part in parts]
        shapes = {piece.shape[1:] for piece in pieces}
        dtypes = {piece.dtype for piece in pieces}
        if len(shapes) > 1 or len(dtypes) > 1:
            raise DataError(
                f"{where}: array '{name}' differs between files "
                f"(shapes {sorted(map(str, shapes))}, dtypes {sorted(map(str, dtypes))})"
            )
        arrays[name] = np.concatenate(pieces, axis=0)
    return arrays
