"""``TrialRecorder``: the Tune callback that journals every finished trial the moment it ends,
its model kept under ``candidates/`` (among the ``keep_candidates`` best, or on the Pareto
front) or ``kept/`` (the best so far), else deleted at once, as are the models no longer kept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray import tune

from raysearch.errors import DiskFullError
from raysearch.layout import CANDIDATES, KEPT
from raysearch.modelfile import place_model, remove_model
from raysearch.modelfolder import ModelFolder
from raysearch.quantize.techniques.mixed_precision.sensitivity import (
    SENSITIVITY_FILE,
    read_sensitivity_table,
    write_sensitivity_table,
)
from raysearch.ranking import (
    best_record,
    best_records,
    better,
    finite,
    is_candidate,
    is_probe,
    pareto_front,
    stopped_at_rung,
)
from raysearch.search._logs import check_tune_disk
from raysearch.search.record.journal import Journal
from raysearch.search.record.reported import reported_record
from raysearch.search.record.retries import RETRIES_SPENT, RetryLog
from raysearch.search.runtime._node_loss import ModelLostError, NodeWatch, lost_trial_line
from raysearch.search.runtime.transfer import current_node_id, drop_model, fetch_model
from raysearch.trialrecord import TrialRecord

__all__ = ["TrialRecorder"]

_logger = logging.getLogger(__name__)


def _error_line(text: str) -> str:
    """The most telling line of an error text (the last ``Name: message`` line), or what
    killed the trial's process or node."""
    died = lost_trial_line(str(text)) or _process_death(str(text))
    if died is not None:
        return died
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if ":" in line and (head.endswith("Error") or head.endswith("Exception")):
            return line[:2000]
    return (lines[-1] if lines else str(text))[:2000]


class TrialRecorder(tune.Callback):
    """Records finished trials durably; see the module docstring.

    Args:
        keep_candidates: how many of the best candidates' models to keep (None: every one).
        select, objectives: the config's: what ranks the candidates for ``best/``, and the
            Pareto front whose candidates' models are kept too.
        prior: records of earlier sessions (resume), never recorded twice.
        clock: returns the search's elapsed wall time (for ``elapsed_s``).
        on_record: called with each new record.
        client_folder: the onnxruntime-genai or Optimum folder of the float model: each model
            kept is written as such a folder.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        journal: Journal,
        *,
        higher_is_better: bool,
        keep_candidates: int | None = None,
        select: str = "metric",
        objectives: Sequence[str] = ("metric",),
        prior: Sequence[TrialRecord] = (),
        clock: Callable[[], float] | None = None,
        on_record: Callable[[TrialRecord], None] | None = None,
        watch_nodes: bool = False,
        max_failures: int = 0,
        client_folder: ModelFolder | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.client_folder = client_folder
        #: Each trial's node and reruns; on a cluster (``watch_nodes``), its nodes' losses.
        self.retries = RetryLog(NodeWatch() if watch_nodes else None, max_failures)
        self.journal = journal
        self.higher_is_better = higher_is_better
        self.keep_candidates = keep_candidates
        self.select = select
        self.objectives = tuple(objectives)
        self.clock = clock
        self.on_record = on_record
        self.records: list[TrialRecord] = list(prior)
        self.recorded: set[str] = {str(r.trial_id) for r in prior}
        self.best: TrialRecord | None = None
        self._node_id: str | None = None
        # Rows of sensitivity.parquet: the rankings trials computed, once per (base, rank_by).
        self._sensitivity = read_sensitivity_table(self.output_dir / SENSITIVITY_FILE)
        for record in prior:
            if self._better(record):
                self.best = record
        self._drop_unkept_models()

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if trial.trial_id in self.recorded:
            return
        if result.get("done", True) is False:
            return  # a rung before the last, and ASHA lets the trial go on
        check_tune_disk()
        record = reported_record(result) or TrialRecord()
        if record.disk_full:  # the search stops, the trial unjournaled: resume reruns it
            raise DiskFullError(record.error or "no space left on device")
        self.record(trial, record.replace(stopped_at_rung=stopped_at_rung(record)))

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.retries.started(trial)

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        text = _last_failure(_error_text(trial) or "the trial's actor failed")
        spent = self.retries.failed(trial.trial_id, _error_line(text))
        if spent is None:
            _logger.info("trial %s runs again after: %s", trial.trial_id, text.strip()[-2000:])
            return
        _logger.debug("trial %s failed (max_failures used up):\n%s", trial.trial_id, text)
        # Its next run ends at once, failed with this line (see record.retries).
        trial.config[RETRIES_SPENT] = {
            "error": spent,
            "node_id": self.retries.node_of(trial.trial_id),
            "node": getattr(trial, "node_ip", None),
        }

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if trial.trial_id in self.recorded:
            return
        text = _error_text(trial) or "the trial's actor failed"
        _logger.debug("trial %s raised:\n%s", trial.trial_id, text)
        record = TrialRecord(
            status="failed",
            error=self.retries.line(trial.trial_id, _error_line(_last_failure(text))),
            node=getattr(trial, "node_ip", None),
            node_id=self.retries.node_of(trial.trial_id),
        )
        self.record(trial, record)

    def record(self, trial: Any, record: TrialRecord) -> TrialRecord:
        """Complete ``record`` with the trial's config, keep or delete its model, journal it."""
        return self._record(trial.trial_id, trial.config, record)

    def record_reused(
        self, trial_id: str, config: dict[str, Any], record: TrialRecord
    ) -> TrialRecord:
        """Journal a result no trial ran (an earlier search's probe of the same settings,
        without a model); ``config`` is what the searcher would have handed the trial."""
        return self._record(trial_id, config, record.replace(model_path=None))

    def _record(self, trial_id: str, config: dict[str, Any], record: TrialRecord) -> TrialRecord:
        ok = record.status == "ok"
        self._add_sensitivity(record.sensitivity)
        full = record.replace(
            trial_id=trial_id,
            number=config.get("number"),
            phase=config.get("phase"),
            stage=record.stage or config.get("stage"),
            key=config.get("key"),
            point=config.get("point"),
            params=config.get("params"),
            settings=config.get("settings"),
            **self.retries.fields(trial_id),
            metric=finite(record.metric) if ok else None,
            objective=finite(record.objective) if ok else None,
            sensitivity=None,
        )
        # The one rule, as the journal reads it (a probe's stage comes with the config).
        full = full.replace(
            is_candidate=is_candidate(full) and not is_probe(full),
            elapsed_s=None if self.clock is None else round(self.clock(), 3),
        )
        # Last: the record it returns is the one kept as the best (kept by identity).
        full = self._place_model(trial_id, full)
        self.journal.append(full)
        self.records.append(full)
        self.recorded.add(trial_id)
        self._drop_unkept_models()
        self._log(full)
        if self.on_record is not None:
            self.on_record(full)
        return full

    def _add_sensitivity(self, rows: list[dict[str, Any]] | None) -> None:
        known = {(r.get("base"), r.get("rank_by")) for r in self._sensitivity}
        new = [r for r in rows or () if (r.get("base"), r.get("rank_by")) not in known]
        if new:
            self._sensitivity += new
            write_sensitivity_table(self.output_dir / SENSITIVITY_FILE, self._sensitivity)

    def _better(self, record: TrialRecord) -> bool:
        # The outputs' rule, ties to the trial started first, whatever order trials end in.
        if self.best is None:
            return better(record, None, self.higher_is_better, self.select)
        return best_record([self.best, record], self.higher_is_better, self.select) is record

    def _place_model(self, trial_id: str, record: TrialRecord) -> TrialRecord:
        """``record`` with ``model_file`` (None: deleted), or ``model_lost``."""
        source = Path(record.model_path) if record.model_path else None
        if source is not None and not source.is_absolute():
            source = self.output_dir / source
        # A trial on another node left its model in that node's temp folder.
        node_id = record.node_id
        remote = source is not None and node_id is not None and node_id != self._driver_node()
        have = source is not None and record.status == "ok" and (remote or source.is_file())
        record = record.replace(model_path=None)
        kept: str | None = None
        try:
            if have and is_candidate(record) and self._among_kept(record):
                kept = self._move(source, self._kept_path(CANDIDATES, trial_id), node_id, remote)
            best = self._better(record)
            if best and have and kept is None:
                kept = self._move(source, self._kept_path(KEPT, trial_id), node_id, remote)
        except ModelLostError as exc:  # the record says so, and the best stays a model we have
            _logger.warning("trial %s: model lost: %s", trial_id, exc)
            return record.replace(model_lost=str(exc))
        if kept is None and source is not None:
            if remote:
                drop_model(node_id, os.fspath(source))
            else:
                remove_model(source)
        record = record.replace(model_file=kept)
        if best:  # the previous best's model goes once this record is journaled
            self.best = record
        return record

    def _kept_candidates(self) -> list[TrialRecord]:
        prefix = CANDIDATES + "/"
        return [r for r in self.records if (r.model_file or "").startswith(prefix)]

    def _among_kept(self, record: TrialRecord) -> bool:
        """Whether the candidate ``record``'s model is kept (``keep_candidates``, the front)."""
        if self.keep_candidates is None:
            return True
        if any(r is record for r in self._front([*self.records, record])):
            return True
        pool = [*self._kept_candidates(), record]
        top = best_records(pool, self.keep_candidates, self.higher_is_better, self.select)
        return any(r is record for r in top)

    def _front(self, records: Sequence[TrialRecord]) -> list[Any]:
        """The candidates of ``records`` on the Pareto front (none with one objective)."""
        if len(self.objectives) < 2:
            return []
        return pareto_front(records, self.objectives, self.higher_is_better)

    def _drop_unkept_models(self) -> None:
        """Delete the models no longer kept (never the best's); their ``model_file`` None."""
        top = self._kept_candidates()
        if self.keep_candidates is not None:
            top = best_records(top, self.keep_candidates, self.higher_is_better, self.select)
        keep = {id(r) for r in [*top, *self._front(self.records), self.best]}
        for index, record in enumerate(self.records):
            model_file = record.model_file or ""
            if id(record) in keep:
                continue
            if model_file.startswith((KEPT + "/", CANDIDATES + "/")):
                self._remove_kept(self.output_dir / model_file)
                self.records[index] = record.replace(model_file=None)

    def _driver_node(self) -> str:
        if self._node_id is None:
            self._node_id = current_node_id()
        return self._node_id

    def _kept_path(self, folder: str, trial_id: str) -> Path:
        """``<folder>/<trial_id>.onnx``, or ``<folder>/<trial_id>/<model>`` (client folder)."""
        if self.client_folder is None:
            return Path(folder) / f"{trial_id}.onnx"
        return Path(folder) / trial_id / self.client_folder.model_name

    def _remove_kept(self, path: Path) -> None:
        remove_model(path)
        if self.client_folder is not None and path.parent.parent.parent == self.output_dir:
            shutil.rmtree(path.parent, ignore_errors=True)  # candidates/<trial_id>/

    def _move(self, source: Path, relative: Path, node_id: str | None, remote: bool) -> str:
        target = self.output_dir / relative
        if remote:
            source = fetch_model(node_id, os.fspath(source), target.parent)
        try:  # the model file and its external-data files (named after the target)
            place_model(source, target, move=True)
            if self.client_folder is not None:
                self.client_folder.copy_into(target.parent)
        except Exception as exc:  # the record matters more than the model: never lose it
            _logger.warning("could not keep the model %s: %s", source, exc)
            remove_model(source)
            raise ModelLostError(f"the model could not be kept: {exc}") from exc
        return relative.as_posix()

    def _log(self, r: TrialRecord) -> None:
        head, said = f"trial {r.trial_id} (#{r.number})", f"params={r.params}"
        if r.reused_from:
            found = f"metric={r.metric} candidate={is_candidate(r)}, measured by {r.reused_from}"
            _logger.info("%s reused (no trial run): %s %s", head, found, said)
        elif r.status == "ok":
            found = f"metric={r.metric} candidate={is_candidate(r)} {r.duration_s or 0.0:.2f}s"
            _logger.info("%s ok: %s %s", head, found, said)
        else:
            _logger.warning("%s failed: %s %s", head, r.error, said)


def _last_failure(text: str) -> str:
    """The last of a trial's error file's ``Failure # n`` entries."""
    return re.split(r"^Failure # \d+ \(occurred at [^)]*\)$", text, flags=re.M)[-1]


def _error_text(trial: Any) -> str | None:
    """The error Tune recorded for ``trial``: its local error file, else storage's."""
    path = getattr(trial, "error_file", None)
    try:
        if path and os.path.isfile(path):
            return Path(path).read_text(errors="replace")
        error = trial.get_error()
    except OSError:
        return None
    return None if error is None else str(error)


def _process_death(text: str) -> str | None:
    """One line for a trial whose actor process died: the fatal error of its Ray log, if any."""
    if "actor died unexpectedly" not in text and "worker process has died" not in text:
        return None
    match = re.search(r"\bpid: (\d+)", text)
    pid = int(match.group(1)) if match else None
    where = f" (pid {pid})" if pid else ""
    cause = _fatal_error(pid) if pid else None
    if cause:
        return f"TrialCrashed: the trial's process{where} died: {cause}"
    detail = re.search(r"Worker exit detail: (.*?)(?: Some common causes|$)", text, re.S)
    said = f"; Ray: {detail.group(1).strip()}" if detail else ""
    return (
        f"TrialCrashed: the trial's process{where} died unexpectedly: killed (e.g. by the "
        f"out-of-memory killer) or crashed in native code{said}"
    )[:2000]


def _fatal_error(pid: int) -> str | None:
    """Python's fatal error (``Segmentation fault``) in the Ray worker log of ``pid``."""
    try:
        import ray

        context = ray.get_runtime_context()
        logs = Path(context.get_temp_dir()) / context.get_session_name() / "logs"
        for path in logs.glob(f"worker-*-{pid}.err"):
            tail = path.read_bytes()[-65536:].decode(errors="replace")
            found = re.findall(r"Fatal Python error: ([^\n]+)", tail)
            if found:
                return found[-1].strip()
    except Exception:  # no local log (another node, a client connection): say less
        return None
    return None
