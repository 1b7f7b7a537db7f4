"""Figure builders on small real traces: the figures must show what the trace holds.

One real 2-rank DDP run per module (small buckets, so several all-reduce spans per step) and
simulated pipeline steps (instant) feed every test; tests read the figure's data arrays and
``layout.meta`` (rows, ranks, totals) rather than only checking that a figure came back.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

import paralab
from paralab.schedules import build_schedule, theoretical_bubble
from paralab.sim.events import simulate_schedule
from paralab.trace import COMM, COMPUTE, STEP, Span, Trace

pytest.importorskip("plotly")

from paralab import viz  # noqa: E402
from paralab.viz._common import (  # noqa: E402
    EXTRA_COLORS,
    KIND_COLORS,
    TIMELINE_MICROBATCH_COLORS,
    WAITING,  # noqa: E402
    fmt_bytes,
    kind_color,
)
from paralab.viz.comm import comm_matrix_data, group_of  # noqa: E402
from paralab.viz.timeline import FILLER, LABELS, call_slots, median_step  # noqa: E402
from tests.conftest import bars  # noqa: E402

TIMES = {"forward": 1e-3, "backward": 2e-3, "backward_input": 1e-3, "backward_weight": 1e-3}


@pytest.fixture(scope="module")
def ddp_run():
    return paralab.run(strategy="ddp", world_size=2, steps=3, bucket_mb=0.1, global_batch=4)


@pytest.fixture(scope="module")
def pipe():
    """A simulated 1F1B step: 4 ranks, 8 microbatches, 1 KiB activations."""
    return simulate_schedule(build_schedule("1f1b", 4, 8), TIMES, 1e-4, activation_bytes=1024)


def test_import_does_not_pull_plotly():
    code = ("import sys, paralab.viz, paralab.widgets, paralab.viz.report; "
            "print(any(m.split('.')[0] in ('plotly', 'ipywidgets') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_timeline_measured_rows_spans_and_bytes(ddp_run):
    trace = ddp_run.trace
    fig = viz.timeline(ddp_run)
    assert fig.layout.meta["ranks"] == 2
    labelled = [row for row in fig.layout.meta["rows"] if FILLER not in row]
    assert labelled == ["r0 compute", "r0 comm", "r1 compute", "r1 comm"]
    assert list(fig.layout.yaxis.categoryarray) == fig.layout.meta["rows"]
    drawn = [s for s in trace.spans if s.lane in ("compute", "comm")]
    assert bars(fig) == len(drawn)
    by_name = {t.name: t for t in fig.data}
    assert len(by_name["all_reduce"].x) == len(trace.select(lane="comm", kind="all_reduce")) > 2 * 3
    # each bar is one span: durations (ms) and hover bytes match the spans, in order
    ar = trace.select(lane="comm", kind="all_reduce")
    t0 = min(s.start for s in drawn)
    assert by_name["all_reduce"].x[0] == pytest.approx(ar[0].duration * 1e3)
    assert by_name["all_reduce"].base[0] == pytest.approx((ar[0].start - t0) * 1e3)
    assert f"({ar[0].bytes:,} B)" in by_name["all_reduce"].hovertext[0]
    assert set(by_name["all_reduce"].y) == {"r0 comm", "r1 comm"}
    # a pass's hover names no bytes ("bytes 0 B" had read as if the forward moved no data)
    passes = [text for t in fig.data if t.name in ("forward", "backward") for text in t.hovertext]
    assert passes and not any("bytes" in text for text in passes)


def test_a_receive_says_its_bytes_are_its_sends_and_waits_for_its_send():
    """A receive's own wire bytes are 0 (a p2p's are counted once, on the send): its hover had read
    "bytes 0 B (0 B)" above its 32 KiB payload, and its wait was "for the last participant"."""
    trace = Trace([
        Span(0, "comm", "send", 0.002, 0.003, peer=1, bytes=32768, payload_bytes=32768, step=0),
        Span(1, "comm", "recv", 0.001, 0.003, peer=0, payload_bytes=32768, step=0)], meta={"world_size": 2})
    hovers = {t.name: list(t.hovertext) for t in viz.timeline(trace).data if t.hovertext}
    (recv,) = [text for name, texts in hovers.items() if name.startswith("recv") for text in texts
               if "recv on" in text]
    assert "wire bytes counted on its send" in recv and "bytes 0 B" not in recv
    assert "payload (the tensors' bytes) 32.0 KiB" in recv
    assert "for its send, then moved data" in "".join(t for texts in hovers.values() for t in texts)
    # its hatched wait says what it waited for: no "others" in a call of two
    (waiting,) = [text for name, texts in hovers.items() if name.startswith("waiting") for text in texts]
    assert waiting.endswith(": its send had not been posted yet")
    (send,) = [text for texts in hovers.values() for text in texts if "send on" in text]
    assert "wire bytes 32.0 KiB (32,768 B)" in send
    small = Trace([Span(0, "comm", "all_reduce", 0.0, 0.001, bytes=16, group_size=2, step=0)])
    (hover,) = [text for t in viz.timeline(small).data if t.hovertext for text in t.hovertext]
    assert "wire bytes 16 B" in hover and "(16 B)" not in hover  # it had read "bytes 16 B (16 B)"
    # by op and step: the receive's op is no bar, so it is not in the legend (it had been, with none)
    assert [t.name for t in viz.comm_by_op(trace).data] == ["send"]
    assert [t.name for t in viz.comm_by_op(trace, payload=True).data] == ["recv", "send"]


def test_timeline_steps_filter(ddp_run):
    fig = viz.timeline(ddp_run.trace, steps=[2])
    assert bars(fig) == len([s for s in ddp_run.trace.spans if s.step == 2 and s.lane in ("compute", "comm")])
    assert fig.layout.title.text.endswith(" · step 2")  # which of the run's steps the figure shows
    assert viz.timeline(ddp_run.trace, steps=[2, 1]).layout.title.text.endswith(" · steps 1, 2")
    assert "step" not in viz.timeline(ddp_run.trace).layout.title.text


def test_a_measured_pass_is_labelled_as_its_predicted_twin():
    """A measured span is named by its kind: its bar had read "forward" (cut to "orwar" when narrow)
    where the predicted bar above it read "F3 s1"."""
    measured = Trace([
        Span(0, "compute", "forward", 0.0, 0.002, name="forward", microbatch=3, stage=1, step=0),
        Span(0, "compute", "backward", 0.002, 0.005, microbatch=3, step=0),
        Span(0, "compute", "backward_input", 0.005, 0.006, microbatch=3, stage=1, step=0),
        Span(0, "compute", "backward_weight", 0.006, 0.007, microbatch=3, stage=1, step=0),
        Span(0, "compute", "recompute", 0.007, 0.008, microbatch=3, stage=1, step=0)])
    fig = viz.timeline(measured)
    assert {t.name: list(t.text) for t in fig.data} == {
        "forward": ["F3 s1"], "backward": ["B3"], "backward_input": ["Bi3 s1"], "backward_weight": ["W3 s1"],
        "recompute": ["recompute"]}


def test_timeline_pipeline_microbatch_colours_and_labels(pipe):
    fig = viz.timeline(pipe)
    assert fig.layout.meta["ranks"] == 4 and len(fig.layout.meta["rows"]) == 8
    fwd = next(t for t in fig.data if t.name == "forward")
    assert len(fwd.x) == 4 * 8
    assert sorted(set(fwd.marker.color)) == sorted(TIMELINE_MICROBATCH_COLORS[:8])  # coloured by microbatch
    assert "F0 s0" in list(fwd.text) and fwd.textangle == 0  # hidden where it does not fit, never on end
    ink = dict(zip(fwd.marker.color, fwd.insidetextfont.color))  # a label in white was lost on light fills
    assert ink["#E7CB94"] == "#222" and ink["#6A3D9A"] == "white"  # sand, deep violet
    send = next(t for t in fig.data if t.name == "send")
    assert isinstance(send.marker.color, str)  # comm stays coloured by kind
    # no microbatch is drawn in a communication kind's colour, and the axis says what colours mean
    comm_colors = {KIND_COLORS[k] for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send",
                                            "recv", "all_to_all", "barrier")}
    assert not set(TIMELINE_MICROBATCH_COLORS) & (comm_colors | set(EXTRA_COLORS))
    # recomputation sits beside the all-reduce (it had been a second purple) and, in zero-bubble
    # schedules, the weight-gradient pass: far from every other kind's colour and the unknown kinds'
    others = [c for kind, c in KIND_COLORS.items() if kind != "recompute" and c.startswith("#")]
    assert min(rgb_distance(KIND_COLORS["recompute"], c) for c in others + EXTRA_COLORS) > 75
    # an expert run's all-to-all beside its all-reduce and receives: it had been a pink among pinks (39)
    kinds = [c for kind, c in KIND_COLORS.items() if kind != "all_to_all" and c.startswith("#")]
    assert min(rgb_distance(KIND_COLORS["all_to_all"], c) for c in kinds + EXTRA_COLORS) > 100
    assert "coloured by microbatch" in fig.layout.xaxis.title.text
    # the key reads a label the figure draws (8 microbatches over 4 stages), and a run of one stage's
    # on its widest bars, a backward's: plotly hides a label its bar cannot hold, often a forward's
    assert fig.layout.xaxis.title.text.endswith("a bar's label: B7 s3 is microbatch 7's backward on stage 3")
    one_stage = Trace(spans=[Span(0, COMPUTE, "forward", 0, 1e-3, microbatch=m, step=0) for m in range(2)])
    assert viz.timeline(one_stage).layout.xaxis.title.text.endswith(
        "<br>a bar's label: F1 is microbatch 1's forward")
    # a run that says it had no pipeline (a hybrid run at pp 1 tags its microbatch) is coloured by kind
    one_stage.meta["pp"] = 1
    assert viz.timeline(one_stage).layout.xaxis.title.text == "time (ms)"
    # a timeline coloured by kind keeps its plain axis
    assert viz.timeline(pipe, color_by="kind").layout.xaxis.title.text == "time (ms)"
    assert "(1,024 B)" in send.hovertext[0] and "peer r" in send.hovertext[0]
    # bars coloured by microbatch stay out of the legend (their swatch had been one microbatch's colour,
    # matching no bar); kinds in one colour keep theirs, and sends back to back are edged apart
    assert fwd.showlegend is False and send.showlegend is not False
    # (a send alone on its row; one beside a receive in flight is too thin for a white edge)
    edges = dict(zip(send.marker.line.width, send.width))
    assert edges[1] == pytest.approx(0.8) and edges[0] < 0.8 and send.marker.line.color == "white"
    by_kind = viz.timeline(pipe, color_by="kind").data
    assert all(t.marker.line.width == 0 for t in by_kind if t.name == "forward")
    # idle is visible as gaps: rank 3's compute bars cover less than the step
    span = max(b + x for t in fig.data for b, x in zip(t.base, t.x))
    busy3 = sum(x for t in fig.data if t.name in ("forward", "backward")
                for y, x in zip(t.y, t.x) if y == "r3 compute")
    assert busy3 < span * 0.95


def test_a_measured_step_is_drawn_beside_as_many_predicted_steps():
    """``steps`` alone had drawn one measured step over every predicted one on the shared time axis,
    the prediction reading three times as slow: the same steps are drawn where the prediction has
    them (predict_run_trace numbers its steps as the run's), else as many from its first."""
    def steps_of(first_step, count, seconds):
        return Trace([Span(r, COMPUTE, "forward", i * seconds, (i + 0.5) * seconds, step=first_step + i)
                      for r in range(2) for i in range(count)])

    def drawn(fig, axis):  # bars drawn on that subplot
        return sum(len(t.x) for t in fig.data if t.type == "bar" and t.yaxis == axis)

    measured = steps_of(0, 3, 0.1)
    same = viz.timeline(measured, predicted=steps_of(0, 3, 0.3), steps=[2])
    assert drawn(same, "y") == drawn(same, "y2") == 2  # step 2 of each rank, measured and predicted
    other = viz.timeline(measured, predicted=steps_of(10, 3, 0.3), steps=[1, 2])
    assert drawn(other, "y2") == 4  # the prediction's first two steps
    every = viz.timeline(measured, predicted=steps_of(0, 3, 0.3), steps=[2], predicted_steps=[0, 1, 2])
    assert drawn(every, "y2") == 6  # asked for


def test_hatched_microbatch_bars_keep_their_colour_array_out_of_the_hatch(pipe):
    """plotly.js draws each hatched bar's background in its own colour (fillmode "overlay"); a pattern
    background left unset defaulted to the bars' colour array, whose contrast() had logged "Invalid color
    specifier" six times a trace in the browser console (tests/test_browser.py sees the log)."""
    split = simulate_schedule(build_schedule("zb-h1", 4, 8), TIMES, 1e-4, activation_bytes=1024)
    hatched = [t for run in (pipe, split) for t in viz.timeline(run).data
               if t.marker.pattern.shape and not isinstance(t.marker.color, str)]  # not the waits' hatch
    assert {t.name: t.marker.pattern.shape for t in hatched} == {
        "backward": "/", "backward_input": "\\", "backward_weight": "x"}
    assert all(t.marker.pattern.fillmode == "overlay" and isinstance(t.marker.pattern.bgcolor, str)
               for t in hatched)


def test_timeline_measured_with_prediction(ddp_run, pipe):
    stacked = viz.timeline(ddp_run, predicted=pipe)
    assert len(stacked.layout.meta["predicted_rows"]) == 8
    assert stacked.layout.yaxis2.categoryarray == tuple(stacked.layout.meta["predicted_rows"])
    assert {t.yaxis for t in stacked.data} == {"y", "y2"}
    assert bars(stacked) == bars(viz.timeline(ddp_run)) + bars(viz.timeline(pipe))
    # the title names both (it had read "timeline: measured · ddp" over the prediction too)
    assert stacked.layout.title.text.startswith("timeline: measured and simulated ")
    overlay = viz.timeline(ddp_run, predicted=pipe, layout="overlay")
    rows = list(overlay.layout.yaxis.categoryarray)
    assert [row for row in rows if FILLER not in row][:4] == ["r0 compute", "r0 comm", "r0 compute pred",
                                                              "r0 comm pred"]
    with pytest.raises(ValueError):
        viz.timeline(ddp_run, predicted=pipe, layout="sideways")


def test_bubble_bars_and_theory(pipe):
    fig = viz.bubble(pipe)
    assert len(fig.data[0].x) == 4
    assert fig.layout.meta["theoretical"] == pytest.approx(theoretical_bubble("1f1b", 4, 8))
    idle = pipe.idle_fraction()
    assert list(fig.data[0].y) == pytest.approx([idle[r] for r in range(4)])


def test_the_bubble_figure_writes_no_label_where_a_line_runs():
    """Rank 0's "54%" over its bar had sat on the dotted mean line (57.4%), and "mean 57.4%" at the
    plot's left edge on the 60% tick: each value now reads under its bar, beside the rank, and the
    lines are named in the legend."""
    spans = [Span(r, STEP, STEP, step, step + 1.0, step=step) for step in range(3) for r in (0, 1)]
    spans += [Span(r, COMPUTE, "forward", step, step + busy, step=step)
              for step in range(3) for r, busy in ((0, 0.46), (1, 0.392))]
    fig = viz.bubble(Trace(spans=spans), schedule=("1f1b", 2, 4, 1))
    assert not fig.layout.annotations and fig.data[0].text is None
    assert list(fig.layout.xaxis.ticktext) == ["r0: 54%", "r1: 61%"]
    lines = {t.name: (t.x, t.y) for t in fig.data if t.type == "scatter"}
    assert lines.keys() == {"mean 57.4%", "1f1b theory 20.0%"}
    assert lines["mean 57.4%"][1] == pytest.approx((0.574, 0.574))
    assert lines["1f1b theory 20.0%"][1] == (0.2, 0.2)
    # each line spans the plot's width; the tallest bar stands a tenth under the top (it had sat on it)
    assert all(x == fig.layout.xaxis.range == (-0.5, 1.5) for x, _ in lines.values())
    assert fig.layout.yaxis.range == pytest.approx((0, 1.1 * 0.608))


def test_bubble_vs_microbatches_curves():
    fig = viz.bubble_vs_microbatches(("gpipe", "interleaved", "zb-h1"), stages=4,
                                     microbatches=(2, 4, 6, 8, 9))
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["gpipe"].x) == [2, 4, 6, 8, 9]
    assert list(by_name["interleaved (v=2)"].x) == [2, 4, 6, 8]  # 9 does not split into equal rounds
    # with free p2p and equal stages the simulated gpipe bubble is the closed form
    assert list(by_name["gpipe"].y) == pytest.approx(list(by_name["gpipe theory"].y))
    assert by_name["gpipe"].y[0] > by_name["gpipe"].y[-1]  # more microbatches, smaller bubble
    # the figure says which curves lie on top of one another: gpipe is its closed form
    assert any({"gpipe", "gpipe theory"} <= set(g["lines"]) for g in fig.layout.meta["overlap"])
    assert fig.layout.annotations[0].text.startswith("gpipe and gpipe theory overlap")
    assert fig.layout.meta["notes"] == []


def test_zbv_closed_form_is_said_to_be_a_bound_where_it_reads_low():
    """Below p microbatches ZB-V's closed form counts only its start-up ramp (33% at m = 1 on 4 stages,
    against 65% simulated): notebook 02 had drawn the gap unexplained."""
    fig = viz.bubble_vs_microbatches(("1f1b", "zbv"), stages=4, microbatches=(1, 2, 4, 8))
    zbv, theory = (next(t for t in fig.data if t.name == name) for name in ("zbv", "zbv theory"))
    assert zbv.y[0] > 1.5 * theory.y[0]
    assert "zbv's closed form is a lower bound below 4 microbatches" in fig.layout.annotations[0].text
    assert viz.bubble_vs_microbatches(("zbv",), stages=4, microbatches=(4, 8)).layout.meta["notes"] == []
    timed = viz.bubble_vs_microbatches(("zbv",), stages=4, microbatches=(4, 8),
                                       compute_time={"forward": 1.0, "backward": 3.0})
    assert timed.layout.meta["notes"] == [
        "zbv's closed form assumes equal forward, input- and weight-gradient passes"]


def test_comm_by_op_and_matrix_bytes_per_step(ddp_run):
    trace = ddp_run.trace
    fig = viz.comm_by_op(trace)
    ar = next(t for t in fig.data if t.name == "all_reduce")
    assert list(ar.x) == ["step 0", "step 1", "step 2"]
    per_step = sum(s.bytes for s in trace.select(lane="comm") if s.step == 1)
    assert ar.customdata[1][1] == per_step and fig.layout.meta["unit"] == "MiB"
    assert ar.y[1] == pytest.approx(per_step / 2**20)  # the axis in MiB, as a text beside it would say
    assert ar.hovertemplate.endswith("(%{customdata[1]:,.0f} B)<extra></extra>")  # had been "874496 B"
    total = sum(s.bytes for s in trace.select(lane="comm")) / 3
    matrix = comm_matrix_data(trace)  # the whole trace: three steps
    assert matrix[0][0] == matrix[1][1] == 0
    assert matrix[0][1] + matrix[1][0] == pytest.approx(3 * total)
    heat = viz.comm_matrix(trace)  # per step
    # hover: the axis labels are "r0" already ("rr1 → r1" had been written); a cell of none says 0 B
    assert heat.data[0].hovertemplate.startswith("%{y} → %{x}: ")
    assert heat.data[0].hovertext[0][0].startswith("0 B")
    assert heat.layout.meta["ranks"] == 2 and heat.layout.meta["total_bytes"] == pytest.approx(total)
    split = viz.comm_link_split(trace)
    assert split.layout.meta["bytes"] == {"all_reduce": {"intra_node": total, "inter_node": 0}}
    assert split.layout.meta["bytes"]["all_reduce"]["intra_node"] == trace.comm_bytes_by_link()["intra_node"]


def test_comm_matrix_p2p_counts_sends_once(pipe):
    m = comm_matrix_data(pipe)
    # 1F1B, 8 microbatches: stage s sends 8 activations forward and 8 gradients back
    assert m[0][1] == 8 * 1024 and m[1][0] == 8 * 1024 and m[0][2] == 0
    assert m[3][2] == 8 * 1024 and m[3][0] == 0


def test_comm_matrix_group_inference():
    meta = {"tp": 2, "dp": 2, "pp": 2}
    tp_span = Span(5, "comm", "all_reduce", 0, 1, bytes=100, group_size=2)
    assert group_of(tp_span, 8, meta) == [4, 5]  # tp fastest
    dp_meta = {"tp": 2, "dp": 4, "pp": 1}
    assert group_of(Span(3, "comm", "all_reduce", 0, 1, group_size=4), 8, dp_meta) == [1, 3, 5, 7]
    t = Trace(spans=[Span(r, "comm", "all_gather", 0, 1, bytes=300, group_size=4) for r in range(4)])
    m = comm_matrix_data(t)
    assert m[0] == [0, 300, 0, 0] and m[3] == [300, 0, 0, 0]  # a ring: all to the successor
    exchange = Trace(spans=[Span(r, "comm", "all_to_all", 0, 1, bytes=300, group_size=4) for r in range(4)])
    assert comm_matrix_data(exchange)[0] == [0, 100, 100, 100]  # no ring: a slice to every other rank
    # a group recorded without the span's own rank (an imported profile's) has no ring to follow
    stray = Trace(spans=[Span(3, "comm", "all_reduce", 0, 1, bytes=200, group_ranks=[0, 1])])
    assert comm_matrix_data(stray)[3] == [100, 100, 0, 0]


@pytest.mark.parametrize("hierarchical_dp", [0, 4])
def test_the_rank_matrix_crosses_nodes_where_the_node_split_does(hierarchical_dp):
    """A ring over 16 ranks in nodes of 4 sends one byte in four across nodes, as the inside/across
    split counts: the matrix, once spreading each rank's bytes over its 15 peers, had drawn 12 of every
    15 cells across nodes, all-to-all traffic beside the split's ring."""
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm_compare import predicted_comm_trace

    spec = ParallelSpec(dp=16, global_batch=16, hierarchical_dp=hierarchical_dp)
    trace = predicted_comm_trace(get_model("gpt3-1.3b"), spec, gpus_per_node=4)
    matrix = comm_matrix_data(trace)
    crossing = sum(b for src, row in enumerate(matrix) for dst, b in enumerate(row) if src // 4 != dst // 4)
    assert crossing == pytest.approx(trace.comm_bytes_by_link()["inter_node"])
    assert sum(b > 0 for b in matrix[0]) == (1 if not hierarchical_dp else 2)  # its successor(s) alone


def test_the_explorers_rank_matrix_gives_every_panel_a_scale_a_short_title_and_the_rule():
    """The explorer's grown 64-rank panel has no text in its cells: without a colour bar it had no
    scale at all; its long label, as a title, was cut at 1100 px and ran into its neighbour at 820."""
    from paralab.viz.comm_compare import compare_matrix

    def ring(world: int, nodes: int) -> Trace:
        return Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=3 << 20, group_size=world,
                                 inter_node=(r + 1) % world // (world // nodes) != r // (world // nodes))
                            for r in range(world)], meta={"gpus_per_node": world // nodes})

    sources = {"measured, 4 ranks": ring(4, 1),
               "predicted, 64 ranks (64 dp x 1 tp x 1 pp, tiny in fp32, 8/node)": ring(64, 8)}
    fig = compare_matrix(sources)
    bars = [t.colorbar for t in fig.data]
    assert all(t.showscale is not False for t in fig.data) and len({b.x for b in bars}) == 2
    assert [b.title.text for b in bars] == ["MiB", "MiB"]  # the unit over its bar, "per step" in the title
    assert [a.text for a in fig.layout.annotations[:2]] == ["measured, 4 ranks", "predicted, 64 ranks"]
    assert "64 dp x 1 tp x 1 pp, tiny in fp32, 8/node" in fig.layout.annotations[2].text
    assert "ring successor" in fig.layout.title.subtitle.text
    assert len(fig.layout.shapes) == 8  # a dashed box per node of the 64 ranks, none for one node
    # taller with its ranks to a cap: the 64-rank panel had made its 4-rank neighbours 1,000 px columns
    from paralab.viz.comm_compare import MATRIX_MAX_PX
    assert fig.layout.height <= MATRIX_MAX_PX + 60 < 120 + 14 * 64  # its rule and note below: 53 px
    # labels in cells only where they fit: three panels, one of 8 ranks, had shrunk them to 5 px
    three = compare_matrix({"a": ring(2, 1), "b": ring(2, 1), "c": ring(8, 2)})
    assert [t.texttemplate for t in three.data] == ["%{text}", "%{text}", None]
    # in a cell its number in the colour bar's unit, the bytes in words on hover: "3.0 MiB" in each of
    # 16 cells of a third of the width had been drawn at some 6 px
    cells = [v for row in fig.data[0].text for v in row if v]
    assert cells and set(cells) == {"3"} and fig.data[0].customdata[0][1] == "3.0 MiB"
    thousand = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1000 << 10, group_size=2)
                            for r in (0, 1)])
    assert compare_matrix({"a": thousand}).data[0].text[0][1] == "1,000"  # not "1e+03" (KiB)
    assert fig.data[0].customdata[0][0] == "0 B"
    assert "<br>%{y} → %{x}: %{customdata}" in fig.data[0].hovertemplate


def test_the_explorers_node_split_names_its_bars_short_with_the_details_below():
    """A grown run's whole label as a category had slanted and squeezed the plot to 60 px at 820 px."""
    from paralab.viz.comm_compare import compare_links

    trace = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1 << 20, group_size=4) for r in range(4)])
    long = "predicted, 8 ranks (8 dp x 1 tp x 1 pp, hierarchical all-reduce, tiny in fp32, 4/node)"
    fig = compare_links({"measured, 4 ranks": trace, long: trace})
    assert all(list(t.x) == ["measured, 4 ranks", "predicted, 8 ranks"] for t in fig.data)
    assert "predicted, 8 ranks: 8 dp x 1 tp x 1 pp, hierarchical" in fig.layout.annotations[0].text
    assert long in fig.data[0].customdata[1][0]  # the whole label on hover


def test_the_node_split_and_the_rank_matrix_never_give_two_sources_one_short_name():
    """Two labels of one short name ("predicted, 4 ranks", and the same with its details) had been one
    category, plotly stacking both bars into one of 2.50 MiB (each is 1.25), and two panels of one
    title."""
    from paralab.viz.comm_compare import compare_links, compare_matrix

    trace = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1 << 20, group_size=4) for r in range(4)])
    grown = "predicted, 4 ranks (4 dp x 1 tp x 1 pp, tiny in fp32, 8/node)"
    sources = {"measured, 4 ranks": trace, "predicted, 4 ranks": trace, grown: trace}
    links = compare_links(sources)
    inside = next(t for t in links.data if t.name == "inside a node")
    assert list(inside.x) == ["measured, 4 ranks", "predicted, 4 ranks", "predicted, 4 ranks #2"]
    assert "predicted, 4 ranks #2: 4 dp x 1 tp" in links.layout.annotations[0].text
    titles = [a.text for a in compare_matrix(sources).layout.annotations[:3]]
    assert titles == ["measured, 4 ranks", "predicted, 4 ranks", "predicted, 4 ranks #2"]


def test_comm_link_split_draws_several_runs_on_one_axis(ddp_run):
    """Notebook 06 had drawn a flat ring and a hierarchical all-reduce as two figures, each bar at the
    top of its own axis, so 2.5 MiB across nodes looked like 1.67: one figure, one y axis, each run's
    bars under its label, across nodes stacked at the base."""
    crossing = Trace(spans=[Span(r, "comm", "all_reduce", 0, 1, bytes=1 << 20, group_size=2, inter_node=True)
                            for r in range(2)])
    fig = viz.comm_link_split({"flat": ddp_run, "across": crossing})
    assert {t.yaxis or "y" for t in fig.data} == {"y"} and fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["across nodes", "inside a node"]  # the first at the base
    assert all([list(level) for level in t.x] == [["flat", "across"], ["all_reduce", "all_reduce"]]
               for t in fig.data)
    assert fig.layout.meta["bytes"]["across"] == {"all_reduce": {"intra_node": 0, "inter_node": 2 << 20}}
    assert set(fig.layout.meta["bytes"]) == {"flat", "across"}
    # a run inside one node: the legend says no bar crosses nodes, not a colour for bars that are not there
    assert [t.name for t in viz.comm_link_split(ddp_run).data] == ["across nodes (none)", "inside a node"]


def test_scaling_speedup_and_ideal():
    fig = viz.scaling({1: 0.4, 2: 0.25, 4: 0.1},
                      predicted=[{"world_size": 1, "step_time_s": 1.0, "tokens_per_s": 10},
                                 {"world_size": 8, "step_time_s": 1.0, "tokens_per_s": 70}])
    meta = fig.layout.meta
    assert meta["measured"]["speedup"] == pytest.approx([1.0, 1.6, 4.0])
    assert meta["predicted"]["speedup"] == pytest.approx([1.0, 7.0])  # throughput ratio (weak scaling)
    ideal = next(t for t in fig.data if t.name == "ideal")
    assert list(ideal.x) == [1, 2, 4, 8] and list(ideal.y) == [1, 2, 4, 8]


def test_series_that_start_at_different_sizes_each_get_the_ideal_of_their_own_start():
    """Measured from 2 ranks, predicted from 1: each speedup is over its own start, so one ideal from
    1 rank would put a measured perfect doubling at half the ideal."""
    fig = viz.scaling({2: 0.4, 4: 0.2}, predicted={1: 0.8, 2: 0.4, 4: 0.2})
    ideals = {t.name: (list(t.x), list(t.y)) for t in fig.data if t.name.startswith("ideal")}
    assert ideals == {"ideal from 1 rank": ([1, 2, 4], [1, 2, 4]), "ideal from 2 ranks": ([2, 4], [1, 2])}


def test_step_times_over_ten_seconds_are_drawn_in_seconds():
    """gpt3-1.3b's 28 s step on one GPU had put ticks at 25k on a "ms per step" axis."""
    slow = viz.scaling(predicted={1: 28.0, 2: 14.0})
    assert slow.layout.yaxis.title.text == "seconds per step" and list(slow.data[0].y) == [28.0, 14.0]
    assert "s/step" in slow.data[0].hovertemplate and "ms/step" not in slow.data[0].hovertemplate
    fast = viz.scaling({1: 0.4, 2: 0.25}, predicted={1: 0.5})
    assert fast.layout.yaxis.title.text == "ms per step" and list(fast.data[0].y) == pytest.approx([400, 250])
    assert slow.layout.meta["predicted"]["step_time_s"] == [28.0, 14.0]  # meta stays in seconds


def test_the_speedup_axis_names_the_size_it_is_over():
    """gpt3-13b on tp fits from 4 GPUs: its 1.45 at 8 had read as 1.45 times one GPU under "speedup (x)"."""
    def axis(*args, **kwargs):
        return viz.scaling(*args, **kwargs).layout.yaxis2.title.text

    assert axis(predicted={4: 60.0, 8: 43.0}) == "speedup over 4 ranks (x)"
    assert axis({1: 0.4, 2: 0.25}) == "speedup over 1 rank (x)"
    assert axis({2: 0.4, 4: 0.2}, predicted={1: 0.8, 2: 0.4}) == "speedup over each curve's first size (x)"
    assert axis() == "speedup (x)"


def _steps_of(times: list[float]) -> Trace:
    """A one-rank trace whose steps take ``times`` seconds, back to back."""
    starts = [sum(times[:i]) for i in range(len(times))]
    return Trace(spans=[Span(0, "step", f"step {i}", start, start + t, step=i)
                        for i, (start, t) in enumerate(zip(starts, times))])


def test_speedup_timeline_divides_the_baselines_median_step_by_each_step(ddp_run):
    """The baseline is another run (its median step after the first) or seconds; a run is not its
    own baseline unless it is given as one."""
    baseline = _steps_of([9.0, 0.4, 0.2, 0.3])  # median after the warm-up step: 0.3 s
    fig = viz.speedup_timeline({"ddp": ddp_run}, baseline=baseline)
    meta = fig.layout.meta["ddp"]
    assert meta["steps"] == [0, 1, 2]
    assert meta["speedup"] == pytest.approx([0.3 / t for t in ddp_run.trace.step_times()])
    assert len(fig.data) == 2
    assert [a.text for a in fig.layout.annotations if a.text.startswith("1x")] == ["1x: the baseline"]
    in_seconds = viz.speedup_timeline(_steps_of([1.0, 0.5]), baseline=2.0).layout.meta["run"]
    assert in_seconds["speedup"] == pytest.approx([2.0, 4.0])
    assert len(viz.speedup_timeline({"ddp": ddp_run}).data) == 1  # no baseline: throughput alone


def test_memory_stacked_per_rank(ddp_run):
    kinds = ddp_run.summary["memory_by_kind"]
    fig = viz.memory(ddp_run)
    # the kinds the bars hold: a kind the peak does not hold (gradients not made yet, or activations
    # freed) would be a legend entry that names nothing drawn
    held = [k for k in ("params", "grads", "optimizer", "activations") if any(rank[k] for rank in kinds)]
    assert [t.name for t in fig.data] == held and {"params", "optimizer"} <= set(held)
    assert fig.layout.yaxis.title.text == "peak memory (MiB)"
    assert viz.memory(ddp_run, what="resident memory").layout.yaxis.title.text == "resident memory (MiB)"
    assert fig.layout.barmode == "stack" and list(fig.data[0].x) == ["r0", "r1"]
    assert fig.data[0].customdata[0][1] == kinds[0]["params"]
    assert "(%{customdata[1]:,.0f} B)" in fig.data[0].hovertemplate  # separators, as the rank matrix's
    assert fig.layout.meta["totals"][1] == sum(kinds[1].values())
    two = viz.memory({"ddp": ddp_run, "other": ddp_run.summary})
    assert two.layout.meta["bars"] == 4 and list(two.data[0].x[0]) == ["ddp", "ddp", "other", "other"]


def test_elastic_without_records_reads_steps_from_the_trace(ddp_run):
    fig = viz.elastic(ddp_run.trace)
    st = next(t for t in fig.data if t.name == "step time")
    assert list(st.y) == pytest.approx([t * 1e3 for t in ddp_run.trace.step_times()])
    assert [label for label, _, _ in fig.layout.meta["phases"]] == ["training at 2 ranks"]
    assert fig.layout.meta["world_size"] == [2, 2, 2]


def test_loss_curves(ddp_run):
    fig = viz.loss_curves({"ddp": ddp_run, "flat": [3.0, 3.0]})
    assert list(fig.data[0].y) == pytest.approx(ddp_run.losses) and len(fig.data[1].y) == 2
    assert fig.layout.meta["overlap"] == [] and not fig.layout.annotations


def test_loss_curves_say_which_lines_overlap():
    losses = [4.8, 4.5, 4.2]
    runs = {"one": losses, "two": [4.8, 4.5 * (1 + 3e-8), 4.2], "three": losses,
            "four": [4.8, 4.5, 4.2 * (1 - 1e-8)]}
    fig = viz.loss_curves(runs)
    assert fig.layout.annotations[0].text == "all four lines overlap: max relative difference 3e-08"
    widths = [t.line.width for t in fig.data]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 4  # each visible around the next
    fig = viz.loss_curves({"a": losses, "b": losses, "c": [4.8, 4.6, 4.4]})
    assert fig.layout.meta["overlap"] == [{"lines": ["a", "b"], "max_rel_diff": 0.0}]
    assert fig.layout.annotations[0].text.startswith("a and b overlap")
    fig = viz.loss_curves({"a": losses, "b": losses})
    assert fig.layout.annotations[0].text.startswith("both lines overlap")  # not "all two lines"
    assert fig.layout.yaxis.title.text == "loss (cross-entropy, nats per token)"
    assert viz.loss_curves({"a": losses}, y_title="mse").layout.yaxis.title.text == "mse"


# ------------------------------------------------------------------ a real hybrid run on two nodes
@pytest.fixture(scope="module")
def hybrid():
    """dp 2 x tp 2 x pp 2 on 8 ranks in two emulated nodes of 4: every dimension, both links."""
    return paralab.run("hybrid", 8, dp=2, tp=2, pp=2, microbatches=2, nodes=2, steps=2, global_batch=8)


@pytest.mark.timeout(300)
def test_comm_by_dimension_totals_equal_the_traces_bytes_per_group(hybrid, no_leftover_ranks):
    trace, layout = hybrid.trace, hybrid.layout
    fig = viz.comm_by_dimension(hybrid)
    per_group = trace.comm_bytes_by_group()
    assert None not in per_group, "a measured trace names every group"
    expected = {axis: sum(b for g, b in per_group.items() if list(g) in layout.groups(axis) or (
        axis == "pp" and len(g) == 2 and any(set(g) <= set(line) for line in layout.groups("pp"))))
        for axis in ("dp", "tp", "pp")}
    assert fig.layout.meta["bytes"] == expected
    assert list(fig.layout.meta["bytes"]) == ["dp", "tp", "pp"]  # dp, cp, tp, pp, ep order
    assert sum(expected.values()) == sum(trace.comm_bytes().values())
    by_link = fig.layout.meta["by_link"]
    assert sum(v["inter_node"] for v in by_link.values()) == trace.comm_bytes_by_link()["inter_node"]
    assert by_link["tp"]["inter_node"] == 0 and by_link["pp"]["intra_node"] == 0  # tp inside, pp across
    bars = {t.name: t for t in fig.data if t.xaxis == "x"}
    assert [c[1] for c in bars["all_reduce"].customdata][:2] == [expected["dp"], expected["tp"]]
    # wire bytes: a receive has none (its send counts them), so it has no bar and no legend entry
    assert "send" in bars and "recv" not in bars
    # each stack's total over it, in both panels alike: a segment's label had read as its bar's
    over = [(a.x, a.text, a.xref) for a in fig.layout.annotations if a.text.startswith("<b>")]
    assert over == [(d, f"<b>{fmt_bytes(n)}</b>", xref) for xref in ("x", "x2") for d, n in expected.items()]


@pytest.mark.timeout(300)
def test_mesh_draws_the_layouts_groups_nodes_and_their_traffic(hybrid, no_leftover_ranks):
    layout = hybrid.layout
    fig = viz.mesh(hybrid)
    drawn = fig.layout.meta["groups"]
    assert drawn == {axis: layout.groups(axis) for axis in ("dp", "tp", "pp")}
    by_trace = {(t.meta["axis"], tuple(t.meta["ranks"])) for t in fig.data if t.meta}
    assert by_trace == {(axis, tuple(g)) for axis, groups in drawn.items() for g in groups}
    assert fig.layout.meta["nodes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert sum(1 for s in fig.layout.shapes if s.line.dash == "dash") == 2 * 3  # two nodes in each panel
    tp0 = next(t for t in fig.data if t.meta and t.meta["axis"] == "tp" and t.meta["ranks"] == [0, 1])
    own = hybrid.trace.comm_bytes_by_group()[(0, 1)]
    assert (f"all_reduce: {fmt_bytes(own)} per step" in tp0.hovertext[0]
            and "inside node 0" in tp0.hovertext[0])
    pipe = next(t for t in fig.data if t.meta and t.meta["axis"] == "pp" and t.meta["ranks"] == [0, 4])
    assert "across nodes 0, 1" in pipe.hovertext[0] and "send:" in pipe.hovertext[0]


def test_the_mesh_titles_count_one_group_and_say_what_sequence_parallel_does():
    """"cp: 1 groups of 2"; and a tp panel had said "all-reduces in every layer" of sequence parallel,
    whose tp groups all-gather and reduce-scatter."""
    import dataclasses

    from paralab.layout import mesh_layout

    for layout in (mesh_layout(dp=2, tp=2), mesh_layout(dp=2, tp=2, pp=2), mesh_layout(cp=2, tp=2)):
        lo, hi = viz.mesh(layout).layout.xaxis.range  # the grid in the middle: its title stands over it
        last = (layout.pp - 1) * (layout.cp * layout.tp + 1) + layout.cp * layout.tp - 1
        assert (lo, hi) == pytest.approx((-0.7, last + 0.7))
    titles = [a.text for a in viz.mesh(mesh_layout(cp=2)).layout.annotations]
    assert any(t.startswith("<b>cp</b>: 1 group of 2<br>") for t in titles), titles
    sp = dataclasses.replace(mesh_layout(tp=2, dp=2), sequence_parallel=True)
    (tp,) = [a.text for a in viz.mesh(sp).layout.annotations if a.text.startswith("<b>tp</b>")]
    assert tp == ("<b>tp</b>: 2 groups of 2<br><sup>tensor parallel: all-gathers and reduce-scatters in "
                  "every layer</sup>")


@pytest.mark.timeout(300)
def test_a_real_runs_calls_wait_for_peers_that_entered_before_they_left(hybrid, no_leftover_ranks):
    """Ranks of one machine share one clock: no collective is entered by its last member after
    another member had left it, no receive ends before its send began; and the timeline draws each
    wait over its call."""
    arrivals = hybrid.trace.comm_arrivals()
    matched = [a for a in arrivals if a.last_entry is not None]
    assert len(matched) == sum(1 for a in arrivals if a.span.kind != "send")  # every collective and receive
    for a in matched:
        assert a.last_entry <= a.span.end, a
    fig = viz.timeline(hybrid, steps=[1])
    waits = next(t for t in fig.data if t.name == "waiting for peers")
    shown = [a for a in matched if a.span.step == 1 and a.wait_s > 0]
    assert (len(waits.x) == len(shown)
            and sorted(waits.x) == pytest.approx(sorted(a.wait_s * 1e3 for a in shown)))


def test_the_timeline_dots_the_compute_a_blocking_call_stopped():
    """A forward 0-8 ms blocked 2-4 ms on an all-reduce, and an async all-gather issued 5-5.5 ms and
    waited for from 6 ms: the forward is dotted over 2-4, 5-5.5 and 6-7, each named after its call;
    a wait outside every compute span (a pipeline receive between passes) dots nothing."""
    spans = [Span(0, STEP, "step", 0, 0.012, step=0), Span(0, COMPUTE, "forward", 0, 0.008, step=0),
             Span(0, COMM, "all_reduce", 0.002, 0.004, name="mlp g", issue_s=0.002, step=0),
             Span(0, COMM, "all_gather", 0.005, 0.007, name="params", issue_s=0.0005, waited_s=0.001, step=0),
             Span(0, COMM, "recv", 0.009, 0.011, name="recv F0", waited_s=0.002, step=0)]
    fig = viz.timeline(Trace(spans=spans))
    blocked = next(t for t in fig.data if t.name == "compute blocked on comm")
    assert list(blocked.base) == pytest.approx([2, 5, 6]) and list(blocked.x) == pytest.approx([2, 0.5, 1])
    assert set(blocked.y) == {"r0 compute"}
    assert "mlp g: blocked" in blocked.hovertext[0] and "params: blocked" in blocked.hovertext[2]
    plain = viz.timeline(Trace(spans=spans), waits=False)
    assert not any(t.name == "compute blocked on comm" for t in plain.data)


def test_calls_in_flight_together_share_their_row_side_by_side():
    """Two gathers in flight together (a prefetch) and a third after both: the two split the comm row
    into two sub-rows, the first on the first, each under half as tall, where drawn over one another they
    had read as one call; the third, alone, has the whole row again, and a call's drawn wait shares
    its call's sub-row. Compute bars keep the whole row."""
    spans = [Span(0, STEP, "step", 0, 0.010, step=0), Span(0, COMPUTE, "forward", 0, 0.010, step=0),
             Span(0, COMM, "all_gather", 0.001, 0.005, name="block 0", step=0),
             Span(0, COMM, "all_gather", 0.002, 0.004, name="block 1", step=0),
             Span(0, COMM, "all_gather", 0.006, 0.008, name="block 2", step=0),
             Span(1, STEP, "step", 0, 0.010, step=0), Span(1, COMPUTE, "forward", 0, 0.010, step=0),
             Span(1, COMM, "all_gather", 0.003, 0.005, name="block 0", step=0),
             Span(1, COMM, "all_gather", 0.003, 0.004, name="block 1", step=0),
             Span(1, COMM, "all_gather", 0.006, 0.008, name="block 2", step=0)]
    fig = viz.timeline(Trace(spans=spans))
    gathers = next(t for t in fig.data if t.name == "all_gather")
    placed = {(row, round(base, 3)): (width, round(offset, 3))
              for row, base, width, offset in zip(gathers.y, gathers.base, gathers.width, gathers.offset)}
    # rank 0 (times from the first span, 0 ms): block 0 on top, block 1 under it, a gap between them
    # (15% of a sub-row, split above and below each), block 2 alone
    assert placed[("r0 comm", 1.0)] == (pytest.approx(0.34), -0.37)
    assert placed[("r0 comm", 2.0)] == (pytest.approx(0.34), 0.03)
    assert placed[("r0 comm", 6.0)] == (pytest.approx(0.8), -0.4)
    forward = next(t for t in fig.data if t.name == "forward")
    assert list(forward.width) == pytest.approx([0.8, 0.8])
    hover = dict(zip(zip(gathers.y, (round(b, 3) for b in gathers.base)), gathers.hovertext))
    assert "sub-row 2 of 2: up to 2 calls in flight at once" in hover[("r0 comm", 2.0)]
    assert "sub-row" not in hover[("r0 comm", 6.0)]
    # rank 1's two gathers start together (the one ending first on top); a wait drawn over a call
    # shares its sub-row
    wait = Span(1, COMM, WAITING, 0.003, 0.0035, name="all_gather: waiting", step=0)
    twin = Span(1, COMM, WAITING, 0.003, 0.0035, name="all_gather: waiting", step=0)  # the same but its call
    slots = call_slots(spans, {id(spans[7]): wait, id(spans[8]): twin})
    assert slots[id(spans[8])] == slots[id(twin)] == (0, 2)
    assert slots[id(wait)] == slots[id(spans[7])] == (1, 2)


def test_activation_growth_draws_both_kernels_whatever_the_preset_trains_with():
    """The scores line is standard attention and the flash line a fused kernel, even for a preset that
    trained with flash attention (llama3-8b): quadratic against linear, and cp N keeps 1/N of flash."""
    from paralab.sim.presets import get_model

    model = get_model("llama3-8b")
    assert model.attention == "fused"
    lines = viz.activation_growth(model, [4096, 8192], cps=(4,)).layout.meta["bytes"]
    kept, flash = lines["whole sequence, scores kept"], lines["whole sequence, no scores (flash)"]
    assert flash[1] == pytest.approx(2 * flash[0]) and kept[1] > 2 * kept[0] and kept[0] > flash[0]
    assert lines["cp 4 (ring)"] == pytest.approx([f / 4 for f in flash])


def test_cp_modes_draws_ring_against_all_to_all_by_name():
    """The legend names the modes as the text does (all-to-all, not the cp_mode value alltoall); the
    figure's data stays keyed by the cp_mode values."""
    from paralab.sim.hardware import get_hardware
    from paralab.sim.presets import get_model

    model = get_model("llama3-8b").replace(seq=8192)
    fig = viz.cp_modes(model, get_hardware("h100"), [2, 4], global_batch=1, recompute="full")
    assert {t.name for t in fig.data} == {"ring", "all-to-all"}
    assert set(fig.layout.meta["bytes"]) == {"ring", "alltoall"}


def test_attention_per_rank_draws_the_counted_pairs_at_the_runs_mean_rate():
    """Per run: a solid bar per rank of its measured ms (median after the first step) and a hatched
    one of its counted pairs times the run's mean ms per pair, so both add up to the same total."""
    from types import SimpleNamespace

    def run(seconds, pairs):  # two steps per rank: the first is left out as warm-up
        return SimpleNamespace(rank_results=[
            {"attention_cpu_s": {"0": 9.0, "1": s}, "attention_pairs": {"0": n, "1": n}}
            for s, n in zip(seconds, pairs)])

    fig = viz.attention_per_rank({"zigzag": run([0.010, 0.012], [100, 100]),
                                  "contiguous": run([0.004, 0.016], [50, 150])})
    timed, counted = (t for t in fig.data if t.name.startswith("contiguous"))
    assert list(timed.y) == pytest.approx([4.0, 16.0]) and list(counted.y) == pytest.approx([5.0, 15.0])
    assert counted.marker.pattern.shape == "/" and list(counted.customdata) == [50, 150]
    meta = fig.layout.meta
    assert meta["imbalance"] == pytest.approx({"zigzag": 1.2, "contiguous": 4.0})
    assert meta["pair_imbalance"] == {"zigzag": 1.0, "contiguous": 3.0}


def _compared(label, organisation, gpus, published, predicted, miss="", batch=0):
    """A published run's comparison without running the cost model: only what the figures read. Its
    global batch is ``batch`` sequences, one a GPU unless given."""
    from types import SimpleNamespace

    from paralab.sim import ParallelSpec
    from paralab.sim.published import Compared

    parallel = ParallelSpec(dp=gpus, micro_batch=1, global_batch=batch or gpus)
    run = SimpleNamespace(label=label, organisation=organisation, gpus=gpus, published=published,
                          known_miss=miss, metric="tokens_per_s", hardware=SimpleNamespace(name="a100"),
                          parallel=parallel,
                          predicted=lambda prediction: prediction)  # the "prediction" is the figure itself
    return Compared(run, predicted)


def test_published_errors_draw_each_run_against_its_gpus_with_the_misses_open():
    compared = [_compared("A", "Org1", 8, 100.0, 110.0), _compared("A", "Org1", 64, 100.0, 95.0),
                _compared("B", "Org2", 1024, 200.0, 270.0, miss="why")]
    fig = viz.published_errors(compared)
    first, second = fig.data
    assert [first.name, second.name] == ["Org1", "Org2"]
    assert list(first.x) == [8, 64] and list(first.y) == pytest.approx([10.0, -5.0])
    assert list(second.y) == pytest.approx([35.0]) and second.marker.symbol == ("diamond-open",)
    assert all(not s.endswith("-open") for s in first.marker.symbol)
    band = fig.layout.shapes[0]
    assert (band.y0, band.y1) == (-20.0, 20.0)
    assert fig.layout.yaxis.range[1] >= 40  # the miss at +35% is inside the plot
    meta = fig.layout.meta
    assert meta["errors"] == pytest.approx([0.10, -0.05, 0.35])
    assert meta["mean_abs_error_covered"] == pytest.approx(0.075)
    assert "2 inside" in fig.layout.title.text and "1 known misses" in fig.layout.title.text


def test_published_errors_draw_organisations_at_one_gpu_count_apart_and_hover_the_true_count():
    """Runs of several organisations on the same GPU count had sat on top of one another."""
    from paralab.viz.published import SPREAD

    compared = [_compared("A", "Org1", 8, 100.0, 110.0), _compared("B", "Org2", 8, 100.0, 111.0),
                _compared("C", "Org3", 8, 100.0, 109.0), _compared("D", "Org2", 64, 100.0, 100.0)]
    fig = viz.published_errors(compared)
    at_8 = [x for trace in fig.data for x, c in zip(trace.x, trace.customdata) if c[4] == "8"]
    assert at_8 == pytest.approx([8 / SPREAD, 8, 8 * SPREAD])  # in the organisations' order, about 8
    assert list(fig.data[1].x) == pytest.approx([8, 64])  # one organisation alone at 64 stays on it
    assert all("%{customdata[4]} GPUs" in t.hovertemplate and "%{x" not in t.hovertemplate for t in fig.data)
    assert fig.layout.meta["gpus"] == [8, 8, 64, 8]  # the true counts, in drawing order


def test_published_errors_hover_each_runs_figures_in_its_own_metric():
    """Runs report tokens/s, MFU % or TFLOP/s: the hover had given bare figures in scientific notation,
    "published 1.327e+05" beside another run's "49.2", without the metric of either."""
    tokens = _compared("A", "Org1", 1024, 132_700.0, 138_200.0)
    mfu = _compared("B", "Org1", 64, 49.2, 50.1)
    mfu.run.metric = "mfu"
    (trace,) = viz.published_errors([tokens, mfu]).data
    assert "%{customdata[5]}" in trace.hovertemplate
    assert [list(c[2:4]) + [c[5]] for c in trace.customdata] == [["132,700", "138,200", "tokens/s"],
                                                                 ["49.2", "50.1", "MFU %"]]


def test_published_scaling_draws_the_share_each_count_keeps_published_and_predicted():
    from paralab.sim.published import Scaling

    flat = Scaling("flat", (_compared("S", "O", 8, 800.0, 880.0), _compared("S", "O", 16, 1520.0, 1740.0)),
                   miss="too flat")
    close = Scaling("close", (_compared("T", "O", 100, 1000.0, 1000.0),
                              _compared("T", "O", 400, 3600.0, 3560.0)), miss="")
    fixed = Scaling("fixed, weak scaling", (_compared("U", "O", 64, 640.0, 640.0, batch=512),
                                            _compared("U", "O", 128, 1200.0, 1200.0, batch=512)), miss="")
    grows = Scaling("grows", (_compared("V", "O", 64, 640.0, 640.0, batch=64),
                              _compared("V", "O", 128, 1200.0, 1200.0, batch=512)), miss="")
    fig = viz.published_scaling([flat, close, fixed, grows])
    published, predicted = fig.data[:2]
    assert list(published.x) == [8, 16]
    assert list(published.y) == pytest.approx([100.0, 95.0])  # 100 -> 95 tokens/s per GPU
    assert list(predicted.y) == pytest.approx([100.0, 100 * (1740 / 16) / (880 / 8)])
    assert [t.showlegend for t in fig.data] == [True, True] + [False] * 6
    titles = [a.text for a in fig.layout.annotations]
    assert "published 5.0%, predicted 1.1% (miss)" in titles[0] and "(miss)" not in titles[1]
    assert fig.layout.meta["series"][1]["published"] == pytest.approx([1.0, 0.9])
    # each title says whether the batch is fixed or grows with the GPUs (torchtitan's, 2 a GPU, had
    # not said it was weak scaling), and a name that says "weak scaling" itself is not made to repeat it
    assert "<br>weak scaling: 1 sequence per GPU<br>" in titles[0]
    assert titles[2].startswith("fixed<br>global batch fixed: 512 sequences<br>")
    assert "<br>global batch growing: 64 to 512 sequences<br>" in titles[3]
    assert fig.layout.meta["series"][3]["global_batch"] == [64, 512]
    # four panels on three columns: the two empty cells draw no axes, and each column's lowest panel
    # carries the x-axis title (a title and ticks had hung under two empty cells, like broken plots)
    axes = {name: fig.layout[name] for name in ("xaxis4", "xaxis5", "xaxis6", "yaxis5", "yaxis6")}
    assert [a.visible for a in axes.values()] == [None, False, False, False, False]
    assert [fig.layout[f"xaxis{i}"].title.text for i in range(1, 7)] == [
        None, "GPUs (log scale)", "GPUs (log scale)", "GPUs (log scale)", None, None]


def test_the_hiding_figure_marks_each_threshold_where_its_curve_reaches_one():
    """The curve is sampled at powers of two, so it had met its threshold's line at 85%, and the line's
    label sat at 10^1418 on the log axis, never drawn."""
    from paralab.viz.overlap import hiding

    tokens = [2.0**k for k in range(7, 13)]
    fig = hiding({"link": [t / 1418 for t in tokens]}, tokens, {"link": 1418.0})
    (curve,) = fig.data
    assert (1418.0, 1.0) in zip(curve.x, curve.y) and list(curve.x) == sorted(curve.x)
    (label,) = fig.layout.annotations
    assert label.text == "1,418" and label.x == pytest.approx(math.log10(1418))
    assert fig.layout.xaxis.dtick == 1  # labels at powers of ten: a lone minor "2" had read as 2 tokens


def test_the_hiding_figures_curves_stay_apart_where_both_reach_one():
    """Past their thresholds both curves lie at 100%: a solid line over another had hidden it, the first
    curve seeming to stop at its threshold. Each is dashed its own way."""
    from paralab.viz.overlap import hiding

    tokens = [2.0**k for k in range(7, 16)]
    fig = hiding({"node": [t / 1418 for t in tokens], "nic": [t / 11000 for t in tokens]}, tokens)
    assert [t.line.dash for t in fig.data] == ["solid", "dash"]


def rgb_distance(a: str, b: str) -> float:
    """Euclidean distance between two #RRGGBB colours, 0 to 441."""
    return math.dist(*([int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in (a, b)))


@pytest.mark.parametrize("rank_order", ["tp-dp-pp", "tp-pp-dp"])
def test_a_prediction_in_llama3s_rank_order_is_split_by_dimension_as_its_groups_are(rank_order):
    """The comm figures name a collective's dimension from its ranks' mesh coordinates: a prediction
    numbered tp, pp, dp (Llama 3's order) carries its order in its meta, so its gradient all-reduce is
    still dp and its sends pp (they had read as pp and dp)."""
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm import bytes_by_dimension
    from paralab.viz.comm_compare import predicted_comm_trace

    spec = ParallelSpec(dp=2, tp=2, pp=2, global_batch=8, microbatches=4, rank_order=rank_order)
    trace = predicted_comm_trace(get_model("llama3-8b"), spec, gpus_per_node=4)
    by_dimension = bytes_by_dimension(trace)
    assert trace.meta["rank_order"] == rank_order
    assert set(by_dimension["dp"]) == {"all_reduce"} and set(by_dimension["pp"]) == {"send"}
    # dp's ring crosses nodes in Llama 3's order (ranks 4 apart), pp's sends in the lab's
    crossing = {dim: sum(links["inter_node"] for links in ops.values()) > 0
                for dim, ops in by_dimension.items() if dim in ("dp", "pp")}
    assert crossing == {"dp": rank_order == "tp-pp-dp", "pp": rank_order == "tp-dp-pp"}


def test_an_expert_groups_all_to_all_is_ep_and_its_gradient_all_reduce_dp():
    """With ep = dp the experts' group and the data-parallel group are the same ranks: the dense
    gradients' all-reduce had been filed under ep beside the tokens' all-to-all (a measured run), and a
    prediction, whose meta the layout was read from without its ep, had filed both under dp."""
    from paralab.sim.presets import get_model
    from paralab.sim.specs import ParallelSpec
    from paralab.viz.comm import bytes_by_dimension
    from paralab.viz.comm_compare import predicted_comm_trace

    trace = predicted_comm_trace(get_model("mixtral-8x7b"), ParallelSpec(dp=4, ep=4, tp=2, global_batch=8),
                                 gpus_per_node=8)
    by_dimension = bytes_by_dimension(trace)
    assert set(by_dimension["ep"]) == {"all_to_all"} and set(by_dimension["dp"]) == {"all_reduce"}


def test_the_speedup_figure_makes_room_for_its_legends_rows():
    """Three runs, their predictions, the measured and predicted curves and two ideals are eight
    legend entries: three rows in a notebook cell of 760 px, whose third had touched the subplot titles.
    The top margin grows a row's height per row past the first."""
    from paralab.viz.scaling import LEGEND_ROW_PX, speedup_steps

    runs = {n: _steps_of([0.3 / n] * 3) for n in (1, 2, 4)}
    few = speedup_steps({1: runs[1]}, baseline=runs[1])
    many = speedup_steps(runs, baseline=runs[1], predicted={1: 0.3, 2: 0.16, 4: 0.09},
                         curve={1: 0.3, 2: 0.16, 4: 0.09, 8: 0.05}, ideal_here={1: 1.0, 2: 2.0, 4: 2.0})
    entries = [sum(t.showlegend is not False for t in fig.data) for fig in (few, many)]
    assert entries == [3, 8]
    assert many.layout.margin.t == few.layout.margin.t + 2 * LEGEND_ROW_PX


def test_speedups_below_one_have_a_labelled_tick_under_them():
    """A 4-rank run at 0.67x had sat on the speedup panel's floor with 1 its lowest tick, and two
    hybrids at 0.09x and 0.2x under the step panel's only ticks, 0.5 and 1."""
    from paralab.viz.scaling import speedup_steps

    runs = {1: _steps_of([0.3] * 3), 2: _steps_of([0.2] * 3), 4: _steps_of([0.45] * 3)}
    panel = speedup_steps(runs, baseline=runs[1]).layout.yaxis2
    below = [t for t in panel.tickvals if math.log10(t) >= panel.range[0] and t <= 0.3 / 0.45]
    assert below == [0.5]
    # and one at or above the fastest point drawn (the ideal's 4x), inside the panel
    assert max(panel.tickvals) == 4.0 and math.log10(4.0) < panel.range[1]
    timeline = viz.speedup_timeline({"slow": _steps_of([1.0] * 3)}, baseline=0.1).layout.yaxis2
    assert timeline.rangemode == "tozero" and timeline.nticks >= 6


def test_ring_against_tree_stops_a_node_link_at_the_node():
    """Notebook 13 had drawn "NVLink (H100 node)" out to 1,024 ranks, though a node joins 8 GPUs: a
    link given a reach is drawn up to it, and a note on the plot says why; one without runs on."""
    from paralab.viz.collectives import ring_against_tree

    links = {"NVLink": (3e-6, 3e11), "InfiniBand": (6e-6, 4e10)}
    groups = [2, 4, 8, 16, 32]
    fig = ring_against_tree(links, 2**16, groups, reach={"NVLink": 8})
    drawn = {t.name: list(t.x) for t in fig.data}
    assert drawn == {"NVLink, ring": [2, 4, 8], "NVLink, tree": [2, 4, 8],
                     "InfiniBand, ring": groups, "InfiniBand, tree": groups}
    assert len(fig.layout.meta["NVLink, ring"]) == 3
    (note,) = fig.layout.annotations
    assert "joins the 8 GPUs of a node" in note.text
    assert not ring_against_tree(links, 2**16, [2, 4, 8], reach={"NVLink": 8}).layout.annotations  # none cut


def test_the_kinds_of_an_elastic_timeline_each_have_a_colour_of_their_own():
    """Hashed into EXTRA_COLORS, a checkpoint's load had shared a worker's start's colour, and its save
    ring attention's."""
    kinds = ("forward", "backward", "optimizer", "all_reduce", "failure", "failure_detected",
             "worker_start", "rendezvous", "checkpoint_save", "checkpoint_load", "slowdown", "attention",
             "send", "recv")
    colors = [kind_color(kind) for kind in kinds]
    assert len(set(colors)) == len(colors), dict(zip(kinds, colors))


def test_an_instant_on_the_event_lane_is_drawn_wide_enough_to_see():
    """An elastic run's failure and its detection last no time: they had a legend entry and no bar."""
    from paralab.trace import EVENT

    spans = [Span(0, STEP, "step", 0, 1.0, step=0), Span(0, COMPUTE, "forward", 0, 1.0, step=0),
             Span(0, EVENT, "failure", 0.5, 0.5, name="SIGKILL (node lost)")]
    failure = next(t for t in viz.timeline(Trace(spans=spans)).data if t.name == "failure")
    assert list(failure.x) == [pytest.approx(4.0)]  # 0.4% of the 1,000 ms axis
    assert "duration 0.000 ms" in failure.hovertext[0]  # its own time, said


def test_timeline_microbatch_colours_are_not_the_kinds_and_labels_stay_readable_where_whitened():
    """Microbatch 0 had been drawn in the forward's blue and microbatch 1 in the backward's orange, so
    F0, F1, B0, B1 read as forward, backward, forward, backward: every microbatch shade is now 20 or
    more CIE76 units from every kind's colour. A forward blocked on its all-reduce is whitened; its
    label, white under that white before, is written over it in dark ink, and off its own bar."""
    from tests.test_elastic import lab

    for shade in TIMELINE_MICROBATCH_COLORS:
        for kind, color in [*KIND_COLORS.items(), *enumerate(EXTRA_COLORS)]:
            if color.startswith("#"):
                assert math.dist(lab(shade), lab(color)) >= 20, (shade, kind, color)
    spans = [Span(0, STEP, "step", 0, 0.010, step=0),
             Span(0, COMPUTE, "forward", 0, 0.008, microbatch=0, stage=0, step=0),
             Span(0, COMPUTE, "forward", 0.008, 0.010, microbatch=1, stage=0, step=0),
             Span(0, COMM, "all_reduce", 0.001, 0.007, name="mlp g", issue_s=0.006, step=0)]
    fig = viz.timeline(Trace(spans=spans))
    forward = next(t for t in fig.data if t.name == "forward")
    assert list(forward.marker.color) == TIMELINE_MICROBATCH_COLORS[:2]
    assert list(forward.text) == ["", "F1 s0"] and list(forward.insidetextfont.color) == ["white", "white"]
    labels = fig.data[-1]  # drawn last: over the whitening
    assert labels.name == LABELS and list(labels.text) == ["F0 s0"]
    assert list(labels.insidetextfont.color) == ["#222"]
    assert labels.hoverinfo == "skip" and labels.showlegend is False
    # blocked in many short stretches (a tensor-parallel forward's all-reduces), its middle in a gap
    # between two: the label is inked for the washed fill under most of the bar, not for the gap
    calls = [Span(0, COMM, "all_reduce", lo, hi, issue_s=hi - lo, step=0)
             for lo, hi in ((0, 0.0019), (0.0021, 0.0037), (0.0045, 0.0079))]  # the middle, 0.004, in a gap
    fig = viz.timeline(Trace(spans=[*spans[:3], *calls]))
    assert list(fig.data[-1].text) == ["F0 s0"] and list(fig.data[-1].insidetextfont.color) == ["#222"]


def test_microbatch_bars_give_plotly_colours_not_numbers(pipe):
    """Microbatch numbers on a colour scale made plotly.js log "Invalid color specifier: Int8Array" for
    every bar, hundreds per figure: each bar now carries its colour."""
    for t in viz.timeline(pipe).data:
        colors = [t.marker.color] if isinstance(t.marker.color, str) else list(t.marker.color)
        assert t.marker.colorscale is None and all(isinstance(c, str) for c in colors), t.name


def test_many_calls_in_flight_spread_over_filler_rows_each_tall_enough_to_see():
    """22 all-reduces in flight at once (0.05 MiB buckets) had shared one comm row, each a 1-pixel
    line washed out by its white edge: the row now grows by unlabelled filler rows, so each call keeps
    a fifth of a row at least, without an edge, and still says in its hover what it shares the row with."""
    calls = [Span(0, COMM, "all_reduce", 0.001 * k, 0.030 + 0.0001 * k, name=f"bucket {k}", step=0)
             for k in range(22)]
    spans = [Span(0, STEP, "step", 0, 0.040, step=0), Span(0, COMPUTE, "backward", 0, 0.025, step=0), *calls]
    fig = viz.timeline(Trace(spans=spans), waits=False)
    rows = fig.layout.meta["rows"]
    assert rows == ["r0 compute", "r0 comm"] + [f"r0 comm{FILLER}{k}" for k in range(1, 6)]
    assert list(fig.layout.yaxis.ticktext) == ["r0 compute", "r0 comm"] + [""] * 5
    reduces = next(t for t in fig.data if t.name == "all_reduce")
    assert min(reduces.width) >= 0.2 and set(reduces.marker.line.width) == {0}
    bottoms = [o + w for o, w in zip(reduces.offset, reduces.width)]
    assert max(bottoms) < 5.4 and max(bottoms) > 5.3  # down to the last filler row
    # a gap between neighbours: two calls that start and end together had read as one thick bar
    assert all(nxt > end for end, nxt in zip(bottoms, list(reduces.offset)[1:]))
    assert "sub-row 22 of 22" in reduces.hovertext[-1]


def test_the_key_says_what_each_hatch_of_a_split_backward_means():
    """Bars carry three hatches, but the key had said only "backwards hatched": where a backward is
    split into its input-gradient (Bi) and weight-gradient (W) passes, it names all three."""
    split = simulate_schedule(build_schedule("zb-h1", 4, 8), TIMES, 1e-4)
    key = viz.timeline(split).layout.xaxis.title.text
    assert "hatched: ╲ input-gradient backward (Bi), ╳ weight-gradient backward (W)<br>" in key
    plain = viz.timeline(simulate_schedule(build_schedule("1f1b", 4, 8), TIMES, 1e-4))
    plain = plain.layout.xaxis.title.text
    assert "backwards hatched<br>" in plain and "Bi" not in plain


def test_steps_median_draws_the_typical_step_not_a_noisy_last_one():
    """Notebook 02 drew its last step, one noisy send stretching it to 103 ms against a 58 ms median:
    ``steps="median"`` draws the step (after the warm-up) nearest the median time, and says so."""
    times = [0.090, 0.058, 0.057, 0.060, 0.103]
    starts = [sum(times[:k]) for k in range(len(times))]
    spans = [span for k, (t0, length) in enumerate(zip(starts, times)) for span in (
        Span(0, STEP, "step", t0, t0 + length, step=k),
        Span(0, COMPUTE, "forward", t0, t0 + length / 2, step=k))]
    trace = Trace(spans=spans)
    assert median_step(trace) == 1  # median of 58, 57, 60, 103 is 59: 58 and 60 tie, the first wins
    fig = viz.timeline(trace, steps="median")
    assert fig.layout.title.text.endswith("step 1 (58.0 ms, the step nearest the 59.0 ms median)")
    with pytest.raises(ValueError, match="steps are step numbers"):
        viz.timeline(trace, steps="last")  # had drawn nothing, in silence
    assert len(fig.data[0].x) == 1
    # a profile recorded from step 2 (its schedule warmed up before): step 2 is one of the typical ones
    later = Trace(spans=[Span(0, STEP, "step", 20.0 * k, 20.0 * k + took, step=k)
                         for k, took in ((2, 1.0), (3, 3.0))])
    assert median_step(later) == 2  # 1 and 3 s, median 2: a tie, the first wins (had been step 3, alone)


def test_a_predictions_memory_bar_is_the_fullest_gpus_not_rank_0s():
    """A prediction's memory is its fullest GPU's, which in a pipeline is often not the first stage:
    its one bar had been labelled "r0"."""
    from paralab.sim import ParallelSpec, get_hardware, get_model, predict

    prediction = predict(get_model("llama3-8b"), ParallelSpec(dp=4, pp=2, microbatches=8),
                         get_hardware("h100"))
    for given in (prediction, prediction.memory_bytes_per_gpu, prediction.to_dict()):  # to_dict had raised
        assert list(viz.memory(given).data[0].x) == ["the fullest GPU"]
    assert list(viz.memory({"a": prediction, "b": prediction}).data[0].x) == ["a", "b"]  # one bar a run
