"""Widgets driven from Python: moving a control must change the figure's data.

No browser here (tests/test_report.py and the notebook browser test cover rendering). "Run for real"
starts real ranks once (2 pipeline stages of the tiny model); its error path uses a stand-in.
"""

from __future__ import annotations

import pytest

from paralab.config import ConfigError
from paralab.trace import Counter, Span, Trace

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

import ipywidgets  # noqa: E402

from paralab import widgets  # noqa: E402


def bars(fig) -> int:
    """Bars of spans (not the hatched waits drawn over calls)."""
    return sum(len(t.x) for t in fig.data if t.type == "bar" and t.name != "waiting for peers")


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
    app.controls["overlap"].value = 1.0  # each F&B slot one forward time shorter: a shorter step, a smaller bubble
    assert "F&B hides 1 F" in app.info.value
    assert number("step ") < step and number("bubble simulated ") < bubble
    app.controls["microbatches"].value = 6  # fewer than 2 x 4 stages
    assert "at least as many microbatches as stages" in app.message.value


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


def test_pipeline_explorer_run_for_real_shows_measured(no_leftover_ranks):
    """The button launches real pipeline ranks (2 stages, tiny model) and draws what they measured
    above the prediction, with the progress bar following the steps."""
    app = widgets.pipeline_explorer(schedule="1f1b", stages=2, microbatches=4, steps=3)
    app.button.click()
    assert app.progress.value == app.progress.max == 3
    assert app.measured is not None and "predicted_rows" in app.measured.layout.meta
    assert len(app.measured.layout.meta["rows"]) == 4 and "step time" in app.message.value
    forwards = [t for t in app.measured.data if t.name == "forward" and t.yaxis in (None, "y")]
    assert forwards and sum(len(t.x) for t in forwards) == 2 * 4  # each stage ran 4 forwards in the step shown


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


def test_memory_explorer_redraws():
    app = widgets.memory_explorer(model="gpt3-1.3b", dp=8)
    totals = list(app.figure.layout.meta["totals"])
    assert len(totals) == 4 and totals[0] > totals[1] > totals[2] > totals[3]  # ZeRO 0..3
    app.controls["pp"].value = 4  # ZeRO-2/3 do not combine with pp
    assert app.figure.layout.meta["bars"] == 2
    assert list(app.figure.data[0].x) == ["no ZeRO", "ZeRO-1"]


def test_comm_explorer_views_and_calculator():
    t = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1000, payload_bytes=750, group_size=4, step=0)
                     for r in range(4)], meta={"world_size": 4})
    app = widgets.comm_explorer(t)
    assert app.figure.data[0].customdata[0][1] == 4000  # exact bytes (the axis is in KiB)
    app.controls["payload"].value = True
    assert app.figure.data[0].customdata[0][1] == 3000
    app.controls["view"].value = "rank matrix"
    assert app.figure.data[0].type == "heatmap" and app.figure.layout.meta["ranks"] == 4
    before = list(app.calculator.data[0].y)
    app.controls["op"].value = "all_gather"
    assert list(app.calculator.data[0].y) == pytest.approx([b / 2 for b in before])


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
