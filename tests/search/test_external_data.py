"""Models with external data (every model over 2 GB) through a whole search: the float model
travels to other nodes as its files, quantized models keep their ``.data`` files in
``candidates/``, ``kept/`` and ``best/``, and ``best/`` loads and re-evaluates from anywhere.

The float models here are small but saved with external data; ONNX Runtime's quantizer (as
its ``StaticQuantConfig`` does) then writes every quantized model with an external
``<name>.data`` file too, the same files it writes for a float model over 2 GB, so the same
code of raysearch runs — each test checks that the quantized models do have that file.
Trials on another node of a cluster: ``tests/scale/test_cluster.py``, on its two-node cluster.
``test_a_model_over_2_gb_travels_through_the_object_store`` ships a real 2 GiB weight.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import ray
from onnx import TensorProto, helper

from raysearch.cli import main
from raysearch.config import load_config
from raysearch.evaluate import compute_metric
from raysearch.modelfile import file_hash, place_model
from raysearch.quantize.tempdirs import private_dir
from raysearch.search import AutoSearch
from raysearch.search.runtime.transfer import materialize_model, model_blob
from raysearch.trialrecord import TrialRecord
from tests.external_models import (
    check_whole,
    external_mlp_data,
    make_external_mlp,
)
from tests.models import IR_VERSION, OPSET

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]


@pytest.fixture
def external(tmp_path) -> dict[str, Path]:
    model = make_external_mlp(tmp_path / "model" / "ext.onnx", location="weights.bin")
    data = tmp_path / "calib.npz"
    np.savez(data, **external_mlp_data(64))
    return {"model": model, "data": data}


def _config(files: dict[str, Path], out: Path, **extra) -> dict:
    return {
        "model": str(files["model"]),
        "calibration_data": str(files["data"]),
        "search_space": {
            "calibrate_method": ["MinMax", "Percentile"],
            "per_channel": [True, False],
        },
        "search_algo": "Grid",
        "metric": "cos",
        "tolerance": 0.99,
        "output_dir": str(out),
        **extra,
    }


def _metric(files: dict[str, Path], quantized: Path, metric: str) -> float:
    data = dict(np.load(files["data"]))
    reference = ort.InferenceSession(str(files["model"])).run(None, data)[0]
    got = ort.InferenceSession(str(quantized)).run(None, data)[0]
    return compute_metric(metric, {"y": got}, {"y": reference})


def test_a_search_keeps_every_quantized_model_with_its_external_data(external, tmp_path, capsys):
    result = AutoSearch(_config(external, tmp_path / "out", keep_candidates=True)).run()
    out = result.output_dir
    table = result.results.to_pylist()
    assert len(table) == 4 and all(r["status"] == "ok" for r in table)
    candidates = [r for r in table if r["is_candidate"]]
    assert candidates
    # Each candidate's model came with its .data file (written by ONNX Runtime next to the
    # trial's model, which a folder deleted at the end held).
    assert not (out / "trials_tmp").exists()
    names = {p.name for p in (out / "candidates").iterdir()}
    assert names == {f"{r['trial_id']}.onnx{x}" for r in candidates for x in ("", ".data")}
    for r in candidates:
        check_whole(out / "candidates" / f"{r['trial_id']}.onnx")
    assert {r["model_file"] for r in candidates} == {
        f"candidates/{r['trial_id']}.onnx" for r in candidates
    }

    # best/ holds model.onnx with model.onnx.data; moved elsewhere (and the rest of the
    # output folder gone) it loads and re-evaluates to the reported best metric.
    summary = json.loads((out / "summary.json").read_text())
    best = out / "best"
    assert {p.name for p in best.iterdir()} == {"model.onnx", "model.onnx.data", "config.yaml"}
    moved = Path(shutil.move(str(best), str(tmp_path / "moved_best")))
    shutil.rmtree(out / "candidates")
    check_whole(moved / "model.onnx")
    assert _metric(external, moved / "model.onnx", "cos") == pytest.approx(
        summary["best_metric"], rel=1e-6
    )
    shutil.move(str(moved), str(best))

    # best/config.yaml reads back (the model with external data passes its checks) and
    # `raysearch show` reports the search.
    (space,) = load_config(best / "config.yaml").search_spaces
    assert len(space.expand().points) == 1
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "Best model:" in shown and str(best / "model.onnx") in shown


def test_the_best_model_that_is_no_candidate_stays_whole_in_kept(external, tmp_path):
    # L2 <= 0 is out of reach: no candidate, so the best model so far lives in kept/.
    config = _config(external, tmp_path / "out", metric="L2", tolerance=0.0)
    result = AutoSearch(config).run()
    out = result.output_dir
    assert result.summary["n_candidates"] == 0 and result.best_metric is not None
    best_id = result.summary["best_trial_id"]
    # Only the best trial's model, with its data: earlier bests went, data files included.
    assert {p.name for p in (out / "kept").iterdir()} == {f"{best_id}.onnx", f"{best_id}.onnx.data"}
    check_whole(out / "kept" / f"{best_id}.onnx")
    assert not (out / "candidates").exists() and not (out / "trials_tmp").exists()
    moved = Path(shutil.copytree(out / "best", tmp_path / "copy_of_best"))
    shutil.rmtree(out)
    assert _metric(external, moved / "model.onnx", "L2") == pytest.approx(
        result.best_metric, rel=1e-5, abs=1e-9
    )


def test_the_float_model_travels_through_the_object_store_as_its_files(external):
    model = external["model"]
    data = external_mlp_data(8)
    expected = ort.InferenceSession(str(model)).run(None, data)[0]
    digest = file_hash(model)
    blob = model_blob(model, chunk_bytes=4096)  # several chunks for the weights
    assert [f.name for f in blob.files] == ["ext.onnx", "weights.bin"]
    assert len(blob.files[1].chunks) > 1
    shutil.rmtree(private_dir("raysearch-models") / blob.sha256[:24], ignore_errors=True)
    # Gone from the disk: the worker can only get it from the object store.
    shutil.rmtree(model.parent)

    @ray.remote(num_cpus=0)
    def on_a_worker(blob, data):
        path = Path(materialize_model(blob))
        outputs = ort.InferenceSession(str(path)).run(None, data)[0]
        return str(path), sorted(p.name for p in path.parent.iterdir()), file_hash(path), outputs

    path, names, worker_digest, outputs = ray.get(on_a_worker.remote(blob, data))
    try:
        # The same files, under the same names (the .onnx still finds weights.bin), and so
        # the same hash for the calibration cache and the float reference on every node.
        assert names == ["ext.onnx", "weights.bin"]
        assert worker_digest == digest
        np.testing.assert_array_equal(outputs, expected)
        assert materialize_model(blob) == path  # once per node
    finally:
        shutil.rmtree(Path(path).parent, ignore_errors=True)


def test_a_model_over_2_gb_travels_through_the_object_store(tmp_path):
    # One MatMul with a [4096, 131072] float32 weight (2 GiB) in an external file; the file is
    # sparse (zeros), so building it costs no disk.
    rows, cols = 4096, 131072
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[rows, cols])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "big.onnx.data", "offset": 0, "length": 2**31}.items():
        entry = weight.external_data.add()
        entry.key, entry.value = key, str(value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", cols])],
        [weight],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = IR_VERSION
    folder = tmp_path / "big"
    folder.mkdir()
    onnx.save_model(proto, str(folder / "big.onnx"))
    with open(folder / "big.onnx.data", "wb") as fh:
        fh.truncate(2**31)
    started = time.perf_counter()
    blob = model_blob(folder / "big.onnx")
    assert [(f.name, f.size) for f in blob.files] == [
        ("big.onnx", (folder / "big.onnx").stat().st_size),
        ("big.onnx.data", 2**31),
    ]
    target = private_dir("raysearch-models") / blob.sha256[:24]
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(folder)

    @ray.remote(num_cpus=0)
    def on_a_worker(blob):
        path = Path(materialize_model(blob))
        return str(path), {p.name: p.stat().st_size for p in path.parent.iterdir()}

    try:
        path, sizes = ray.get(on_a_worker.remote(blob))
        assert sizes["big.onnx.data"] == 2**31 and Path(path).name == "big.onnx"
        assert onnx.load(path, load_external_data=False).graph.node[0].op_type == "MatMul"
    finally:
        shutil.rmtree(target, ignore_errors=True)
        del blob
    print(f"2 GiB shipped in {time.perf_counter() - started:.1f} s")


def test_overwrite_removes_the_data_files_it_wrote_and_nothing_else(external, tmp_path):
    from raysearch.search.record.journal import Journal
    from raysearch.search.runner import JOURNAL, MARKER, _clean_output_dir

    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("{}")
    journal = Journal(out / JOURNAL)
    for trial in ("t1", "t2"):
        journal.append(TrialRecord(trial_id=trial, status="ok"))
    for folder, name in (("candidates", "t1.onnx"), ("kept", "t2.onnx"), ("best", "model.onnx")):
        source = make_external_mlp(tmp_path / "src" / f"{folder}.onnx")
        place_model(source, out / folder / name, move=True)
    (out / "candidates" / "notes.txt").write_text("mine")
    _clean_output_dir(out, storage_owned=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "candidates",
        "candidates/notes.txt",
    ]


def test_external_data_outside_the_models_folder_is_named_before_the_search(external, tmp_path):
    from raysearch.errors import ConfigError

    model = onnx.load(str(external["model"]), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../weights.bin"
    shutil.move(str(external["model"].parent / "weights.bin"), str(tmp_path / "weights.bin"))
    onnx.save_model(model, str(external["model"]))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"model: external data file '\.\./weights\.bin' of "):
        AutoSearch(_config(external, out)).run()
    assert not out.exists()


def _train_once(external: dict[str, Path], out: Path, evaluator) -> TrialRecord:
    """One trial of a real :class:`QuantTrainable` (in this process) scored by ``evaluator``."""
    import gc

    from raysearch.data import DataSource
    from raysearch.evaluate import Evaluator
    from raysearch.search.record.reported import reported_record
    from raysearch.search.tune.trainable import make_trainable
    from raysearch.trial import FloatBaseline, TrialRunner, TrialSpec

    def factory(threads: int = 1, gpu_id: int | None = None) -> TrialRunner:
        data = DataSource.load(external["data"], external["model"])
        score = Evaluator(evaluator, tolerance=0.1)
        return TrialRunner(
            TrialSpec(external["model"], data, None, score, baseline=FloatBaseline(score=1.0))
        )

    trainable = make_trainable(factory, out)(config={"settings": {"calibrate_method": "MinMax"}})
    try:
        return reported_record(trainable.train())
    finally:
        trainable.stop()
        gc.unfreeze()  # the trainable froze this process's objects for its actor's life


def _accept(path: str, providers: list) -> float:
    return 1.0


def _refuse(path: str, providers: list) -> float:
    raise RuntimeError("this evaluator scores nothing")


def test_a_trial_run_again_or_failing_leaves_no_stale_data_file(external, tmp_path):
    from raysearch.search.tune.trainable import TRIALS_TMP

    out = tmp_path / "out"
    trials = out / TRIALS_TMP
    trials.mkdir(parents=True)
    # What a killed first run of the same trial left (Tune runs it again on resume): ONNX
    # Runtime would append the new data to it.
    stale = b"stale" * 1000
    (trials / "default.onnx.data").write_bytes(stale)
    record = _train_once(external, out, _accept)
    assert record.status == "ok"
    model = trials / "default.onnx"
    check_whole(model)
    proto = onnx.load(str(model), load_external_data=False)
    offsets = [
        int(e.value) for t in proto.graph.initializer for e in t.external_data if e.key == "offset"
    ]
    assert min(offsets) == 0 and not (trials / "default.onnx.data").read_bytes().startswith(stale)

    # ONNX Runtime writes the model with its data file, then the evaluator fails: the trial
    # engine deletes the model file, and the data file goes with it.
    record = _train_once(external, out, _refuse)
    assert record.status == "failed" and "scores nothing" in record.error
    assert list(trials.iterdir()) == []
