"""The files a search leaves under ``output_dir`` (README.md, "Outputs"), written from its
records by :func:`write_outputs`: ``summary.json``, ``results.parquet`` (``_table``),
``best/`` (``_best``), ``report.html`` (``_report``, with ``_study``, ``_words`` and
``_report_page``), ``batch_report.html`` (``_batch_report``), ``tensorboard/`` and ``plots/``
(``_tensorboard``, ``_plots``). Each file is written to a temporary name and moved into
place; which files these are is :mod:`raysearch.layout`.
"""

from raysearch.outputs._batch_report import (
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
