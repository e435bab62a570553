"""What goes to ``auto_search.log`` and not the terminal: ONNX Runtime's warnings when the
float model's run by a custom evaluator opens a session, and Ray Tune's notes on slow steps of
its own loop."""

from __future__ import annotations

import logging
import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from raysearch.layout import LOG_FILE
from raysearch.search._logs import LogSetup
from raysearch.search.preflight import stderr_lines


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _model_with_an_unused_initializer() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.ones(3, np.float32), "unused_w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_onnx_runtimes_warnings_are_collected_off_the_terminal(capfd):
    """A session on a model with an unused initializer: ONNX Runtime's C++ logger writes a
    line to file descriptor 2 (as a custom evaluator's sessions do on PP-OCR)."""
    with stderr_lines() as lines:
        ort.InferenceSession(
            _model_with_an_unused_initializer(), providers=["CPUExecutionProvider"]
        )
    assert capfd.readouterr().err == ""
    assert any("Removing initializer 'unused_w'" in line for line in lines)


def test_tunes_slow_step_notes_go_to_the_log_only(tmp_path):
    console, ray_handler = _Kept(), _Kept()
    root, ray_logger = logging.getLogger(), logging.getLogger("ray")
    root.addHandler(console)
    ray_logger.addHandler(ray_handler)
    log = LogSetup(tmp_path)
    try:
        slow = "The `process_trial_result` operation took 0.750 s, which may be a performance "
        logging.getLogger("ray.tune.utils.util").warning(slow + "bottleneck.")
        logging.getLogger("ray.tune.utils.util").warning("another warning")
    finally:
        log.close()
        root.removeHandler(console)
        ray_logger.removeHandler(ray_handler)
    text = (tmp_path / LOG_FILE).read_text()
    assert "performance bottleneck" in text and "another warning" in text
    seen = [r.getMessage() for r in console.records + ray_handler.records]
    assert not any("bottleneck" in m for m in seen)
    assert "another warning" in seen


def test_what_a_failing_block_wrote_to_stderr_is_shown_after_all(capfd):
    with pytest.raises(RuntimeError), stderr_lines():
        os.write(2, b"the evaluator says why\n")
        raise RuntimeError("evaluator failed")
    assert "the evaluator says why" in capfd.readouterr().err
