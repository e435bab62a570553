"""``AutoSearch``: one search from a config to its outputs, on Ray Tune; and its resume.

The config, the model, the data and the float reference are checked
(:mod:`~raysearch.search.preflight`), the targets (:mod:`raysearch.search.targets`) and Ray's
capacity too, before anything is written; then the output folder is claimed
(:mod:`raysearch.search.record.output_dir`) and one session runs (``_execute``). Every
finished trial is journaled at once, and the outputs are written from the journal. A resume
rebuilds the searcher, the phases, the rungs, the stop counts and the elapsed time from the
journal and runs the trials left in a new Tune experiment; no finished trial runs again.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from raysearch.config import SearchConfig, load_config
from raysearch.errors import InputError
from raysearch.layout import CACHE_DIR, CONFIG_FILE, JOURNAL, MARKER, SUMMARY
from raysearch.search._execute import Execution, missing_module_error
from raysearch.search._result import SearchResult, build_result
from raysearch.search.record.journal import Journal
from raysearch.search.record.output_dir import (
    FolderInUse,
    check_not_in_use,
    check_output_dir,
    clean_output_dir,
    continued_folder,
    hold_output_dir,
    refuse_links,
    rewrite_config,
    stop_changed,
    storage_path,
    write_config,
)
from raysearch.search.runtime import KeptWarm
from raysearch.search.runtime.cluster import (
    check_resources,
    cluster_address,
    start_ray,
    started_locally,
    stop_ray,
)
from raysearch.search.targets import check_targets
from raysearch.strategies import check_strategy_available
from raysearch.usercode import check_shippable, code_folders, import_plugins

if TYPE_CHECKING:
    from raysearch.search.preflight import Prepared

__all__ = [
    "AutoSearch",
    "SearchResult",
    "search_running_in",
    "MARKER",
    "JOURNAL",
    "_clean_output_dir",
]

_logger = logging.getLogger("raysearch.search")

#: The name tests import (the output folder's cleaning lives in ``search.record.output_dir``).
_clean_output_dir = clean_output_dir


class AutoSearch:
    """A quantization search from a config (a :class:`SearchConfig`, a dict or a YAML path).

    Args:
        config: a :class:`SearchConfig`, a mapping of its keys (Python objects allowed where
            the README says so) or the path of a YAML file.

    Raises:
        ConfigError: the config has mistakes (all of them, one line each).

    Example:
        >>> result = AutoSearch("config.yaml").run()                      # doctest: +SKIP
        >>> result.best_metric, result.summary["stop_reason"]              # doctest: +SKIP
        (0.0042, 'candidates_found')
        >>> AutoSearch.resume("raysearch_output")                          # doctest: +SKIP
    """

    def __init__(self, config: SearchConfig | Mapping[str, Any] | str | os.PathLike) -> None:
        if isinstance(config, SearchConfig):
            self.config = config
        elif isinstance(config, Mapping):
            self.config = SearchConfig.from_dict(config)
        else:
            self.config = load_config(config)
        check_strategy_available(self.config.search_algo)
        self.output_dir = Path(self.config.output_dir).resolve()

    def run(
        self,
        *,
        overwrite: bool = False,
        progress: TextIO | bool | None = True,
        preflight: Future[Prepared] | None = None,
        kept: KeptWarm | None = None,
        callbacks: Sequence[Any] | None = None,
    ) -> SearchResult:
        """Run the search to its end and write its outputs.

        Args:
            overwrite: replace a previous search in ``output_dir`` (only raysearch's files).
            progress: where the live progress line goes: True standard error, or a stream;
                False or None only ``auto_search.log``.
            preflight: the :func:`~raysearch.search.preflight.start_preflight` of this
                config, already under way; None runs it here, beside Ray's start.
            kept: what the running cluster keeps between searches; None: one is made
                when the search joins a cluster.
            callbacks: Ray Tune callbacks of this session, beside the config's ``loggers``.

        Returns:
            The :class:`SearchResult`: the best setting and metric, the candidates, the
            summary and the ``results.parquet`` table.

        Nothing is written before the input, the targets and the cluster are checked. With
        ``resume_if_exists`` an earlier run of the same search is continued instead.

        Raises:
            ConfigError: ``output_dir`` holds a previous search and ``overwrite`` is False
                (with ``resume_if_exists``: another search), or files of the names raysearch
                writes that raysearch did not create.
            InputError: the model, the data, the evaluator, the Optuna storage, a logger's
                place or the resources are unusable, or a callback is no
                ``ray.tune.Callback``.
        """
        started = time.monotonic()
        callbacks = _checked_callbacks(callbacks)
        folder = self.output_dir
        earlier = None if overwrite else continued_folder(self.config)
        if earlier is not None:
            _logger.info("continuing the search in %s (resume_if_exists)", earlier)
            return self.resume(earlier, config=self.config, progress=progress, callbacks=callbacks)
        previous = check_output_dir(folder, overwrite=overwrite)
        # The Optuna storage and the loggers' places, before anything is written.
        check_targets(self.config)
        if kept is None and preflight is None and _joins_cluster(self.config):
            kept = KeptWarm()
        prepared = _preflight_beside_ray(self.config, pending=preflight, kept=kept)
        check_resources(self.config)
        with hold_output_dir(folder):
            if previous:
                clean_output_dir(folder, storage_owned=self.config.storage_path is None)
            write_config(folder, self.config, storage_path(self.config, folder))
            execution = Execution(self.config, folder)
            execution.kept = kept
            execution.callbacks = callbacks
            return execution.execute(
                resume=False,
                progress=progress_stream(progress),
                prepared=prepared,
                started_at=started,
            )

    @classmethod
    def resume(
        cls,
        output_dir: str | os.PathLike,
        *,
        config: SearchConfig | Mapping[str, Any] | None = None,
        progress: TextIO | bool | None = True,
        address: str | None = None,
        callbacks: Sequence[Any] | None = None,
    ) -> SearchResult:
        """Continue the interrupted search in ``output_dir``; finished trials are neither lost
        nor run again. ``config`` is needed for a search started from Python objects a YAML
        file cannot hold, or to go on with other stop conditions (a finished search too).

        Args:
            output_dir: the interrupted (or finished) search's output folder.
            config: the search's config, when the saved one cannot serve.
            progress: where the live progress line goes, as :meth:`run`'s.
            address: the Ray cluster to join instead of the one the search started on.
            callbacks: Ray Tune callbacks of this session, as :meth:`run`'s.

        Returns:
            The :class:`SearchResult` of the whole search.

        Raises:
            InputError: ``output_dir`` holds no raysearch search.
        """
        callbacks = _checked_callbacks(callbacks)
        folder = Path(output_dir).resolve()
        marker = folder / MARKER
        if not marker.is_file():
            raise InputError(f"{folder}: no raysearch search to resume here ({MARKER} missing)")
        check_not_in_use(folder)
        refuse_links(folder)
        state = json.loads(marker.read_text())
        search = cls._resumed(folder, state, config)
        if address:
            search.config.address = address
        changed = config is not None and stop_changed(folder, search.config)
        if state.get("status") == "finished" and (folder / SUMMARY).is_file() and not changed:
            _logger.info("%s: the search had finished; nothing to resume", folder)
            summary = json.loads((folder / SUMMARY).read_text())
            records = Journal(folder / JOURNAL).load()
            return build_result(folder, summary, records, search.config.metric_higher_is_better)
        _import_session_modules(folder, search.config, state.get("plugin_imports"))
        check_targets(search.config)
        with hold_output_dir(folder):
            # Checked again, the float reference read from the cache.
            prepared = _preflight_beside_ray(search.config, cache_dir=str(folder / CACHE_DIR))
            if changed:
                _logger.info("%s: the search goes on with the stop conditions given", folder)
                rewrite_config(folder, search.config)
            execution = Execution(search.config, search.output_dir)
            execution.callbacks = callbacks
            return execution.execute(
                resume=True, progress=progress_stream(progress), prepared=prepared
            )

    @classmethod
    def _resumed(
        cls,
        folder: Path,
        state: Mapping[str, Any],
        config: SearchConfig | Mapping[str, Any] | None,
    ) -> AutoSearch:
        """The search of ``folder`` from ``config``, else from the config file it saved."""
        if config is not None:
            search = cls(config if isinstance(config, SearchConfig) else dict(config))
            search.config.output_dir = folder
            search.output_dir = folder
            return search
        if state.get("unserializable"):
            keys = ", ".join(state["unserializable"])
            raise InputError(
                f"{folder}: this search was started from Python objects ({keys}); resume "
                "it from Python with AutoSearch.resume(dir, config=...)"
            )
        if not (folder / CONFIG_FILE).is_file():
            raise InputError(
                f"{folder}: the search was stopped before it started ({CONFIG_FILE} "
                "missing); start it again with `raysearch run CONFIG --overwrite`"
            )
        raw = yaml.safe_load((folder / CONFIG_FILE).read_text())
        raw["output_dir"] = str(folder)
        code_dirs = state.get("code_dirs")
        return cls(SearchConfig.from_dict(raw, base_dir=folder, code_dirs=code_dirs))


def _import_session_modules(folder: Path, config: SearchConfig, modules: Any) -> None:
    """Import the plugin modules the search's last session imported (the marker's
    ``plugin_imports``; a phase may import one only when it starts): one that cannot be imported
    here refuses the resume now, before Ray starts, as the phase's import would later."""
    try:
        import_plugins(
            [m for m in modules or () if isinstance(m, str)], search_dirs=config.code_dirs
        )
    except ImportError as exc:
        raise missing_module_error(folder, config.search_algo, exc) from None


def progress_stream(progress: TextIO | bool | None) -> TextIO | None:
    """Where :meth:`AutoSearch.run`'s ``progress`` sends the live line: standard error for
    True, the stream itself, or None (the log only).

    Example:
        >>> import io, sys
        >>> progress_stream(True) is sys.stderr, progress_stream(False)
        (True, None)
        >>> stream = io.StringIO()
        >>> progress_stream(stream) is stream
        True
    """
    if progress is True:
        return sys.stderr
    if progress is False or progress is None:
        return None
    return progress


def search_running_in(folder: str | os.PathLike) -> bool:
    """Whether a running search holds ``folder`` (its lock)."""
    try:
        check_not_in_use(Path(folder))
    except FolderInUse:
        return True
    return False


def _checked_callbacks(callbacks: Sequence[Any] | None) -> list[Any]:
    """``callbacks`` as a list; InputError when one is no ``ray.tune.Callback``."""
    from ray.tune import Callback

    checked = list(callbacks or ())
    for i, callback in enumerate(checked):
        if not isinstance(callback, Callback):
            raise InputError(
                f"callbacks[{i}]: expected a ray.tune.Callback, got {type(callback).__name__}"
            )
    return checked


def _joins_cluster(config: SearchConfig) -> bool:
    """Whether the search runs on a Ray that outlives it (a joined cluster, or one
    initialised before from Python)."""
    import ray

    return cluster_address(config.address) is not None or ray.is_initialized()


def _preflight_beside_ray(
    config: SearchConfig,
    cache_dir: str | None = None,
    pending: Future[Prepared] | None = None,
    kept: KeptWarm | None = None,
) -> Prepared:
    """:func:`~raysearch.search.preflight.preflight` in a thread (or ``pending``) while this
    thread starts or joins Ray (whose signal handlers need the main thread). A bad input is
    the error reported, and a Ray started for it is shut down; ``kept`` is opened once a
    cluster is joined, closed when this call started Ray."""
    from concurrent.futures import ThreadPoolExecutor

    from raysearch.search.preflight import preflight, warn_if_u8s8_saturates

    with ThreadPoolExecutor(1, thread_name_prefix="raysearch-preflight") as pool:
        lookup = kept.lookup_reference if kept is not None else None
        checked = pending or pool.submit(
            preflight, config, cache_dir=cache_dir, kept=lookup, defer_reference=kept is None
        )
        if checked.done() and checked.exception() is not None:  # refused: start no Ray
            if kept is not None:
                kept.close()
            checked.result()
        try:
            started = start_ray(config.address, *_code_to_ship(config))
        except BaseException:
            if kept is not None:
                kept.close()
            checked.result()  # raises the input's error, if any, instead of Ray's
            raise
        if kept is not None:
            kept.close() if started_locally() else kept.open()
        try:
            prepared = checked.result()
        except BaseException:
            if started:
                stop_ray()
            raise
    warn_if_u8s8_saturates(config.search_spaces)
    return prepared


def _code_to_ship(config: SearchConfig) -> tuple[list[Path], list[Path]]:
    """The code folders a search ships to a Ray cluster it joins, and what in them it leaves
    out (the model, the data, the output folder).

    Raises:
        ConfigError: a folder is too large to ship.
    """
    import ray

    folders = code_folders(config.code_modules(), config.code_dirs)
    if cluster_address(config.address) is None or ray.is_initialized():
        return folders, []
    excluded = [Path(config.output_dir).absolute()]
    for value in (config.model, config.calibration_data, config.eval_data):
        if isinstance(value, (str, os.PathLike)):
            excluded.append(Path(value).absolute())
    for folder in folders:
        modules = [name for name in config.code_modules() if _module_folder(name) == folder]
        check_shippable(folder, excluded, modules=modules)
    return folders, excluded


def _module_folder(name: str) -> Path | None:
    """The folder an imported module's file (or package folder) lies in."""
    file = getattr(sys.modules.get(name.partition(".")[0]), "__file__", None)
    if file is None:
        return None
    path = Path(file).absolute()
    return path.parent.parent if path.name == "__init__.py" else path.parent
