"""Widgets driven from Python: moving a control must change the figure's data.

No browser here (tests/test_report.py and the notebook browser test cover rendering). "Run for real"
starts real ranks once (2 pipeline stages of the tiny model); its error path uses a stand-in.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from paralab.config import ConfigError
from paralab.sim.specs import RANK_ORDERS
from paralab.trace import Counter, Span, Trace

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

import ipywidgets  # noqa: E402

from paralab import sim, widgets  # noqa: E402
from paralab.widgets._common import NOT_REDRAWN  # noqa: E402
from paralab.widgets.collectives import Link  # noqa: E402
from tests.conftest import bars  # noqa: E402


def test_pipeline_explorer_sliders_redraw():
    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=4)
    assert isinstance(app, ipywidgets.VBox)
    # F and B per (rank, microbatch); per stage boundary and microbatch a send and a recv each way
    assert bars(app.figure) == 4 * 4 * 2 + 3 * 4 * 2 * 2
    assert app.figure.layout.meta["ranks"] == 4
    app.controls["microbatches"].value = 8
    fwd = next(t for t in app.figure.data if t.name == "forward")
    assert len(fwd.x) == 4 * 8
    app.controls["stages"].value = 6
    assert app.figure.layout.meta["ranks"] == 6 and len(app.figure.layout.yaxis.categoryarray) == 12
    # every row keeps its tick label: listed ticks had stayed the first shape's, and r4, r5 went unnamed
    assert list(app.figure.layout.yaxis.ticktext) == list(app.figure.layout.yaxis.categoryarray)
    assert "bubble simulated" in app.info.value and app.last_update_ms > 0
    app.controls["schedule"].value = "zb-h1"
    assert {t.name for t in app.figure.data} >= {"backward_input", "backward_weight"}


def shown(control) -> bool:
    return control.layout.display != "none"


def test_pipeline_explorer_shows_only_the_controls_of_the_chosen_schedule_with_whole_labels():
    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=8)
    assert not shown(app.controls["virtual_stages"]) and not shown(app.controls["overlap"])
    app.controls["schedule"].value = "interleaved"
    assert shown(app.controls["virtual_stages"]) and not shown(app.controls["overlap"])
    app.controls["schedule"].value = "zbv"  # two chunks per rank, fixed: no slider for them
    assert not shown(app.controls["virtual_stages"])
    for control in app.controls.values():  # a label is never cut to fit a fixed width
        assert control.style.description_width == "initial", control.description


def test_pipeline_explorer_offers_dualpipev_and_its_overlap():
    app = widgets.pipeline_explorer(schedule="1f1b", stages=4, microbatches=8)
    app.controls["schedule"].value = "dualpipev"
    assert shown(app.controls["overlap"]) and app.message.value == ""
    assert {t.name for t in app.figure.data} >= {"backward", "backward_input", "backward_weight"}
    def number(after):
        return float(app.info.value.split(after)[1].split("%")[0].split(" ")[0])

    bubble, step = number("bubble simulated "), number("step ")
    # each F&B slot one forward time shorter: a shorter step, a smaller bubble
    app.controls["overlap"].value = 1.0
    assert "F&B hides 1 F" in app.info.value and "closed form (nothing hidden, free p2p)" in app.info.value
    assert number("step ") < step and number("bubble simulated ") < bubble
    # a slot hides at most its forward: past that it would run shorter than its backward alone
    assert app.controls["overlap"].max == 1.0
    app.controls["microbatches"].value = 6  # fewer than 2 x 4 stages
    assert "needs at least 8 microbatches" in app.message.value
    assert app.info.value == ""  # the last shape's step and bubble are not shown beside the refusal
    assert app.figure.layout.title.text.startswith(NOT_REDRAWN)  # nor its figure taken for this shape's
    app.controls["microbatches"].value = 8
    assert app.message.value == "" and not app.figure.layout.title.text.startswith(NOT_REDRAWN)


def test_pipeline_explorer_draws_what_a_binder_box_can_redraw():
    """Eight virtual stages of 64 stages and 128 microbatches had pushed 390,000 bars (9 s and 800 MiB
    on one CPU); the explorer now refuses more than MAX_DRAWN chunk-microbatches, and says why."""
    from paralab.widgets.pipeline import MAX_DRAWN

    app = widgets.pipeline_explorer(schedule="interleaved", stages=16, microbatches=16, virtual_stages=8)
    before = bars(app.figure)
    app.controls["microbatches"].value = 128  # 16 x 8 x 128 = 16,384
    assert f"draws up to {MAX_DRAWN:,} chunk-microbatches" in app.message.value
    assert "this shape has 16,384" in app.message.value
    assert bars(app.figure) == before
    # nor does it draw one it starts with
    app = widgets.pipeline_explorer(schedule="interleaved", stages=64, microbatches=128, virtual_stages=8)
    assert bars(app.figure) == 0 and "this shape has 65,536" in app.message.value
    assert not app.figure.layout.title.text.startswith(NOT_REDRAWN)  # nothing was drawn to be the last


def test_pipeline_explorer_invalid_combination_shows_message():
    app = widgets.pipeline_explorer(schedule="interleaved", stages=4, microbatches=8, virtual_stages=2)
    before = bars(app.figure)
    app.controls["microbatches"].value = 9  # interleaved needs equal rounds of microbatches (2 rounds of 4.5)
    assert "equal rounds" in app.message.value
    assert bars(app.figure) == before  # the last good timeline stays
    app.controls["microbatches"].value = 12
    assert app.message.value == "" and bars(app.figure) > before


def test_pipeline_explorer_run_for_real_error(monkeypatch):
    import paralab

    def refuse(**kwargs):
        raise ConfigError("strategy 'pp' is not implemented in this version of paralab")

    monkeypatch.setattr(paralab, "run", refuse)
    app = widgets.pipeline_explorer(stages=2, microbatches=2)
    app.button.click()
    assert "ConfigError" in app.message.value and "not implemented" in app.message.value
    assert app.measured is None


def test_pipeline_explorer_runs_every_shape_it_draws(monkeypatch):
    """4 ranks of DualPipeV's 2 chunks need 8 layers: the tiny model's 4 are deepened, not refused."""
    import paralab

    asked = {}

    def record(**kwargs):
        asked.update(kwargs)
        raise ConfigError("recorded, not run")

    monkeypatch.setattr(paralab, "run", record)
    app = widgets.pipeline_explorer(schedule="dualpipev", stages=4, microbatches=8)
    app.button.click()
    assert asked["model"].layers == 8 and asked["model"].hidden == paralab.config.MODEL_PRESETS["tiny"].hidden
    app.controls["schedule"].value = "1f1b"
    app.button.click()
    assert asked["model"] == "tiny"


def test_pipeline_explorer_run_for_real_shows_measured(no_leftover_ranks):
    """The button launches real pipeline ranks (2 stages, tiny model) and draws what they measured
    above the prediction, with the progress bar following the steps."""
    app = widgets.pipeline_explorer(schedule="1f1b", stages=2, microbatches=4, steps=3)
    app.button.click()
    assert app.progress.value == app.progress.max == 3
    assert app.measured is not None and "predicted_rows" in app.measured.layout.meta
    assert len(app.measured.layout.meta["rows"]) == 4 and "step time" in app.message.value
    forwards = [t for t in app.measured.data if t.name == "forward" and t.yaxis in (None, "y")]
    # each stage ran 4 forwards in the step shown
    assert forwards and sum(len(t.x) for t in forwards) == 2 * 4


def test_scaling_explorer_redraws():
    app = widgets.scaling_explorer(model="gpt3-1.3b", hardware="h100", dim="dp", max_gpus=8)
    assert app.figure.layout.meta["predicted"]["world_size"] == [1, 2, 4, 8]
    before = list(app.figure.layout.meta["predicted"]["step_time_s"])
    app.controls["hardware"].value = "a100"
    after = list(app.figure.layout.meta["predicted"]["step_time_s"])
    assert after[0] > before[0]  # the A100 is slower
    app.controls["max_gpus"].value = 32
    app.controls["dim"].value = "tp"  # gpt3-1.3b has 16 heads: tp=32 is refused
    assert app.figure.layout.meta["predicted"]["world_size"] == [1, 2, 4, 8, 16]
    assert "tp=32" in app.message.value


def test_the_scaling_explorer_marks_a_figure_it_could_not_redraw(monkeypatch):
    from paralab.widgets import explorers

    app = widgets.scaling_explorer(model="gpt3-1.3b", hardware="h100", dim="dp", max_gpus=8)
    assert_marks_what_it_refuses(app, monkeypatch, explorers, "scaling_points", ("hardware", "a100"),
                                 ("hardware", "h100"))


def test_the_levers_explorer_marks_a_figure_it_could_not_redraw(monkeypatch):
    from types import SimpleNamespace

    from paralab.sim import bridge

    hook = SimpleNamespace(predict_memory=bridge.predict_memory)  # the app takes its function when made
    monkeypatch.setattr(bridge, "predict_memory", lambda cfg: hook.predict_memory(cfg))
    app = widgets.levers_explorer()
    assert_marks_what_it_refuses(app, monkeypatch, hook, "predict_memory", ("layers", 8), ("layers", 2))


def test_the_scaling_explorer_draws_only_sizes_that_fit_in_memory():
    """A batch of 512 in one micro-batch had put 5,698 GiB on each GPU of the default view, drawn as a
    near-ideal curve; a replica now runs a micro-batch at a time, and what does not fit is named."""
    app = widgets.scaling_explorer(model="gpt3-1.3b", hardware="h100", dim="dp", max_gpus=64)
    assert app.figure.layout.meta["predicted"]["world_size"] == [1, 2, 4, 8, 16, 32, 64]
    assert app.message.value == ""
    app.controls["model"].value = "gpt3-13b"  # 13B x 16 bytes of model states: only sharded by tp or pp
    assert "dp=1, 2, 4, 8, 16, 32, 64: does not fit, " in app.message.value
    # nothing to draw: the last curve is kept, marked (an empty figure had autoscaled its axes to nonsense)
    assert app.figure.layout.meta["predicted"]["world_size"] == [1, 2, 4, 8, 16, 32, 64]
    title = app.figure.layout.title.text
    assert title.startswith(NOT_REDRAWN) and "gpt3-1.3b" in title
    app.controls["dim"].value = "tp"
    assert app.figure.layout.meta["predicted"]["world_size"] == [4, 8]
    assert "tp=1, 2: does not fit, " in app.message.value
    assert "tp=16, 32, 64: tp 16 to 64 does not divide the 40 attention heads" in app.message.value


def test_the_scaling_explorer_says_each_refusal_once_and_ticks_only_what_it_draws():
    """A micro-batch of 32 had repeated "does not fit, 374.5 GiB per GPU" for five sizes and a batch
    refusal for six more, over axes autoscaled to 0.125 ... 524.2881k ranks and a speedup of 8,192.001."""
    app = widgets.scaling_explorer(model="gpt3-1.3b", hardware="h100", dim="dp", max_gpus=64)
    drawn = [1, 2, 4, 8, 16, 32, 64]
    assert list(app.figure.layout.xaxis.tickvals) == list(app.figure.layout.xaxis2.tickvals) == drawn
    assert list(app.figure.layout.yaxis2.ticktext) == ["1", "2", "4", "8", "16", "32", "64"]
    app.controls["micro_batch"].value = 32
    text = app.message.value
    assert "dp=1, 2, 4, 8, 16: does not fit, " in text and "GiB per GPU against 71.7 GiB usable" in text
    assert "dp=32, 64: global batch 512 is not a whole number of micro-batches of 32 per replica" in text
    assert text.count("does not fit") == text.count("global batch 512") == 1
    assert app.figure.layout.meta["predicted"]["world_size"] == drawn
    assert app.figure.layout.title.text.startswith(NOT_REDRAWN)
    app.controls["micro_batch"].value = 1
    app.controls["global_batch"].value = -4  # one reason for every size: said once
    assert app.message.value.count("global batch -4") == 1
    # started where no size runs: an empty figure, no tick beyond what it draws, nothing marked
    empty = widgets.scaling_explorer(model="gpt3-13b", dim="dp", max_gpus=8)
    assert "no size can run" in empty.message.value and empty.figure.layout.xaxis.tickvals == ()
    assert not empty.figure.layout.title.text.startswith(NOT_REDRAWN)


def test_the_scaling_explorer_says_once_a_refusal_that_differs_only_in_each_sizes_numbers():
    """A global batch of 100,000 had said the simulator's limit seven times, once per size, each with its
    own count of GPUs: reasons alike but for their numbers are one line now, a number that differs
    written as the range the sizes span, one that does not as it is."""
    from paralab.widgets.explorers import said_once

    app = widgets.scaling_explorer(model="gpt3-1.3b", hardware="h100", dim="tp", max_gpus=64)
    app.controls["global_batch"].value = 100000
    text = app.message.value
    assert text.count("the simulator models up to") == 1
    assert ("tp=1, 2, 4, 8, 16, 32, 64: the simulator models up to 16,777,216 GPUs and 65,536 microbatches "
            "a step, got a world size of 1 to 64 and 100,000 microbatches") in text
    assert said_once("tp", [(1, "does not fit, 236.5 GiB per GPU"), (2, "does not fit, 1,120.3 GiB per GPU"),
                            (16, "tp 16 does not divide 40 heads, 12 layers"),
                            (32, "tp 32 does not divide 40 heads, 12 layers")]) == [
        "tp=1, 2: does not fit, 236.5 to 1,120.3 GiB per GPU",
        "tp=16, 32: tp 16 to 32 does not divide 40 heads, 12 layers"]


def test_the_scaling_explorer_refuses_a_global_batch_of_zero():
    """0 had been drawn as "global batch 0": the spec filled in a micro-batch per replica, a batch
    growing with dp (weak scaling, 927x at 1024 GPUs) nobody had asked for."""
    app = widgets.scaling_explorer(model="gpt3-1.3b", hardware="h100", dim="dp", max_gpus=8)
    app.controls["global_batch"].value = 0
    assert "global batch 0: give the sequences per step, 1 or more" in app.message.value
    title = app.figure.layout.title.text
    assert title.startswith(NOT_REDRAWN) and "global batch 512" in title
    app.controls["global_batch"].value = 64
    assert app.message.value == "" and "global batch 64" in app.figure.layout.title.text


def test_the_explorers_refusals_name_no_python_class(monkeypatch):
    from paralab.widgets import explorers

    def fail(*args, **kwargs):
        raise RuntimeError("the cost model failed")

    scaling, memory = widgets.scaling_explorer(max_gpus=8), widgets.memory_explorer(dp=8)
    monkeypatch.setattr(explorers, "scaling_points", fail)
    monkeypatch.setattr(explorers, "memory_by_zero", fail)
    for app in (scaling, memory):
        app.redraw()
        assert "the cost model failed" in app.message.value and "RuntimeError" not in app.message.value


def test_the_explorers_show_their_labels_whole():
    """At a notebook's 930 px the scaling explorer's "global batch" read "global bat…"."""
    t = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1000, group_size=2, step=0) for r in range(2)])
    apps = (widgets.scaling_explorer(max_gpus=8), widgets.memory_explorer(dp=8), widgets.comm_explorer(t))
    for app in apps:
        for control in app.controls.values():
            assert control.style.description_width == "initial", control.description


def test_memory_explorer_redraws():
    app = widgets.memory_explorer(model="gpt3-1.3b", dp=8)
    totals = list(app.figure.layout.meta["totals"])
    assert len(totals) == 4 and totals[0] > totals[1] > totals[2] > totals[3]  # ZeRO 0..3
    app.controls["pp"].value = 4  # every ZeRO stage beside a pipeline (as DeepSpeed and FSDP run them)
    assert list(app.figure.data[0].x) == ["no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    staged = list(app.figure.layout.meta["totals"])
    # a quarter of the layers each
    assert staged[0] > staged[1] > staged[2] > staged[3] and staged[0] < totals[0]
    app.controls["pp"].value = 64  # gpt3-1.3b has 24 layers: refused, said, the last figure kept
    assert "layers" in app.message.value and list(app.figure.layout.meta["totals"]) == staged
    # ... under a title that says so: it had named dp=8 tp=1 pp=4 beside controls at pp=64
    assert app.figure.layout.title.text.startswith(NOT_REDRAWN) and "pp=4" in app.figure.layout.title.text
    app.controls["micro_batch"].value = 2  # still refused: marked once, not twice
    assert app.figure.layout.title.text.count("not redrawn") == 1
    app.controls["pp"].value = 2
    assert "pp=2" in app.figure.layout.title.text and "not redrawn" not in app.figure.layout.title.text


def test_the_memory_explorers_line_is_what_fits_is_tested_against():
    """The line had been drawn at the part's 80 GiB while fits compares with the 71.7 GiB a plan may
    fill: a pipeline of gpt3-13b at 72.0 GiB sat under the line and did not fit."""
    app = widgets.memory_explorer(model="gpt3-13b", hardware="h100", dp=1, pp=8)
    usable = sim.cost.usable_memory(sim.get_hardware("h100"))
    lines = sorted(shape.y0 for shape in app.figure.layout.shapes)
    assert lines == pytest.approx([usable / 2**30, sim.get_hardware("h100").memory_bytes / 2**30])
    assert app.figure.layout.meta["totals"][0] > usable  # the bar over the line is the one that does not fit
    # the lines are named in the legend: written on them, a name had sat on a bar (and, under bars of
    # deepseek-v3's 10,000 GiB, on the other line's name)
    names = [t.name for t in app.figure.data]
    assert names[-2:] == ["fits below: 71.7 GiB usable", "h100 capacity 79.6 GiB"]
    # each bar says its total and its side of the line (ZeRO-3 of gpt3-13b at dp=8, 70.7 GiB, had sat
    # on the 71.7 GiB line with nothing to say which side): what fits says, not what the eye guesses
    totals, fits = app.figure.layout.meta["totals"], app.figure.layout.meta["fits"]
    assert list(fits) == [t <= usable for t in totals] and not fits[0]
    texts = [a.text for a in app.figure.layout.annotations]
    said = [f"{t / 2**30:.1f} GiB<br><b>{'fits' if ok else 'over'}</b>" for t, ok in zip(totals, fits)]
    assert texts == said
    assert [a.x for a in app.figure.layout.annotations] == list(app.figure.data[0].x)
    near = widgets.memory_explorer(model="gpt3-13b", hardware="h100", dp=8).figure
    zero3 = near.layout.annotations[-1]
    assert near.data[0].x[-1] == "ZeRO-3" and 70 < zero3.y < usable / 2**30
    assert zero3.text.endswith("fits</b>")
    app.controls["pp"].value = 1
    app.controls["model"].value = "tiny"  # megabytes: no line at 80 GiB to flatten the bars
    assert app.figure.layout.shapes == () and "MiB" in app.figure.layout.yaxis.title.text
    assert app.figure.layout.annotations == ()  # far below the line: the title says so once
    assert [t.name for t in app.figure.data] == ["params", "grads", "optimizer", "activations"]
    assert "far below the 71.7 GiB" in app.figure.layout.title.text


def test_the_memory_explorer_says_what_its_measured_runs_were():
    """Notebook 04's measured runs (tiny, 4 ranks, MiB) had sat under a gpt3-13b prediction titled
    "measured peak memory per rank" alone, their bars named ddp and zero3 beside "no ZeRO" and "ZeRO-3"."""
    from types import SimpleNamespace

    from paralab.config import RunConfig
    from paralab.sim.bridge import predict_memory
    from paralab.viz._common import fmt_bytes

    def run(strategy: str, zero: int, **kinds):
        cfg = RunConfig.build("tiny", strategy=strategy, world_size=2, global_batch=4)
        summary = {"strategy": strategy, "zero": zero, "world_size": 2, "model": "tiny", "micro_batch": 2,
                   "memory_by_kind": [kinds, kinds]}
        return SimpleNamespace(config=cfg, summary=summary)

    ddp = run("ddp", 0, params=100, grads=200, optimizer=200, activations=0)
    zero3 = run("zero3", 3, params=50, grads=60, optimizer=50, activations=80)
    app = widgets.memory_explorer(model="gpt3-13b", dp=64, measured={"ddp": ddp, "zero3": zero3})
    measured = app.measured_figure
    assert measured.layout.title.text == "measured: tiny, 2 ranks, micro-batch 2 - peak memory per rank (MiB)"
    assert list(dict.fromkeys(measured.data[0].x[0])) == ["no ZeRO", "ZeRO-3"]  # as the prediction names them
    note = app.measured_note.value
    assert "no ZeRO: after backward, gradients beside their bucket copies" in note  # none at its peak
    assert f"no ZeRO {fmt_bytes(predict_memory(ddp.config)['total'])} (measured 500 B)" in note
    assert f"ZeRO-3 {fmt_bytes(predict_memory(zero3.config)['total'])} (measured 240 B)" in note


def test_the_explorers_split_layers_that_do_not_divide_as_the_refusal_suggests():
    """40 layers on 16 stages had been refused with advice to give stage_layers, which neither widget
    can take; they now run the split the refusal suggested, and say so."""
    memory = widgets.memory_explorer(model="gpt3-13b", hardware="h100", dp=1, pp=16)
    assert memory.message.value == "" and len(memory.figure.layout.meta["totals"]) == 4
    assert "layers per stage 2 + 8 x 3 + 7 x 2" in memory.figure.layout.title.text
    scaling = widgets.scaling_explorer(model="gpt3-13b", hardware="h100", dim="pp", max_gpus=64)
    assert 16 in scaling.figure.layout.meta["predicted"]["world_size"]
    assert "pp=16 splits the layers 2 + 8 x 3 + 7 x 2" in scaling.message.value
    # the explorer has no virtual stages control: they are not named
    assert "pp=64: pp 64 does not divide 40 layers; no split" in scaling.message.value
    # a caller's split serves the other dimensions' sweeps; a pp sweep takes each depth's own
    from paralab.widgets.explorers import scaling_points

    kept, _ = scaling_points("gpt3-1.3b", "h100", "dp", 4, 512, base={"pp": 2, "stage_layers": (10, 14)})
    even, _ = scaling_points("gpt3-1.3b", "h100", "dp", 4, 512, base={"pp": 2})
    assert len(kept) == len(even) == 3 and kept[0]["step_time_s"] != even[0]["step_time_s"]
    deep, _ = scaling_points("gpt3-1.3b", "h100", "pp", 8, 512, base={"stage_layers": (12, 12)})
    assert [p["world_size"] for p in deep] == [1, 2, 4, 8]  # (12, 12) had refused every depth but 2


def test_the_levers_explorer_measures_the_kinds_at_the_peak_as_it_predicts_them(no_leftover_ranks,
                                                                                monkeypatch):
    """It had drawn each kind's own high-water mark of a one-step run: gradients the prediction's peak
    moment does not hold, and no optimizer states (the first step makes them after its backward)."""
    from paralab.runtime import worker

    monkeypatch.setattr(worker, "available_memory_bytes", lambda: 64 * 2**30)  # whatever this machine has
    app = widgets.levers_explorer(layers=2, hidden=64, seq=64, micro_batch=2)
    drawn = {t.name: t.y[0] for t in app.figure.data}
    assert "grads" not in drawn  # none at the peak: a kind no bar holds is not in the legend
    predicted = {k: drawn.get(k, 0) for k in ("params", "grads", "optimizer", "activations")}
    measured = app.measure()
    assert measured is not None and "at the moment of the run" in app.message.value
    assert measured["grads"] == predicted["grads"] == 0  # set to None before the peak
    for kind in ("params", "optimizer", "activations"):
        assert measured[kind] / 2**20 == pytest.approx(predicted[kind], rel=0.05), kind


def test_the_levers_explorer_does_not_start_a_run_this_machine_cannot_hold(monkeypatch):
    from paralab.runtime import launch, worker

    monkeypatch.setattr(worker, "available_memory_bytes", lambda: 2 * 2**30)  # a Binder box's 2 GB
    monkeypatch.setattr(launch, "launch", lambda cfg: pytest.fail("a run was started"))
    app = widgets.levers_explorer()
    for name, value in (("layers", 4), ("hidden", 256), ("seq", 1024), ("micro_batch", 4)):
        app.controls[name].value = value
    from paralab.sim.bridge import predict_memory
    from paralab.widgets.levers import run_config, too_big_to_measure

    sdpa = predict_memory(run_config({name: control.value for name, control in app.controls.items()}))
    assert not too_big_to_measure(sdpa)  # the fused kernel's run would be measured
    app.controls["attention"].value = "math"  # its s x s scores, 4 sequences of 1,024 tokens a layer
    assert app.measure() is None and "not measured" in app.message.value
    assert app.message.value.count("use sdpa attention") == 1  # offered where the run has math
    assert "use sdpa" not in too_big_to_measure({k: 2**40 for k in sdpa}, "sdpa")  # not where it has it


def test_comm_explorer_views_and_calculator():
    """A bare trace: the measured views (per rank and step; all ranks by step) and the calculator."""
    t = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1000, payload_bytes=750, group_size=4, step=0)
                     for r in range(4)], meta={"world_size": 4})
    app = widgets.comm_explorer(t)
    assert list(app.figure.data[0].y) == [1000]
    app.controls["payload"].value = True
    assert list(app.figure.data[0].y) == [750]
    app.controls["view"].value = "by step"
    assert app.figure.data[0].customdata[0][1] == 3000  # exact bytes (the axis is in KiB)
    app.controls["view"].value = "rank matrix"
    assert app.figure.data[0].type == "heatmap" and app.figure.layout.meta["measured, 4 ranks"]["ranks"] == 4
    before = list(app.calculator.data[0].y)
    app.controls["op"].value = "all_gather"
    assert list(app.calculator.data[0].y) == pytest.approx([b / 2 for b in before])
    # in MiB, said on the axis: a ring all-gather of 100 MiB over 2 ranks sends half of it
    assert app.calculator.data[0].y[0] == pytest.approx(50)
    assert app.calculator.layout.yaxis.title.text == "MiB"
    # group sizes are whole: ticks at those drawn only (a lone group of 2 had had 0.25, 0.5 and 1 beside it)
    app.controls["max_group"].value = 2
    assert app.calculator.data[0].x == ("2",) and list(app.calculator.layout.xaxis2.tickvals) == [2]
    app.controls["max_group"].value = 8
    assert list(app.calculator.layout.xaxis2.tickvals) == [2, 4, 8]


def browser_layout(fw):
    """The layout the browser holds of FigureWidget ``fw`` from now on, as a model of plotly.js's
    relayout: each relayout the widget sends applied path by path, an object replacing what the path
    held, a None deleting it (as Chromium's plotly.js does: test_browser replays the same switches
    there; in-place updates, sent as restyle and update messages, are not modelled)."""
    shown = json.loads(json.dumps(fw.layout.to_plotly_json()))

    def relayout(change):
        for path, value in (change["new"] or {}).get("relayout_data", {}).items():
            *parents, leaf = path.split(".")
            node = shown
            for key in parents:
                node = node.setdefault(key, {})
            if value is None:
                node.pop(leaf, None)
            else:
                node[leaf] = json.loads(json.dumps(value))

    fw.observe(relayout, names="_py2js_relayout")
    return shown


def test_a_view_drawn_after_another_kind_shows_none_of_its_layout():
    """The rank matrix's panels (their domains, second and third axes, "to rank" title) had stayed in
    the browser after switching back to the bars: plotly.js merges a new layout into the one it shows.
    What the old layout set and the new one does not is cleared, so the browser shows the new one."""
    t = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1000, payload_bytes=750, group_size=4, step=0)
                     for r in range(4)], meta={"world_size": 4})
    app = widgets.comm_explorer(t)
    shown = browser_layout(app.figure)
    for view in ("rank matrix", "by op", "rank matrix", "intra vs inter", "by step"):
        app.controls["view"].value = view
        drawn = json.loads(json.dumps(app.figure.layout.to_plotly_json()))
        held = {key: value for key, value in shown.items() if value != {}}  # an axis emptied: its defaults
        assert {**held, "meta": None} == {**drawn, "meta": None}, view  # meta: data, not drawn
    assert "xaxis2" not in shown and "domain" not in shown.get("xaxis", {})


def calculator_curve(app, name: str) -> list[float]:
    return list(next(t for t in app.calculator.data if t.name.startswith(name)).y)


def test_the_calculator_prices_the_ring_its_title_names_and_says_where_nccls_tree_takes_over():
    """Its "one rank per node" curve had been the cost model's pick, the faster of ring and tree: 0.20
    ms at 1,024 ranks where the ring takes 20.46, and 8 ranks across nodes faster than 8 inside one."""
    from paralab.collectives import ring_time
    from paralab.sim.hardware import get_hardware

    app = widgets.comm_explorer()
    for name, value in (("op", "all_reduce"), ("size_mb", 0.01), ("max_group", 1024), ("hardware", "h100")):
        app.controls[name].value = value
    h100, payload = get_hardware("h100"), app.controls["size_mb"].value * 2**20
    groups = [2**k for k in range(1, 11)]
    assert calculator_curve(app, "one rank per node") == pytest.approx(
        [ring_time("all_reduce", payload, n, h100.inter_latency, h100.inter_bw) * 1e3 for n in groups])
    # inside a node as far as a node reaches (8 GPUs): held flat beyond, it had read as 64 ranks in one
    inside = [ring_time("all_reduce", payload, n, h100.intra_latency, h100.intra_bw) for n in groups[:3]]
    assert calculator_curve(app, "inside a node (up to 8 GPUs)") == pytest.approx([t * 1e3 for t in inside])
    assert calculator_curve(app, "one rank per node")[2] > calculator_curve(app, "inside a node")[2]
    note = app.calculator.layout.annotations[-1].text
    assert "across nodes NCCL's tree beats this ring from 4 ranks on" in note
    app.controls["size_mb"].value, app.controls["max_group"].value = 1000.0, 8  # bandwidth-bound
    assert "this ring beats NCCL's tree at every group shown" in app.calculator.layout.annotations[-1].text
    app.controls["op"].value = "all_gather"  # no tree: nothing to say
    assert not any("tree" in (a.text or "") for a in app.calculator.layout.annotations)


def test_the_calculator_reads_its_size_and_bytes_in_binary_units():
    """0.0123 MiB had been titled "0.01 MiB", and 10,000 MiB's bars read "20k" MiB on their axis."""
    app = widgets.comm_explorer()
    app.controls["size_mb"].value = 0.0123
    assert app.calculator.layout.title.text == "ring all_reduce of 12.6 KiB on h100"
    app.controls["size_mb"].value, app.controls["max_group"].value = 10000.0, 1024
    assert app.calculator.layout.yaxis.title.text == "GiB"
    assert max(app.calculator.data[0].y) == pytest.approx(2 * 1023 / 1024 * 10000 / 1024)
    assert app.calculator.layout.title.text == "ring all_reduce of 9.77 GiB on h100"


def test_the_comm_explorer_disables_what_the_by_step_view_does_not_draw():
    """In "by step" (the run alone) the grown run's sliders had looked live, and tp 8 had printed a
    refusal of a prediction that view does not draw, headed "SpecError:"."""
    from types import SimpleNamespace

    from paralab.config import RunConfig
    from paralab.trace import COMM

    grown_run = ("world_size", "tp", "pp", "gpus_per_node", "model")
    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, global_batch=8)
    spans = [Span(r, COMM, "all_reduce", 0.0, 1.0, step=0, bytes=8, group_size=4) for r in range(4)]
    app = widgets.comm_explorer(SimpleNamespace(config=cfg, trace=Trace(spans=spans)), world_size=16)
    app.controls["tp"].value = 8
    assert "tp 8 does not divide the 4 attention heads" in app.message.value
    assert "SpecError" not in app.message.value
    app.controls["view"].value = "by step"
    assert app.message.value == "" and list(app.sources()) == ["measured, 4 ranks"]
    assert all(app.controls[name].disabled for name in grown_run)
    assert not app.controls["payload"].disabled  # it still applies
    app.controls["view"].value = "rank matrix"
    assert not any(app.controls[name].disabled for name in grown_run)
    assert "tp 8 does not divide" in app.message.value


def ddp_stand_in(world_size: int = 4, model="tiny"):
    """A ddp run of ``model`` as the comm explorer reads it: its config and a traced all-reduce."""
    from types import SimpleNamespace

    from paralab.config import RunConfig

    cfg = RunConfig.build(model, strategy="ddp", world_size=world_size, global_batch=8)
    spans = [Span(r, "comm", "all_reduce", 0.0, 1.0, step=0, bytes=8, group_size=world_size)
             for r in range(world_size)]
    return SimpleNamespace(config=cfg, trace=Trace(spans=spans))


def test_the_comm_explorers_what_if_at_the_runs_own_size_keeps_its_own_bar_and_panel():
    """At the run's own size the sliders' prediction had been named as the run's ("predicted, 4
    ranks"): one bar of both stacked (2.50 MiB, each 1.25), two matrix panels of one title."""
    app = widgets.comm_explorer(ddp_stand_in(4), hardware="h100", world_size=16, gpus_per_node=8)
    app.controls["view"].value = "intra vs inter"
    app.controls["world_size"].value = 4
    measured, predicted, what_if = app.sources()
    assert what_if.startswith("what if, 4 ranks (4 dp x 1 tp x 1 pp")
    inside = next(t for t in app.figure.data if t.name == "inside a node")
    assert list(inside.x) == ["measured, 4 ranks", "predicted, 4 ranks", "what if, 4 ranks"]
    app.controls["view"].value = "rank matrix"
    titles = [a.text for a in app.figure.layout.annotations[:3]]
    assert titles == ["measured, 4 ranks", "predicted, 4 ranks", "what if, 4 ranks"]


def test_the_comm_explorers_what_if_says_a_custom_shape_as_the_runs_model():
    """A run of a shape of its own is named "custom" (RunConfig.build): its what-if had read "custom in
    fp32", which the notebook never explains."""
    from paralab.config import MODEL_PRESETS

    shape = dataclasses.asdict(dataclasses.replace(MODEL_PRESETS["tiny"], layers=3))  # no preset's shape
    app = widgets.comm_explorer(ddp_stand_in(4, model=shape), hardware="h100", world_size=8, gpus_per_node=8)
    what_if = list(app.sources())[-1]
    assert "the run's model in fp32" in what_if and "custom" not in what_if, what_if


def test_predicted_comm_follows_the_cost_model_on_the_mesh():
    """Every rank carries the cost model's bytes per family for its pipeline stage, on its own mesh
    group (the first stage's gradients include the position embedding, the last's the final norm);
    with 2 GPUs per node the tp pairs stay inside a node and the dp and pipeline traffic crosses, and
    so does the tied embedding's all-reduce between the two stages (GPT-3 ties it); each stage gathers
    what it receives over its tp pair (Megatron-LM's scatter/gather)."""
    from paralab.layout import mesh_layout
    from paralab.sim import counting
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm_compare import links_per_rank_step, predicted_comm_trace

    model, spec = get_model("gpt3-1.3b"), ParallelSpec(dp=2, tp=2, pp=2, global_batch=8, microbatches=4)
    trace = predicted_comm_trace(model, spec, gpus_per_node=2)
    layout = mesh_layout(dp=2, tp=2, pp=2)
    by_stage = [counting.wire_bytes_by_key(counting.comm_payloads(model, spec, stage)) for stage in (0, 1)]
    assert by_stage[0]["dp_all_reduce"] > by_stage[1]["dp_all_reduce"]
    assert counting.comm_bytes_per_gpu(model, spec) == by_stage[0]  # the busier stage's
    for rank in range(8):
        spans, counted = trace.select(rank=rank), by_stage[layout.coord(rank)["pp"]]
        for family, axis in (("tp", "tp"), ("dp", "dp"), ("embedding", "pp")):
            mine = [s for s in spans if s.name == f"{family} all_reduce"]
            assert sum(s.bytes for s in mine) == pytest.approx(counted[f"{family}_all_reduce"], abs=1)
            assert all(s.group_ranks == layout.group_of(axis, rank) for s in mine)
            assert all(s.inter_node == (family != "tp") for s in mine)
        sends = [s for s in spans if s.kind == "send"]
        assert [s.peer for s in sends] == [r for r in (rank + 4, rank - 4) if 0 <= r < 8]
        assert all(s.inter_node for s in sends)
        assert sum(s.bytes for s in sends) == pytest.approx(counted["pp_send"], abs=1)  # one way each
        # each t-th sent is gathered whole again on the receiving stage's tp pair, inside its node
        (gather,) = [s for s in spans if s.name == "pp all_gather"]
        assert gather.group_ranks == layout.group_of("tp", rank) and not gather.inter_node
        assert gather.bytes == pytest.approx(counted["pp_all_gather"], abs=1)
    crossing = [c["dp_all_reduce"] + c["embedding_all_reduce"] + c["pp_send"] for c in by_stage]
    assert links_per_rank_step(trace)["inter_node"] == pytest.approx(sum(crossing) / 2, rel=1e-6)


@pytest.mark.parametrize("rank_order", RANK_ORDERS)
def test_predicted_comm_numbers_ranks_as_the_spec_orders_them(rank_order):
    """Llama 3's tp, pp, dp order puts a pipeline's stages on one node and spreads each dp group
    across nodes: the predicted trace's groups, peers and inter-node flags follow the spec's order, as
    the cost model prices them (it had laid every spec out in the lab's tp, dp, pp order)."""
    from paralab.sim import cost
    from paralab.sim.hardware import get_hardware
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm_compare import predicted_comm_trace

    spec = ParallelSpec(dp=2, tp=2, pp=2, global_batch=8, microbatches=4, rank_order=rank_order)
    hw = dataclasses.replace(get_hardware("h100"), gpus_per_node=4)
    trace = predicted_comm_trace(get_model("llama3-8b"), spec, gpus_per_node=hw.gpus_per_node)
    apart = {axis: spec.stride(axis) for axis in ("tp", "dp", "pp")}
    for family, axis, size in (("tp", "tp", spec.tp), ("dp", "dp", spec.dp)):
        spans = [s for s in trace.select(lane="comm") if s.name == f"{family} all_reduce"]
        assert spans and all(s.group_ranks[1] - s.group_ranks[0] == apart[axis] for s in spans)
        assert {s.inter_node for s in spans} == {cost.crosses_nodes(hw, size, apart[axis])}
    sends = [s for s in trace.select(lane="comm") if s.kind == "send"]
    assert sends and all(abs(s.peer - s.rank) == apart["pp"] for s in sends)
    assert {s.inter_node for s in sends} == {cost.crosses_nodes(hw, spec.pp, apart["pp"])}
    assert {s.inter_node for s in sends} == {rank_order == "tp-dp-pp"}  # 4 apart across, 2 apart inside


@pytest.mark.parametrize("mode", ["ring", "alltoall"])
def test_predicted_comm_puts_context_parallel_traffic_on_the_cp_groups(mode):
    """A cp run's prediction is the slice run's traffic (gradients over dp and cp together) and the
    ring's hops to the next cp rank, or the all-to-alls on the cp group, with the bytes the cost model
    counts (paralab.sim.context)."""
    from paralab.comm import ring_next
    from paralab.layout import mesh_layout
    from paralab.sim import context, counting
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm_compare import predicted_comm_trace

    model = get_model("llama3-8b").replace(seq=8192)
    spec = ParallelSpec(dp=2, cp=2, tp=2, global_batch=4, micro_batch=1, cp_mode=mode)
    trace = predicted_comm_trace(model, spec, gpus_per_node=4)
    layout = mesh_layout(dp=2, cp=2, tp=2)
    cp_bytes = context.comm_bytes_per_gpu(model, spec)
    gradients = counting.comm_bytes_per_gpu(*context.slice_run(model, spec))["dp_all_reduce"]
    op = "send" if mode == "ring" else "all_to_all"
    for rank in range(8):
        cp_group = layout.group_of("cp", rank)
        mine = [s for s in trace.select(rank=rank) if s.name == f"cp {op}"]
        assert sum(s.bytes for s in mine) == pytest.approx(cp_bytes[f"cp_{op}"], abs=len(mine))
        if mode == "ring":
            assert {s.peer for s in mine} == {ring_next(rank, cp_group)} and len(cp_group) == 2
        else:
            assert len(mine) == 4 and all(s.group_ranks == cp_group for s in mine)
        (reduce,) = [s for s in trace.select(rank=rank) if s.name == "dp all_reduce"]
        assert reduce.bytes == pytest.approx(gradients, abs=1)
        assert next(g for g in layout.groups("dp", "cp") if rank in g) == reduce.group_ranks
    assert trace.meta["cp"] == 2 and trace.meta["world_size"] == 8


def test_predicted_comm_puts_the_experts_all_to_alls_on_the_expert_groups():
    from paralab.layout import mesh_layout
    from paralab.sim import counting
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm_compare import predicted_comm_trace
    from paralab.widgets.explorers import _mesh_text

    model, spec = get_model("mixtral-8x7b"), ParallelSpec(dp=4, ep=2, global_batch=8, micro_batch=1)
    trace = predicted_comm_trace(model, spec)
    layout, counted = mesh_layout(dp=4, ep=2), counting.comm_bytes_per_gpu(model, spec)
    for rank in range(4):
        expert_group = next(g for g in layout.expert_groups() if rank in g)
        (a2a,) = [s for s in trace.select(rank=rank) if s.name == "ep all_to_all"]
        assert a2a.bytes == pytest.approx(counted["ep_all_to_all"], abs=1)
        assert a2a.group_ranks == expert_group == [rank - rank % 2, rank - rank % 2 + 1]
        reduces = {len(s.group_ranks or range(4)) for s in trace.select(rank=rank) if s.kind == "all_reduce"}
        assert reduces == {4, 2}  # replicated parameters over dp, experts over the ranks that hold them
    assert _mesh_text(trace.meta) == "4 dp x 1 tp x 1 pp, ep 2"  # what the explorer's label says


def test_the_comm_explorer_offers_an_expert_parallel_run_only_models_with_experts():
    """Every dense preset had been offered to an ep run, and each one refused."""
    from paralab.config import RunConfig
    from paralab.sim.presets import get_model
    from paralab.widgets.explorers import _RunPredictor

    ep = _RunPredictor(RunConfig.build("tiny-moe", strategy="ep", world_size=4, ep=2, global_batch=8))
    offered = ep.models()
    assert offered[0] == "tiny-moe" and "mixtral-8x7b" in offered and "gpt3-1.3b" not in offered
    assert all(ep.model_spec(name).experts for name in offered)
    dense = _RunPredictor(RunConfig.build("tiny", strategy="ddp", world_size=2, global_batch=8)).models()
    assert "gpt3-1.3b" in dense and "mixtral-8x7b" in dense and get_model("gpt3-1.3b").experts == 0


def test_the_comm_explorer_refuses_a_grown_run_its_expert_parallel_cannot_shard_over():
    """ep 2 over dp 1 (world size 2 at tp 2) had gone to ep 1 in silence, its all-to-alls with it."""
    from paralab.config import RunConfig
    from paralab.sim.specs import SpecError
    from paralab.widgets.explorers import _RunPredictor

    ep = _RunPredictor(RunConfig.build("tiny-moe", strategy="ep", world_size=4, ep=2, global_batch=8))
    with pytest.raises(SpecError, match=r"the run's ep 2 shards experts over data-parallel ranks: dp 1 "):
        ep.grown("tiny-moe", world_size=2, tp=2, pp=1, gpus_per_node=8)
    assert ep.grown("tiny-moe", world_size=4, tp=1, pp=1, gpus_per_node=8).select(kind="all_to_all")


def test_a_ring_run_and_its_prediction_send_the_same_cp_bytes(no_leftover_ranks):
    import paralab

    run = paralab.run("cp", 2, steps=2, global_batch=4, cp_mode="ring",
                      model=dict(layers=2, hidden=32, heads=4, vocab=64, seq_len=64))
    app = widgets.comm_explorer(run, world_size=8)
    measured, same, grown = app.sources()
    sent = app.figure.layout.meta["bytes"]
    assert sent[measured]["send"] == sent[same]["send"] == run.summary["comm_bytes"]["send"] / 2
    assert "4 dp x 2 cp x 1 tp" in grown and sent[grown]["send"] == sent[same]["send"]
    # a start the cost model refuses (3 ranks for a cp of 2) is said, not raised
    odd = widgets.comm_explorer(run, world_size=3)
    assert "not a multiple" in odd.message.value and set(odd.figure.layout.meta["bytes"]) == {measured, same}
    assert "tp x pp x cp (the run&#x27;s) = 2" in odd.message.value  # the run's cp, which has no control


def test_comm_explorer_puts_the_run_beside_its_prediction_and_grows_it(no_leftover_ranks):
    import paralab

    run = paralab.run("ddp", 2, steps=2, global_batch=8)
    app = widgets.comm_explorer(run, world_size=16, gpus_per_node=4)
    measured, same, grown = app.sources()
    meta = app.figure.layout.meta["bytes"]
    assert (meta[measured] == meta[same]
            == {"all_reduce": pytest.approx(run.summary["comm_bytes"]["all_reduce"] / 2)})
    assert meta[grown]["all_reduce"] == pytest.approx(meta[same]["all_reduce"] * (2 * 15 / 16) / (2 * 1 / 2))
    app.controls["view"].value = "intra vs inter"
    links = app.figure.layout.meta["bytes"]
    assert links[measured]["inter_node"] == 0 and links[grown]["inter_node"] > 0  # 16 ranks on 4 nodes
    app.controls["tp"].value = 8  # the tiny model has 4 heads: refused, the rest still drawn
    assert "tp 8 does not divide the 4 attention heads" in app.message.value
    assert app.figure.layout.meta["bytes"] == {k: v for k, v in links.items() if k != grown}
    # the other controls still answer (a refusal had frozen the view and the calculator)
    app.controls["view"].value = "by op"
    assert set(app.figure.layout.meta["bytes"]) == {measured, same}
    app.controls["op"].value = "all_gather"
    assert "all_gather" in app.calculator.layout.title.text
    app.controls["tp"].value = 2
    assert app.message.value == "" and "8 dp x 2 tp" in list(app.sources())[2]
    app.controls["pp"].value = 16  # at cp 1 the refusal names no cp (there is no cp control)
    assert "world size 16 is not a multiple of tp x pp = 32" in app.message.value
    app.controls["pp"].value = 1
    # a what-if model sending GiB beside the run's KiB: the bars by op on a log axis, where the measured
    # and predicted ones had shrunk to nothing
    assert app.figure.layout.yaxis.type == "linear"
    app.controls["model"].value = "gpt3-175b"
    assert app.figure.layout.yaxis.type == "log" and "(log scale)" in app.figure.layout.yaxis.title.text
    app.controls["model"].value = "tiny"  # and back: linear, with no log range left behind
    assert app.figure.layout.yaxis.type == "linear" and app.figure.layout.yaxis.range is None
    # the links view too, its bars side by side there (stacked heights mislead on a log axis)
    app.controls["view"].value = "intra vs inter"
    app.controls["model"].value = "gpt3-175b"
    assert (app.figure.layout.yaxis.type, app.figure.layout.barmode) == ("log", "group")
    app.controls["model"].value = "tiny"
    assert (app.figure.layout.yaxis.type, app.figure.layout.barmode) == ("linear", "stack")
    # a start that is not a power of two (a machine of 6 GPUs: 4 x 6) is one of the slider's stops
    assert widgets.comm_explorer(run, world_size=24).controls["world_size"].value == 24


def test_the_comm_explorers_what_if_splits_layers_a_depth_does_not_divide():
    """126 layers on 4 stages had been refused with "give stage_layers", for which this explorer has no
    control; it splits them as the scaling and memory explorers do."""
    app = widgets.comm_explorer(ddp_stand_in(4), hardware="h100", world_size=16, gpus_per_node=8)
    app.controls["pp"].value = 4
    app.controls["model"].value = "llama3-405b"
    assert app.message.value == ""
    assert list(app.sources())[2].startswith("what if, 16 ranks (4 dp x 1 tp x 4 pp, llama3-405b")


def test_speedup_explorer_draws_runs_prediction_and_ideals(monkeypatch, no_leftover_ranks):
    """Measured step by step and against world size; the prediction follows the controls. (The
    measuring machine is priced as an A100 here, so the test never calibrates this one.)"""
    import paralab
    from paralab.widgets import speedup

    monkeypatch.setattr(speedup, "this_machine", lambda: "a100")
    common = dict(steps=3, global_batch=8, threads_per_rank=1)
    runs = {1: paralab.run("single", 1, **common), 2: paralab.run("ddp", 2, **common)}
    app = widgets.speedup_explorer(runs, max_world=8)
    assert app.controls["max_world"].description == "up to (ranks)"  # it had not said what it counts
    meta = app.figure.layout.meta
    assert meta["runs"][2]["step_time_s"] == runs[2].trace.step_times()
    assert (meta["measured"][2]
            == pytest.approx(runs[1].trace.median_step_time() / runs[2].trace.median_step_time()))
    assert sorted(meta["predicted"]) == [1, 2, 4, 8] and "ideal_here" not in meta  # priced as GPUs
    before = dict(meta["predicted"])
    app.controls["model"].value = "medium"
    assert app.figure.layout.meta["predicted"] != before
    app.controls["max_world"].value = 16  # the global batch of 8 does not split over 16 ranks
    assert sorted(app.figure.layout.meta["predicted"]) == [1, 2, 4, 8] and "16 ranks" in app.message.value
    assert_marks_what_it_refuses(app, monkeypatch, speedup, "predicted_curve", ("dtype", "bf16"),
                                 ("dtype", "fp32"))


def assert_marks_what_it_refuses(app, monkeypatch, module, name: str, refused: tuple, drawn: tuple) -> None:
    """An explorer whose ``module.name`` fails for a setting keeps its figure, headed "not redrawn",
    and says why; the next setting that draws clears the mark."""
    real = getattr(module, name)

    def failing(*args, **kwargs):
        if app.controls[refused[0]].value == refused[1]:
            raise RuntimeError("the cost model failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, failing)
    app.controls[refused[0]].value = refused[1]
    assert app.figure.layout.title.text.startswith(NOT_REDRAWN)
    assert "the cost model failed" in app.message.value
    app.controls[drawn[0]].value = drawn[1]
    assert not app.figure.layout.title.text.startswith(NOT_REDRAWN)


def test_the_predicted_speedup_grows_a_hybrid_run_along_dp():
    """tp and pp kept, dp filled from the world size, two ranks per node kept; one rank is the single
    device; a size the batch cannot split is left out with the reason."""
    from paralab import RunConfig
    from paralab.layout import resolve_layout
    from paralab.sim.bridge import predict_run
    from paralab.widgets.speedup import _config_at, predicted_curve

    cfg = RunConfig.build("tiny", strategy="hybrid", world_size=4, dp=2, tp=2, pp=1, microbatches=2, nodes=2,
                          global_batch=8)
    points, skipped = predicted_curve(cfg, "tiny", "a100", "fp32", 16)
    assert [p["world_size"] for p in points] == [1, 2, 4, 8]
    assert points[2]["step_time_s"] == pytest.approx(predict_run(cfg, "a100").step_time_s)
    shapes = {n: resolve_layout(_config_at(cfg, n, "tiny", "fp32")) for n in (1, 2, 8)}
    assert shapes[1].strategy == "single" and shapes[1].world_size == 1
    assert [(s.dp, s.tp, s.pp, s.nodes) for s in (shapes[2], shapes[8])] == [(1, 2, 1, 1), (4, 2, 1, 4)]
    assert len(skipped) == 1 and skipped[0].startswith("16 ranks: global batch 8")


def test_the_cores_bound_what_cpu_ranks_can_speed_up(monkeypatch):
    from paralab import RunConfig
    from paralab.runtime import worker
    from paralab.widgets.speedup import machine_allows

    monkeypatch.setattr(worker, "usable_cores", lambda: 2)
    one_thread = RunConfig.build("tiny", strategy="ddp", threads_per_rank=1)
    assert machine_allows(one_thread, [1, 2, 4, 8]) == {1: 1.0, 2: 2.0, 4: 2.0, 8: 2.0}
    fair_share = RunConfig.build("tiny", strategy="ddp")  # one rank takes both cores: nothing to gain
    assert machine_allows(fair_share, [1, 2, 4]) == {1: 1.0, 2: 1.0, 4: 1.0}


def test_elastic_monitor_updates_as_samples_arrive():
    def step(k, ranks, t):
        return [Span(r, "step", "step", t, t + 0.5, step=k) for r in range(ranks)]

    app = widgets.elastic_monitor()
    app.push(counters=[Counter(0, "world_size", 0.5, 4), Counter(0, "world_size", 1.5, 4)],
             spans=step(0, 4, 0.0) + step(1, 4, 1.0))
    ws = next(t for t in app.figure.data if t.name == "world size")
    assert list(ws.y) == [4, 4]
    app.push(counters=[Counter(0, "world_size", 2.5, 3)],
             spans=[Span(3, "event", "failure", 1.7, 1.7, name="r3")] + step(2, 3, 2.0))
    ws = next(t for t in app.figure.data if t.name == "world size")
    assert [y for y in ws.y if y is not None] == [4, 4, 3]
    assert None in ws.y, "no line across the failure"
    assert "world size 3" in app.status.value and "failure" in app.status.value
    assert "failure" in [label for label, _, _ in app.figure.layout.meta["phases"]]


def test_the_elastic_monitor_pushes_into_its_own_copy_not_the_callers_trace():
    """update(run) had kept the run's own trace, so every later push grew the student's RunResult."""
    given = Trace(spans=[Span(0, "step", "step", 0.0, 0.5, step=0)],
                  counters=[Counter(0, "world_size", 0.2, 1)])
    opened, updated = widgets.elastic_monitor(given), widgets.elastic_monitor()
    updated.update(given)
    for app in (opened, updated):
        app.push(counters=[Counter(0, "world_size", 1.0, 1)],
                 spans=[Span(0, "step", "step", 1.0, 1.5, step=1)])
        assert len(given.spans) == 1 and len(given.counters) == 1 and len(app.trace.spans) == 2


def test_the_elastic_monitor_tells_apart_the_worlds_of_samples_pushed_without_the_runs_history():
    """Pushed as its docstring says (spans, no meta), a run of 2 steps at 3 ranks, a kill and 2 steps at 2
    had stopped at "detected" and read "training at 3 ranks throughout"."""
    def steps(first: int, ranks: int, t0: float) -> list[Span]:
        return [Span(r, "step", "step", t0 + 0.1 * i, t0 + 0.1 * i + 0.05, step=first + i)
                for i in range(2) for r in range(ranks)]

    def event(rank: int, kind: str, start: float, end: float, name: str = "") -> Span:
        return Span(rank, "event", kind, start, end, name=name)

    def rendezvous(ranks: int, start: float, end: float) -> list[Span]:
        return [event(r, "rendezvous", start, end, f"rendezvous: world of {ranks}") for r in range(ranks)]

    app = widgets.elastic_monitor()
    app.push(spans=rendezvous(3, -0.5, 0.0) + steps(0, 3, 1.0))
    app.push(spans=[event(2, "failure", 1.3, 1.3, "SIGKILL"), event(0, "failure_detected", 1.35, 1.35),
                    event(0, "worker_start", 5.0, 7.0), event(1, "worker_start", 5.0, 7.1),
                    *rendezvous(2, 7.0, 7.5), *steps(2, 2, 8.0)])
    phases = app.figure.layout.meta["phases"]
    assert [label for label, _, _ in phases] == ["start", "training at 3 ranks", "failure", "detected",
                                                  "rendezvous", "restore", "training at 2 ranks"]
    assert phases[4][1:] == pytest.approx((1.35, 5.0)) and phases[5][1:] == pytest.approx((5.0, 8.0))
    assert app.figure.layout.meta["world_size"] == [3, 3, 2, 2]
    assert "then <b>training at 2 ranks</b>" in app.figure.layout.annotations[-1].text


def test_elastic_monitor_counts_steps_not_samples():
    """Without step spans the steps are read from step_time_s samples: one per rank and step."""
    app = widgets.elastic_monitor()
    app.push(counters=[Counter(rank, "step_time_s", k + 0.01 * rank, 0.5)
                       for k in range(3) for rank in range(3)])
    assert "3 steps" in app.status.value


def test_the_elastic_monitor_draws_the_steps_its_samples_time_and_counts_them_in_words():
    """Samples alone (step_time_s, one per rank and step) had been counted in the status line, "4 steps",
    over a figure that said "no step recorded"; one step had read "1 steps"; a NaN world size had raised."""
    app = widgets.elastic_monitor()
    app.push(counters=[Counter(rank, "step_time_s", 1.0 + k + 0.01 * rank, 0.5) for k in range(4)
                       for rank in range(2)])
    assert app.figure.layout.meta["steps"] == [0, 1, 2, 3] and app.figure.layout.meta["world_size"] == [2] * 4
    assert not any("no step recorded" in (a.text or "") for a in app.figure.layout.annotations)
    # a node that joins for steps 2 and 3 is in those steps, not the first two; a NaN time is no step
    late = [Counter(0, "step_time_s", t, 0.5) for t in (1.0, 2.0, 3.0, 4.0)]
    late += [Counter(1, "step_time_s", t, 0.5) for t in (3.01, 4.01, 5.0)]
    late[-1].value = float("nan")
    app.update(Trace(counters=late))
    assert app.figure.layout.meta["world_size"] == [1, 1, 2, 2] and ">4 steps<" in app.status.value
    one = widgets.elastic_monitor()
    one.push(counters=[Counter(0, "world_size", 0.1, float("nan"))],
             spans=[Span(0, "step", "step", 0, 0.5, step=0)])
    assert ">1 step<" in one.status.value, one.status.value


def test_the_comm_explorer_predicts_a_hierarchical_run_in_its_three_steps_and_grown():
    """Beside a hierarchical run the prediction is its reduce-scatter, all-reduce and all-gather; grown
    to 8 ranks of 4 a node it stays hierarchical over the new nodes, and where one node holds every
    rank it is the flat all-reduce those steps add up to."""
    from types import SimpleNamespace

    from paralab.config import RunConfig
    from paralab.trace import COMM, Span, Trace
    from paralab.viz.comm_compare import per_rank_step

    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, nodes=2, hierarchical=True, global_batch=8)
    spans = [Span(r, COMM, "all_reduce", 0.0, 1.0, step=0, bytes=8, group_size=2) for r in range(4)]
    app = widgets.comm_explorer(SimpleNamespace(config=cfg, trace=Trace(spans=spans)), world_size=8,
                                gpus_per_node=4)
    (_, same), (grown_label, grown) = list(app.sources().items())[1:]
    three_steps = {"reduce_scatter", "all_reduce", "all_gather"}
    assert set(per_rank_step(same)) == set(per_rank_step(grown)) == three_steps
    assert "tiny in fp32" in grown_label  # the grown model keeps the run's dtype, and says so
    assert "hierarchical all-reduce" in grown_label
    app.controls["gpus_per_node"].value = 8
    (one_node_label, one_node), = list(app.sources().items())[2:]
    assert set(per_rank_step(one_node)) == {"all_reduce"} and "hierarchical" not in one_node_label


def test_the_comm_explorer_says_when_a_run_traced_no_collective():
    """torch's own strategies run their collectives inside torch: their measured bars are empty, and
    without a word the prediction beside them read as unmatched."""
    from types import SimpleNamespace

    from paralab.config import RunConfig
    from paralab.trace import COMPUTE, Span, Trace

    cfg = RunConfig.build("tiny", strategy="torch_ddp", world_size=2, global_batch=8)
    trace = Trace(spans=[Span(r, COMPUTE, "forward", 0.0, 1.0, step=0) for r in range(2)],
                  meta={"strategy": "torch_ddp"})
    app = widgets.comm_explorer(SimpleNamespace(config=cfg, trace=trace))
    assert "torch_ddp traced no collective" in app.message.value
    app.redraw()
    assert "traced no collective" in app.message.value  # kept past a redraw
    # one rank has no peer: its reason is that, not torch's sight (which it had been told)
    single = RunConfig.build("tiny", strategy="single", world_size=1, global_batch=8)
    alone = Trace(spans=[Span(0, COMPUTE, "forward", 0.0, 1.0, step=0)], meta={"strategy": "single"})
    app = widgets.comm_explorer(SimpleNamespace(config=single, trace=alone))
    assert "single traced no collective (one rank has no peer to send to)" in app.message.value


@pytest.mark.parametrize("make, message", [
    # traitlets had said only "Invalid selection: value not found", naming neither argument nor choices
    (lambda: widgets.scaling_explorer(model="x"), "model='x' is not one of this explorer's choices: gpt3-"),
    (lambda: widgets.scaling_explorer(dim="zz"), "dim='zz' is not one of this explorer's choices: dp, tp"),
    (lambda: widgets.scaling_explorer(max_gpus=0), "max_gpus=0 is not one of this explorer's choices: 2, 4"),
    (lambda: widgets.memory_explorer(tp=3), "tp=3 is not one of this explorer's choices: 1, 2, 4, 8, 16"),
    (lambda: widgets.levers_explorer(dtype="fp8"), "dtype='fp8' is not one of this explorer's choices"),
    (lambda: widgets.pipeline_explorer(schedule="bogus"), "schedule='bogus' is not one of this explorer's"),
    # a slider had clamped these without a word, or a size of 0 divided by zero
    (lambda: widgets.pipeline_explorer(stages=0), "stages must be a whole number from 2 to 64, got 0"),
    (lambda: widgets.pipeline_explorer(p2p=-1.0), "p2p must be a number from 0 to 2, got -1.0"),
    (lambda: widgets.pipeline_explorer(stages=3.5), "stages must be a whole number from 2 to 64, got 3.5"),
    (lambda: widgets.pipeline_explorer(virtual_stages=1), "virtual_stages must be a whole number from 2"),
    # a generator of runs had been spent by the check, and the explorer built from nothing
    (lambda: widgets.speedup_explorer(x for x in [5.0]), "runs must be one or more RunResults"),
    (lambda: widgets.collectives_explorer(size_mb=0), "size_mb must be a number of MiB above 0, got 0"),
    # had been min() of an empty sequence, and an AttributeError of a step time
    (lambda: widgets.speedup_explorer({}), "runs must be one or more RunResults of paralab.run"),
    (lambda: widgets.speedup_explorer({1: 5.0}), "runs must be one or more RunResults of paralab.run"),
])
def test_an_explorer_refuses_an_argument_its_controls_cannot_show(make, message):
    with pytest.raises(ValueError) as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize("make, error, message", [
    # had been "'int' object is not iterable", an int() parse error and a speedup of -1 drawn
    (lambda: widgets.scaling_explorer(measured=5), TypeError, "runs must be RunResults, Predictions or"),
    (lambda: widgets.scaling_explorer(measured={"a": 1.0}), ValueError,
     "a run's world size must be a whole number >= 1, got 'a'"),
    (lambda: widgets.scaling_explorer(measured={2: -1.0}), ValueError,
     "the run at world size 2 needs a step time of a number of seconds > 0, got -1.0"),
    # had been "'str' object has no attribute 'items'"
    (lambda: widgets.memory_explorer(measured="x"), TypeError,
     "measured must be {label: RunResult or summary}"),
    # had been "missing 1 required positional argument: 'bandwidth'", and negative times drawn
    (lambda: widgets.collectives_explorer(measured={"a": (1,)}), TypeError,
     "measured link 'a' must be a Link or (alpha in s, bandwidth in bytes/s), got (1,)"),
    (lambda: widgets.collectives_explorer(measured={"a": (1e-5, -3)}), ValueError,
     "measured link 'a' needs alpha >= 0 s and a bandwidth > 0 bytes/s"),
    (lambda: widgets.collectives_explorer(measured=[1]), TypeError,
     "measured must be {name: link}, got list"),
    (lambda: widgets.collectives_explorer(measured={"a": Link(1e-5, -3.0)}), ValueError,
     "measured link 'a' needs alpha >= 0 s and a bandwidth > 0 bytes/s"),
])
def test_an_explorer_names_measured_runs_it_cannot_read(make, error, message):
    with pytest.raises(error) as info:
        make()
    assert message in str(info.value)


def test_measured_runs_are_read_as_a_json_file_keys_them_and_as_a_fit_may_give_them():
    """World sizes as JSON keys them (digits) or numpy's numbers are read as the numbers they are (the
    first checks had refused np.int64(2)); a fitted link of alpha 0
    or unbounded bandwidth (fit_alpha_beta's bounds) is drawn."""
    import numpy as np

    for keys in (["2", "4"], [np.int64(2), np.int64(4)]):  # as JSON keys them, and from an array
        app = widgets.scaling_explorer(measured=dict(zip(keys, [1.0, np.float32(0.5)])))
        measured = app.figure.layout.meta["measured"]
        assert measured["world_size"] == [2, 4] and measured["speedup"] == [1.0, 2.0]
    app = widgets.collectives_explorer(measured={"fitted": (0.0, math.inf)})
    assert "fitted" in app.controls["link"].options
