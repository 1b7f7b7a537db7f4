"""What a widget tells the learner when a control moves: axes readable at every setting, what the
numbers beside a figure mean and where they stop holding, what a wait is for, and which settings a
figure left on screen belongs to.

Widgets are driven from Python; the tests read the figures' data and layout and the message lines.
One test starts real ranks (a 2-stage pipeline of the tiny model); the levers' measurement and this
machine's calibration are stand-ins.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re

import pytest

from paralab.runtime import worker
from paralab.trace import STEP, Span, Trace

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from paralab import widgets  # noqa: E402


def labelled_ticks(axis) -> list[str]:
    """The tick labels a log axis shows inside its range."""
    low, high = axis.range
    return [text for value, text in zip(axis.tickvals, axis.ticktext) if low <= math.log10(value) <= high]


@pytest.mark.parametrize("link, size_mb, up_to, unit", [
    ("h100 NVLink", 1024, 4, "ms"),  # 3.0 to 6.0 ms: no power of ten inside, and had no label at all
    ("h100 InfiniBand", 1024, 256, "ms"),  # 24 to 53 ms
    ("gloo here", 1024, 4, "s"),  # 1.0 to 2.0 s, which had read "1M" microseconds
    ("gloo here", 2**-10, 1024, "ms"),  # 0.57 ms to 0.58 s
])
def test_the_collectives_time_axis_is_labelled_at_every_size_in_a_unit_that_fits(link, size_mb, up_to, unit):
    app = widgets.collectives_explorer(measured={"gloo here": (2.84e-4, 1.07e9)}, link=link)
    app.controls["size_mb"].value = size_mb
    app.controls["max_group"].value = up_to
    axis = app.figure.layout.yaxis
    assert axis.title.text == f"time ({unit})"
    assert len(labelled_ticks(axis)) >= 2, axis.ticktext
    drawn = [y for trace in app.figure.data for y in trace.y]
    low, high = axis.range
    assert low < math.log10(min(drawn)) and math.log10(max(drawn)) < high  # nothing drawn off the axis
    seconds = {"s": 1, "ms": 1e-3}[unit]
    assert max(drawn) * seconds == pytest.approx(max(max(t) for t in app.figure.layout.meta.values()))


def stand_in_run(world_size: int, step_s: float):
    """A RunResult of the tiny model's ddp (one rank: single) with three steps of ``step_s``."""
    from paralab import RunConfig
    from paralab.layout import resolve_layout
    from paralab.runtime.result import RunResult

    cfg = RunConfig.build("tiny", strategy="ddp" if world_size > 1 else "single", world_size=world_size,
                          global_batch=8, steps=3)
    spans = [Span(r, STEP, STEP, k * step_s, (k + 1) * step_s, step=k)
             for k in range(3) for r in range(world_size)]
    return RunResult(cfg, resolve_layout(cfg), [1.0] * 3, Trace(spans=spans), [])


def stand_in_calibration():
    """What measuring this machine (10-30 s) would give, at once: an A100 with CPU-like kernels."""
    from paralab.sim import hardware

    return dataclasses.replace(hardware.get_hardware("a100"), elementwise_bw=5e9, elementwise_backward_bw=4e9,
                               calibration={"version": hardware.CALIBRATION_VERSION, "gloo": True})


def test_the_speedup_explorer_says_it_measures_this_machine_before_it_does(monkeypatch, tmp_path, capsys):
    """Its first open prices the runs on this machine, measured for 10-30 s per thread count the ranks
    get: it had sat 20 s without a word. The cell's output says so before each measurement, as the
    CLI does, with the cache it goes to; a second explorer reads the cache and says nothing."""
    from paralab.sim import hardware
    from paralab.widgets import speedup

    told_first = []

    def calibrate(threads=None, **kwargs):
        told_first.append("measuring this machine once (10-30 s when quiet" in capsys.readouterr().out)
        return stand_in_calibration()

    monkeypatch.setenv("PARALAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "calibrate", calibrate)
    monkeypatch.setattr(speedup, "this_machine", lambda: "local")
    monkeypatch.setattr(worker, "usable_cores", lambda: 2)  # ranks of 2 threads (one rank) and of 1
    runs = {1: stand_in_run(1, 0.04), 2: stand_in_run(2, 0.03)}
    widgets.speedup_explorer(runs, max_world=4)
    assert told_first == [True, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local_hardware_t1.json", "local_hardware_t2.json"]
    widgets.speedup_explorer(runs, max_world=4)
    assert len(told_first) == 2 and "measuring" not in capsys.readouterr().out


def test_the_speedup_explorer_draws_this_cpus_ceiling_beside_its_own_prediction_only(monkeypatch, tmp_path):
    """"What this machine allows", the ceiling of CPU ranks sharing its cores, had stood beside h100
    predictions, where it read as the h100's."""
    from paralab.sim import hardware
    from paralab.widgets import speedup

    monkeypatch.setenv("PARALAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "calibrate", lambda threads=None, **kwargs: stand_in_calibration())
    monkeypatch.setattr(speedup, "this_machine", lambda: "local")
    monkeypatch.setattr(worker, "usable_cores", lambda: 2)
    app = widgets.speedup_explorer({1: stand_in_run(1, 0.04), 2: stand_in_run(2, 0.03)}, max_world=4)

    def ceiling_drawn() -> bool:
        return any(trace.name == "what this machine allows" for trace in app.figure.data)

    assert ceiling_drawn()
    app.controls["hardware"].value = "h100"
    assert not ceiling_drawn() and "ideal_here" not in app.figure.layout.meta
    app.controls["hardware"].value = speedup.THIS_MACHINE
    assert ceiling_drawn()


def test_the_collectives_size_reads_in_binary_units():
    """The size slider had read "1.02e+3" (MiB) at 1 GiB, beside a title saying "1 GiB"."""
    app = widgets.collectives_explorer(size_mb=1.0)
    size = app.controls["size_mb"]
    labels = [label for label, _ in size.options]
    assert size.label == "1 MiB" and (labels[0], labels[-1]) == ("1 KiB", "1 GiB")
    size.value = 1024
    assert size.label == "1 GiB" and "1 GiB" in app.figure.layout.title.text


# ------------------------------------------------------------------------------------- pipeline
def test_the_pipeline_explorer_draws_what_a_browser_draws_in_a_second_or_two():
    """64 stages of 128 microbatches had drawn 48,600 bars, a 12 MB figure a JupyterLab tab took 12 s to
    draw, while the line said "update 1262 ms": Python's part only. Now such a shape is refused with the
    reason, and the title and legend keep their place over a taller figure. The line then said "342 bars
    built in 21 ms (your browser then draws them)": a time that means nothing in the book's static
    snapshot and is noise beside the bubble, so the line says the schedule's numbers only (the time
    stays in ``last_update_ms``)."""
    from paralab.viz._common import go, style
    from paralab.widgets.pipeline import MAX_DRAWN
    from tests.conftest import bars

    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=8)
    assert "bubble simulated" in app.info.value and app.last_update_ms > 0
    assert not re.search(r"bars|\d ms\b|browser", app.info.value), app.info.value
    app.controls["stages"].value = 64
    app.controls["microbatches"].value = 16  # the most microbatches drawn over 64 stages
    drawn = bars(app.figure)
    assert 6000 < drawn < 6500 and "bubble simulated" in app.info.value and "bars" not in app.info.value
    pinned = style(go().Figure(), height=app.figure.layout.height).layout
    assert (app.figure.layout.title.y, app.figure.layout.legend.y) == (pinned.title.y, pinned.legend.y)
    app.controls["microbatches"].value = 128
    assert f"draws up to {MAX_DRAWN:,} chunk-microbatches" in app.message.value and bars(app.figure) == drawn


def test_the_pipeline_explorer_says_when_its_closed_form_is_only_a_lower_bound():
    """ZB-V's closed form counts only its start-up ramp: with fewer microbatches than stages it is a
    lower bound (paralab.schedules.theoretical_bubble), and 33.3% simulated had stood beside 14.3% closed
    form without a word. Every other schedule's form is exact there."""
    app = widgets.pipeline_explorer(schedule="zbv", stages=2, microbatches=1, p2p=0.0)
    assert "closed form 14.3% (only a lower bound with fewer microbatches than stages)" in app.info.value
    app.controls["microbatches"].value = 2
    assert "lower bound" not in app.info.value
    app.controls["schedule"].value = "1f1b"
    app.controls["microbatches"].value = 1
    assert "lower bound" not in app.info.value


@pytest.mark.filterwarnings("ignore:world size 2 exceeds")
def test_the_pipeline_explorer_marks_a_run_with_its_shape_and_says_when_ranks_share_cores(
        monkeypatch, no_leftover_ranks):
    """4 ranks on 2 cores had measured a 79% bubble beside 29% simulated, with nothing saying the
    ranks took turns on the cores; and a measured figure left on screen when the microbatches moved
    read as the new shape's. (Real ranks: 2 stages, counted here as sharing 1 core.)"""
    from paralab.widgets._common import EARLIER_RUN

    monkeypatch.setattr(worker, "usable_cores", lambda: 1)
    app = widgets.pipeline_explorer(schedule="1f1b", stages=2, microbatches=2, steps=2)
    app.button.click()
    assert "the 2 ranks shared this machine's 1 core:" in app.message.value.replace("&#x27;", "'")
    title = app.measured.layout.title.text
    assert title.startswith("run for real, 1f1b, 2 ranks, 2 microbatches: step ")
    top = app.measured.layout.margin.t
    app.controls["microbatches"].value = 4
    app.controls["microbatches"].value = 3  # a second move marks it once
    # still the run's own shape, said to be an earlier run's: under a message about 5 stages it had read
    # as theirs
    assert app.measured.layout.title.text == EARLIER_RUN + title
    app.controls["microbatches"].value = 2  # the run's settings again
    assert app.measured.layout.title.text == title and app.measured.layout.margin.t == top


def test_ranks_within_the_cores_are_not_said_to_share_them(monkeypatch):
    from paralab import RunConfig
    from paralab.widgets.pipeline import crowded

    monkeypatch.setattr(worker, "usable_cores", lambda: 4)
    cfg = RunConfig.build("tiny", strategy="pp", world_size=4, pp=4, microbatches=4, device="cpu")
    assert crowded(cfg, 4) == ""
    monkeypatch.setattr(worker, "usable_cores", lambda: 2)
    assert "the 4 ranks shared this machine's 2 cores" in crowded(cfg, 4)
    assert crowded(dataclasses.replace(cfg, device="cuda"), 4) == ""  # a GPU each: the cores do not time them


def test_ranks_that_share_a_busy_machine_are_said_to(monkeypatch):
    """On a machine other jobs kept busy a measured bubble of 64% had stood beside 20% simulated, its 2
    ranks within the 2 cores and nothing said: the load average before the run is counted too."""
    import os

    from paralab import RunConfig
    from paralab.widgets.pipeline import crowded

    monkeypatch.setattr(worker, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cfg = RunConfig.build("tiny", strategy="pp", world_size=2, pp=2, microbatches=4, threads_per_rank=1)
    assert crowded(cfg, 2, load=0.0) == ""
    assert ("the 2 ranks shared this machine with other work (load average 1.5 on its 2 cores before the "
            "run): a rank waiting for a core holds up its neighbours") in crowded(cfg, 2, load=1.5)


def test_the_pipeline_explorer_runs_for_real_only_what_a_binder_box_holds(monkeypatch):
    """Its slider goes to 64 stages, a process each: "Run for real" had started up to the capacity
    check's 8 ranks a core, where a notebook must run in a Binder box's 1 CPU and 2 GB."""
    import paralab
    from paralab.widgets.pipeline import MAX_RUN_RANKS

    monkeypatch.setattr(paralab, "run", lambda **kwargs: pytest.fail("a run was started"))
    app = widgets.pipeline_explorer(schedule="1f1b", stages=8, microbatches=8)
    assert MAX_RUN_RANKS == 4 and app.button.disabled
    assert "Run for real starts at most 4 ranks" in app.info.value and "Binder" in app.button.tooltip
    assert app.run_for_real() is None
    assert "8 pipeline ranks are simulated only, in the figure below" in app.message.value
    app.controls["stages"].value = 4
    assert not app.button.disabled and "at most" not in app.info.value


def test_the_pipeline_explorer_says_dualpipevs_fewest_microbatches_in_its_sliders_terms():
    """Its refusal had read "needs at least as many microbatches as stages (2 x pp = 8)" beside a stages
    slider at 4: the schedule counts the V's model stages, the slider the ranks."""
    app = widgets.pipeline_explorer(schedule="dualpipev", stages=4, microbatches=8)
    app.controls["microbatches"].value = 6
    assert ("dualpipev on 4 pipeline ranks needs at least 8 microbatches (2 model chunks on each rank, 8 "
            "stages in its pipeline), got 6") in app.message.value
    assert "2 x pp" not in app.message.value


def test_the_timeline_caption_reads_a_bar_of_the_shape_drawn():
    """Its example had stayed the first shape's, "F7 s3" under 2 stages of 2 microbatches."""
    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=8)
    assert "B7 s3 is microbatch 7's backward on stage 3" in app.figure.layout.xaxis.title.text
    app.controls["stages"].value = 2
    app.controls["microbatches"].value = 2
    assert "B1 s1 is microbatch 1's backward on stage 1" in app.figure.layout.xaxis.title.text


def test_the_timeline_caption_fits_a_notebook_cell():
    """Its one line of 100 characters had run past a 930-pixel cell: "... backwards hatc"."""
    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=8)
    caption = app.figure.layout.xaxis.title.text
    assert "coloured by microbatch" in caption and max(map(len, caption.split("<br>"))) <= 70


# ------------------------------------------------------------------------------------- refusals and axes
def test_a_refused_figure_says_so_on_a_line_of_its_own_above_the_legend():
    """Before the title on its line, the mark had pushed the end of a long one (llama3-70b at dp=1024
    tp=8 pp=64, its layers per stage) past the figure's right edge."""
    from paralab.widgets._common import MARK_PX, NOT_REDRAWN

    def placed(fig) -> tuple:
        """The title, and in pixels up from the bottom its last line and the legend; the plot's top margin."""
        height, layout = fig.layout.height, fig.layout
        return layout.title.text, layout.title.y * height, layout.legend.y * height, layout.margin.t

    app = widgets.memory_explorer(model="llama3-70b", hardware="h100", dp=1024, tp=8, pp=64)
    title, title_px, legend_px, top = placed(app.figure)
    app.controls["tp"].value = 16  # the model's 8 key-value heads do not split 16 ways
    assert NOT_REDRAWN.endswith("<br>") and placed(app.figure) == pytest.approx(
        (NOT_REDRAWN + title, title_px - MARK_PX / 2, legend_px - MARK_PX, top + MARK_PX))
    app.controls["tp"].value = 8
    assert placed(app.figure) == pytest.approx((title, title_px, legend_px, top))
    # a figure updated in place under its title takes the mark off, and gives back its line
    pipeline = widgets.pipeline_explorer(schedule="interleaved", stages=4, microbatches=8, virtual_stages=2)
    top = pipeline.figure.layout.margin.t
    pipeline.controls["microbatches"].value = 9  # interleaved's rounds do not split 9
    assert pipeline.figure.layout.margin.t == top + MARK_PX
    pipeline.controls["microbatches"].value = 12
    assert pipeline.figure.layout.margin.t == top and NOT_REDRAWN not in pipeline.figure.layout.title.text


def test_the_memory_explorer_reads_thousands_of_gib_whole():
    """A trillion parameters on one GPU: the axis had read "15k" GiB, plotly's SI "k"."""
    app = widgets.memory_explorer(model="megatron-1t", hardware="h100", dp=1, tp=1, pp=1)
    assert app.figure.layout.yaxis.tickformat == ","
    assert any("15,634.1 GiB" in (note.text or "") for note in app.figure.layout.annotations)


def test_an_empty_elastic_monitor_draws_no_negative_ranks_steps_or_seconds():
    """Before its first sample plotly's empty axes had run from -1: minus one rank, step and second."""
    fig = widgets.elastic_monitor().figure
    ranks = [axis for name, axis in fig.layout.to_plotly_json().items()
             if name.startswith("yaxis") and axis.get("title", {}).get("text") == "ranks"]
    assert len(ranks) == 2 and all(axis.get("rangemode") == "tozero" for axis in ranks)
    assert all(axis.get("rangemode") == "nonnegative" for name, axis in fig.layout.to_plotly_json().items()
               if name.startswith("xaxis"))


# ------------------------------------------------------------------------------------- levers
def test_the_levers_explorer_reads_its_axis_in_the_unit_of_its_bars_and_every_kind_on_hover():
    """At its largest settings math attention's scores take 40 GiB: the axis had read "40k" (MiB), and
    the parameters and optimizer states, a few pixels tall, could not be pointed at."""
    app = widgets.levers_explorer()
    assert app.figure.layout.yaxis.title.text == "peak memory (MiB)"
    for name, value in (("layers", 16), ("hidden", 512), ("seq", 1024), ("micro_batch", 16),
                        ("attention", "math")):
        app.controls[name].value = value
    assert app.figure.layout.yaxis.title.text == "peak memory (GiB)"
    assert 30 < sum(trace.y[0] for trace in app.figure.data) < 100
    assert app.figure.layout.hovermode == "x unified"  # one hover names every kind of the bar
    assert {trace.name for trace in app.figure.data} >= {"params", "optimizer", "activations"}


def test_the_levers_explorer_names_its_settings_under_the_bars_and_its_buttons_whole():
    """The title naming every setting had run under the plot's toolbar ("...bf16, recomp"), and the
    button read "Measure on thi…"."""
    app = widgets.levers_explorer(dtype="bf16")
    assert app.figure.layout.title.text == "memory by kind on one device"
    assert app.figure.layout.xaxis.title.text == ("4 layers, hidden 64, sequence 128, micro-batch 4, bf16, "
                                                  "recompute none, sdpa")
    assert app.button.layout.width == "auto"


@pytest.mark.parametrize("explorer", ["levers_explorer", "memory_explorer", "scaling_explorer",
                                      "comm_explorer"])
def test_every_explorers_toggle_buttons_sit_beside_their_label(explorer):
    """ipywidgets 8 stacks a toggle's label over its buttons, each 148 px wide: the memory explorer's
    "recompute" had sat over its row of buttons, which the levers explorer's did not."""
    app = getattr(widgets, explorer)()
    toggles = [c for c in app.controls.values() if type(c).__name__ == "ToggleButtons"]
    assert toggles
    for control in toggles:  # beside their label, each as wide as its text
        assert control.style.button_width == "auto" and control.layout.display == "flex", control.description


def test_the_levers_explorer_says_why_a_measured_peak_holds_gradients_the_prediction_has_not(monkeypatch):
    """Under selective recomputation with a long math sequence the measured peak held 0.63 MiB of
    gradients against none predicted, and nothing said why: the cost model weighs the moment the last
    layer's attention core is recomputed without the gradients made before it (8 layers, hidden 128,
    256 tokens: 53.7 MiB measured against 52.2 predicted)."""
    from types import SimpleNamespace

    from paralab.runtime import launch
    from paralab.widgets import levers

    held = {"params": 4e5, "grads": 0.0, "optimizer": 2e6, "activations": 6e5}
    monkeypatch.setattr(launch, "launch", lambda cfg: SimpleNamespace(summary={"memory_by_kind": [held]}))
    app = widgets.levers_explorer()
    app.measure()
    assert "early in the backward" not in app.message.value  # no gradient at the peak: nothing to explain
    held["grads"] = 3e5
    app.measure()
    assert "its peak fell early in the backward" in app.message.value
    assert "grads" in {trace.name for trace in app.figure.data}
    # it names what the run's policy makes: selective recomputation's core only under selective
    said = {}
    for policy in ("none", "full", "selective"):
        app.controls["recompute"].value = policy
        app.measure()
        said[policy] = html.unescape(app.message.value)
    assert "(the head's) beside the saved activations" in said["none"]
    assert "after its attention core) beside the recomputed attention core" in said["selective"]
    # under full recomputation this run's predicted peak holds gradients, so the explorer says nothing:
    # the rule itself, asked
    full = levers.inside_backward({"grads": 3e5}, {"grads": 0.0}, "full")
    assert "selective" not in full and "(the head's) beside the recomputed activations" in full


def test_the_levers_explorer_will_not_measure_what_would_take_minutes_here_and_runs_one_at_a_time(
        monkeypatch):
    """bf16 at 8 layers of 512, 1,024 tokens, micro-batch 8, full recompute: pressed, the button had held
    the kernel five minutes on a 2-core box (its bf16 matrix multiplies at 1.4 GFLOP/s), then said the
    run hung; and a second click while a measurement ran had queued another."""
    from types import SimpleNamespace

    from paralab.runtime import launch
    from paralab.widgets import levers

    app = widgets.levers_explorer()
    for name, value in (("layers", 8), ("hidden", 512), ("seq", 1024), ("micro_batch", 8), ("dtype", "bf16"),
                        ("recompute", "full")):
        app.controls[name].value = value
    monkeypatch.setattr(levers, "matmul_rate", lambda dtype: 1.4e9)
    monkeypatch.setattr(worker, "available_memory_bytes", lambda: 64 * 2**30)  # memory is not the refusal
    monkeypatch.setattr("paralab.config.cuda_device_count", lambda: 0)  # the CPU's rate prices the run
    monkeypatch.setattr(launch, "launch", lambda cfg: pytest.fail("a run was about to start"))
    assert app.measure() is None
    assert re.search(r"its 2 steps would take at least \d+ min here", app.message.value)
    assert "1.4 GFLOP/s this machine&#x27;s bf16 matrix multiplies reach" in app.message.value
    assert "or use fp32" in app.message.value
    seen = []  # the button while the run runs, and after
    held = {"params": 4e5, "grads": 0.0, "optimizer": 2e6, "activations": 6e5}
    monkeypatch.setattr(launch, "launch", lambda cfg: seen.append(app.button.disabled) or SimpleNamespace(
        summary={"memory_by_kind": [held]}))
    app.controls["layers"].value, app.controls["dtype"].value = 2, "fp32"
    monkeypatch.setattr(levers, "matmul_rate", lambda dtype: 1.5e11)
    assert app.measure() is not None and seen == [True] and not app.button.disabled


def test_the_pipeline_explorer_stops_each_schedules_stages_where_it_stops_drawing():
    """DualPipeV at 17 to 64 stages could never be drawn: "needs at least 128 microbatches" at 64, and
    at 128 "this shape has 16,384" chunk-microbatches. The stages slider stops where the fewest
    microbatches a schedule builds for stop being drawn, and the explorer says why."""
    from paralab.schedules import SCHEDULES
    from paralab.widgets import pipeline

    app = widgets.pipeline_explorer(schedule="1f1b", stages=64, microbatches=8)
    for name in SCHEDULES:
        app.controls["schedule"].value = name
        most = app.controls["stages"].max
        v = 2 if name in ("interleaved", "zbv", "dualpipev") else 1
        # every stage count the slider offers draws with some microbatch count, one more would not
        assert all(pipeline.drawn_at(name, p, v, 128) for p in range(2, most + 1)), name
        assert most == 64 or not pipeline.drawn_at(name, most + 1, v, 128), name
    app.controls["schedule"].value = "dualpipev"
    assert app.controls["stages"].max == 16 and app.controls["stages"].value == 16
    app.controls["microbatches"].value = 32
    assert app.message.value == ""
    assert "the explorer draws dualpipev up to 16 pipeline ranks" in app.info.value
    app.controls["stages"].value = 4  # said where the slider stops only
    assert "up to" not in app.info.value
    app.controls["schedule"].value = "1f1b"
    assert app.controls["stages"].max == 64 and "up to" not in app.info.value


def test_a_redrawn_pipeline_inks_each_label_for_its_own_bar():
    """Redrawn in place, the bars kept the previous shape's label colours: from 1f1b to gpipe a third
    of the labels stood white on the light shades, and from 8 microbatches to 12 the colours ran short."""
    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=8)
    for control, value in (("schedule", "gpipe"), ("microbatches", 12)):
        app.controls[control].value = value
        shape = {key: app.controls[key].value for key in ("schedule", "stages", "microbatches")}
        fresh = widgets.pipeline_explorer(**shape).figure
        for drawn, anew in zip(app.figure.data, fresh.data, strict=True):
            assert drawn.insidetextfont == anew.insidetextfont, (control, drawn.name)


def test_the_pipeline_explorer_offers_interleaved_two_chunks_at_least_and_says_its_p2p():
    """The virtual-stages slider, shown for interleaved only, had gone down to 1, which interleaved
    refuses; a step longer than the closed form's, with p2p 2.0 left from another schedule, had read as
    a bug: the info line says the p2p time it pays."""
    app = widgets.pipeline_explorer(schedule="interleaved", stages=4, microbatches=8, virtual_stages=2)
    assert app.controls["virtual_stages"].min == 2
    app.controls["p2p"].value = 2.0
    app.controls["schedule"].value = "1f1b"
    app.controls["stages"].value, app.controls["microbatches"].value = 2, 5
    assert "p2p 2 F" in app.info.value
    app.controls["p2p"].value = 0.0
    assert "p2p" not in app.info.value


def test_the_memory_explorer_keeps_long_titles_whole():
    """llama3-405b at dp=1024 tp=8 pp=64 had run its title "... (layers per stage 1 + 62 x 2 + 1)" past
    the figure's right edge (plotly does not wrap titles): the split goes on a line of its own, and the
    legend and the plot move down to clear it."""
    app = widgets.memory_explorer(model="llama3-405b", hardware="a100", dp=1024, tp=8, pp=64)
    app.controls["recompute"].value = "full"
    app.controls["micro_batch"].value = 32
    layout = app.figure.layout
    lines = layout.title.text.split("<br>")
    assert len(lines) == 2 and lines[1].startswith("layers per stage")
    assert all(len(line) <= 70 for line in lines), lines  # some 600 px at the title's 17 px
    one_line = widgets.memory_explorer(model="llama3-405b", hardware="a100", dp=8).figure.layout
    assert layout.margin.t == one_line.margin.t + 22 and layout.legend.y < one_line.legend.y
    tiny = widgets.memory_explorer(model="tiny", dp=1024, tp=1, pp=4).figure.layout.title.text
    assert all(len(line) <= 70 for line in tiny.split("<br>")), tiny


def test_the_speedup_explorers_panel_titles_stay_over_their_panels(monkeypatch):
    """The lower-left panel's title, "speedup over the one-rank median, step by step", had run under
    the right panel's y-axis title at a notebook's 700 px."""
    from paralab.widgets import speedup

    monkeypatch.setattr(speedup, "this_machine", lambda: "a100")
    app = widgets.speedup_explorer({1: stand_in_run(1, 0.04), 2: stand_in_run(2, 0.03)}, max_world=4)
    fig = app.figure
    plot_px = 700 - fig.layout.margin.l - fig.layout.margin.r
    lower_left = fig.get_subplot(2, 1)
    width = (lower_left.xaxis.domain[1] - lower_left.xaxis.domain[0]) * plot_px
    title = next(a for a in fig.layout.annotations
                 if a.y == lower_left.yaxis.domain[1] and a.yanchor == "bottom")
    assert len(title.text) * 0.55 * 16 <= width, title.text  # 16 px subplot titles, ~0.55 em a character
