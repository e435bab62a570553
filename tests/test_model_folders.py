"""Language models as they are deployed: an onnxruntime-genai folder (``GroupQueryAttention``
with a fused q/k/v projection, the cache's head size symbolic in the graph and given in
``genai_config.json``) and an Optimum folder (``config.json`` beside ``model.onnx``) are taken
as ``model:``; every feed a decoder needs is built from ``input_ids`` alone; the folders a
search writes (``best/``, ``candidates/<trial>/``) are the same kind of folder, loaded and
decoded by the real clients (:mod:`tests.clients`)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from raysearch.config import SearchConfig
from raysearch.data import DataSource, model_inputs
from raysearch.errors import ConfigError
from raysearch.evaluate import measure_decoder_latency
from raysearch.modelfolder import CacheDims, cache_dims, model_folder
from tests.clients import BYTEGPT, BYTELLAMA, export_optimum, generate
from tests.lm_models import make_decoder_lm

GENAI = BYTELLAMA / "genai"

needs_bytellama = pytest.mark.skipif(not GENAI.is_dir(), reason="no shared bytellama model")


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _text(folder: Path, rows: int, seq: int) -> Path:
    ids = np.load(BYTEGPT / "eval.npz")["input_ids"][:rows, :seq]
    np.savez(folder / "text.npz", input_ids=ids)
    return folder / "text.npz"


@needs_bytellama
def test_genai_feeds_come_from_genai_config_and_match_the_graph(tmp_path):
    model = GENAI / "model.onnx"
    past = {i.name: i.shape for i in model_inputs(model) if i.name.startswith("past")}
    assert past["past_key_values.0.key"] == ("batch_size", 2, "past_sequence_length", 64)
    # The graph alone says the same (a model copied away from its genai_config.json).
    header = onnx.load(str(model), load_external_data=False)
    assert cache_dims(None, header) == cache_dims(model) == CacheDims(2, 64)
    data = DataSource.load(_text(tmp_path, 2, 16), model)
    assert set(data.arrays) == {i.name for i in model_inputs(model)}
    assert data.arrays["past_key_values.2.value"].shape == (2, 2, 0, 64)
    session = _session(model)
    logits = session.run(["logits"], data.batch(0))[0]
    assert logits.shape == (2, 16, 256) and np.isfinite(logits).all()
    # A decode step against the cache: the prompt, then tokens one by one.
    times = measure_decoder_latency(session, data, runs=3)
    assert times["decode_latency_ms"] > 0 and times["prefill_latency_ms"] > 0
    # In turn with another model's steps (a bound's): both timed on the same tokens.
    both = measure_decoder_latency(session, data, runs=3, anchor=_session(model))
    assert both["decode_latency_ms"] > 0 and both["anchor_decode_latency_ms"] > 0


def _symbolic_head_size(path: Path) -> Path:
    """The tiny decoder with its cache's head size named, not given (as genai's builder
    writes it)."""
    proto = onnx.load(str(path))
    for value in [*proto.graph.input, *proto.graph.output]:
        if "past" in value.name or "present" in value.name:
            value.type.tensor_type.shape.dim[3].dim_param = "kv_cache_dim"
    onnx.save(proto, str(path))
    return path


class _CacheLengths:
    """A real session that records the cache length of every run it makes."""

    def __init__(self, session: ort.InferenceSession):
        self.session, self.lengths = session, []

    def __getattr__(self, name: str):
        return getattr(self.session, name)

    def run(self, names, feed):
        self.lengths.append(feed["past_key_values.0.key"].shape[2])
        return self.session.run(names, feed)


def test_a_decode_step_timed_against_an_anchor_runs_every_cache_length_once_untimed(tmp_path):
    """Against an anchor (reused from trial to trial) the trial's fresh session meets each
    cache length first untimed, as the anchor has: both decode the sequence twice, alike."""
    model = make_decoder_lm(tmp_path / "lm.onnx")
    data = DataSource.load({"input_ids": np.arange(24, dtype=np.int64).reshape(1, 24)}, model)
    trial, anchor = _CacheLengths(_session(model)), _CacheLengths(_session(model))
    both = measure_decoder_latency(trial, data, runs=3, anchor=anchor)
    assert both["decode_latency_ms"] > 0 and both["anchor_decode_latency_ms"] > 0
    decoded = trial.lengths[4:]  # after the prefill's timing: a warm-up and 3 runs
    half = len(decoded) // 2
    assert decoded[:half] == decoded[half:] and len(set(decoded[:half])) > 2
    assert anchor.lengths == decoded
    alone = _CacheLengths(_session(model))
    measure_decoder_latency(alone, data, runs=3)  # no anchor: one pass
    assert alone.lengths.count(0) < trial.lengths.count(0)


def test_optimum_feeds_come_from_config_json(tmp_path):
    folder = tmp_path / "optimum"
    folder.mkdir()
    model = _symbolic_head_size(make_decoder_lm(folder / "model.onnx"))
    assert model_folder(model) is None
    assert "kv_cache_dim" in [i.shape[3] for i in model_inputs(model) if i.name.startswith("past")]
    config = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
              "hidden_size": 64}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    folder_of = model_folder(model)
    assert folder_of is not None and folder_of.kind == "optimum"
    assert cache_dims(model) == CacheDims(2, 16)
    data = DataSource.load({"input_ids": np.ones((3, 5), np.int64)}, model)
    assert data.arrays["past_key_values.0.key"].shape == (3, 2, 0, 16)
    logits = _session(model).run(["logits"], data.batch(0))[0]
    assert logits.shape[:2] == (3, 5)


@needs_bytellama
def test_model_takes_a_client_folder_and_refuses_a_folder_of_neither(tmp_path):
    base = {"calibration_data": str(BYTEGPT / "calib.npz"), "metric": "kl", "tolerance": 0.001,
            "search_space": "WEIGHT_ONLY_INT4_SEARCH"}  # fmt: skip
    config = SearchConfig.from_dict({**base, "model": str(GENAI)})
    assert config.model == GENAI / "model.onnx"
    assert model_folder(config.model).kind == "genai"
    (tmp_path / "model.onnx").write_bytes((GENAI / "model.onnx").read_bytes())
    with pytest.raises(ConfigError, match="got a directory with neither"):
        SearchConfig.from_dict({**base, "model": str(tmp_path)})


def _client_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.name not in ("config.yaml",)}


def _search(tmp_path: Path, model: Path) -> tuple[Path, list[dict]]:
    from raysearch.search import AutoSearch

    result = AutoSearch({
        "model": str(model),
        "calibration_data": str(_text(tmp_path, 8, 64)),
        "search_space": {"quantizer": ["weight_only"], "algorithm": ["rtn", "k_quant"],
                         "block_size": [32], "accuracy_level": [4]},
        "search_algo": "Grid",
        "metric": "kl",
        "tolerance": 1.0,
        "early_stopping": False,
        "keep_candidates": True,
        "resources": {"max_concurrent_trials": 1},
        "output_dir": str(tmp_path / "out"),
    }).run()  # fmt: skip
    return tmp_path / "out", result.results.to_pylist()


def _check_folders(out: Path, rows: list[dict], source: Path) -> None:
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("error") for r in rows]
    assert all(r["decode_latency_ms"] and r["prefill_latency_ms"] for r in rows)
    wanted = {p.name for p in source.iterdir() if not p.name.endswith((".onnx", ".data"))}
    for folder in [out / "best", *(p for p in (out / "candidates").iterdir())]:
        names = _client_files(folder)
        assert wanted <= names, (folder, names)
        for item in folder.iterdir():  # readable by the user's group and others, as umask says
            assert item.stat().st_mode & stat.S_IRUSR
            assert item.stat().st_mode & 0o777 == 0o666 & ~_umask(), item


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
@needs_bytellama
def test_a_genai_folder_searched_writes_genai_folders_og_decodes(tmp_path):
    out, rows = _search(tmp_path, GENAI)
    _check_folders(out, rows, GENAI)
    assert generate("genai", out / "best", 100) == 100
    # best/ moved elsewhere still loads: its data is named as the graph expects
    moved = shutil.copytree(out / "best", tmp_path / "elsewhere")
    assert generate("genai", moved, 5) == 5


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
@needs_bytellama
def test_an_optimum_folder_searched_writes_optimum_folders_ortmodel_decodes(tmp_path):
    source = export_optimum(BYTELLAMA / "hf", tmp_path / "optimum")
    out, rows = _search(tmp_path, source)
    _check_folders(out, rows, source)
    assert generate("optimum", out / "best", 100) == 100
