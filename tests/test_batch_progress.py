"""The batch's progress line over its models (issue 48 item 7: ``raysearch batch`` printed
nothing but started/done lines for minutes): the models done, running, failed and waiting, the
trials their searches finished (from their journals), each running model's trials and the
elapsed time; on a file or pipe a line when it changed, at most every ``every_s``, and the
last at the end. No Ray: the clock is the test's, the searches are quick commands."""

from __future__ import annotations

import io
import json
import re

from raysearch.batch._progress import BatchProgress
from raysearch.batch._searches import BatchSearches


def _journal(folder, statuses: list[str], candidates: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "trial_id": f"t{i}",
                "number": i,
                "status": status,
                "metric": 0.99 if status == "ok" else None,
                "is_candidate": i < candidates,
            }
        )
        for i, status in enumerate(statuses)
    ]
    (folder / "journal.jsonl").write_text("".join(line + "\n" for line in lines))


def test_the_line_counts_the_models_and_the_trials_of_their_journals(tmp_path):
    now = [0.0]
    out = io.StringIO()
    meter = BatchProgress(tmp_path, ["mlp", "cnn", "enc"], out, every_s=30, clock=lambda: now[0])
    _journal(tmp_path / "mlp", ["ok", "ok", "failed"], candidates=2)
    meter.update(["mlp"], [], [], waiting=2)
    now[0] = 10.0
    _journal(tmp_path / "mlp", ["ok", "ok", "failed", "ok"], candidates=2)
    meter.update(["mlp"], [], [], waiting=2)  # not due yet: at most one line every 30 s
    now[0] = 40.0
    meter.update(["mlp"], [], [], waiting=2)
    now[0] = 75.0
    meter.update(["mlp"], [], [], waiting=2)  # due, but nothing changed
    _journal(tmp_path / "cnn", ["ok"])
    now[0] = 125.0
    meter.say("mlp: done")
    meter.close(["mlp", "cnn"], ["enc"])
    assert out.getvalue().splitlines() == [
        "[batch] models 0/3 done, 1 running, 0 failed, 2 waiting | trials 3 done, 1 failed, "
        "2 candidates | mlp 3 | 00:00",
        "[batch] models 0/3 done, 1 running, 0 failed, 2 waiting | trials 4 done, 1 failed, "
        "2 candidates | mlp 4 | 00:40",
        "[batch] mlp: done",
        "[batch] models 2/3 done, 0 running, 1 failed | trials 5 done, 1 failed, 2 candidates "
        "| 02:05",
    ]


def test_the_searches_of_a_batch_print_the_line_between_their_events(tmp_path):
    (tmp_path / "logs").mkdir()
    out = io.StringIO()
    searches = BatchSearches(tmp_path, 1, {}, {}, out)
    searches.run([("a", ["spaces"]), ("b", ["no-such-command"])])
    lines = [re.sub(r"\d\d:\d\d$", "MM:SS", line) for line in out.getvalue().splitlines()]
    assert lines[:2] == [
        "[batch] a: started",
        "[batch] models 0/2 done, 1 running, 0 failed, 1 waiting | trials 0 done | a 0 | MM:SS",
    ]
    assert "[batch] a: done" in lines and "[batch] b: started" in lines
    assert lines[-1] == "[batch] models 1/2 done, 0 running, 1 failed | trials 0 done | MM:SS"


def test_the_line_counts_every_model_of_the_manifest_and_not_the_journals_overwritten(tmp_path):
    """The line's models are the manifest's, as the batch summary counts them: an entry refused
    when the manifest was read counts as failed from the start, a search kept from an earlier
    run as done (or failed, when it ended badly); the trials of a kept search count, those of
    a search the batch runs again with --overwrite do not until it writes its own journal."""
    (tmp_path / "logs").mkdir()
    _journal(tmp_path / "kept", ["ok", "ok", "ok"], candidates=1)
    _journal(tmp_path / "again", ["ok", "failed", "ok", "ok", "ok"])  # overwritten
    out = io.StringIO()
    errors = {"refused": "models[1]: model: file not found"}
    searches = BatchSearches(tmp_path, 1, {}, errors, out)
    searches.run(
        [("again", ["--help"])],
        models=["kept", "refused", "again", "kept_failed"],
        kept={"kept": True, "kept_failed": False},
        fresh=["again"],
    )
    lines = [re.sub(r"\d\d:\d\d$", "MM:SS", line) for line in out.getvalue().splitlines()]
    assert lines[:2] == [
        "[batch] again: started",
        "[batch] models 1/4 done, 1 running, 2 failed | trials 3 done, 1 candidates | again 0 "
        "| MM:SS",
    ]
    assert lines[-1] == (
        "[batch] models 2/4 done, 0 running, 2 failed | trials 3 done, 1 candidates | MM:SS"
    )
    # Once the search overwriting it writes its own journal, that one counts.
    meter = BatchProgress(tmp_path, ["again"], None, fresh=["again"])
    assert (
        meter.line(["again"], [], [], 0) == "models 0/1 done, 1 running, 0 failed | "
        "trials 0 done | again 0"
    )
    (tmp_path / "again" / "journal.jsonl").unlink()
    _journal(tmp_path / "again", ["ok"])
    assert meter.line(["again"], [], [], 0).endswith("trials 1 done | again 1")


def test_a_batch_with_nothing_left_to_run_says_so_with_every_model(tmp_path):
    (tmp_path / "logs").mkdir()
    _journal(tmp_path / "a", ["ok", "ok"])
    _journal(tmp_path / "b", ["ok"])
    out = io.StringIO()
    BatchSearches(tmp_path, 2, {}, {}, out).run([], models=["a", "b"], kept={"a": True, "b": True})
    assert re.sub(r"\d\d:\d\d$", "MM:SS", out.getvalue().strip()) == (
        "[batch] models 2/2 done, 0 running, 0 failed | trials 3 done | MM:SS"
    )
