"""The ``raysearch`` command line.

Exit status: 0 when a search finished with a result (a best setting, whether or not it met
the tolerance), 1 when it finished without one (no trial succeeded, or none finished within
the time limit: one line on standard error names the most frequent error), 2 on bad input
(a one-line message that names the problem; no traceback unless ``--debug``), 1 on an
internal error, 130 when interrupted (Ctrl-C: the outputs hold what finished; ``raysearch
resume`` continues). ``batch`` exits 1 too when any model failed, once every model's
outputs and the batch summary (which says why, per model) are written.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from raysearch.errors import ConfigErrors, DiskFullError, InputError
from raysearch.layout import BEST, LOG_FILE, REPORT
from raysearch.ranking import LATENCIES

if TYPE_CHECKING:
    from raysearch.trialrecord import TrialRecord

__all__ = ["main"]

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"raysearch: error: {message} (see raysearch --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="raysearch",
        description="Search post-training quantization settings of an ONNX model on Ray Tune.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run a search from a YAML config")
    run.add_argument("config", type=Path, help="the search config (YAML)")
    run.add_argument("overrides", nargs="*", help="key.path=value overrides, values as YAML")
    run.add_argument("--output-dir", type=Path, help="where outputs go (overrides output_dir)")
    run.add_argument("--address", help="Ray cluster to join: auto, host:port or ray://host:port")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous search in the output folder (only files raysearch created)",
    )

    resume = sub.add_parser("resume", help="continue an interrupted search")
    resume.add_argument("output_dir", type=Path, help="the interrupted search's output folder")
    resume.add_argument("--address", help="Ray cluster to join: auto, host:port or ray://host:port")

    validate = sub.add_parser("validate", help="check a config and print the space's size")
    validate.add_argument("config", type=Path)
    validate.add_argument("overrides", nargs="*", help="key.path=value overrides")

    sub.add_parser("spaces", help="list the predefined search spaces and their sizes")

    show = sub.add_parser("show", help="print the summary and top settings of a search")
    show.add_argument("output_dir", type=Path)
    show.add_argument("--top", type=int, default=5, help="how many settings to list")
    show.add_argument(
        "--csv",
        action="store_true",
        help="print results.parquet as CSV instead (every trial; lists as JSON text)",
    )

    report = sub.add_parser(
        "report", help="write report.html for a search (finished, interrupted or running)"
    )
    report.add_argument("output_dir", type=Path, help="the search's output folder")

    export = sub.add_parser(
        "export", help="write a search as an Optuna study (for optuna-dashboard)"
    )
    export.add_argument("output_dir", type=Path, help="the search's output folder")
    export.add_argument(
        "--optuna",
        required=True,
        metavar="STORAGE_URL",
        help="the Optuna storage to write to, e.g. sqlite:///study.db",
    )
    export.add_argument(
        "--study-name", help="the study's name (default: the folder's name and the search's id)"
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a study of that name in the storage (no other study is touched)",
    )

    batch = sub.add_parser("batch", help="search many models from a manifest on one cluster")
    batch.add_argument("manifest", type=Path, help="the batch manifest (YAML)")
    batch.add_argument("--output-dir", type=Path, help="where outputs go (overrides output_dir)")
    batch.add_argument(
        "--address",
        help="Ray cluster every search joins: auto, host:port or ray://host:port (overrides "
        "address)",
    )
    batch.add_argument(
        "--overwrite", action="store_true", help="rerun finished searches instead of keeping them"
    )

    demo = sub.add_parser("demo", help="run the embedded demo search (magika, local Ray)")
    demo.add_argument("--output-dir", type=Path, help="where outputs go")
    demo.add_argument("--overwrite", action="store_true", help="replace a previous demo run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``raysearch`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.debug:  # how Quark's and Neural Compressor's names were read: one line
        logging.getLogger(DIALECTS_LOGGER).setLevel(logging.INFO)
    try:
        with _narrowing_quiet(args.command, args.debug):
            return _COMMANDS[args.command](args)
    except InputError as exc:
        if args.debug:
            raise
        for error in exc.errors if isinstance(exc, ConfigErrors) else (exc,):
            print(f"raysearch: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DiskFullError as exc:  # not a bug: the message says what to free and how to go on
        if args.debug:
            raise
        print(f"raysearch: error: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    except KeyboardInterrupt:
        print("raysearch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): point stdout at /dev/null for the exit's flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # an internal error: say what, point at --debug
        if args.debug:
            raise
        print(
            f"raysearch: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _load(args: argparse.Namespace):
    from raysearch.config import load_config

    overrides = list(getattr(args, "overrides", []) or [])
    if getattr(args, "output_dir", None) is not None:
        overrides.append(f"output_dir={args.output_dir.resolve()}")
    if getattr(args, "address", None):
        overrides.append(f"address={args.address}")
    return load_config(args.config, overrides)


def _space_report(config) -> list[str]:
    """What the search will run, under the rules and refusals it applies."""
    import functools

    from raysearch.quantize.registry import backend_reject
    from raysearch.space import expand_spaces
    from raysearch.strategies import ModelFacts

    reject = functools.partial(backend_reject, weights=ModelFacts.of(config.model).weights)
    lines = []
    limit = config.stop.iteration_limit
    if config.search_algo == "Grid":
        grid = expand_spaces(config.search_spaces, reject)
        lines.append(f"grid: {len(grid)} settings ({grid.total} combinations)")
        for rule, count in sorted(grid.dropped.items()):
            lines.append(f"  dropped by {rule}: {count}")
        if 0 < limit < len(grid):
            lines.append(f"  stop.iteration_limit: only the first {limit} run")
        return lines
    for space in config.search_spaces:
        names = ", ".join(p.name for p in space.params if not p.domain.is_fixed)
        if space.has_ranges:
            size = "ranges"
        else:
            size = (
                f"{len(expand_spaces([space], reject))} distinct valid settings of "
                f"{space.grid_size()} combinations"
            )
        lines.append(f"{space.name}: {config.search_algo} over {names or 'nothing'} ({size})")
    if limit > 0:
        lines.append(f"stop.iteration_limit: at most {limit} trials")
    return lines


def _cmd_validate(args: argparse.Namespace) -> int:
    """Every check ``run`` makes before Ray starts, then the space's size; what it cannot
    check without Ray or ``run``'s flags, one line each."""
    from raysearch.search.preflight import preflight, warn_if_u8s8_saturates
    from raysearch.search.targets import check_targets
    from raysearch.strategies import check_strategy_available

    with _narrowing_notes() as notes:
        config = _load(args)
    check_strategy_available(config.search_algo)
    prepared = preflight(config, check_only=True)
    check_targets(config)
    warn_if_u8s8_saturates(config.search_spaces)
    print(f"{args.config}: valid")
    for line in _space_report(config):
        print(line)
    for note in notes:
        print(f"note: {note} (raysearch spaces counts every setting of the preset)")
    for line in _validate_notes(config, prepared):
        print(line)
    return EXIT_OK


def _validate_notes(config, prepared) -> list[str]:
    """What ``validate`` saw of the float model, and what it left to ``run``, and why."""
    lines = []
    if prepared.float_score is not None:
        name = str(config.metric).rsplit(":", 1)[-1]
        took = prepared.info.get("float_score_s") or 0.0
        line = f"float model: {name} = {_fmt(prepared.float_score)} (scored in {took:.1f} s"
        limit = config.stop.time_limit
        if limit is not None and limit > 0:
            line += f", {took / limit:.0%} of time_limit {_fmt(limit)} s"
        lines.append(line + ")")
    elif prepared.probe is not None:
        rows = len(prepared.evaluation)
        first, last = next(prepared.evaluation.batch_ranges(0, 1))
        lines.append(
            f"float model: runs on the evaluation data ({rows} rows)"
            if last - first >= rows
            else f"float model: runs on the evaluation data's first batch ({last - first} of "
            f"{rows} rows; run computes the rest while its first trials start)"
        )
    lines.append(
        "not checked: whether a Ray node can hold one trial (resources), which needs Ray: "
        "run checks it once Ray starts"
    )
    folder_note = _output_dir_note(config)
    if folder_note:
        lines.append(folder_note)
    return lines


def _output_dir_note(config) -> str | None:
    """Why ``run`` would refuse the output folder as it is now, which ``validate`` reports."""
    from raysearch.search.record.output_dir import check_output_dir, continued_folder

    if continued_folder(config) is not None:
        return None
    try:
        check_output_dir(Path(config.output_dir).resolve(), overwrite=False)
    except InputError as exc:
        return f"note: run without --overwrite would refuse it: {exc}"
    return None


@contextlib.contextmanager
def _narrowing_quiet(command: str, debug: bool) -> Iterator[None]:
    """A predefined space narrowed to this install: a warning for the commands that search,
    quiet for the others."""
    logger = logging.getLogger(NARROWED_LOGGER)
    level = logger.level
    if command not in _SEARCHING and not debug:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _narrowing_notes() -> Iterator[list[str]]:
    """The notes of the predefined spaces narrowed to this install while the block runs,
    kept instead of logged."""
    notes: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage())

    logger = logging.getLogger(NARROWED_LOGGER)
    handler, level, propagate = _Keep(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield notes
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _cmd_spaces(args: argparse.Namespace) -> int:
    """Each predefined space and its settings (how many a search here runs, if narrowed)."""
    import yaml

    from raysearch.config import predefined_spaces, runnable_predefined_space
    from raysearch.quantize.registry import backend_reject
    from raysearch.space import SearchSpace, expand_spaces

    print(f"{'name':<26} {'settings':>8}  description")
    narrowed = []
    for name, path in predefined_spaces().items():
        data = yaml.safe_load(path.read_text())
        space = SearchSpace.parse(data["search_space"], path=name)
        count = len(expand_spaces([space], backend_reject))
        raw, notes = runnable_predefined_space(name)
        mark = "*" if notes else " "
        print(f"{name:<26} {count:>7}{mark}  {data.get('description', '')}")
        if notes:
            here = len(expand_spaces([SearchSpace.parse(raw, path=name)], backend_reject))
            narrowed.append((name, count, here, notes))
    for name, count, here, notes in narrowed:
        why = "; ".join(note.split(": ", 1)[1] for note in notes)
        print(f"* {name}: a search here runs {here} of its {count} settings: {why}")
    return EXIT_OK


#: The commands that run a search: a predefined space narrowed to this install is a warning
#: for them, quiet for the others.
_SEARCHING = frozenset({"run", "resume", "demo", "batch"})
#: ``raysearch.config.NARROWED_LOGGER`` and ``_dialects.LOGGER`` (not imported: a fast start).
NARROWED_LOGGER = "raysearch.config.narrowed"
DIALECTS_LOGGER = "raysearch.config.dialects"


def _run_search(config, overwrite: bool) -> int:
    from raysearch.search.preflight import start_preflight
    from raysearch.search.record.output_dir import check_output_dir, continued_folder

    # ``resume_if_exists``: an earlier run of the same search in the folder goes on.
    folder = None if overwrite else continued_folder(config)
    if folder is not None:
        from raysearch.search import AutoSearch

        print(f"raysearch: continuing the search in {folder} (resume_if_exists)", file=sys.stderr)
        return _ended(AutoSearch.resume(folder, config=config, progress=sys.stderr))
    # The input checked and the float reference computed while Ray Tune is imported.
    check_output_dir(Path(config.output_dir).resolve(), overwrite=overwrite)
    from raysearch.search.targets import check_targets

    check_targets(config)
    from raysearch.search.runtime import KeptWarm
    from raysearch.search.runtime.cluster import cluster_address

    kept = KeptWarm() if cluster_address(config.address) else None
    pending = start_preflight(config, kept=kept.lookup_reference if kept else None)
    from raysearch.search import AutoSearch

    result = AutoSearch(config).run(
        overwrite=overwrite, progress=sys.stderr, preflight=pending, kept=kept
    )
    return _ended(result)


def _cmd_run(args: argparse.Namespace) -> int:
    return _run_search(_load(args), args.overwrite)


def _cmd_resume(args: argparse.Namespace) -> int:
    from raysearch.search import AutoSearch

    return _ended(AutoSearch.resume(args.output_dir, progress=sys.stderr, address=args.address))


def _ended(result: Any) -> int:
    """Print the summary of a search that ended in this command; its exit status, with its
    line on standard error: 0 with a result, 1 without one or when a stage of its strategy
    failed, 130 interrupted."""
    _print_summary(result.summary, result.output_dir, ended=True)
    if result.summary.get("stop_reason") == "strategy_failed":
        print(
            "raysearch: internal error: a stage of the search strategy failed (its traceback "
            f"is in {Path(result.output_dir) / LOG_FILE}); the outputs hold the trials that "
            "finished",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    if result.summary.get("stop_reason") == "interrupted":
        print(
            f"Interrupted: continue with `raysearch resume {result.output_dir}`.", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    if result.summary.get("best_metric") is None:
        print(f"raysearch: error: {_no_result(result.summary)}", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    args.config = Path(str(resources.files("raysearch.configs") / "quickstart.yaml"))
    print("raysearch demo: int8 search for Google's magika content-type model (ships with")
    print("raysearch); data built from this Python installation's files, cached after first use.")
    print("Settings are ranked by top-1 agreement with the float model less the cosine distance")
    print("of its output probabilities; hopeless ones stop after 10 % of the files.")
    return _run_search(_load(args), args.overwrite)


def _fmt(value: Any) -> str:
    """A value as a person reads it: numbers to 6 digits, lists as ``[a, b]``, mappings as
    ``{key: value}``, true and false and null as YAML writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def _size(n_bytes: Any) -> str:
    return f"{n_bytes / 1e6:.3g} MB" if isinstance(n_bytes, (int, float)) else "size unknown"


def _float_line(summary: dict[str, Any], metric: str) -> str:
    """The float model's metric, size and latency, whatever the metric."""
    from raysearch.metrics import METRICS

    if summary.get("float_metric") is not None:
        score = f"{metric} = {_fmt(summary['float_metric'])}"
    elif metric in METRICS:  # a built-in metric compares with the float model's own outputs
        score = f"{metric} = {_fmt(METRICS[metric].best)} (the reference: its own outputs)"
    else:
        score = f"{metric} not known"
    latency, on_cpu = summary.get("float_latency_ms"), summary.get("float_latency_cpu_ms")
    if latency is not None:
        timed = f"{_fmt(latency)} ms per batch"
    elif on_cpu is not None:  # the trials ran on a GPU: not compared (outputs._writer)
        timed = f"{_fmt(on_cpu)} ms per batch"
    else:
        timed = "latency not measured"
    for key, label, unit, _ in LATENCIES[1:]:  # a language-model metric's decode, prefill
        value = summary.get(f"float_{key}")
        if value is None:
            value = summary.get(f"float_{key.replace('_ms', '_cpu_ms')}")
        if value is not None:
            timed += f", {label} {_fmt(value)} {unit}"
    if latency is None and on_cpu is not None:
        timed += " on the driver's CPU"
    return f"Float model: {score}, {_size(summary.get('float_model_size_bytes'))}, {timed}"


def _against_float(summary: dict[str, Any]) -> list[str]:
    lines = []
    for key, label, unit, field in (("model_size_bytes", "size", None, None), *LATENCIES):
        mine, ref = summary.get(f"best_{key}"), summary.get(f"float_{key}")
        if mine is None:
            continue
        said = _size(mine) if unit is None else f"{_fmt(mine)} {unit}"
        if ref:
            said += f" ({mine / ref:.1%} of the float model's)"
        timed = (summary.get(field) or {}).get("models") or {} if field else {}
        best = timed.get(str(summary.get("best_trial_id")))
        if unit is not None and best and timed.get("float"):
            rounds = summary[field]["rounds"]
            said += (
                f", both timed alone after the search: {_fmt(best['min_ms'])}-"
                f"{_fmt(best['max_ms'])} ms against {_fmt(timed['float']['min_ms'])}-"
                f"{_fmt(timed['float']['max_ms'])} ms over {rounds} rounds"
            )
        elif unit is not None and summary.get("latency_timing"):
            said += f", {summary['latency_timing']}"  # the trials' figures: said so
        lines.append(f"  {label}: {said}")
    return lines


def _tolerance_words(summary: dict[str, Any], metric: str) -> str | None:
    """When nothing met the tolerance: which bound, and by how much the best missed it."""
    tolerance = summary.get("tolerance")
    if summary.get("n_candidates") or tolerance is None or summary.get("tolerance_note"):
        return None  # a tolerance_note is printed as a note, with its own figures
    if summary.get("tolerance_mode"):  # a custom metric: the drop against the float score
        relative = " relative" if summary["tolerance_mode"] == "relative" else ""
        bound = f"a{relative} drop in {metric} of at most {_fmt(tolerance)}"
    else:
        bound = f"{metric} {'>=' if summary.get('higher_is_better') else '<='} {_fmt(tolerance)}"
    missed = summary.get("best_missed_by")
    if summary.get("best_metric") is None or missed is None:
        return f"No setting met the tolerance ({bound})."
    return f"No setting met the tolerance ({bound}): the best missed it by {missed:.3g}."


def _print_summary(summary: dict[str, Any], output_dir: Path, *, ended: bool = False) -> None:
    """A summary a new user understands: what was searched, what won, where it is. ``ended``:
    the search ended in this command, whose exit status line says why it has no result."""
    print()
    print(
        f"Search finished ({summary.get('stop_reason')}): {summary.get('n_trials')} trials, "
        f"{summary.get('n_failed')} failed, {summary.get('n_candidates')} candidates, "
        f"{_fmt(summary.get('wall_time_s'))} s."
    )
    stopping = summary.get("early_stopping") or {}
    if stopping.get("n_stopped"):
        rows = stopping.get("rows_if_whole")
        rows = f" ({stopping['rows_evaluated']} of {rows} evaluation rows run)" if rows else ""
        print(f"Early stopping: {stopping['n_stopped']} trials stopped at a rung{rows}.")
    metric = str(summary.get("metric", "metric")).rsplit(":", 1)[-1]
    print(_float_line(summary, metric))
    if summary.get("best_metric") is None:
        if not ended or summary.get("stop_reason") == "interrupted":
            print(_no_result(summary))
    else:
        interval = summary.get("best_metric_interval")
        said = f" (95 % interval {_fmt(interval[0])}-{_fmt(interval[1])})" if interval else ""
        print(f"Best setting: {metric} = {_fmt(summary['best_metric'])}{said}")
        for key, value in (summary.get("best_params") or {}).items():
            print(f"  {key}: {_fmt(value)}")
        for line in _against_float(summary):
            print(line)
        if summary.get("best_model_path"):  # in best/ of the folder, wherever it moved
            best = Path(output_dir).resolve() / BEST / Path(summary["best_model_path"]).name
            print(f"Best model: {best}")
    missed = _tolerance_words(summary, metric)
    if missed:
        print(missed)
    for note in ("tolerance_note", "latency_note", "gpu_note"):
        if summary.get(note):
            print(f"Note: {summary[note]}.")
    print(f"Outputs: {output_dir} ({_outputs_in(Path(output_dir))})")
    report = Path(output_dir) / REPORT
    if report.is_file():
        print(f"Report: {report.resolve()} (open it in a browser)")


def _no_result(summary: dict[str, Any]) -> str:
    """Why a search has no best setting, in one line."""
    n_trials, n_failed = summary.get("n_trials") or 0, summary.get("n_failed") or 0
    note = summary.get("stop_note")
    if note:
        return f"No result: {note}."
    if not n_trials:
        return "No result: no trial finished."
    if n_failed >= n_trials:
        common = summary.get("most_frequent_error") or {}
        if common.get("error"):
            return (
                f"No trial succeeded: {n_failed} of {n_trials} failed, {common['trials']} with: "
                f"{common['error']} (see results.parquet and auto_search.log)"
            )
        return f"No trial succeeded: {n_failed} of {n_trials} failed (see auto_search.log)."
    return (
        f"No result: none of the {n_trials - n_failed} trials that ran finished on every "
        "evaluation row (early stopping stopped them, or their metric is not a number)."
    )


def _outputs_in(folder: Path) -> str:
    """The outputs a search wrote in ``folder``."""
    from raysearch.layout import PLOTS, RESULTS, SUMMARY, TENSORBOARD

    names = [name for name in (SUMMARY, RESULTS, REPORT) if (folder / name).is_file()]
    names += [f"{name}/" for name in (BEST, PLOTS, TENSORBOARD) if (folder / name).is_dir()]
    return ", ".join(names) or "none"


def _param_value(value: Any) -> Any:
    """A ``params/`` cell of ``results.parquet`` (a list or mapping stored as JSON text)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _cmd_show(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq

    folder = args.output_dir
    summary_path = folder / "summary.json"
    results_path = folder / "results.parquet"
    if not summary_path.exists() and not results_path.exists():
        raise InputError(f"{folder}: no raysearch outputs here (summary.json, results.parquet)")
    if args.csv:
        if not results_path.exists():
            raise InputError(f"{folder}: no results.parquet here (the search has no outputs yet)")
        from raysearch.outputs import write_results_csv

        write_results_csv(pq.read_table(results_path), sys.stdout)
        return EXIT_OK
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if summary is not None:
        _print_summary(summary, folder)
    if results_path.exists():
        rows = pq.read_table(results_path).to_pylist()
        ok = [r for r in rows if r.get("status") == "ok" and r.get("metric") is not None]
        ok = [r for r in ok if r.get("stopped_at_rung") is None]  # else over some rows only
        higher = bool((summary or {}).get("higher_is_better", False))
        ok.sort(key=lambda r: r["metric"], reverse=higher)
        print(f"\nTop {min(args.top, len(ok))} of {len(rows)} trials:")
        for r in ok[: args.top]:
            params = {
                k[len("params/") :]: _param_value(v)
                for k, v in r.items()
                if k.startswith("params/") and v is not None
            }
            mark = "*" if r["is_candidate"] else " "  # results.parquet's: the one rule
            print(f" {mark} {r['trial_id']}  {_fmt(r['metric'])}  {_fmt(params)}")
    return EXIT_OK


def _read_search(folder: Path) -> tuple[list[TrialRecord], dict[str, Any], Any]:
    """A search folder's records, its summary (``summary.json`` once the search ended, else
    what its records say) and its config (None when it cannot be read and the search ended)."""
    from raysearch.config import load_config
    from raysearch.layout import CONFIG_FILE, JOURNAL, MARKER, SUMMARY
    from raysearch.outputs import running_summary
    from raysearch.search.record.journal import Journal

    if not (folder / JOURNAL).is_file() or not (folder / CONFIG_FILE).is_file():
        raise InputError(f"{folder}: no raysearch search here ({JOURNAL}, {CONFIG_FILE})")
    records = Journal(folder / JOURNAL).load()
    marker = folder / MARKER
    status = json.loads(marker.read_text()).get("status") if marker.is_file() else None
    ended = status != "running" and (folder / SUMMARY).is_file()
    try:
        config = load_config(folder / CONFIG_FILE, check_paths=False)
    except InputError:
        if not ended:
            raise
        config = None  # only the space's default setting needs it then
    if ended:
        summary = json.loads((folder / SUMMARY).read_text())
    else:
        summary = running_summary(records, config)
    return records, summary, config


def _cmd_report(args: argparse.Namespace) -> int:
    """``report.html`` again from the folder's journal (what its records say while the
    search runs)."""
    from raysearch.outputs import write_report

    folder = args.output_dir
    records, summary, config = _read_search(folder)
    path = write_report(folder, records, summary, config=config)
    if path is None:
        print(f"raysearch: error: {folder}: the report could not be written", file=sys.stderr)
        return EXIT_INTERNAL
    print(f"Report: {path} ({len(records)} trials, {summary.get('stop_reason')})")
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    """The search in ``DIR`` as an Optuna study in the storage ``--optuna`` names."""
    from raysearch.outputs import default_study_name, export_study
    from raysearch.search.record.output_dir import search_id

    folder = args.output_dir
    records, summary, _ = _read_search(folder)
    name = args.study_name
    if name is None:  # the name a live study (optuna_storage) has too
        name = default_study_name(folder, search_id(folder))
    study = export_study(records, summary, args.optuna, name, overwrite=args.overwrite)
    print(
        f"Optuna study '{name}' in {args.optuna}: {len(study.trials)} trials "
        f"(optuna-dashboard {args.optuna})"
    )
    return EXIT_OK


def _cmd_batch(args: argparse.Namespace) -> int:
    from raysearch.batch import BatchManifest, run_batch

    manifest = BatchManifest.load(args.manifest, args.output_dir, args.address)
    table = run_batch(manifest, progress=sys.stderr, overwrite=args.overwrite)
    rows = table.to_pylist()
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"Batch finished: {ok} of {len(rows)} models searched successfully.")
    print((manifest.output_dir / "batch_summary.md").read_text())
    print(
        f"Outputs: {manifest.output_dir} (batch_summary.parquet, batch_summary.md, "
        "batch_report.html, one folder per model)"
    )
    return EXIT_OK if ok == len(rows) else EXIT_INTERNAL


_COMMANDS = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "validate": _cmd_validate,
    "spaces": _cmd_spaces,
    "show": _cmd_show,
    "report": _cmd_report,
    "export": _cmd_export,
    "demo": _cmd_demo,
    "batch": _cmd_batch,
}


def console_main() -> NoReturn:
    """The ``raysearch`` console script (and ``python -m raysearch``): :func:`main`, then Ray
    shut down, the logs and streams flushed, and an ``os._exit`` that skips the interpreter's
    teardown (clearing Ray's, ONNX Runtime's and plotly's modules takes longer than writing
    the outputs). The output writers' libraries are imported without the optional packages
    they would pull in for nothing (:mod:`raysearch._optional_imports`).
    """
    from raysearch._optional_imports import skip_unused_optional_imports
    from raysearch.search.runtime.cluster import end_with_process

    skip_unused_optional_imports()
    end_with_process()
    status = main()
    _shut_down_ray()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``): nothing left to say
            pass
    os._exit(status)


def _shut_down_ray() -> None:
    """Shut down (or disconnect from) the Ray this process uses, or wait for the shutdown of
    the search's own Ray that began when its trials ended. The garbage collector is switched
    off first: a reference cycle holding Ray object references freed after the shutdown makes
    Ray's core worker end the process with its own status (this process ends with
    ``os._exit`` right after)."""
    if "ray" in sys.modules:  # also when the search's own Ray is shutting down already
        from raysearch.search.runtime.cluster import shutdown_ray

        gc.disable()
        shutdown_ray()


if __name__ == "__main__":
    console_main()
