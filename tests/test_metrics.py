"""raysearch.metrics: the one table of built-in metrics, read by the config and evaluate
stages."""

from __future__ import annotations

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
    assert list(METRICS) == ["L1", "L2", "cos", "PSNR", "SSIM"]


@pytest.mark.parametrize("name", list(METRICS))
def test_each_metric_is_computed_by_its_table_function(name: str):
    rng = np.random.default_rng(0)
    f = rng.normal(size=(6, 5))
    q = f + rng.normal(scale=0.1, size=f.shape)
    expected = float(np.mean(METRICS[name].function(q, f)))
    assert compute_metric(name, {"y": q}, {"y": f}) == pytest.approx(expected)


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
        " 'raysearch._evaluate', 'raysearch.demo'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
