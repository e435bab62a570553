"""W&B's offline runs read back with W&B's own record format: a ``run-<id>.wandb`` file is a
LevelDB-style log (a 7-byte header, then 32 KiB blocks of framed chunks) of
``wandb.proto.wandb_internal_pb2.Record`` messages, which is what ``wandb sync`` uploads."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

#: The file's header: W&B's identifier, its magic number and the format's version.
HEADER = b":W&B" + struct.pack("<H", 0xBEE1) + bytes([0])
_BLOCK = 32768
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[Any]:
    """Every record of the ``.wandb`` file at ``path``, in order; a chunk whose checksum is
    wrong or that the file ends inside (a run cut short) ends the list."""
    data = path.read_bytes()
    assert data[: len(HEADER)] == HEADER, f"{path}: not a W&B run file"
    records, pending, offset = [], b"", len(HEADER)
    while offset + _CHUNK_HEADER <= len(data):
        left_in_block = _BLOCK - offset % _BLOCK
        if left_in_block < _CHUNK_HEADER:  # the block's tail is padding
            offset += left_in_block
            continue
        checksum, length, kind = struct.unpack_from("<IHB", data, offset)
        start = offset + _CHUNK_HEADER
        chunk = data[start : start + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != checksum:
            break
        offset = start + length
        if kind in (_FULL, _FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def read_run(path: Path) -> dict[str, Any]:
    """What an offline run holds: its ``run`` record's name, group and tags, its config (each
    key's JSON text), each logged step's values (JSON text), its summary and whether it ended
    (an ``exit`` record)."""
    run: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "exit": None}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(name=record.run.display_name, group=record.run.run_group)
            run["tags"] = list(record.run.tags)
            for item in record.run.config.update:
                run["config"][item.key] = item.value_json
        elif kind == "config":
            for item in record.config.update:
                run["config"][item.key or "/".join(item.nested_key)] = item.value_json
        elif kind == "history":
            step = {(i.key or "/".join(i.nested_key)): i.value_json for i in record.history.item}
            run["history"].append(step)
        elif kind == "summary":
            for item in record.summary.update:
                run["summary"][item.key or "/".join(item.nested_key)] = item.value_json
        elif kind == "exit":
            run["exit"] = record.exit.exit_code
    return run
