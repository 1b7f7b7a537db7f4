"""The standalone HTML report: content checks on the file, the CLI entry, and a real browser.

The browser test opens the report from disk in headless Chromium (Debian's package, driven by
Python playwright with executable_path; never a downloaded browser), blocks every request that is
not the file itself, and checks that each figure rendered bars or cells.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

import paralab
from paralab.schedules import build_schedule
from paralab.sim.events import simulate_schedule
from paralab.trace import Trace

pytest.importorskip("plotly")

from paralab.viz.report import add_report_args, report_main, write_report  # noqa: E402

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/lib/chromium/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def ddp_run():
    return paralab.run(strategy="ddp", world_size=2, steps=3, bucket_mb=0.1, global_batch=4)


@pytest.fixture(scope="module")
def report(ddp_run, tmp_path_factory):
    predicted = simulate_schedule(build_schedule("1f1b", 2, 4), {"forward": 0.002, "backward": 0.004}, 1e-4)
    return write_report(ddp_run, tmp_path_factory.mktemp("report") / "report.html", predicted=predicted)


def figure_divs(text: str) -> list[str]:
    return re.findall(r'<div id="(figure-\d+)" class="plotly-graph-div"', text)


def test_report_content(report, ddp_run):
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>")
    divs = figure_divs(text)
    for heading in ("Timeline", "Communication by op and step", "Bytes exchanged, rank by rank",
                    "Communication by parallel dimension and link", "Device mesh", "Memory per rank",
                    "Loss", "Summary"):
        assert f"<h2>{heading}</h2>" in text, heading
    assert "Pipeline bubble" not in text and "less the compute" not in text  # a DDP run has no bubble
    assert "bubble_fraction" not in text  # nor a row of it, as the report of its trace file says
    assert len(divs) >= 6 and text.count("Plotly.newPlot") == len(divs)
    assert "on 2 ranks" in text and "<td>r1</td>" in text and "<td>r2</td>" not in text
    assert '"r0 compute"' in text and '"r1 comm"' in text and '"r0 comm"' in text
    assert ddp_run.summary["strategy"] in text and "all_reduce: " in text
    # standalone: plotly.js inline, nothing fetched from the network
    assert len(text) > 3_000_000 and not re.search(r'<script[^>]+src=', text)
    assert "cdn.plot.ly" not in text.split("</head>")[1]


def test_the_report_draws_the_median_step_of_several_and_the_whole_of_one(ddp_run):
    """Every step of a 4-rank DualPipeV side by side had left its bars too thin to read: the report
    draws the typical step, as the notebooks do, and says which."""
    from paralab.viz.report import report_figures

    def timeline_title(trace):
        figure = dict(report_figures(trace))["Timeline"]
        return figure.layout.title.text

    assert "step 1" in timeline_title(ddp_run.trace) or "step 2" in timeline_title(ddp_run.trace)
    assert "median" in timeline_title(ddp_run.trace)
    one = Trace(spans=[s for s in ddp_run.trace.spans if s.step == 1], meta=ddp_run.trace.meta)
    assert "median" not in timeline_title(one)


def test_report_from_trace_and_chrome_export(ddp_run, tmp_path):
    chrome = ddp_run.save_trace(tmp_path / "trace.chrome.json")  # what `paralab run --trace` writes
    back = Trace.load(chrome)
    assert len(back.spans) == len(ddp_run.trace.spans) and back.summary() == ddp_run.trace.summary()
    plain = ddp_run.trace.save(tmp_path / "trace.json")
    out = write_report(Trace.load(plain), tmp_path / "t.html")
    text = out.read_text()
    assert "<h2>Timeline</h2>" in text and "bubble_fraction" not in text
    # the run's memory and layout are in its trace: a report of the file had drawn no memory at all
    assert "<h2>Memory per rank</h2>" in text and "<th>dp</th><td>2</td>" in text
    assert "<th>steps</th><td>3</td>" in text and "<th>cp_mode</th>" not in text  # no cp: no cp mode
    assert Trace.load(plain).meta["peak_memory_bytes"] == ddp_run.summary["peak_memory_bytes"]
    # ... and its losses, in either format: a report of the file had drawn no Loss, a --report of the run did
    assert Trace.load(chrome).meta["losses"] == ddp_run.losses
    assert "<h2>Loss</h2>" in text and "<th>losses</th>" in text


def test_the_summary_table_names_every_degree_and_the_choices_that_apply(tmp_path):
    """A cp run's report had read "strategy cp, world_size 2, pp 1": no cp, no dp, no tp, its ring
    mode unsaid; a tp run with sequence parallel could not be told from one without."""
    from paralab.trace import STEP, Span

    steps = [Span(rank, STEP, "step", 0.02 * k, 0.02 * (k + 1), name=f"step {k}", step=k)
             for rank in (0, 1) for k in range(3)]
    layout = {"dp": 1, "tp": 1, "pp": 1, "cp": 2, "cp_mode": "ring", "cp_split": "zigzag", "ep": 1,
              "zero": 0, "sequence_parallel": False, "virtual_stages": 1}
    meta = {"strategy": "cp", "world_size": 2, **{k: layout[k] for k in ("dp", "tp", "pp", "cp", "ep")},
            "layout": layout, "config": {"steps": 3, "device": "cpu", "dtype": "fp32", "trace": False}}
    text = write_report(Trace(spans=steps, meta=meta), tmp_path / "cp.html").read_text()
    for row in ("<th>cp</th><td>2</td>", "<th>cp_mode</th><td>ring</td>", "<th>cp_split</th><td>zigzag</td>",
                "<th>dp</th><td>1</td>", "<th>tp</th><td>1</td>", "<th>dtype</th><td>fp32</td>"):
        assert row in text, row
    for absent in ("<th>ep</th>", "<th>zero</th>", "<th>sequence_parallel</th>", "<th>virtual_stages</th>"):
        assert absent not in text, absent
    assert "<th>step_time_s</th><td>20.00 ms (the median step)</td>" in text
    sp = {**meta, "strategy": "tp", "tp": 2, "cp": 1, "layout": {**layout, "tp": 2, "cp": 1,
                                                               "sequence_parallel": True}}
    text = write_report(Trace(spans=steps, meta=sp), tmp_path / "sp.html").read_text()
    assert "<th>sequence_parallel</th><td>True</td>" in text and "<th>cp_mode</th>" not in text


def test_a_report_of_step_spans_only_says_what_was_not_measured(tmp_path):
    """A --no-trace run's trace holds step spans only: its report had read a pipeline idle 100% of each
    step and no bytes sent. It says those figures were not measured, and draws no bubble."""
    from paralab.trace import STEP, Span

    said = "not measured (--no-trace)"
    steps = [Span(rank, STEP, "step", 0.02 * k, 0.02 * (k + 1), name=f"step {k}", step=k)
             for rank in (0, 1) for k in range(3)]
    meta = {"strategy": "pp", "world_size": 2, "pp": 2, "schedule": "1f1b", "microbatches": 4,
            "config": {"trace": False}}
    text = write_report(Trace(spans=steps, meta=meta), tmp_path / "r.html").read_text()
    assert text.count(said) >= 2 and "Pipeline bubble" not in text
    assert "<h2>Timeline</h2>" not in text  # of step spans alone: an empty panel
    assert "<th>bubble_fraction</th><td>not measured" in text
    traced = write_report(Trace(spans=steps, meta={**meta, "config": {"trace": True}}), tmp_path / "t.html")
    assert said not in traced.read_text() and "Pipeline bubble" in traced.read_text()
    # its two idle figures (the per-rank table's, the bubble's) are told apart; a ddp run has one
    assert "idle (not computing) is each step less the compute" in traced.read_text()


def test_the_heading_counts_one_rank_and_one_step_in_the_singular(tmp_path):
    """A one-process profile's report had been headed "imported on 1 ranks", "1 ranks · ... 1 steps"."""
    from paralab.trace import STEP, Span

    one = Trace(spans=[Span(0, STEP, "step", 0.0, 0.02, name="step 0", step=0)], meta={"source": "imported"})
    text = write_report(one, tmp_path / "one.html").read_text()
    assert "paralab report: imported on 1 rank<" in text and "1 rank · 1 span · 1 step · " in text
    # an elastic run's worlds in order: one that ended on 3 ranks had been headed "on 4 ranks"
    worlds = [{"name": f"gen-00{k}", "world_size": n} for k, n in enumerate((4, 4, 3))]
    elastic = Trace(spans=one.spans, meta={"strategy": "elastic", "generations": worlds})
    text = write_report(elastic, tmp_path / "e.html").read_text()
    assert "paralab report: elastic on 4 ranks, then 3<" in text
    # one world of 3 whose lanes are 4 nodes (one replaced): headed by its world, not its lanes
    lanes = [Span(rank, STEP, "step", 0.0, 0.02, name="step 0", step=0) for rank in range(4)]
    worlds = [{"name": "gen-000", "world_size": 3}, {"name": "gen-001", "world_size": 3}]
    replaced = Trace(spans=lanes, meta={"strategy": "elastic", "generations": worlds, "config": {"steps": 1}})
    text = write_report(replaced, tmp_path / "r.html").read_text()
    assert "paralab report: elastic on 3 ranks<" in text
    assert "<td>20.00 ms (its one step, warm-up included)</td>" in text  # no median of one step


def test_an_imported_profiles_warnings_and_memory_note_head_the_report(ddp_run, tmp_path):
    """An import without record_shapes has bytes of 0 that are not a measure, and a CPU profile's memory
    is what it allocated while recording: the report had shown both as plain figures."""
    own = {k: v for k, v in ddp_run.trace.meta.items() if k != "tokens_per_step"}  # a profile does not say
    meta = {**own, "source": "imported", "warnings": ["rank 1 was profiled without record_shapes=True"],
            "memory_note": "CPU ranks: the most bytes allocated while the profiler recorded",
            "bytes_unknown_ops": ["all_reduce"]}
    text = write_report(Trace(ddp_run.trace.spans, meta=meta), tmp_path / "imported.html").read_text()
    notes = text.split('<ul class="notes">')[1].split("</ul>")[0]
    assert "without record_shapes=True" in notes and "allocated while the profiler recorded" in notes
    assert text.index('<ul class="notes">') < text.index("<h2>Summary</h2>")
    assert '<ul class="notes">' not in write_report(ddp_run.trace, tmp_path / "own.html").read_text()
    # a profile says nothing of tokens: its throughput is unknown, not 0 tokens/s
    assert "<th>tokens_per_s</th><td>unknown: " in text and "paralab import --tokens-per-step" in text
    assert "unknown: " not in write_report(ddp_run.trace, tmp_path / "own.html").read_text()
    # an op whose sizes the profile lacks says so, where its 0 bytes had read as a measure
    assert "<th>comm_bytes</th><td>all_reduce: unknown (no record_shapes)</td>" in text
    assert "<th>pp</th><td>1</td>" in text  # the layout the trace records


def _parser():
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    return parser


def test_report_main_exit_codes(ddp_run, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    notrace = tmp_path / "other.json"
    notrace.write_text(json.dumps({"hello": 1}))
    for path in (tmp_path / "missing.json", bad, notrace):
        assert report_main(_parser().parse_args([str(path), "-o", str(tmp_path / "x.html")])) == 2
        assert "cannot read trace" in capsys.readouterr().err
    report_main(_parser().parse_args([str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.html")]))
    # the file and what the system said, not "[Errno 2] No such file or directory: '...'"
    said = capsys.readouterr().err
    assert f"cannot read trace: {tmp_path / 'missing.json'}: No such file or directory" in said
    assert not (tmp_path / "x.html").exists()
    trace = ddp_run.trace.save(tmp_path / "good.json")
    out = tmp_path / "sub" / "r.html"
    assert report_main(_parser().parse_args([str(trace), "-o", str(out), "--title", "my run"])) == 0
    assert out.exists() and "<h1>my run</h1>" in out.read_text()


def test_report_refuses_a_prediction_of_another_layout(ddp_run, tmp_path, capsys):
    """A 2-rank pipeline's prediction had been stacked under a 4-rank hybrid run, exit 0, under a title
    calling them one run. The run's own prediction is stacked; another layout's is refused, saying how."""
    from paralab import RunConfig
    from paralab.sim.bridge import predict_run_trace

    measured = ddp_run.trace.save(tmp_path / "ddp.json")
    own = predict_run_trace(ddp_run.config, "h100").save(tmp_path / "own.json")
    assert report_main(_parser().parse_args([str(measured), "--predicted", str(own),
                                             "-o", str(tmp_path / "ok.html")])) == 0
    # which hardware the prediction is of, and what it says beside the measurement (had said neither)
    page = (tmp_path / "ok.html").read_text()
    assert re.search(r"predicted on h100: a step of [\d.,]+ ms, against [\d.,]+ ms measured", page)
    assert "measured and simulated on h100" in page
    others = {"dp 1 against 2, pp 2 against 1": dict(strategy="pp", world_size=2, microbatches=2),
              "world size 4 against 2, dp 4 against 2": dict(strategy="ddp", world_size=4)}
    for says, options in others.items():
        other = predict_run_trace(RunConfig.build(**options, global_batch=4), "h100")
        other = other.save(tmp_path / "other.json")
        assert report_main(_parser().parse_args([str(measured), "--predicted", str(other),
                                                 "-o", str(tmp_path / "no.html")])) == 2
        assert f"the --predicted trace is not of this run's layout ({says})" in capsys.readouterr().err
    assert not (tmp_path / "no.html").exists()


def _chromium() -> str | None:
    log = Path("/tmp/chromium.log")
    deadline = time.monotonic() + 120  # the Debian package may still be installing
    while (log.exists() and not log.read_text(errors="replace").rstrip().endswith("done")
           and time.monotonic() < deadline):
        time.sleep(2)
    for path in CHROMIUM_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


@pytest.mark.browser
def test_report_renders_in_chromium(report):
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium binary (install Debian's chromium package)")
    expected = len(figure_divs(report.read_text()))
    url = report.resolve().as_uri()
    outside = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            def gate(route):
                if route.request.url == url:
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            page.route("**/*", gate)
            page.goto(url)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                                   f"{expected}",
                                   timeout=30_000)
            plots = page.locator(".js-plotly-plot")
            assert plots.count() == expected
            timeline = page.locator("#figure-0")
            bar_paths = timeline.locator("g.barlayer path").count()
            assert bar_paths > 0
            rows = timeline.locator("g.ytick text").all_text_contents()
            assert {"r0 compute", "r1 comm"} <= set(rows)
            for i in range(expected):
                fig = page.locator(f"#figure-{i}")
                drawn = fig.locator("g.barlayer path, g.scatterlayer path.js-line, g.hm image, "
                                    "g.heatmaplayer image").count()
                assert drawn > 0, f"figure {i} drew nothing"
            assert not errors, errors
            # in a narrow window the page does not run past its edge: the per-rank table scrolls
            # sideways in its own box (its last column had been cut off at 800 px)
            narrow = browser.new_page(viewport={"width": 800, "height": 900})
            narrow.route("**/*", gate)
            narrow.goto(url)
            narrow.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                                     f"{expected}", timeout=30_000)
            assert narrow.evaluate("document.documentElement.scrollWidth") <= 800
        finally:
            browser.close()
    assert outside == []


def test_without_plotly_a_report_is_refused_in_one_line_before_anything_runs(tmp_path, capsys, monkeypatch):
    """`paralab run --report` had trained and then died importing plotly (exit 1, a traceback), and
    `paralab report` had shown the traceback: on a core install, both say how to get plotly, exit 2."""
    import sys

    from paralab.cli import main

    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises ImportError
    out = tmp_path / "r.html"
    assert main(["run", "--strategy", "single", "--steps", "1", "--report", str(out)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "--report: paralab.viz needs plotly: pip install 'paralab[lab]'" in said
    assert main(["report", str(tmp_path / "any.json"), "-o", str(out)]) == 2
    said = capsys.readouterr().err
    assert said == "paralab report: paralab.viz needs plotly: pip install 'paralab[lab]' (from a clone of " \
                   "paralab: pip install -e '.[lab]'), or pip install plotly\n"
    assert not out.exists()


def test_a_simulated_step_at_scale_says_what_its_ranks_are_one_replica_of(tmp_path):
    """predict_trace draws one replica's pipeline ranks: the report had been headed "simulated on 5
    ranks" beside the 1,000-GPU job's tokens/s, and the timeline "interleaved p=5 m=20", silent on the
    virtual stages, the micro-batch and the uneven split its bars follow."""
    from paralab.sim import ParallelSpec, get_hardware, get_model, predict_trace
    from paralab.viz.timeline import timeline

    split = (4, 5) + (4,) * 17 + (3,)
    spec = ParallelSpec(dp=50, tp=4, pp=5, zero=1, schedule="interleaved", virtual_stages=4, microbatches=20,
                        micro_batch=1, sequence_parallel=True, stage_layers=split)
    trace = predict_trace(get_model("llama3-70b"), spec, get_hardware("h100"))
    text = write_report(trace, tmp_path / "sim.html").read_text()
    assert ("paralab report: simulated on 5 ranks, one replica&#x27;s pipeline of dp 50 x tp 4 x pp 5 "
            "(1,000 GPUs)<") in text
    assert timeline(trace).layout.title.text == (
        "timeline: simulated · interleaved p=5 v=4 m=20 · microbatches of 1 sequence · layers per chunk "
        "4 + 5 + 17 x 4 + 3")
