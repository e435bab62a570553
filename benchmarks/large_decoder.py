"""A weight-only search of a decoder over 2 GB saved with external data (issue 46 item 5):
memory per trial process against the model's size, the search's time, and best/ re-evaluated
after it is moved.

The decoder is ``tests/lm_models.py``'s at ``LARGE`` size (5 blocks of 2048 wide, a
16384-wide SwiGLU, 8192 tokens: 2.2 GiB of float32 weights in one external file, 36 weight
MatMuls), built here in a temporary folder. The search is ``AutoSearch`` in this process
(the driver: the float reference is computed here), a grid of RTN block sizes at 4 bits,
``metric: kl``, on 4 sequences of 16 tokens. Memory: every process of this run (this driver
and the Ray processes it started) is sampled; a process's peak is its ``VmHWM`` (the kernel's
high-water mark of its resident set, so no peak falls between samples).

Usage:
    .venv/bin/python benchmarks/large_decoder.py               # 2 block sizes, 2 at a time
    .venv/bin/python benchmarks/large_decoder.py --smoke       # the tests' tiny decoder, external
    .venv/bin/python benchmarks/large_decoder.py --blocks 32 64 128 --concurrent 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import Run, quiet  # noqa: E402
from tests.process_memory import PeakMemory  # noqa: E402

GIB = 2**30


def _config(model: Path, data: Path, out: Path, blocks: list[int], concurrent: int) -> dict:
    return {
        "model": str(model),
        "calibration_data": str(data),
        "batch_size": 4,
        "search_space": {
            "quantizer": ["weight_only"],
            "bits": [4],
            "algorithm": ["rtn"],
            "symmetric": [True],
            "block_size": blocks,
        },
        "search_algo": "Grid",
        "metric": "kl",
        "tolerance": 1.0,
        "measure_latency": False,
        "early_stopping": False,
        "resources": {"max_concurrent_trials": concurrent},
        "seed": 0,
        "output_dir": str(out),
    }


def reevaluate(model: Path, best: Path, feeds: dict[str, np.ndarray]) -> float:
    """KL(float || best) on ``feeds``, each model in its own ONNX Runtime session, one at a
    time (the float model's outputs kept, its session closed before best's opens)."""
    import onnxruntime as ort

    from raysearch.metrics import compute_metric

    reference = {"logits": ort.InferenceSession(str(model)).run(["logits"], feeds)[0]}
    got = {"logits": ort.InferenceSession(str(best)).run(["logits"], feeds)[0]}
    return compute_metric("kl", got, reference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--concurrent", type=int, default=2, help="max_concurrent_trials")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--smoke", action="store_true", help="the tests' tiny decoder instead")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    run = Run("large_decoder", args)
    quiet()

    from raysearch import AutoSearch
    from tests.lm_models import LARGE, LARGE_LAYERS, TINY, decoder_lm_data, make_decoder_lm

    dims, layers = (TINY, 2) if args.smoke else (LARGE, LARGE_LAYERS)

    work = Path(tempfile.mkdtemp(prefix="large-decoder-", dir=args.workdir))
    try:
        started = time.perf_counter()
        model = make_decoder_lm(
            work / "model" / "lm.onnx", layers, dims=dims, external_data="weights.bin"
        )
        built_s = time.perf_counter() - started
        model_bytes = sum(p.stat().st_size for p in model.parent.iterdir())
        feeds = decoder_lm_data(4, 16, layers, dims=dims)
        np.savez(work / "text.npz", input_ids=feeds["input_ids"])

        config = _config(model, work / "text.npz", work / "out", args.blocks, args.concurrent)
        with PeakMemory() as memory:
            started = time.perf_counter()
            result = AutoSearch(config).run()
            search_s = time.perf_counter() - started

        rows = result.results.to_pylist()
        best = result.output_dir / "best"
        moved = Path(shutil.move(str(best), str(work / "moved_best")))
        best_files = {p.name: p.stat().st_size for p in moved.iterdir()}
        kl_moved = reevaluate(model, moved / "model.onnx", feeds)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    me = os.getpid()
    trials = {p: b for p, b in memory.peaks.items() if "Trainable" in memory.names.get(p, "")}
    others = {
        memory.names.get(p, str(p)): b
        for p, b in memory.peaks.items()
        if p != me and p not in trials
    }
    payload: dict[str, Any] = {
        "model_bytes": model_bytes,
        "model_build_s": round(built_s, 1),
        "search_s": round(search_s, 1),
        "trials": [
            {
                k: v
                for k, v in r.items()
                if k in ("trial_id", "status", "metric", "model_size_bytes", "error")
                or k.endswith("block_size")
            }
            for r in rows
        ],
        "best_files": best_files,
        "best_metric": result.best_metric,
        "best_metric_after_move": kl_moved,
        "driver_peak_bytes": memory.peaks.get(me, 0),
        "trial_process_peak_bytes": memory.of("Trainable"),
        "other_process_peak_bytes": dict(sorted(others.items(), key=lambda kv: -kv[1])[:6]),
    }
    run.write(payload, args.out)
    print(f"model: {model_bytes / GIB:.2f} GiB ({model_bytes:,} bytes), built in {built_s:.1f} s")
    print(f"search: {len(rows)} trials in {search_s:.1f} s (AutoSearch.run, Ray's start included)")
    for r in payload["trials"]:
        print(f"  {r}")
    print(f"best/ files: {best_files}")
    print(f"best metric {result.best_metric!r}; re-evaluated after the move {kl_moved!r}")
    print(f"driver peak RSS: {payload['driver_peak_bytes'] / GIB:.2f} GiB")
    for peak in payload["trial_process_peak_bytes"]:
        print(f"trial process peak RSS: {peak / GIB:.2f} GiB ({peak / model_bytes:.2f}x the model)")
    for name, peak in payload["other_process_peak_bytes"].items():
        print(f"  other process {name}: {peak / GIB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
