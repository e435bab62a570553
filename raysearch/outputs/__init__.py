"""The files a search leaves under ``output_dir`` (README.md, "Outputs"), written from its
records.

:func:`write_outputs` takes the finished-trial records (the journal's lines, see
:mod:`raysearch.search.record.recorder`) and writes

- ``summary.json``: ``stop_reason``, ``n_trials``, ``n_failed``, ``n_candidates``,
  ``best_metric``, ``best_params``, ``best_model_path``, ``float_metric``, ``wall_time_s``,
  plus the metric's name and direction, the tolerance, the algorithm and the device; and,
  when only settings that quantize nothing met the tolerance, ``tolerance_note`` (in words),
  ``unquantized_met_tolerance`` and ``best_quantized_missed_by``; otherwise, when no trial met
  it, ``best_missed_by`` (how far the best missed, in the metric's units);
- ``results.parquet``: one row per trial (``trial_id``, ``number``, ``status``, ``metric``,
  ``is_candidate``, the timings, ``calib_cache_hit``, ``node``, ``device``, ``error``, ...)
  and one ``params/<key path>`` column per parameter (a column whose values mix types, or hold
  lists, is JSON text);
- ``best/model.onnx`` (the best trial's model, with its external data as
  ``best/model.onnx.data`` when it has any: ``best/`` loads from wherever it is moved) and
  ``best/config.yaml`` (the user's config with the search space reduced to that one setting,
  ``search_algo: Grid``);
- ``report.html``: the search on one page, offline (:mod:`raysearch.outputs._report`: the
  summary in words, Optuna's figures of a study made from the records, every trial in a
  sortable table, the failures by error); :func:`write_report` writes it again from a folder's
  records (``raysearch report DIR``), and a report that fails is logged, never raised;
- ``batch_report.html`` (``raysearch batch``, in the batch's folder): one row per model linking
  to its ``report.html``, and the batch's timeline (:mod:`raysearch.outputs._batch_report`);
  the batch writes plotly.js once beside it (:func:`write_plotly_js`) and its models' reports
  load it from there (``PLOTLY_SRC_ENV`` in their environment) instead of inlining it;
- ``tensorboard/`` (metric, best-so-far, duration per trial), ``plots/metric_per_trial.png``
  and, from ten scored trials on (as ``report.html``), ``plots/param_importance.png``
  (Optuna's PED-ANOVA importance, which needs no extra package, over the complete trials and
  those stopped at a rung with their score over the rows they reached: the trials behind it
  in its title and in ``summary.json``'s ``param_importance_trials`` and
  ``param_importance_stopped``); :func:`write_trial_plots` writes these two alone, for a
  search that writes them while it times latency again; the ``raysearch`` command's search
  has its plots drawn by a process of its own meanwhile (:class:`PlotProcess`).

Every file is written to a temporary name in its folder and moved into place with
``os.replace``; a folder (``tensorboard/``) is built beside its final name and swapped in.
Which files these are is :mod:`raysearch.layout`.

One module per output: ``_table`` (``results.parquet``), ``_best`` (``best/``),
``_tensorboard``, ``_plots``, ``_report`` (``report.html``, with ``_study``: its Optuna
figures, ``_words``: its summary in words, ``_report_page``: its style and script), and
``_writer`` (the summary and :func:`write_outputs`).

Example:
    >>> summary = write_outputs(out, records, config=cfg, stop_reason="space_exhausted",
    ...                         wall_time_s=12.5)                           # doctest: +SKIP
    >>> summary["n_trials"], summary["best_metric"]                        # doctest: +SKIP
    (6, 0.0031)
"""

from raysearch.outputs._batch_report import (
    BATCH_REPORT,
    build_batch_report,
    float_model_metric,
    write_batch_report,
)
from raysearch.outputs._live_study import LiveStudy
from raysearch.outputs._plots_process import PlotProcess
from raysearch.outputs._report import (
    PLOTLY_JS,
    PLOTLY_SRC_ENV,
    build_report,
    write_plotly_js,
    write_report,
)
from raysearch.outputs._study import default_study_name, export_study
from raysearch.outputs._study_values import timed_alone
from raysearch.outputs._table import RESULT_COLUMNS, results_table, write_results_csv
from raysearch.outputs._writer import (
    preload_output_modules,
    running_summary,
    write_outputs,
    write_trial_plots,
)
from raysearch.ranking import best_record, best_records, better
from raysearch.space import fixed_space

__all__ = [
    "write_outputs",
    "write_trial_plots",
    "write_report",
    "build_report",
    "write_plotly_js",
    "export_study",
    "default_study_name",
    "LiveStudy",
    "PlotProcess",
    "write_results_csv",
    "write_batch_report",
    "build_batch_report",
    "float_model_metric",
    "BATCH_REPORT",
    "PLOTLY_JS",
    "PLOTLY_SRC_ENV",
    "running_summary",
    "timed_alone",
    "preload_output_modules",
    "results_table",
    "fixed_space",
    "best_record",
    "best_records",
    "better",
    "RESULT_COLUMNS",
]
