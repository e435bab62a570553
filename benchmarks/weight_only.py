"""Weight-only 4-bit quantization of a decoder language model (issue 46's acceptance): the
``WeightOnly`` strategy on ``WEIGHT_ONLY_INT4_SEARCH`` with ``metric: kl``, a tolerance and
``select: size``, against the one-shot settings other tools apply, in the same run.

The search is the ``raysearch run`` command (its wall time from the command's start). The
anchors call ONNX Runtime's ``MatMulNBitsQuantizer`` directly (not raysearch's backend):

- ONNX Runtime's class defaults: ``MatMulNBitsQuantizer(model)``: block 128, asymmetric;
- Olive's default (``OnnxBlockWiseRtnQuantization``): RTN block 128, symmetric;
- Neural Compressor's first choice: RTN group 32, asymmetric;
- NNCF's ``compress_weights`` with its defaults (8-bit asymmetric per-channel weights in
  ``DequantizeLinear``; skipped without NNCF);
- NNCF's 4-bit default, ``mode: int4_sym`` (group 128, ``lm_head`` and embeddings at its 8-bit
  backup), through raysearch's ``nncf_weight_only`` backend, which repairs what NNCF 3.4
  writes wrongly for ONNX Runtime (skipped without NNCF).

Every model (the search's ``best/`` too) is evaluated here the same way: KL(float ||
quantized) and next-token top-1 agreement with the float model (``raysearch.metrics``), each
with its 95 % bootstrap interval, on every row of the evaluation data, one thread; size is the
file; time is the quantization's (the search's: its whole wall time).

Usage:
    .venv/bin/python benchmarks/weight_only.py            # bytegpt, tolerance 0.00025
    .venv/bin/python benchmarks/weight_only.py --smoke    # the tiny decoder of the tests
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import Run, print_table  # noqa: E402
from raysearch.metrics import mean_metric, metric_interval, metric_per_sample  # noqa: E402
from raysearch.quantize.backends.weight_only import import_quantizer  # noqa: E402

BYTEGPT = ROOT.parent / "shared" / "models" / "bytegpt"
ANCHORS = {
    "ort_default (block 128, asym)": {"block_size": 128, "is_symmetric": False},
    "olive_default (RTN 128, sym)": {"block_size": 128, "is_symmetric": True},
    "inc_first (RTN 32, asym)": {"block_size": 32, "is_symmetric": False},
}


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    return _run(_session(path), ids)


def _run(session: ort.InferenceSession, ids: np.ndarray) -> np.ndarray:
    feeds = {"input_ids": ids}
    names = {i.name for i in session.get_inputs()}
    rows, seq = ids.shape
    if "attention_mask" in names:
        feeds["attention_mask"] = np.ones_like(ids)
    if "position_ids" in names:
        feeds["position_ids"] = np.broadcast_to(np.arange(seq, dtype=np.int64), ids.shape).copy()
    for spec in session.get_inputs():
        if spec.name.startswith("past_key_values"):
            shape = [rows] + [d if isinstance(d, int) else 0 for d in spec.shape[1:]]
            feeds[spec.name] = np.zeros(shape, np.float32)
    out = [o.name for o in session.get_outputs()]
    name = "logits" if "logits" in out else out[0]
    return session.run([name], feeds)[0]


def latencies(path: Path, ids: np.ndarray, runs: int = 20) -> dict[str, float]:
    """Median milliseconds (one thread) of a one-token forward pass (``[1, 1]``: what a decode
    step multiplies, without a cache for a model that has none) and of a prefill of one
    sequence (``[1, seq]``, 128 tokens on bytegpt), after one warm-up run each."""
    session = _session(path)
    out = {}
    for name, feed in (("decode_1_ms", ids[:1, :1]), ("prefill_ms", ids[:1])):
        _run(session, feed)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            _run(session, feed)
            times.append((time.perf_counter() - start) * 1000)
        out[name] = float(np.median(times))
    return out


def evaluate(path: Path, reference: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
    """KL, top-1 agreement (each with its 95 % interval), size and weight-MatMul precisions."""
    logits = _logits(path, ids)
    row: dict[str, Any] = {"size_kb": round(os.path.getsize(path) / 1000, 1)}
    row.update(latencies(path, ids))
    for name in ("kl", "top1_agreement"):
        values = metric_per_sample(name, {"logits": logits}, {"logits": reference})
        row[name] = mean_metric(name, values)
        row[f"{name}_ci"] = list(metric_interval(name, values))
    model = onnx.load(str(path), load_external_data=False)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    bits = [next(a.i for a in n.attribute if a.name == "bits") for n in nbits]
    row["matmuls_4bit"], row["matmuls_8bit"] = bits.count(4), bits.count(8)
    inits = {t.name: t for t in model.graph.initializer}
    floating = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    row["matmuls_float"] = sum(
        n.op_type == "MatMul" and n.input[1] in inits and inits[n.input[1]].data_type in floating
        for n in model.graph.node
    )
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    row["matmuls_dequantized"] = sum(
        n.op_type == "MatMul" and n.input[1] in dequantized for n in model.graph.node
    )
    return row


def anchor(model: Path, out: Path, block_size: int, is_symmetric: bool) -> float:
    """ONNX Runtime's MatMulNBitsQuantizer with these arguments; its seconds."""
    mnq = import_quantizer()
    start = time.perf_counter()
    quantizer = mnq.MatMulNBitsQuantizer(
        onnx.load(str(model)), block_size=block_size, is_symmetric=is_symmetric
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), use_external_data_format=False)
    return time.perf_counter() - start


def nncf_anchor(model: Path, out: Path) -> float | None:
    """NNCF's ``compress_weights`` with its defaults (8-bit asymmetric per-channel weights in
    DequantizeLinear); its seconds, or None without NNCF."""
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        return None
    from raysearch.quantize.backends.nncf import import_nncf

    nncf = import_nncf()
    float_model = onnx.load(str(model))
    start = time.perf_counter()
    compressed = nncf.compress_weights(float_model)
    seconds = time.perf_counter() - start
    onnx.save(compressed, str(out))
    return seconds


def nncf_int4_anchor(model: Path, out: Path) -> float | None:
    """NNCF's ``compress_weights(mode=INT4_SYM)`` through the ``nncf_weight_only`` backend
    (a weight whose rows 128 does not divide gets a smaller power of two: the tiny decoder's);
    its seconds, or None without NNCF."""
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        return None
    from raysearch.quantize.backends.nncf_weight_only import NncfWeightOnlyBackend

    settings = {"mode": "int4_sym", "group_size_fallback_mode": "adjust"}
    with NncfWeightOnlyBackend(model, None) as backend:
        start = time.perf_counter()
        backend.quantize(settings, out)
        return time.perf_counter() - start


def probe_subset_correlation(
    model: Path, base: dict[str, Any], reference: np.ndarray, ids: np.ndarray, rows: int
) -> dict[str, Any]:
    """The sensitivity ranking from probes scored on the first ``rows`` sequences against the
    one from every sequence: Spearman's rank correlation of the per-node KL (each probe: one
    weight MatMul alone at the base's 4 bits, the rest float, as the strategy's)."""
    from scipy.stats import spearmanr

    from raysearch.quantize.backends.weight_only import WeightOnlyBackend, weight_matmuls

    nodes = weight_matmuls(onnx.load(str(model)))
    subset, full = [], []
    with tempfile.TemporaryDirectory() as tmp, WeightOnlyBackend(model, None) as backend:
        for node in nodes:
            settings = {
                **base,
                "nodes_4bit": [node],
                "nodes_float": [n for n in nodes if n != node],
            }
            out = Path(tmp) / "probe.onnx"
            backend.quantize(settings, out)
            values = metric_per_sample("kl", {"logits": _logits(out, ids)}, {"logits": reference})
            subset.append(float(values[:rows].mean()))
            full.append(float(values.mean()))
    rho = spearmanr(subset, full).statistic
    top = sorted(range(len(nodes)), key=lambda i: -full[i])[:3]
    top_subset = sorted(range(len(nodes)), key=lambda i: -subset[i])[:3]
    return {
        "rows": rows,
        "of_rows": len(ids),
        "spearman": float(rho),
        "top3_all_rows": [nodes[i] for i in top],
        "top3_subset": [nodes[i] for i in top_subset],
    }


def search(model: Path, calib: Path, data: Path, folder: Path, tolerance: float) -> float:
    """``raysearch run`` of the WeightOnly strategy; its wall seconds from the start."""
    config = {
        "model": str(model),
        "calibration_data": str(calib),
        "eval_data": str(data),
        "search_space": "WEIGHT_ONLY_INT4_SEARCH",
        "search_algo": "WeightOnly",
        "metric": "kl",
        "tolerance": tolerance,
        "select": "size",
        "output_dir": str(folder / "search"),
        "seed": 0,
    }
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    start = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "raysearch"), "run", str(path)],
        capture_output=True,
        text=True,
        # cold: no sensitivity probe reused from an earlier run's probe cache
        env={**os.environ, "RAYSEARCH_PROBE_CACHE": "0"},
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    print(proc.stdout[-1500:])
    return wall


def _smoke_model(folder: Path) -> tuple[Path, Path, Path]:
    from tests.lm_models import VOCAB, make_decoder_lm

    model = make_decoder_lm(folder / "lm.onnx")
    ids = np.random.default_rng(5).zipf(1.5, (16, 12)).clip(1, VOCAB - 1).astype(np.int64)
    np.savez(folder / "text.npz", input_ids=ids)
    return model, folder / "text.npz", folder / "text.npz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tolerance", type=float, default=0.00025)
    parser.add_argument("--smoke", action="store_true", help="the tests' tiny decoder")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run = Run("weight_only", args)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.smoke:
            model, calib, data = _smoke_model(folder)
        else:
            model, calib, data = BYTEGPT / "model.onnx", BYTEGPT / "calib.npz", BYTEGPT / "eval.npz"
        ids = np.load(data)["input_ids"]
        reference = _logits(model, ids)
        rows = [{"setting": "float", "size_kb": round(os.path.getsize(model) / 1000, 1)}]
        rows[0].update(latencies(model, ids))
        for name, arguments in ANCHORS.items():
            out = folder / f"{len(rows)}.onnx"
            seconds = anchor(model, out, **arguments)
            rows.append({"setting": name, **evaluate(out, reference, ids), "time_s": seconds})
        seconds = nncf_anchor(model, folder / "nncf.onnx")
        if seconds is not None:
            row = {"setting": "nncf_default (compress_weights)"}
            rows.append(
                {**row, **evaluate(folder / "nncf.onnx", reference, ids), "time_s": seconds}
            )
        seconds = nncf_int4_anchor(model, folder / "nncf_int4.onnx")
        if seconds is not None:
            row = {"setting": "nncf_int4_sym (nncf_weight_only)"}
            rows.append(
                {**row, **evaluate(folder / "nncf_int4.onnx", reference, ids), "time_s": seconds}
            )
        wall = search(model, calib, data, folder, args.tolerance)
        best = folder / "search" / "best" / "model.onnx"
        summary = json.loads((folder / "search" / "summary.json").read_text())
        row = {"setting": "raysearch WeightOnly (best/)", **evaluate(best, reference, ids)}
        row["time_s"] = wall
        rows.append(row)
        base = {
            k.split(".")[-1]: v
            for k, v in (summary.get("best_params") or {}).items()
            if k.split(".")[-1] in ("algorithm", "bits", "block_size", "symmetric")
        }
        correlation = probe_subset_correlation(model, base, reference, ids, max(1, len(ids) // 4))
        import pyarrow.parquet as pq

        table = pq.read_table(folder / "search" / "results.parquet").to_pylist()
    stages: dict[str, int] = {}
    for record in table:
        stages[record.get("stage") or "?"] = stages.get(record.get("stage") or "?", 0) + 1
    probes = [r for r in table if r.get("stage") == "sensitivity" and r.get("metric") is not None]
    ranking = [
        {"node": (r.get("params/nodes_4bit") or r.get("params/nodes_8bit"))[0], "kl": r["metric"]}
        for r in sorted(probes, key=lambda r: -r["metric"])
    ]
    print(
        f"sensitivity probes on {correlation['rows']} of {correlation['of_rows']} rows against "
        f"all rows: Spearman {correlation['spearman']:.3f}; top 3 {correlation['top3_subset']} "
        f"against {correlation['top3_all_rows']}"
    )
    print_table(
        rows,
        [
            "setting",
            "kl",
            "top1_agreement",
            "size_kb",
            "time_s",
            "decode_1_ms",
            "prefill_ms",
            "matmuls_4bit",
            "matmuls_8bit",
        ],
        f"weight-only int4 on {'the tiny decoder' if args.smoke else 'bytegpt'}",
    )
    run.write(
        {
            "tolerance": args.tolerance,
            "rows": rows,
            "search_wall_s": wall,
            "search_trials": len(table),
            "trials_per_stage": stages,
            "best_params": summary.get("best_params"),
            "sensitivity_ranking": ranking,
            "probe_subset_rank_correlation": correlation,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
