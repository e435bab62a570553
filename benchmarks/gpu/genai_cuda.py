"""bytellama's genai folder on the lent GPU (issue 55, Build item 5): raysearch's WeightOnly
search of the builder's ``-p fp16 -e cuda`` folder with four trials sharing the GPU, against
the builder's own ``-p int4 -e cuda``, both decoded by onnxruntime-genai's CUDA build.

Usage (on the GPU machine, after ``setup.sh``)::

    python3 benchmarks/gpu/genai_cuda.py FLOAT_DIR INT4_DIR EVAL_NPZ CALIB_NPZ WORK OUT_JSON

1. KL of the builder's int4 against the float folder, both run by ONNX Runtime's CUDA provider
   on the evaluation data fed as deployed (the feeds raysearch builds from ``input_ids``).
2. ``raysearch run`` on the float folder: WeightOnly, ``metric: kl``, the builder's KL as the
   tolerance, ``size_budget`` the builder's int4 size in MB, ``select: metric``,
   ``gpu_per_trial: 0.25`` (four trials at a time on the one GPU), a time limit of
   ``GENAI_CUDA_TIME_LIMIT`` seconds (150).
3. KL and size of ``best/``, and each folder's onnxruntime-genai ms per decoded token on CUDA
   (greedy, 200 tokens after a 9-byte prompt, the folders interleaved, best of 5 rounds).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from raysearch.data import DataSource  # noqa: E402
from raysearch.evaluate import run_model  # noqa: E402
from raysearch.metrics import mean_metric, metric_per_sample  # noqa: E402
from raysearch.modelfile import model_size_bytes  # noqa: E402

#: CUDA; a dry run of the script on a machine without a GPU sets GENAI_CUDA_PROVIDER
#: to the CPU's and GENAI_CUDA_GPU_PER_TRIAL to 0.
PROVIDER = os.environ.get("GENAI_CUDA_PROVIDER", "CUDAExecutionProvider")
GPU_PER_TRIAL = float(os.environ.get("GENAI_CUDA_GPU_PER_TRIAL", "0.25"))


def logits(folder: Path, ids: np.ndarray) -> np.ndarray:
    """The folder's logits on ``ids`` through ONNX Runtime's CUDA provider."""
    model = folder / "model.onnx"
    session = ort.InferenceSession(str(model), providers=[PROVIDER])
    assert session.get_providers()[0] == PROVIDER, session.get_providers()
    data = DataSource.load({"input_ids": ids}, model, batch_size=8)
    return np.asarray(run_model(session, data)[0]["logits"], np.float32)


def kl(folder: Path, reference: np.ndarray, ids: np.ndarray) -> float:
    values = metric_per_sample("kl", {"logits": logits(folder, ids)}, {"logits": reference})
    return float(mean_metric("kl", values))


def genai_decode_ms(folders: dict[str, Path], tokens: int = 200, rounds: int = 5) -> dict:
    """onnxruntime-genai's best ms per decoded token of each folder, on the provider its
    genai_config.json names (CUDA for the builder's ``-e cuda`` folders and raysearch's copies)."""
    import onnxruntime_genai as og

    models = {name: og.Model(str(folder)) for name, folder in folders.items()}
    prompt = list(b"def main(")
    best = {name: float("inf") for name in folders}
    for _ in range(rounds):
        for name, model in models.items():
            params = og.GeneratorParams(model)
            params.set_search_options(
                max_length=len(prompt) + tokens, min_length=len(prompt) + tokens, do_sample=False
            )
            generator = og.Generator(model, params)
            generator.append_tokens(prompt)
            generator.generate_next_token()
            start, n = time.perf_counter(), 0
            while not generator.is_done():
                generator.generate_next_token()
                n += 1
            best[name] = min(best[name], (time.perf_counter() - start) * 1000 / max(n, 1))
    return best


def main(float_dir: str, int4_dir: str, eval_npz: str, calib_npz: str, work: str, out: str) -> None:
    source, int4, work_dir = Path(float_dir), Path(int4_dir), Path(work)
    ids = np.load(eval_npz)["input_ids"]
    reference = logits(source, ids)
    result: dict[str, Any] = {"providers": ort.get_available_providers()}
    builder_kl = kl(int4, reference, ids)
    budget_mb = model_size_bytes(int4 / "model.onnx") / 1e6
    result["builder_int4"] = {"kl": builder_kl, "size_mb": budget_mb}
    print(json.dumps(result), flush=True)
    config = {
        "model": str(source), "calibration_data": calib_npz, "eval_data": eval_npz,
        "search_space": "WEIGHT_ONLY_INT4_SEARCH", "search_algo": "WeightOnly", "metric": "kl",
        "tolerance": builder_kl, "size_budget": round(budget_mb, 4), "select": "metric",
        "seed": 0, "resources": {"gpu_per_trial": GPU_PER_TRIAL, "max_concurrent_trials": 4},
        "stop": {"time_limit": int(os.environ.get("GENAI_CUDA_TIME_LIMIT", "150"))},
    }  # fmt: skip
    (work_dir / "search.json").write_text(json.dumps(config))
    start = time.perf_counter()
    done = subprocess.run(
        ["raysearch", "run", str(work_dir / "search.json"), "--output-dir", str(work_dir / "s")],
        capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    result["search"] = {"exit": done.returncode, "wall_s": round(time.perf_counter() - start, 1)}
    print(done.stdout[-3000:], done.stderr[-3000:], flush=True)
    import pyarrow.parquet as pq

    rows = pq.read_table(work_dir / "s" / "results.parquet").to_pylist()
    result["search"]["trials"] = len(rows)
    result["search"]["by_device"] = dict(collections.Counter(str(r.get("device")) for r in rows))
    result["search"]["by_status"] = dict(collections.Counter(str(r.get("status")) for r in rows))
    result["search"]["decode_ms_in_trials"] = sorted(
        round(r["decode_latency_ms"], 3) for r in rows if r.get("decode_latency_ms") is not None
    )
    summary = json.loads((work_dir / "s" / "summary.json").read_text())
    result["search"]["best_params"] = summary.get("best_params")
    result["search"]["float_decode_latency_ms"] = summary.get("float_decode_latency_ms")
    folders = {"float fp16": source, "builder int4 (-e cuda)": int4}
    best = work_dir / "s" / "best"
    if (best / "model.onnx").exists():
        size_mb = model_size_bytes(best / "model.onnx") / 1e6
        result["best"] = {"kl": kl(best, reference, ids), "size_mb": size_mb}
        folders["raysearch best/"] = best
    print(json.dumps(result), flush=True)
    result["genai_cuda_decode_ms_per_token"] = genai_decode_ms(folders)
    Path(out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:])
