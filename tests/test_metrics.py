"""raysearch.metrics: the one table of built-in metrics, read by the config and evaluate
stages."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import raysearch.config as config
import raysearch.evaluate as evaluate
from raysearch.metrics import BUILTIN_METRICS, METRICS, canonical_metric, compute_metric


def test_both_stages_read_the_one_table():
    assert config.BUILTIN_METRICS is BUILTIN_METRICS is evaluate.BUILTIN_METRICS
    assert BUILTIN_METRICS == {m.name: m.higher_is_better for m in METRICS.values()}
    assert list(METRICS) == [
        "L1",
        "L2",
        "cos",
        "PSNR",
        "SSIM",
        "kl",
        "top1_agreement",
        "perplexity",
    ]


def _by_hand(name: str, q: list[float], f: list[float]) -> float:
    """One sample's metric written out from the module's table, in plain Python."""
    n = len(f)
    errors = [a - b for a, b in zip(q, f)]
    if name == "L1":
        return sum(abs(e) for e in errors) / n
    if name == "L2":
        return math.sqrt(sum(e * e for e in errors) / n)
    if name == "cos":
        dot = sum(a * b for a, b in zip(q, f))
        return dot / (math.sqrt(sum(a * a for a in q)) * math.sqrt(sum(b * b for b in f)))
    if name == "PSNR":
        peak = max(abs(b) for b in f)
        return 10 * math.log10(peak**2 / (sum(e * e for e in errors) / n))
    mq, mf = sum(q) / n, sum(f) / n
    vq, vf = sum((a - mq) ** 2 for a in q) / n, sum((b - mf) ** 2 for b in f) / n
    cov = sum((a - mq) * (b - mf) for a, b in zip(q, f)) / n
    c1, c2 = (0.01 * (max(f) - min(f))) ** 2, (0.03 * (max(f) - min(f))) ** 2
    return ((2 * mq * mf + c1) * (2 * cov + c2)) / ((mq**2 + mf**2 + c1) * (vq + vf + c2))


@pytest.mark.parametrize("name", [n for n, m in METRICS.items() if not m.lm])
def test_each_metric_is_the_formula_of_its_table_averaged_over_samples(name: str):
    # The language-model metrics' formulas: tests/test_lm_metrics.py
    rng = np.random.default_rng(0)
    f = rng.normal(size=(6, 5))
    q = f + rng.normal(scale=0.1, size=f.shape)
    expected = sum(_by_hand(name, list(a), list(b)) for a, b in zip(q, f)) / len(f)
    assert compute_metric(name, {"y": q}, {"y": f}) == pytest.approx(expected, rel=1e-12)
    # Two outputs of a sample are one vector: the float model's output order, flattened.
    halves = {"a": q[:, :2], "b": q[:, 2:]}, {"a": f[:, :2], "b": f[:, 2:]}
    assert compute_metric(name, *halves) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("written", "canonical"),
    [("cos", "cos"), ("cosine", "cos"), ("cos_sim", "cos"), ("l2", "L2"), ("psnr", "PSNR"),
     ("ssim", "SSIM"), ("pkg.mod:fn", None), ("accuracy", None)],
)  # fmt: skip
def test_aliases_and_spellings_map_to_a_builtin_name(written: str, canonical: str | None):
    assert canonical_metric(written) == canonical


def test_a_config_with_a_builtin_metric_imports_neither_evaluate_nor_demo():
    code = (
        "import sys\n"
        "from raysearch.config import SearchConfig\n"
        "cfg = SearchConfig.from_dict({'model': 'm.onnx', 'calibration_data': 'c.npz',"
        " 'search_space': 'A8W8_SEARCH', 'metric': 'cosine'}, check_paths=False)\n"
        "assert cfg.metric == 'cos' and cfg.metric_higher_is_better\n"
        "print(sorted(m for m in sys.modules if m.startswith(('raysearch.evaluate',"
        " 'raysearch.demo'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
