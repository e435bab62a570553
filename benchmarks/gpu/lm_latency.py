"""Latency of a decoder language model's weight-only variants on ONNX Runtime's CUDA provider
and on the CPU: one-token decode (``input_ids`` of shape [1, 1]) and a 128-token prefill
([1, 128]), median and spread of timed runs after warm-ups.

Where each kind of node ran on CUDA (``cuda_placement``: op type -> providers) is read from
ONNX Runtime's profile of one prefill: ONNX Runtime leaves shape computations to the CPU on
purpose, so what matters is that ``MatMulNBits`` runs on CUDA.

Usage (on the lent GPU machine, see README.md here):
    python3 benchmarks/gpu/lm_latency.py MODEL_DIR OUT_JSON FLOAT_MODEL [NAME=MODEL ...]

The variants quantized here with ONNX Runtime's ``MatMulNBitsQuantizer`` (block 128,
symmetric: ONNX Runtime's and Olive's default; 8 bits with ``accuracy_level`` 4) are timed
beside the given models.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from raysearch.quantize.backends.weight_only import import_quantizer  # noqa: E402

WARMUP, REPEATS = 5, 30


def _quantize(model: Path, out: Path, bits: int, accuracy_level: int | None) -> Path:
    mnq = import_quantizer()
    proto = onnx.load(str(model))
    config = mnq.DefaultWeightOnlyQuantConfig(
        block_size=128,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        quant_format=mnq.QuantFormat.QOperator,
        op_types_to_quantize=("MatMul",),
        bits=bits,
    )
    quantizer = mnq.MatMulNBitsQuantizer(proto, algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), use_external_data_format=False)
    return out


def _placement(path: Path) -> dict[str, list[str]]:
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(path.parent / f"profile_{path.stem}")
    session = ort.InferenceSession(str(path), options, providers=["CUDAExecutionProvider"])
    session.run(None, {"input_ids": np.zeros((1, 128), dtype=np.int64)})
    events = json.loads(Path(session.end_profiling()).read_text())
    seen: dict[str, set[str]] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args:
            seen.setdefault(args["op_name"], set()).add(args["provider"])
    return {op: sorted(providers) for op, providers in sorted(seen.items())}


def _time(path: Path, provider: str, seq: int) -> dict[str, object]:
    options = ort.SessionOptions()
    try:
        session = ort.InferenceSession(str(path), options, providers=[provider])
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        return {"error": str(exc).splitlines()[0][:300]}
    ids = np.random.default_rng(0).integers(0, 256, (1, seq), dtype=np.int64)
    for _ in range(WARMUP):
        session.run(None, {"input_ids": ids})
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        session.run(None, {"input_ids": ids})
        times.append((time.perf_counter() - start) * 1000)
    return {
        "median_ms": round(statistics.median(times), 4),
        "min_ms": round(min(times), 4),
        "max_ms": round(max(times), 4),
        "providers": session.get_providers(),
    }


def main(argv: list[str]) -> None:
    work, out_json, float_model = Path(argv[0]), Path(argv[1]), Path(argv[2])
    work.mkdir(parents=True, exist_ok=True)
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()
    models = {"float": float_model}
    models["int4_block128_sym"] = _quantize(float_model, work / "int4.onnx", 4, None)
    models["int8_block128_sym_acc4"] = _quantize(float_model, work / "int8.onnx", 8, 4)
    for pair in argv[3:]:
        name, path = pair.split("=", 1)
        models[name] = Path(path)
    rows = {}
    for name, path in models.items():
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        rows[name] = {"size_bytes": size, "cuda_placement": _placement(path)}
        for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
            for label, seq in (("decode_1", 1), ("prefill_128", 128)):
                rows[name][f"{provider[:-17].lower()}_{label}"] = _time(path, provider, seq)
        print(name, json.dumps(rows[name]))
    out_json.write_text(json.dumps({"ort": ort.__version__, "models": rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
