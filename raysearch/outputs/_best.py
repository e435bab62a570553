"""``best/``: the best trial's model (with its external data) and its config reduced to that
one setting; for a model of an onnxruntime-genai or Optimum folder, with the files its client
reads (:mod:`raysearch.modelfolder`).

Example:
    >>> fixed_space({"per_channel": True})
    {'per_channel': [True]}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raysearch.config import written_config
from raysearch.fileio import atomic_write_text
from raysearch.layout import BEST, BEST_CONFIG, BEST_MODEL
from raysearch.modelfile import place_model
from raysearch.modelfolder import model_folder
from raysearch.space import fixed_space
from raysearch.trialrecord import TrialRecord

if TYPE_CHECKING:
    from raysearch.config import SearchConfig

__all__ = ["write_best"]

_logger = logging.getLogger("raysearch.outputs")


def _best_config(raw: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    # A reader or a model object given from Python is named, not written.
    config, _ = written_config(raw)
    for key in ("search_space", "search_spaces", "stop", "output_dir", "storage_path", "seed"):
        config.pop(key, None)
    config["search_algo"] = "Grid"
    config["search_space"] = fixed_space(params)
    return config


def write_best(out: Path, best: TrialRecord, config: SearchConfig) -> Path | None:
    """Write ``best/model.onnx`` and ``best/config.yaml`` for the record ``best``; return the
    model's path, None when the trial's model file is missing."""
    best_path: Path | None = None
    best_dir = out / BEST
    best_dir.mkdir(exist_ok=True)
    model_file = best.model_file
    if model_file and (out / model_file).is_file():
        # With its external-data files, renamed model.onnx.data (and the location
        # inside rewritten to match).
        best_path = place_model(out / model_file, best_dir / BEST_MODEL, move=False)
        client = model_folder(config.model) if isinstance(config.model, Path) else None
        if client is not None:
            client.copy_into(best_dir, BEST_MODEL)
    else:
        _logger.warning("the best trial's model file is missing; best/model.onnx not written")
    raw = config.raw or {}
    text = yaml.safe_dump(_best_config(raw, best.params or {}), sort_keys=False, allow_unicode=True)
    atomic_write_text(
        best_dir / BEST_CONFIG,
        f"# raysearch: the best setting of {out} (trial {best.trial_id}, "
        f"{config.metric} = {best.metric:.6g})\n" + text,
    )
    return best_path
