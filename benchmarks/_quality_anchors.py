"""NNCF's own answers on ``quality.py``'s models, scored as the searches score their trials:
its one shot (``model_type: transformer``) and ``quantize_with_accuracy_control`` (the
tolerance as ``max_drop``), each with the share of MatMul/Gemm/Conv nodes it quantized (NNCF's
accuracy control may give up and return the float model) and its seconds.

The trial engine scores each anchor model (``TrialRunner``'s metric: the same evaluator, float
reference and data as the search). Accuracy control needs a metric per validation sample
(NNCF's ONNX backend ranks layers only by one): top-1 agreement for magika, character accuracy
for ppocr_rec (its evaluator's decoding), cosine to the float outputs for the encoder.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from _nncf_anchors import nncf_accuracy_control, nncf_one_shot, top1_agreement

from raysearch.config import SearchConfig
from raysearch.modelgraph import quantized_share, weighted_nodes
from raysearch.search.preflight import preflight
from raysearch.trial import FloatBaseline, TrialRunner, TrialSpec


def _ppocr_char_accuracy(folder: Path):
    import evaluator  # the shared ppocr_rec folder, on sys.path (quality.py puts it there)

    truth = json.loads((folder / "eval_labels.json").read_text())

    def accuracy(outputs: list[np.ndarray], i: int) -> float:
        (text,) = evaluator.decode(outputs[0])
        return max(0.0, 1 - evaluator._distance(text, truth[i]) / len(truth[i]))

    return accuracy


def _cosine_to_float(model: Path, validation: Path):
    from raysearch.data import DataSource
    from raysearch.providers import make_session

    session = make_session(str(model), 1, providers=["CPUExecutionProvider"])
    data = DataSource.load(str(validation), str(model), batch_size=1)
    reference = [session.run(None, feed) for feed in data.batches()]

    def cosine(outputs: list[np.ndarray], i: int) -> float:
        a = np.concatenate([o.ravel() for o in outputs]).astype(np.float64)
        b = np.concatenate([o.ravel() for o in reference[i]]).astype(np.float64)
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))

    return cosine


def _sample_metric(name: str, config: dict[str, Any], shared: Path):
    model = Path(config["model"])
    if name == "magika":
        return top1_agreement(
            model, str(shared / "magika" / "eval.npz")
        ), shared / "magika" / "eval.npz"
    if name == "ppocr_rec":
        folder = shared / "ppocr_rec"
        return _ppocr_char_accuracy(folder), folder / "eval.npz"
    validation = Path(config["eval_data"])
    return _cosine_to_float(model, validation), validation


def anchors(name: str, config: dict[str, Any], work: Path, shared: Path) -> list[dict[str, Any]]:
    """NNCF's one shot and accuracy control on model ``name`` of ``quality.py``."""
    search = SearchConfig.from_dict({**config, "output_dir": str(work / f"anchor-{name}")})
    prepared = preflight(search)
    model = Path(config["model"])
    runner = TrialRunner(
        TrialSpec(
            model,
            prepared.calibration,
            prepared.evaluation,
            prepared.evaluator,
            baseline=FloatBaseline(reference=prepared.reference, score=prepared.float_score),
            measure_latency=False,
        )
    )
    score = runner.techniques.context.score
    nodes = weighted_nodes(str(model))
    rows = []
    calibration = config["calibration_data"]
    metric, validation = _sample_metric(name, config, shared)
    drop = (
        float(config.get("tolerance", 0.01))
        if config.get("tolerance_mode") == "absolute"
        else 1 - float(config["tolerance"])
    )
    for anchor in ("nncf_one_shot", "nncf_accuracy_control"):
        out = work / f"{name}-{anchor}.onnx"
        started = time.perf_counter()
        if anchor == "nncf_one_shot":
            nncf_one_shot(model, calibration, out)
        else:
            nncf_accuracy_control(model, calibration, str(validation), metric, out, max_drop=drop)
        seconds = time.perf_counter() - started
        rows.append(
            {
                "model": name,
                "anchor": anchor,
                "metric": score(str(out)),
                "weighted_nodes_quantized": quantized_share(str(out), nodes),
                "seconds": round(seconds, 1),
            }
        )
    return rows
