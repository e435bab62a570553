"""The one list of the files and folders a search owns in its ``output_dir``.

Everything that creates, cleans, sweeps or names these files imports them from here
(``overwrite`` removes only :data:`OWNED`, and in the result folders only
:data:`RESULT_FILES`); a new output is one line here.

Example:
    >>> "summary.json" in OWNED and "best" in RESULT_FILES
    True
    >>> USER_OUTPUTS
    'summary.json, results.parquet, report.html, best/, plots/, tensorboard/'
"""

from __future__ import annotations

__all__ = [
    "MARKER",
    "LOCK",
    "CONFIG_FILE",
    "JOURNAL",
    "LOG_FILE",
    "CACHE_DIR",
    "RAY_RESULTS",
    "EXPERIMENT",
    "TRIALS_TMP",
    "CANDIDATES",
    "KEPT",
    "CLIENT_FILES",
    "GENAI_CONFIG",
    "HF_CONFIG",
    "SUMMARY",
    "RESULTS",
    "PARETO",
    "REPORT",
    "BEST",
    "BEST_MODEL",
    "BEST_CONFIG",
    "PLOTS",
    "METRIC_PLOT",
    "IMPORTANCE_PLOT",
    "TENSORBOARD",
    "OWNED",
    "RESULT_FILES",
    "ATOMIC_FILES",
    "USER_OUTPUTS",
]

# -- the search's own files (raysearch's alone: removed whole by ``overwrite``) -------------------
#: Marks a folder as a raysearch search (status, Tune's storage path).
MARKER = ".raysearch.json"
#: Locked (``flock``) by the search running in the folder; not in :data:`OWNED`.
LOCK = ".raysearch.lock"
#: The config, paths made absolute: what ``raysearch resume`` reads.
CONFIG_FILE = "raysearch_config.yaml"
#: One line per finished trial.
JOURNAL = "journal.jsonl"
LOG_FILE = "auto_search.log"
#: The calibration cache and the float reference.
CACHE_DIR = "cache"
#: Ray Tune's experiment (when ``storage_path`` is not set).
RAY_RESULTS = "ray_results"
#: Ray Tune's experiment, a folder under ``ray_results/`` (or ``storage_path``).
EXPERIMENT = "search"
#: Where trials write their quantized models before the recorder keeps or drops them.
TRIALS_TMP = "trials_tmp"

# -- the outputs (README.md, "Outputs") -----------------------------------------------------------
SUMMARY = "summary.json"
RESULTS = "results.parquet"
#: The candidates on the Pareto front of the config's ``objectives`` (when several).
PARETO = "pareto.parquet"
#: The search on one page (summary, charts, every trial), self-contained.
REPORT = "report.html"
BEST = "best"
BEST_MODEL = "model.onnx"
BEST_CONFIG = "config.yaml"
PLOTS = "plots"
METRIC_PLOT = "metric_per_trial.png"
IMPORTANCE_PLOT = "param_importance.png"
TENSORBOARD = "tensorboard"
#: The best candidates' models, and the best trial's when it is not one of them.
CANDIDATES = "candidates"
KEPT = "kept"

GENAI_CONFIG = "genai_config.json"
HF_CONFIG = "config.json"
#: The files beside a model that onnxruntime-genai or Optimum read (glob patterns), copied
#: beside every model kept.
CLIENT_FILES: tuple[str, ...] = (
    GENAI_CONFIG,
    HF_CONFIG,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)

#: Everything raysearch may create in an output folder (what ``overwrite`` removes).
OWNED = (
    MARKER,
    CONFIG_FILE,
    JOURNAL,
    LOG_FILE,
    CACHE_DIR,
    RAY_RESULTS,
    TRIALS_TMP,
    CANDIDATES,
    KEPT,
    SUMMARY,
    RESULTS,
    PARETO,
    REPORT,
    BEST,
    PLOTS,
    TENSORBOARD,
)

#: Result folders a user browses: only the files raysearch writes there are removed
#: (``{trial}``: the id of a trial in the search's journal).
RESULT_FILES: dict[str, tuple[str, ...]] = {
    BEST: (BEST_MODEL, f"{BEST_MODEL}.data*", BEST_CONFIG, *CLIENT_FILES),
    CANDIDATES: ("{trial}.onnx", "{trial}.onnx.data*", "{trial}"),
    KEPT: ("{trial}.onnx", "{trial}.onnx.data*", "{trial}"),
    PLOTS: (METRIC_PLOT, IMPORTANCE_PLOT),
    TENSORBOARD: ("events.out.tfevents.*",),
}

#: Files written to a temporary name beside them and moved into place, by folder and stem.
ATOMIC_FILES: dict[str, tuple[str, ...]] = {
    "": (SUMMARY, RESULTS, PARETO, REPORT, TENSORBOARD, MARKER, CONFIG_FILE),
    BEST: (BEST_MODEL, BEST_CONFIG),
    PLOTS: (METRIC_PLOT.rsplit(".", 1)[0], IMPORTANCE_PLOT.rsplit(".", 1)[0]),
}

#: The outputs as the CLI lists them after a search.
USER_OUTPUTS = f"{SUMMARY}, {RESULTS}, {REPORT}, {BEST}/, {PLOTS}/, {TENSORBOARD}/"
