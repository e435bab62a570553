"""report.html from records (no Ray): what it holds, what it leaves out below the minimum of
trials, that a failing report never fails the outputs, and ``raysearch report DIR``. The
report of real searches, opened in a browser, is tests/test_report_browser.py."""

from __future__ import annotations

import json
import logging
import re

import pytest
import yaml

from raysearch.cli import main
from raysearch.outputs import build_report, write_outputs, write_report
from raysearch.outputs._study import MIN_IMPORTANCE_TRIALS
from raysearch.trialrecord import TrialRecord
from tests.test_outputs import config, record  # noqa: F401  (config is a fixture)

SUMMARY = {
    "stop_reason": "iteration_limit",
    "n_trials": 3,
    "n_failed": 1,
    "n_candidates": 1,
    "best_trial_id": "t2",
    "best_metric": 0.01,
    "metric": "L2",
    "higher_is_better": False,
    "tolerance": 0.05,
    "search_algo": "Grid",
    "wall_time_s": 2.5,
    "best_model_size_bytes": 1002,
    "float_model_size_bytes": 4000,
}


def _records(n_ok: int = 2) -> list[TrialRecord]:
    records = [
        record(
            i, 0.01 * (n_ok + 1 - i), candidate=i == 2, calibrate_method=m, per_channel=i % 2 == 0
        )
        for i, m in zip(range(1, n_ok + 1), ["MinMax", "Percentile"] * n_ok)
    ]
    records[0] = records[0].replace(stage="defaults")
    failed = record(n_ok + 1, None, status="failed", calibrate_method="Entropy")
    failed = failed.replace(error="the trial's process (pid 4242) died: Segmentation fault")
    return records + [failed]


def _charts(text: str) -> list[str]:
    return re.findall(r'data-chart="([^"]+)"', text)


def test_the_report_holds_the_summary_the_charts_every_trial_and_the_failures():
    text = build_report(_records(), SUMMARY)
    # plotly.js inlined once, nothing to fetch.
    assert text.count("<script") == 2 + len(_charts(text))
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)
    assert _charts(text) == ["history", "parallel", "slice", "timeline"]
    # MinMax, no per-channel weights: quantize_static's defaults.
    assert (
        "It beats ONNX Runtime&#x27;s default setting (trial t1, L2 = 0.02) by 0.01 in L2." in text
    )
    assert "size 1 kB against 4 kB (25.1% of the float model&#x27;s)" in text
    assert "It stopped because it started the trials stop.iteration_limit allows." in text
    body = text.split('<table id="trials">', 1)[1].split("</table>", 1)[0]
    assert body.count("<tr") == 1 + 3  # the header and one row per trial
    assert "Segmentation fault" in text.split('id="failures"', 1)[1]


def test_importances_only_from_the_minimum_of_complete_trials_with_their_count():
    below = build_report(_records(MIN_IMPORTANCE_TRIALS - 1), SUMMARY)
    assert "importances" not in _charts(below)
    at = build_report(_records(MIN_IMPORTANCE_TRIALS), SUMMARY)
    assert _charts(at)[1] == "importances"
    assert f"over the {MIN_IMPORTANCE_TRIALS} complete trials" in at


def test_no_candidate_says_by_how_much_the_best_missed(config, tmp_path):  # noqa: F811
    records = [record(1, 0.08, calibrate_method="MinMax"), record(2, 0.09)]
    summary = write_outputs(
        tmp_path / "out", records, config=config, stop_reason="space_exhausted", wall_time_s=1
    )
    assert summary["best_missed_by"] == pytest.approx(0.03)
    text = (tmp_path / "out" / "report.html").read_text()
    assert "No setting met the tolerance: the best missed it by 0.03." in text


def test_a_report_that_fails_is_logged_and_the_outputs_are_written(
    config,  # noqa: F811
    tmp_path,
    monkeypatch,
    caplog,
):
    import raysearch.outputs._report as report

    def broken(*args, **kwargs):
        raise RuntimeError("no figures today")

    monkeypatch.setattr(report, "study_figures", broken)
    with caplog.at_level(logging.WARNING, logger="raysearch.outputs"):
        write_outputs(
            tmp_path / "out", _records(), config=config, stop_reason="interrupted", wall_time_s=1
        )
    assert (tmp_path / "out" / "summary.json").is_file()
    assert not (tmp_path / "out" / "report.html").exists()
    assert "writing report.html failed: RuntimeError: no figures today" in caplog.text
    assert write_report(tmp_path / "out", _records(), SUMMARY) is None


def test_raysearch_report_of_a_folder_that_is_no_search_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no raysearch search here" in err[0]


def test_raysearch_report_of_a_running_search_reports_its_records(
    config,  # noqa: F811
    tmp_path,
    capsys,
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "raysearch_config.yaml").write_text(yaml.safe_dump(config.raw))
    (out / ".raysearch.json").write_text(json.dumps({"status": "running"}))
    (out / "journal.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in _records()))
    assert main(["report", str(out)]) == 0
    assert "(3 trials, running)" in capsys.readouterr().out
    text = (out / "report.html").read_text()
    assert "this report holds the trials finished so far" in text


def test_the_sensitivity_rankings_are_charted_when_the_search_computed_them():
    rows = [
        {
            "rank": i + 1,
            "base": "k" * 20,
            "rank_by": "sqnr",
            "tensor": f"t{i}",
            "node": f"n{i}",
            "op_type": "MatMul",
            "group": "g",
            "sqnr_db": 10.0 + i,
        }
        for i in range(3)
    ]
    text = build_report(_records(), SUMMARY, sensitivity=rows)
    assert _charts(text)[-1] == "sensitivity-0"
    assert "The 3 most sensitive tensors of this ranking (lower: more sensitive)." in text


# -- issue 48 item 7: what the report said wrong or not at all ---------------------------------
def _grid_record(i: int, metric: float, **params) -> TrialRecord:
    """A demo-like trial: a custom metric evaluated on a share of the rows (no row count)."""
    row = record(i, metric, candidate=metric > 0.98, **params)
    extra = {"quantized_share": 1.0}
    return row.replace(eval_rows=None, eval_fraction=1.0, extra=extra, settings=dict(params))


DEMO_SUMMARY = {
    **SUMMARY,
    "metric": "raysearch.demo.evaluators:top1_cos",
    "higher_is_better": True,
    "tolerance": 0.02,
    "float_metric": 1.0,
    "n_trials": 4,
    "n_failed": 0,
    "n_candidates": 3,
    "best_trial_id": "t1",
    "best_metric": 0.999885,
    "objectives": ["metric"],
    "best_model_size_bytes": 839889,
    "float_model_size_bytes": 3163737,
}


def _demo_records() -> list[TrialRecord]:
    mm = {"op_types_to_quantize": ["MatMul", "Conv"], "calibrate_method": "Percentile"}
    records = [
        _grid_record(1, 0.999885, activation_type="QUInt8", **mm, **{_PCT: 99.99}),
        _grid_record(2, 0.999885, activation_type="QInt8", **mm, **{_PCT: 99.99}),
        _grid_record(3, 0.99978, activation_type="QInt8", **mm, **{_PCT: 99.999}),
        _grid_record(
            4,
            -0.997175,
            activation_type="QInt8",
            calibrate_method="MinMax",
            op_types_to_quantize=None,
        ),
    ]
    records[3] = records[3].replace(stopped_at_rung=0, eval_fraction=0.1)
    return records


_PCT = "extra_options.CalibPercentile"


def _words(text: str) -> list[str]:
    import html

    summary = text.split('<h2 id="summary">', 1)[1].split("<h2", 1)[0]
    return [html.unescape(p) for p in re.findall(r"<p>(.*?)</p>", summary)]


def _table(text: str, table_id: str) -> list[list[str]]:
    import html

    body = text.split(f'<table id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c))
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)
    ]


def test_the_default_setting_is_onnx_runtimes_when_a_trial_ran_it_and_null_reads_every_op():
    text = build_report(_demo_records(), DEMO_SUMMARY)
    table = _table(text, "best-vs-default")
    assert table[0] == [
        "parameter",
        "ONNX Runtime's default setting (trial t4)",
        "best setting (trial t1)",
    ]
    assert ["op_types_to_quantize", "every op", "MatMul, Conv"] in table
    assert [_PCT, "", "99.99"] in table
    assert (
        "It beats ONNX Runtime's default setting (trial t4, top1_cos = -0.997175 over some of "
        "the rows) by 1.99706 in top1_cos." in _words(text)
    )
    # The charts too: Optuna would write None, its label for a parameter a trial lacks.
    slice_axes = json.dumps(_layout(text, "slice"))
    assert "every op" in slice_axes and "None" not in slice_axes
    trials = _table(text, "trials")
    column = trials[0].index("op_types_to_quantize")
    assert [row[column] for row in trials[1:]] == ["MatMul, Conv"] * 3 + ["every op"]


def test_the_space_default_is_the_first_setting_its_rules_keep(config):  # noqa: F811
    """With no trial at ONNX Runtime's defaults, the space's first setting is the default:
    the first choice of each parameter, less what the validity rules strip (the percentile
    of a MinMax setting), so a trial that ran it is found."""
    from raysearch.config import SearchConfig

    raw = dict(config.raw)
    raw["search_space"] = {
        "calibrate_method": ["MinMax", "Percentile"],
        "per_channel": [True, False],
        "extra_options": {"CalibPercentile": [99.99, 99.999]},
    }
    spaced = SearchConfig.from_dict(raw, check_paths=False)
    rows = [
        record(1, 0.02, calibrate_method="MinMax", per_channel=True).replace(stage=None),
        record(2, 0.01, candidate=True, calibrate_method="Percentile", per_channel=True),
    ]
    text = build_report(rows, SUMMARY | {"best_trial_id": "t2"}, config=spaced)
    assert _table(text, "best-vs-default")[0][1] == "the space's default setting (trial t1)"


def test_the_summary_says_the_metrics_range_ties_sizes_and_rows_evaluated():
    text = build_report(_demo_records(), DEMO_SUMMARY)
    words = _words(text)
    assert words[1] == (
        "top1_cos: higher is better; the float model scores 1 (a custom metric); the trials "
        "scored from -0.997175 to 0.999885 (some stopped at a rung: their score is over some "
        "of the rows)."
    )
    assert (
        "Trial t2 tied with the best on top1_cos = 0.999885 exactly; the ranking kept trial t1: "
        "every rule of the ranking ties (candidates first, then the larger share of "
        "MatMul/Gemm/Conv nodes quantized, then fewer tensors promoted, then the better "
        "metric), so the trial that started first is kept."
    ) in words
    assert (
        "Against the float model: top1_cos 1; size 840 kB against 3.16 MB (26.5% of the float "
        "model's)."
    ) in words
    trials = _table(text, "trials")
    size, rows = trials[0].index("size"), trials[0].index("rows evaluated (share)")
    assert [row[size] for row in trials[1:]] == ["1 kB"] * 4
    assert [row[rows] for row in trials[1:]] == ["100%"] * 3 + ["10%"]
    counted = [r.replace(eval_rows=40 if i == 3 else 400) for i, r in enumerate(_demo_records())]
    trials = _table(build_report(counted, DEMO_SUMMARY), "trials")
    assert [row[rows] for row in trials[1:]] == ["400 (100%)"] * 3 + ["40 (10%)"]


def test_a_builtin_metric_says_its_range():
    words = _words(build_report(_records(), SUMMARY))
    assert words[1] == (
        "L2: lower is better; it lies in [0, inf]; the float model against itself scores 0; "
        "the trials scored from 0.01 to 0.02."
    )


def test_the_pareto_front_only_for_several_objectives_and_axes_in_full_digits():
    one = build_report(_demo_records(), DEMO_SUMMARY)
    assert "pareto" not in _charts(one)
    many = [r.replace(model_size_bytes=1000 * r.number) for r in _demo_records()]
    two = build_report(many, DEMO_SUMMARY | {"objectives": ["metric", "model_size_mb"]})
    assert _charts(two)[-1] == "pareto"
    # Three objectives: a 3-D front, tall enough and seen from far enough that no axis title
    # is cut at its edge.
    many = [r.replace(latency_ms=100.0 + r.number) for r in many]
    three = build_report(
        many, DEMO_SUMMARY | {"objectives": ["metric", "latency_ms", "model_size_mb"]}
    )
    scene = _layout(three, "pareto")
    assert scene["height"] == 650 and scene["scene"]["camera"]["eye"]["x"] > 1.25
    # Optuna writes each parallel-coordinates tick in 3 digits: 100 for 99.99 and 99.999.
    figure = one.split('id="fig-parallel"', 1)[1].split("</script>", 1)[0]
    texts = re.findall(r'"text":"([^"]*)"', figure)
    assert "99.99" in texts and "99.999" in texts and "100" not in texts
    # Optuna's slice plot is 300 px wide per parameter: the page sizes it instead.
    assert "width" not in _layout(one, "slice") and "width" in _layout(one, "slice", fit=False)


def _layout(text: str, key: str, fit: bool = True) -> dict:
    """The plotly layout of the report's figure ``key`` (before fitting it: ``fit=False``)."""
    if not fit:
        from raysearch.outputs._study import study_figures

        figures = study_figures(_demo_records(), DEMO_SUMMARY)
        return next(f for f in figures if f.key == key).figure.to_plotly_json()["layout"]
    script = text.split(f'id="fig-{key}"', 1)[1].split("Plotly.newPlot(", 1)[1]
    decoder = json.JSONDecoder()
    at = script.index(",") + 1  # past the element's id
    _, at = decoder.raw_decode(script, at + len(script[at:]) - len(script[at:].lstrip()))
    rest = script[at:].lstrip(" ,\n")
    return decoder.raw_decode(rest)[0]


def test_a_search_no_trial_finished_says_what_was_searched_and_why_it_stopped(
    config,  # noqa: F811
):
    summary = {
        **SUMMARY,
        "stop_reason": "time_limit",
        "n_trials": 0,
        "n_failed": 0,
        "n_candidates": 0,
        "best_trial_id": None,
        "stop_note": "no trial finished within the time limit (180 s; the custom "
        "evaluator's score of the float model took 98.0 s of it)",
    }
    words = _words(build_report([], summary, config=config))
    assert words[0] == (
        "A Grid search of L2 (lower is better, tolerance 0.05) over calibrate_method, "
        "op_types_to_quantize: 0 trials (0 failed, 0 candidates) in 2.5 s."
    )
    assert words[-1] == (
        "It stopped because its time (stop.time_limit) ran out: no trial finished within the "
        "time limit (180 s; the custom evaluator's score of the float model took 98.0 s of it)."
    )
    assert all("single setting" not in w for w in words)


def test_a_best_slower_than_float_is_said_with_the_spread_of_its_timing():
    summary = {
        **DEMO_SUMMARY,
        "best_latency_ms": 617.5,
        "float_latency_ms": 125.0,
        "best_latency_vs_float": 4.94,
        "latency_note": "the best setting is slower than the float model: 494% of its "
        "latency, each timed alone after the search (select: latency, or objectives with "
        "latency_ms, weighs speed)",
        "latency_retimed": {
            "decides": False,
            "rounds": 5,
            "runs_per_round": 5,
            "threads": 1,
            "models": {
                "float": {"median_ms": 125.0, "min_ms": 120.5, "max_ms": 131.0},
                "t1": {"median_ms": 617.5, "min_ms": 600.0, "max_ms": 650.25},
            },
        },
    }
    words = _words(build_report(_demo_records(), summary))
    assert (
        "Against the float model: top1_cos 1; latency 617.5 (600-650.25 over 5 rounds) against "
        "125 (120.5-131 over 5 rounds) ms per batch, each timed alone after the search (494.0% "
        "of the float model's: slower than the float model); size 840 kB against 3.16 MB "
        "(26.5% of the float model's)."
    ) in words
    assert (
        "The best setting is slower than the float model: 494% of its latency, each timed "
        "alone after the search (select: latency, or objectives with latency_ms, weighs speed)."
    ) in words


def test_the_words_say_the_latency_was_timed_during_the_search():
    summary = {
        **DEMO_SUMMARY,
        "best_latency_ms": 617.5,
        "float_latency_ms": 125.0,
        "latency_timing": "timed during the search, beside other trials",
    }
    words = _words(build_report(_demo_records(), summary))
    assert (
        "Against the float model: top1_cos 1; latency 617.5 against 125 ms per batch, timed "
        "during the search, beside other trials (494.0% of the float model's: slower than the "
        "float model); size 840 kB against 3.16 MB (26.5% of the float model's)."
    ) in words


def test_a_custom_metric_is_described_by_its_evaluators_docstring():
    from raysearch.config import load_config
    from raysearch.demo.evaluators import top1_cos
    from tests.test_report_layout import QUICKSTART

    quickstart = load_config(QUICKSTART, check_paths=False)
    words = _words(build_report(_demo_records(), DEMO_SUMMARY, config=quickstart))
    first = " ".join(top1_cos.__doc__.strip().split("\n\n", 1)[0].split())
    assert first.startswith("The demo's metric (higher is better; 1.0 for the float model")
    assert (
        words[2] == f"top1_cos, as its evaluator (raysearch.demo.evaluators:top1_cos) says: {first}"
    )


def _lm_records() -> list[TrialRecord]:
    """Two trials of a language-model metric: its three metrics with their intervals, and
    the decode step and prefill each trial timed."""
    records = []
    for i, (kl, agree, ppl) in enumerate(((0.0019, 0.989, 3.21), (0.0031, 0.981, 3.25)), 1):
        r = record(i, kl, candidate=i == 1, block_size=32 * i)
        r = r.replace(latency_ms=9.0, decode_latency_ms=0.5 * i, prefill_latency_ms=4.0 * i)
        extra = {
            "quantized_share": 1.0,
            "kl": kl,
            "kl_ci_low": kl - 0.0001,
            "kl_ci_high": kl + 0.0001,
            "top1_agreement": agree,
            "top1_agreement_ci_low": agree - 0.002,
            "top1_agreement_ci_high": agree + 0.002,
            "perplexity": ppl,
            "perplexity_ci_low": ppl - 0.05,
            "perplexity_ci_high": ppl + 0.05,
        }
        records.append(r.replace(extra=extra))
    return records


def test_a_language_model_search_shows_decode_prefill_and_each_metrics_interval():
    summary = {
        **SUMMARY,
        "metric": "kl",
        "n_trials": 2,
        "n_failed": 0,
        "best_trial_id": "t1",
        "best_metric": 0.0019,
        "best_latency_ms": 9.0,
        "float_latency_ms": 10.0,
        "best_decode_latency_ms": 0.5,
        "float_decode_latency_ms": 0.8,
        "best_prefill_latency_ms": 4.0,
        "float_prefill_latency_ms": 5.0,
        "decode_latency_retimed": {
            "decides": False,
            "rounds": 5,
            "runs_per_round": 5,
            "threads": 1,
            "models": {
                "float": {"median_ms": 0.8, "min_ms": 0.75, "max_ms": 0.9},
                "t1": {"median_ms": 0.5, "min_ms": 0.45, "max_ms": 0.6},
            },
        },
    }
    text = build_report(_lm_records(), summary)
    table = _table(text, "trials")
    header = table[0]
    assert header[:9] == [
        "#",
        "trial",
        "status",
        "metric",
        "kl [95 % interval]",
        "top1_agreement [95 % interval]",
        "perplexity [95 % interval]",
        "candidate",
        "latency (ms)",
    ]
    assert header[9:11] == ["decode latency (ms)", "prefill latency (ms)"]
    first = dict(zip(header, table[1]))
    assert first["kl [95 % interval]"] == "0.0019 [0.0018, 0.002]"
    assert first["top1_agreement [95 % interval]"] == "0.989 [0.987, 0.991]"
    assert first["perplexity [95 % interval]"] == "3.21 [3.16, 3.26]"
    assert (first["decode latency (ms)"], first["prefill latency (ms)"]) == ("0.5", "4")
    words = _words(text)
    assert any("kl = 0.0019 (95 % interval 0.0018-0.002)" in w for w in words), words
    against = next(w for w in words if w.startswith("Against the float model"))
    assert (
        "decode step 0.5 (0.45-0.6 over 5 rounds) against 0.8 (0.75-0.9 over 5 rounds) ms per "
        "token, each timed alone after the search (62.5% of the float model's: faster); "
        "prefill 4 against 5 ms per prompt (80.0% of the float model's: faster)"
    ) in against
    assert "reused from" not in header  # no probe was reused
    # The Pareto figure sets the metric against the objectives the config names.
    front = build_report(_lm_records(), summary | {"objectives": ["metric", "decode_latency_ms"]})
    figure = front.split('id="fig-pareto"', 1)[1].split("</script>", 1)[0]
    assert "decode latency (ms)" in figure and "pareto" not in _charts(text)
    # A search that chose by size shows its front of KL, size and decode step, with the
    # settings one-shot tools write marked by name.
    anchored = _lm_records()
    builder = {"algorithm": "rtn", "block_size": 32, "symmetric": True, "accuracy_level": 4}
    anchored[1] = anchored[1].replace(settings={"quantizer": "weight_only", "bits": 4, **builder})
    sized = build_report(anchored, summary | {"select": "size"})
    figure = sized.split('id="fig-pareto"', 1)[1].split("</script>", 1)[0]
    assert "decode latency (ms)" in figure and "size (bytes)" in figure
    assert "onnxruntime-genai builder's int4" in figure and "one-shot tools" in figure
    reused = _lm_records()
    reused[1] = reused[1].replace(stage="sensitivity", reused_from="/runs/first trial 5a3c")
    table = _table(build_report(reused, summary), "trials")
    row = dict(zip(table[0], table[2]))
    assert (row["stage"], row["reused from"]) == ("sensitivity", "/runs/first trial 5a3c")
    # Another metric's search has none of these columns.
    other = _table(build_report(_records(), SUMMARY), "trials")[0]
    assert not any("interval" in h or "decode" in h or "prefill" in h for h in other)


def test_show_prints_the_decode_step_prefill_and_the_best_metrics_interval(tmp_path, capsys):
    summary = {
        "stop_reason": "space_exhausted",
        "n_trials": 2,
        "n_failed": 0,
        "n_candidates": 1,
        "wall_time_s": 10.0,
        "metric": "kl",
        "best_metric": 0.0019,
        "best_metric_interval": [0.0018, 0.002],
        "best_trial_id": "t1",
        "best_params": {"block_size": 32},
        "best_latency_ms": 9.0,
        "float_latency_ms": 10.0,
        "best_decode_latency_ms": 0.5,
        "float_decode_latency_ms": 0.8,
        "best_prefill_latency_ms": 4.0,
        "float_prefill_latency_ms": 5.0,
        "float_model_size_bytes": 1000,
        "decode_latency_retimed": {
            "decides": True,
            "rounds": 3,
            "runs_per_round": 5,
            "threads": 1,
            "models": {
                "float": {"median_ms": 0.8, "min_ms": 0.75, "max_ms": 0.9},
                "t1": {"median_ms": 0.5, "min_ms": 0.45, "max_ms": 0.6},
            },
        },
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(
        line.startswith("Float model: kl = 0 ")
        and line.endswith("10 ms per batch, decode step 0.8 ms per token, prefill 5 ms per prompt")
        for line in out
    ), out
    assert "Best setting: kl = 0.0019 (95 % interval 0.0018-0.002)" in out
    assert (
        "  decode step: 0.5 ms per token (62.5% of the float model's), both timed alone after "
        "the search: 0.45-0.6 ms against 0.75-0.9 ms over 3 rounds"
    ) in out
    assert "  prefill: 4 ms per prompt (80.0% of the float model's)" in out
