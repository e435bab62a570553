"""``start_preflight``: the ``raysearch`` command checks the input and starts the float
reference in a thread before it imports Ray Tune; the result (the reference, once its run
ends) and the errors are those of ``preflight``, and a custom evaluator is left to
``preflight`` in the caller's thread."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

from tests.models import make_mlp_model, mlp_data

_SCRIPT = textwrap.dedent(
    """
    import json, sys

    import raysearch.cli  # what the command has imported when it starts the preflight
    from raysearch.config._config import SearchConfig
    from raysearch.errors import InputError
    from raysearch.search.preflight import preflight, start_preflight

    base = json.loads(sys.argv[1])
    state = {"ray_before": "ray" in sys.modules}
    pending = start_preflight(SearchConfig.from_dict(base))
    prepared = pending.result(timeout=120)
    state["ray_after"] = "ray" in sys.modules or "ray.tune" in sys.modules
    # The command's preflight checks the first batch and computes the rest while Ray starts.
    state["deferred"] = prepared.reference is None and prepared.pending_reference is not None
    reference = prepared.pending_reference.future.result(timeout=120)
    expected = preflight(SearchConfig.from_dict(base))
    state["same_outputs"] = all(
        (reference.outputs[k] == v).all() for k, v in expected.reference.outputs.items()
    )
    state["rows"] = len(prepared.evaluation)
    bad = SearchConfig.from_dict({**base, "eval_data": base["model"]})
    errors = []
    for run in (lambda: start_preflight(bad).result(timeout=120), lambda: preflight(bad)):
        try:
            run()
        except InputError as exc:
            errors.append(str(exc))
    state["errors"] = errors
    custom = {**base, "metric": "tests.evaluators_fixture:mean_output", "higher_is_better": True}
    state["custom"] = start_preflight(SearchConfig.from_dict(custom)) is None
    print(json.dumps(state))
    """
)


def test_the_preflight_runs_before_ray_is_imported_with_preflights_result(tmp_path):
    model = make_mlp_model(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "calib.npz", **mlp_data(16))
    np.savez(tmp_path / "eval.npz", **mlp_data(24, seed=5))
    config = {
        "model": str(model),
        "calibration_data": str(tmp_path / "calib.npz"),
        "eval_data": str(tmp_path / "eval.npz"),
        "metric": "cos",
        "batch_size": 8,
        "search_space": {"calibrate_method": ["MinMax"]},
        "output_dir": str(tmp_path / "out"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["ray_before"] is False and state["ray_after"] is False, state
    assert state["deferred"] and state["same_outputs"] and state["rows"] == 24, state
    # A bad input: the same one-line error from the started preflight as from preflight.
    assert len(state["errors"]) == 2 and state["errors"][0] == state["errors"][1], state
    assert state["custom"] is True, state
