"""``raysearch._optional_imports``: the ``raysearch`` command imports tensorboardX without
PyTorch, ``optuna.importance`` without scikit-learn and ``optuna.visualization`` without
matplotlib (its driver imports no matplotlib: a process of its own draws ``plots/``), the
outputs need none of them, and every other importer still gets each."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import json, sys

    from raysearch._optional_imports import skip_unused_optional_imports

    skip_unused_optional_imports()
    skip_unused_optional_imports()
    import optuna
    import optuna.importance
    import tensorboardX

    state = {
        "finders": sum(type(f).__name__ == "_RefuseUnusedOptional" for f in sys.meta_path),
        "torch_after_tensorboardX": "torch" in sys.modules,
        "sklearn_after_importance": "sklearn" in sys.modules,
    }
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    study.optimize(
        lambda t: t.suggest_float("x", 0, 1) + 0.01 * t.suggest_int("n", 0, 3), n_trials=20
    )
    state["importance"] = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
    )
    from raysearch.outputs import preload_output_modules

    preload_output_modules(plots=False).join(timeout=120)
    import optuna.visualization

    state["matplotlib_after_preload"] = "matplotlib" in sys.modules
    state["plotly_figure"] = type(optuna.visualization.plot_slice(study)).__name__
    import torch
    import sklearn
    import matplotlib.pyplot

    state["torch_for_others"] = hasattr(torch, "tensor")
    state["sklearn_for_others"] = hasattr(sklearn, "__version__")
    state["matplotlib_for_others"] = hasattr(matplotlib.pyplot, "subplots")
    print(json.dumps(state))
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("sklearn") is None,
    reason="PyTorch and scikit-learn (the gp and nncf extras) are what is skipped",
)
def test_output_libraries_come_without_pytorch_and_scikit_learn(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["finders"] == 1
    assert state["torch_after_tensorboardX"] is False
    assert state["sklearn_after_importance"] is False
    assert set(state["importance"]) == {"x", "n"}
    assert state["matplotlib_after_preload"] is False
    assert state["plotly_figure"] == "Figure"
    assert state["torch_for_others"] and state["sklearn_for_others"]
    assert state["matplotlib_for_others"]
