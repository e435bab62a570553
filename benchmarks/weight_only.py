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

``--genai`` runs the same comparison on bytellama as it is deployed, an onnxruntime-genai
folder (``GroupQueryAttention``, the builder's fp32 export), against the builder's own int4
(``-p int4 -e cpu``: RTN block 32 symmetric, its ``is_symmetric`` default, ``accuracy_level``
4), the same with ``accuracy_level`` 0, and ONNX Runtime's and Olive's defaults written into
copies of the genai folder; the search keeps the most accurate model within the builder's
size (``size_budget: builder``) among those more accurate than the builder's int4 and
decoding no slower than it (``max_decode_latency: builder``, ``--max-decode-latency``). Each
folder is also decoded by onnxruntime-genai itself (``og.Generator``, greedy, 200 tokens after a
16-byte prompt, one thread): ms per token, best of 3 rounds, the folders interleaved in one
process. It needs the genai client's environment (``.venv-genai``, ``GENAI_PY`` names
another), whose builder also needs ``torch`` and ``transformers`` 5 for the anchor
(``--builder-int4`` gives a folder made before, e.g. by
``../shared/models/bytellama/make_folders.sh``).

``--libraries`` (issue 55) compares the 4-bit roundings of the libraries raysearch reaches,
each applied uniformly (every weight MatMul at group 32, ``lm_head`` too, embeddings float,
symmetric and asymmetric) on bytellama's genai folder and on bytegpt, KL against ONNX Runtime's
RTN at the same group: NNCF 3.4's ``compress_weights`` data-free, with AWQ, with scale
estimation and with both, on bytegpt's calibration windows (``nncf_weight_only``), and
raysearch's own GPTQ (``weight_only``'s ``algorithm: gptq``, the Hessians from the same
windows; ONNX Runtime's GPTQ writes RTN's weights). ``--blocks`` gives other groups than 32,
``--settings`` a subset of the rows (:data:`LIBRARY_SETTINGS`); the time of a row is its
backend's, built for it (GPTQ's Hessians included).

Usage:
    .venv/bin/python benchmarks/weight_only.py            # bytegpt, tolerance 0.00025
    .venv/bin/python benchmarks/weight_only.py --smoke    # the tiny decoder of the tests
    .venv/bin/python benchmarks/weight_only.py --genai    # bytellama's genai folder
    .venv/bin/python benchmarks/weight_only.py --libraries  # the libraries' 4-bit roundings
    .venv/bin/python benchmarks/weight_only.py --gptq-anchor  # GPTQ against the builder's int4
    .venv/bin/python benchmarks/weight_only.py --anchor-timing  # decode steps timed in turn
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import Run, print_table  # noqa: E402
from raysearch.metrics import mean_metric, metric_interval, metric_per_sample  # noqa: E402
from raysearch.quantize.backends.weight_only import import_quantizer  # noqa: E402

#: The shared models beside the repository (``RAYSEARCH_MODELS_DIR`` names them elsewhere, e.g.
#: from a git worktree).
MODELS = Path(os.environ.get("RAYSEARCH_MODELS_DIR") or ROOT.parent / "shared" / "models")
BYTEGPT = MODELS / "bytegpt"
BYTELLAMA = MODELS / "bytellama"
GENAI_PY = Path(os.environ.get("GENAI_PY") or ROOT / ".venv-genai" / "bin" / "python")
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
    model: Path,
    calib: Path,
    base: dict[str, Any],
    reference: np.ndarray,
    ids: np.ndarray,
    rows: int,
) -> dict[str, Any]:
    """The sensitivity ranking from probes scored on the first ``rows`` sequences against the
    one from every sequence: Spearman's rank correlation of the per-node KL (each probe: one
    weight MatMul alone at the base's 4 bits, the rest float, as the strategy's; a GPTQ base's
    Hessians from ``calib``, as the search's)."""
    from scipy.stats import spearmanr

    from raysearch.data import DataSource
    from raysearch.quantize.backends.weight_only import WeightOnlyBackend, weight_matmuls

    nodes = weight_matmuls(onnx.load(str(model)))
    data = DataSource.load({"input_ids": np.load(calib)["input_ids"]}, model, batch_size=1)
    subset, full = [], []
    with tempfile.TemporaryDirectory() as tmp, WeightOnlyBackend(model, data) as backend:
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


def search(
    model: Path,
    calib: Path,
    data: Path,
    folder: Path,
    tolerance: float,
    name: str = "search",
    **more: Any,
) -> float:
    """``raysearch run`` of the WeightOnly strategy into ``folder / name``; its wall seconds
    from the start."""
    config = {
        "model": str(model),
        "calibration_data": str(calib),
        "eval_data": str(data),
        "search_space": "WEIGHT_ONLY_INT4_SEARCH",
        "search_algo": "WeightOnly",
        "metric": "kl",
        "tolerance": tolerance,
        "select": "size",
        "output_dir": str(folder / name),
        "seed": 0,
        **more,
    }
    path = folder / f"{name}.json"
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

    # One block (8 weight MatMuls, lm_head's among them): every stage of the strategy runs,
    # with half the two-block decoder's sensitivity probes.
    model = make_decoder_lm(folder / "lm.onnx", layers=1)
    ids = np.random.default_rng(5).zipf(1.5, (16, 12)).clip(1, VOCAB - 1).astype(np.int64)
    np.savez(folder / "text.npz", input_ids=ids)
    return model, folder / "text.npz", folder / "text.npz"


#: Decodes each folder given greedily, interleaved, and prints {folder: best ms per token}.
_GENAI_DECODE = """
import json, sys, time, onnxruntime_genai as og
tokens, rounds, folders = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
models = {}
for folder in folders:
    config = og.Config(folder)
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": 1, "inter_op_num_threads": 1}}}}))
    models[folder] = og.Model(config)
prompt = list(b"import os\\ndef main(")
best = {f: float("inf") for f in folders}
for _ in range(rounds):
    for folder, model in models.items():
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + tokens,
                                  min_length=len(prompt) + tokens, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        generator.generate_next_token()  # the prompt's step
        start = time.perf_counter()
        n = 0
        while not generator.is_done():
            generator.generate_next_token()
            n += 1
        best[folder] = min(best[folder], (time.perf_counter() - start) * 1000 / max(n, 1))
print(json.dumps(best))
"""


def genai_decode_ms(folders: list[Path], tokens: int = 200, rounds: int = 3) -> dict[str, float]:
    """onnxruntime-genai's ms per decoded token of each folder (see the module)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [str(GENAI_PY), "-c", _GENAI_DECODE, str(tokens), str(rounds), *map(str, folders)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"onnxruntime-genai could not decode: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _folder_logits(model: Path, ids: np.ndarray) -> np.ndarray:
    """The logits of a decoder fed as deployed (the feeds raysearch builds from input_ids)."""
    from raysearch.data import DataSource
    from raysearch.evaluate import run_model

    data = DataSource.load({"input_ids": ids}, model, batch_size=8)
    return run_model(_session(model), data)[0]["logits"]


def _folder_size_kb(model: Path) -> float:
    from raysearch.modelfile import model_size_bytes

    return round(model_size_bytes(model) / 1000, 1)


def _genai_row(name: str, model: Path, reference: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
    logits = _folder_logits(model, ids)
    row: dict[str, Any] = {"setting": name, "size_kb": _folder_size_kb(model)}
    for metric in ("kl", "top1_agreement"):
        values = metric_per_sample(metric, {"logits": logits}, {"logits": reference})
        row[metric] = mean_metric(metric, values)
        row[f"{metric}_ci"] = list(metric_interval(metric, values))
    return row


def builder_int4(checkpoint: Path, out: Path) -> Path:
    """onnxruntime-genai's builder's ``-p int4 -e cpu`` of the Hugging Face checkpoint."""
    done = subprocess.run(
        [str(GENAI_PY), "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint),
         "-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(out.parent / ".cache")],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the genai builder failed: {done.stderr[-2000:]}")
    return out


def with_accuracy_level(source: Path, out: Path, level: int) -> Path:
    """A copy of the genai folder ``source`` with every ``MatMulNBits`` at ``level``."""
    import shutil

    shutil.copytree(source, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                attribute.i = level
    onnx.save(model, str(out / "model.onnx"))
    return out


def ort_folder(source: Path, out: Path, block_size: int, is_symmetric: bool) -> Path:
    """ONNX Runtime's MatMulNBitsQuantizer with these arguments applied to the genai folder's
    model, written into a copy of the folder with its data as the graph expects."""
    from raysearch.modelfolder import model_folder

    mnq = import_quantizer()
    quantizer = mnq.MatMulNBitsQuantizer(
        onnx.load(str(source / "model.onnx")), block_size=block_size, is_symmetric=is_symmetric
    )
    quantizer.process()
    out.mkdir(parents=True)
    quantizer.model.save_model_to_file(str(out / "model.onnx"), use_external_data_format=True)
    model_folder(source / "model.onnx").copy_into(out)
    return out


def gptq_folder(source: Path, out: Path, settings: dict[str, Any]) -> float:
    """The genai folder's model through raysearch's ``weight_only`` backend at ``settings``
    (``algorithm: gptq`` among them: its Hessians from bytegpt's 64 calibration windows),
    written into a copy of the folder; the backend's seconds, Hessians included."""
    from raysearch.data import DataSource
    from raysearch.modelfolder import model_folder
    from raysearch.quantize.backends.weight_only import WeightOnlyBackend

    model = source / "model.onnx"
    calib = np.load(BYTEGPT / "calib.npz")["input_ids"]
    start = time.perf_counter()
    data = DataSource.load({"input_ids": calib}, model, batch_size=1)
    with WeightOnlyBackend(model, data) as backend:
        backend.quantize(settings, out / "model.onnx")
    seconds = time.perf_counter() - start
    model_folder(model).copy_into(out)
    return seconds


#: ``--gptq-anchor``'s rows: GPTQ uniform at the builder's int4's blocks and compute
#: (block 32, ``accuracy_level`` 4), symmetric (the builder's bytes) and asymmetric.
GPTQ_ANCHORS = {
    "raysearch gptq 32 sym, accuracy_level 4": {"block_size": 32, "symmetric": True},
    "raysearch gptq 32 asym, accuracy_level 4": {"block_size": 32, "symmetric": False},
}


def gptq_anchor_main(args: argparse.Namespace, run: Run) -> None:
    """``--gptq-anchor``: raysearch's GPTQ, every weight MatMul at one setting of
    :data:`GPTQ_ANCHORS`, against the builder's int4 on bytellama's genai folder: KL and
    agreement on every held-out row, size, and onnxruntime-genai decode ms/token with the
    folders interleaved."""
    source = args.genai_folder
    ids = np.load(BYTEGPT / "eval.npz")["input_ids"]
    reference = _folder_logits(source / "model.onnx", ids)
    with tempfile.TemporaryDirectory() as tmp:
        folders = {
            "float (genai fp32)": source,
            "builder int4 (-p int4, accuracy_level 4)": args.builder_int4
            or builder_int4(args.checkpoint, Path(tmp) / "genai-int4"),
        }
        times: dict[str, float] = {}
        for index, (name, settings) in enumerate(GPTQ_ANCHORS.items()):
            folders[name] = Path(tmp) / f"gptq{index}"
            times[name] = gptq_folder(
                source, folders[name], {"algorithm": "gptq", "accuracy_level": 4, **settings}
            )
        rows = [_genai_row(n, f / "model.onnx", reference, ids) for n, f in folders.items()]
        decode = genai_decode_ms(list(folders.values()))
    for row, path in zip(rows, folders.values()):
        row["genai_decode_ms"] = decode[str(path)]
        row["time_s"] = round(times[row["setting"]], 1) if row["setting"] in times else None
        row["kl_1e-3"] = round(row["kl"] * 1e3, 4)
        row["builder_kl_over"] = round(rows[1]["kl"] / row["kl"], 3) if row["kl"] else None
        row["builder_size_over"] = round(row["size_kb"] / rows[1]["size_kb"], 4)
    print_table(
        rows,
        ["setting", "kl_1e-3", "builder_kl_over", "top1_agreement", "size_kb",
         "builder_size_over", "genai_decode_ms", "time_s"],
        "raysearch's GPTQ, uniform, against the builder's int4 on bytellama's genai folder",
    )  # fmt: skip
    run.write({"rows": rows}, args.out)


def probe_additivity(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of the KL of the base's probes (each node alone at the base's setting, the
    rest float) against the KL the base measured on the whole model: how far the additive
    model the allocation plans with is from the truth."""
    probes = [
        t for t in trials
        if t["stage"] == "sensitivity" and t["status"] == "ok"
        and t.get("params/nodes_4bit") is not None and not t.get("params/node_settings")
    ]  # fmt: skip
    if not probes:
        return {"base": None, "probes_sum": float("nan"), "base_kl": float("nan")}
    def setting(trial: dict[str, Any]) -> tuple[Any, ...]:
        # symmetric is a top-level key in a start point and a probe, its algorithm's
        # conditional group's (``rtn.symmetric``, ``gptq.symmetric``) in the grid
        symmetric = next((trial[k] for k in ("params/symmetric", "params/rtn.symmetric",
                          "params/gptq.symmetric") if trial.get(k) is not None), None)  # fmt: skip
        return trial.get("params/algorithm"), trial.get("params/block_size"), symmetric

    base = next(
        (t for t in trials
         if t["stage"] in ("defaults", "blocks") and setting(t) == setting(probes[0])), None
    )  # fmt: skip
    if base is None:
        return {"base": None, "probes_sum": float("nan"), "base_kl": float("nan")}
    algorithm, block, symmetric = setting(probes[0])
    label = f"{algorithm}, block_size {block}, symmetric {symmetric}"
    total = sum(t["metric"] for t in probes if setting(t) == setting(probes[0]))
    return {"base": label, "probes_sum": total, "base_kl": base["metric"]}


def source_space(weight_source: Path) -> dict[str, Any]:
    """``WEIGHT_ONLY_INT4_SEARCH`` with ``algorithm: source`` beside its others and
    ``weight_source`` fixed (its start points as the preset's), as config keys."""
    import yaml

    from raysearch.config._spaces import predefined_spaces

    preset = yaml.safe_load(predefined_spaces()["WEIGHT_ONLY_INT4_SEARCH"].read_text())
    space = dict(preset["search_space"])
    space["algorithm"] = [*space["algorithm"], "source"]
    space["weight_source"] = [str(weight_source.resolve())]
    return {"search_space": space, "points_to_evaluate": preset.get("points_to_evaluate")}


def _source_search(
    weight_source: Path,
    folder: Path,
    tolerance: float,
    folders: dict[str, Path],
    rows: list[dict[str, Any]],
    reference: np.ndarray,
    time_limit: float,
) -> dict[str, Any]:
    """The library's genai folder as it is, then the ``--genai`` search again with its weights
    a choice (:func:`source_space`), each a row and a folder; the second search's summary with
    its trials."""
    calib, data = BYTEGPT / "calib.npz", BYTEGPT / "eval.npz"
    ids = np.load(data)["input_ids"]
    name = "weight_source as written"
    folders[name] = weight_source
    rows.append(_genai_row(name, weight_source / "model.onnx", reference, ids))
    wall = search(
        folders["float (genai fp32)"], calib, data, folder, tolerance, name="search-source",
        stop={"time_limit": time_limit}, size_budget="builder", select="metric",
        **source_space(weight_source),
    )  # fmt: skip
    name = "raysearch WeightOnly + weight_source (best/)"
    folders[name] = folder / "search-source" / "best"
    rows.append(_genai_row(name, folders[name] / "model.onnx", reference, ids))
    rows[-1]["time_s"] = wall
    summary = json.loads((folder / "search-source" / "summary.json").read_text())
    summary["trials"] = pq.read_table(folder / "search-source" / "results.parquet").to_pylist()
    return summary


def _source_summary(sourced: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """What the search with a ``weight_source`` did, printed and returned for the results."""
    stages: dict[str, int] = {}
    for t in sourced["trials"]:
        stages[t["stage"]] = stages.get(t["stage"], 0) + 1
    allocated = [t for t in sourced["trials"] if t["stage"] in ("allocation", "refinement")]
    with_source = sum("source" in str(t.get("params/node_settings") or "") for t in allocated)
    print(
        f"with weight_source: trials by stage {stages}; {with_source} of {len(allocated)} "
        f"allocations give nodes the source's weights; builder's KL / best's: "
        f"{row['builder_kl_over']:.2f}, best's size / builder's: {row['builder_size_over']:.3f}; "
        f"best's settings: {sourced.get('best_params')}"
    )
    return {
        "source_trials": sourced.get("n_trials"),
        "source_best_params": sourced.get("best_params"),
        "source_trials_by_stage": stages,
        "source_allocations_with_source_nodes": with_source,
        "source_allocations": len(allocated),
    }


def decode_bound(text: str) -> float | str | None:
    """``--max-decode-latency`` as the config takes it: a name, milliseconds or null."""
    if text == "null":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def genai_main(args: argparse.Namespace, run: Run) -> None:
    """The ``--genai`` comparison (see the module)."""
    source = args.genai_folder
    calib, data = BYTEGPT / "calib.npz", BYTEGPT / "eval.npz"
    ids = np.load(data)["input_ids"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        int4 = args.builder_int4 or builder_int4(args.checkpoint, folder / "genai-int4")
        folders = {
            "float (genai fp32)": source,
            "builder int4 (-p int4, accuracy_level 4)": int4,
            "builder int4, accuracy_level 0": with_accuracy_level(int4, folder / "int4-acc0", 0),
            "ort_default (block 128, asym)": ort_folder(source, folder / "ort", 128, False),
            "olive_default (RTN 128, sym)": ort_folder(source, folder / "olive", 128, True),
        }
        reference = _folder_logits(source / "model.onnx", ids)
        rows = [_genai_row(n, f / "model.onnx", reference, ids) for n, f in folders.items()]
        # The most accurate model within the builder's size among those more accurate than
        # the builder's int4 (the candidates); the goal is a sixth of its KL.
        tolerance = rows[1]["kl"]
        wall = search(source, calib, data, folder, tolerance, stop={"time_limit": args.time_limit},
                      size_budget="builder", select="metric",
                      max_decode_latency=decode_bound(args.max_decode_latency))  # fmt: skip
        name = "raysearch WeightOnly (best/)"
        folders[name] = folder / "search" / "best"
        best = _genai_row(name, folders[name] / "model.onnx", reference, ids)
        best["time_s"] = wall
        rows.append(best)
        walls = {"search_wall_s": wall}
        sourced: dict[str, Any] = {}
        if args.weight_source:
            sourced = _source_search(
                args.weight_source, folder, tolerance, folders, rows, reference, args.time_limit
            )
            walls["source_search_wall_s"] = rows[-1]["time_s"]
        decode = genai_decode_ms(list(folders.values()))
        for row, path in zip(rows, folders.values()):
            row["genai_decode_ms"] = decode[str(path)]
        summary = json.loads((folder / "search" / "summary.json").read_text())
        trials = pq.read_table(folder / "search" / "results.parquet").to_pylist()
    additivity = probe_additivity(trials)
    print(
        f"probes of the base ({additivity['base']}): their KL sums to "
        f"{additivity['probes_sum']:.4g}, the base measured {additivity['base_kl']:.4g}"
    )
    stages: dict[str, int] = {}
    for t in trials:
        stages[t["stage"]] = stages.get(t["stage"], 0) + 1
    print(
        f"trials by stage: {stages}; builder's KL / best's: {rows[1]['kl'] / best['kl']:.2f} "
        f"(the goal: 6), best's size / builder's: {best['size_kb'] / rows[1]['size_kb']:.3f}"
    )
    for row in rows:
        row["builder_kl_over"] = round(rows[1]["kl"] / row["kl"], 3) if row["kl"] else None
        row["builder_size_over"] = round(row["size_kb"] / rows[1]["size_kb"], 4)
    more = _source_summary(sourced, rows[-1]) if sourced else {}
    for row in rows:
        row["kl_1e-3"] = round(row["kl"] * 1e3, 3)
    print_table(
        rows,
        ["setting", "kl_1e-3", "builder_kl_over", "top1_agreement", "size_kb",
         "builder_size_over", "genai_decode_ms", "time_s"],
        f"weight-only int4 on bytellama's genai folder (tolerance {tolerance:.3g})",
    )  # fmt: skip
    run.write(
        {"tolerance": tolerance, "rows": rows, **walls,
         "search_trials": summary.get("n_trials"), "best_params": summary.get("best_params"),
         "trials_by_stage": stages, "probe_additivity": additivity, **more},
        args.out,
    )  # fmt: skip


#: The settings ``--libraries`` writes every weight MatMul with (lm_head too, embeddings float),
#: at group 32 symmetric and asymmetric: ONNX Runtime's RTN (raysearch's ``weight_only``) and
#: NNCF 3.4's ``compress_weights`` data-free and with its data-aware algorithms.
LIBRARY_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "ort rtn": ("weight_only", {}),
    "raysearch gptq": ("weight_only", {"algorithm": "gptq"}),
    "nncf data-free": ("nncf_weight_only", {}),
    "nncf awq": ("nncf_weight_only", {"awq": True}),
    "nncf scale_estimation": ("nncf_weight_only", {"scale_estimation": True}),
    "nncf awq + scale_estimation": ("nncf_weight_only", {"awq": True, "scale_estimation": True}),
}


def library_setting(
    quantizer: str, extra: dict[str, Any], symmetric: bool, block: int = 32
) -> dict[str, Any]:
    """The backend settings of one ``--libraries`` row: group ``block``, every weight MatMul
    at 4 bits, the embeddings float."""
    if quantizer == "weight_only":
        return {"block_size": block, "symmetric": symmetric, **extra}
    mode = "int4_sym" if symmetric else "int4_asym"
    base = {"mode": mode, "group_size": block, "ratio": 1.0, "all_layers": True}
    return {**base, "quantize_embeddings": False, **extra}


def libraries_main(args: argparse.Namespace, run: Run) -> None:
    """``--libraries``: the 4-bit roundings of the libraries raysearch reaches, uniform at
    group 32, whole model, on bytellama's genai folder and on bytegpt (KL on every row of the
    evaluation data, size of the model and its data)."""
    from raysearch.data import DataSource
    from raysearch.modelfolder import model_folder
    from raysearch.quantize.backends.nncf_weight_only import NncfWeightOnlyBackend
    from raysearch.quantize.backends.weight_only import WeightOnlyBackend

    backends = {"weight_only": WeightOnlyBackend, "nncf_weight_only": NncfWeightOnlyBackend}
    calib = np.load(BYTEGPT / "calib.npz")["input_ids"]
    ids = np.load(BYTEGPT / "eval.npz")["input_ids"]
    rows: list[dict[str, Any]] = []
    models = {
        "bytellama genai": BYTELLAMA / "genai" / "model.onnx",
        "bytegpt": BYTEGPT / "model.onnx",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for model_name, model in models.items():
            genai = model_name.endswith("genai")
            reference = _folder_logits(model, ids)
            data = DataSource.load({"input_ids": calib}, model, batch_size=1)
            for block, symmetric in itertools.product(args.blocks, (True, False)):
                for name in args.settings:
                    quantizer, extra = LIBRARY_SETTINGS[name]
                    out = Path(tmp) / f"{len(rows)}" / "model.onnx"
                    settings = library_setting(quantizer, extra, symmetric, block)
                    start = time.perf_counter()
                    with backends[quantizer](model, data) as backend:
                        backend.quantize(settings, out)
                    seconds = time.perf_counter() - start
                    if genai:
                        model_folder(model).copy_into(out.parent)
                    row = _genai_row(name, out, reference, ids)
                    row.update(
                        model=model_name, block=block, symmetric=symmetric,
                        time_s=round(seconds, 1),
                    )  # fmt: skip
                    rows.append(row)
                    print(
                        f"{model_name}, block {block}, {'sym' if symmetric else 'asym'}, "
                        f"{name}: KL {row['kl'] * 1e3:.4f}e-3, {row['size_kb']} kB, "
                        f"{seconds:.0f} s",
                        flush=True,
                    )
    for row in rows:
        row["kl_1e-3"] = round(row["kl"] * 1e3, 4)
        rtn = next((
            r for r in rows
            if r["model"] == row["model"] and r["symmetric"] == row["symmetric"]
            and r["block"] == row["block"] and r["setting"] == "ort rtn"
        ), None)  # fmt: skip
        row["kl_vs_rtn"] = round(row["kl"] / rtn["kl"], 3) if rtn else None
    print_table(
        rows,
        ["model", "block", "symmetric", "setting", "kl_1e-3", "kl_vs_rtn", "top1_agreement",
         "size_kb", "time_s"],
        "4-bit roundings, whole model (KL against ONNX Runtime's RTN at the same group)",
    )  # fmt: skip
    run.write({"rows": rows}, args.out)


#: AutoRound (Intel's auto-round, SignRound) on bytellama's Hugging Face checkpoint, 4 bits,
#: group 32, symmetric, its "light" recipe (50 iterations a block, learning rate 5e-3), on
#: bytegpt's 64 calibration windows, saved in GPTQ's format (what the genai builder reads).
#: Run by ``--autoround-py``'s python: auto-round and PyTorch, in an environment of its own.
_AUTOROUND = """
import sys, time, numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from auto_round import AutoRound
checkpoint, calib, out = sys.argv[1:4]
torch.set_num_threads(2)
model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32)
ids = torch.from_numpy(np.load(calib)["input_ids"]).long()
batches = [ids[i : i + 8] for i in range(0, len(ids), 8)]
rounder = AutoRound(model, tokenizer=AutoTokenizer.from_pretrained(checkpoint), scheme="W4A16",
                    bits=4, group_size=32, sym=True, dataset=batches, seqlen=ids.shape[1],
                    nsamples=len(ids), batch_size=8, iters=50, lr=5e-3, device_map="cpu",
                    enable_torch_compile=False)
rounder.quantize_and_save(out, format="auto_gptq")
"""


def autoround_main(args: argparse.Namespace, run: Run) -> None:
    """``--autoround-py``: AutoRound's rounding through the genai builder against the
    builder's own int4 and ONNX Runtime's RTN at group 32 (symmetric, and asymmetric: the
    size of AutoRound's GPTQ-format weights, which carry zero points), all at
    ``accuracy_level`` 4 as the builder writes them, on bytellama's genai folder."""
    import shutil

    from raysearch.modelfolder import model_folder
    from raysearch.quantize.backends.weight_only import WeightOnlyBackend

    source = BYTELLAMA / "genai"
    ids = np.load(BYTEGPT / "eval.npz")["input_ids"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        subprocess.run(
            [str(args.autoround_py), "-c", _AUTOROUND, str(BYTELLAMA / "hf"),
             str(BYTEGPT / "calib.npz"), str(folder / "autoround")],
            check=True, env=env, capture_output=True,
        )  # fmt: skip
        (checkpoint,) = (folder / "autoround").iterdir()  # auto-round's own subfolder
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(BYTELLAMA / "hf" / name, checkpoint / name)
        rounded = builder_int4(checkpoint, folder / "genai-autoround")
        seconds = time.perf_counter() - start
        int4 = args.builder_int4 or builder_int4(BYTELLAMA / "hf", folder / "genai-int4")
        folders = {"builder int4 (RTN 32, sym)": int4}
        for symmetric in (True, False):
            out = folder / f"rtn-{symmetric}" / "model.onnx"
            settings = {"block_size": 32, "symmetric": symmetric, "accuracy_level": 4}
            with WeightOnlyBackend(source / "model.onnx", None) as backend:
                backend.quantize(settings, out)
            model_folder(source / "model.onnx").copy_into(out.parent)
            folders[f"ort rtn 32, {'sym' if symmetric else 'asym'}"] = out.parent
        folders["autoround 32, sym (light) + builder"] = rounded
        reference = _folder_logits(source / "model.onnx", ids)
        rows = [_genai_row(n, f / "model.onnx", reference, ids) for n, f in folders.items()]
    rows[-1]["time_s"] = round(seconds, 1)
    for row in rows:
        row["kl_1e-3"] = round(row["kl"] * 1e3, 4)
        row["builder_kl_over"] = round(rows[0]["kl"] / row["kl"], 3)
    print_table(
        rows,
        ["setting", "kl_1e-3", "builder_kl_over", "top1_agreement", "size_kb", "time_s"],
        "AutoRound through the genai builder on bytellama (accuracy_level 4)",
    )
    run.write({"rows": rows}, args.out)


#: ``--anchor-timing``'s models: uniform GPTQ settings (``accuracy_level`` 4) each timed in
#: turn with the builder's int4, beside a byte-for-byte copy of the builder's int4 itself.
ANCHOR_TIMING = {
    "gptq 32 sym": {"block_size": 32, "symmetric": True},
    "gptq 32 asym": {"block_size": 32, "symmetric": False},
    "gptq 128 sym": {"block_size": 128, "symmetric": True},
    "gptq 128 asym": {"block_size": 128, "symmetric": False},
}


def anchor_timing_main(args: argparse.Namespace, run: Run) -> None:
    """``--anchor-timing``: each model's decode step over the builder's int4's as a
    ``max_decode_latency: builder`` trial times it (:func:`raysearch.evaluate.
    measure_decoder_latency` against the builder's session, opened once and reused; a fresh
    session of the model each time), ``--repeats`` times: the median ratio, how many were over
    1 and the range. A copy of the builder's model shows the timing's own bias."""
    from raysearch.data import DataSource
    from raysearch.evaluate import measure_decoder_latency
    from raysearch.providers import make_session

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        int4 = args.builder_int4 or builder_int4(args.checkpoint, folder / "genai-int4")
        models = {"copy of the builder's int4": folder / "copy"}
        shutil.copytree(int4, folder / "copy")
        for name, settings in ANCHOR_TIMING.items():
            models[name] = folder / name.replace(" ", "_")
            gptq_folder(args.genai_folder, models[name],
                        {"algorithm": "gptq", "accuracy_level": 4, **settings})  # fmt: skip
        data = DataSource.load(BYTEGPT / "eval.npz", int4 / "model.onnx")
        anchor_session = make_session(int4 / "model.onnx", 1)
        rows = []
        for name, path in models.items():
            ratios = []
            for _ in range(args.repeats):
                times = measure_decoder_latency(
                    make_session(path / "model.onnx", 1), data, anchor=anchor_session
                )
                ratios.append(times["decode_latency_ms"] / times["anchor_decode_latency_ms"])
            rows.append({
                "model": name, "median_ratio": round(float(np.median(ratios)), 3),
                "over_1": sum(r > 1 for r in ratios), "repeats": len(ratios),
                "min": round(min(ratios), 3), "max": round(max(ratios), 3),
            })  # fmt: skip
    print_table(rows, list(rows[0]), "decode step over the builder's int4's, timed in turn")
    run.write({"rows": rows}, args.out)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tolerance", type=float, default=0.00025)
    parser.add_argument("--smoke", action="store_true", help="the tests' tiny decoder")
    parser.add_argument("--genai", action="store_true", help="bytellama's genai folder")
    parser.add_argument(
        "--builder-int4",
        type=Path,
        default=None,
        help="the builder's int4 folder (else built with GENAI_PY)",
    )
    parser.add_argument(
        "--genai-folder",
        type=Path,
        default=BYTELLAMA / "genai",
        help="with --genai: the builder's fp32 folder of another decoder (default bytellama's)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=BYTELLAMA / "hf",
        help="with --genai: its Hugging Face checkpoint (the builder's int4 is made from it)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=280,
        help="with --genai: each search's stop.time_limit in seconds (the acceptance's 5 "
        "minutes from the command's start: 280)",
    )
    parser.add_argument(
        "--max-decode-latency",
        default="builder",
        help="with --genai: the searches' max_decode_latency (default builder: no candidate "
        "decodes slower than the builder's int4, timed in turn with it; 'float', ms or 'null')",
    )
    parser.add_argument(
        "--weight-source",
        type=Path,
        default=None,
        help="with --genai: a genai folder a library's rounding wrote (e.g. AutoRound's through "
        "the builder): the search again with its weights a choice (algorithm: source)",
    )
    parser.add_argument(
        "--gptq-anchor",
        action="store_true",
        help="raysearch's GPTQ uniform at block 32, accuracy_level 4, against the builder's int4",
    )
    parser.add_argument(
        "--anchor-timing",
        action="store_true",
        help="uniform GPTQ models and a copy of the builder's int4, each decode step timed in "
        "turn with the builder's int4 as max_decode_latency: builder times a trial",
    )
    parser.add_argument("--repeats", type=int, default=12, help="with --anchor-timing")
    parser.add_argument(
        "--libraries",
        action="store_true",
        help="the libraries' 4-bit roundings at group 32 on bytellama genai and bytegpt",
    )
    parser.add_argument(
        "--blocks",
        type=lambda text: [int(b) for b in text.split(",")],
        default=[32],
        help="with --libraries: the groups, comma-separated (default 32)",
    )
    parser.add_argument(
        "--settings",
        type=lambda text: text.split(","),
        default=list(LIBRARY_SETTINGS),
        help="with --libraries: the rows, comma-separated names of LIBRARY_SETTINGS (default all)",
    )
    parser.add_argument(
        "--autoround-py",
        type=Path,
        default=None,
        help="a python with auto-round: its rounding through the genai builder on bytellama",
    )
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.autoround_py:
        autoround_main(args, Run("weight_only_autoround", args))
        return
    if args.libraries:
        libraries_main(args, Run("weight_only_libraries", args))
        return
    if args.anchor_timing:
        anchor_timing_main(args, Run("weight_only_anchor_timing", args))
        return
    if args.gptq_anchor:
        gptq_anchor_main(args, Run("weight_only_gptq_anchor", args))
        return
    run = Run("weight_only_genai" if args.genai else "weight_only", args)
    if args.genai:
        genai_main(args, run)
        return
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
        correlation = probe_subset_correlation(
            model, calib, base, reference, ids, max(1, len(ids) // 4)
        )
        table = pq.read_table(folder / "search" / "results.parquet").to_pylist()
    stages: dict[str, int] = {}
    for record in table:
        stages[record.get("stage") or "?"] = stages.get(record.get("stage") or "?", 0) + 1
    # the base's probes (a menu probe names its node in node_settings)
    probes = [
        r for r in table
        if r.get("stage") == "sensitivity" and r.get("metric") is not None
        and (r.get("params/nodes_4bit") or r.get("params/nodes_8bit"))
    ]  # fmt: skip
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
