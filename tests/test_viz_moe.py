"""The expert-load figures and the reader behind them, on a trace written by hand: what the counters
say is what the figures draw."""

from __future__ import annotations

import pytest

from paralab.moe_load import counter_name, expert_load
from paralab.trace import Counter, Span, Trace
from paralab.viz import expert_cost
from paralab.viz import expert_load as expert_load_figure

# step -> rank -> layer -> tokens sent to experts 0..3; rank 0 holds experts 0-1, rank 1 experts 2-3
ROUTED = {
    0: {0: {0: [4, 4, 4, 4], 1: [5, 3, 4, 4]}, 1: {0: [4, 4, 4, 4], 1: [4, 4, 4, 4]}},
    1: {0: {0: [10, 0, 2, 4], 1: [8, 8, 0, 0]}, 1: {0: [12, 0, 4, 0], 1: [9, 7, 0, 0]}},
}
DROPPED = {0: 0, 1: 3}
A2A_S = {0: 0.010, 1: 0.002}  # rank 0's experts are hot in step 1: it waits least


def hand_written_trace() -> Trace:
    spans, counters = [], []
    for step, ranks in ROUTED.items():
        start = step * 1.0
        for rank, layers in ranks.items():
            spans.append(Span(rank, "step", "step", start, start + 0.9, step=step))
            spans.append(Span(rank, "comm", "all_to_all", start + 0.1, start + 0.1 + A2A_S[rank] * (step + 1),
                              name="combine", step=step))
            for layer, tokens in layers.items():
                t = start + 0.2 + 0.1 * layer
                counters += [Counter(rank, counter_name(layer, "routed", e), t, n)
                             for e, n in enumerate(tokens)]
                counters.append(Counter(rank, counter_name(layer, "dropped"), t, DROPPED[step] * (rank == 1)))
                mine = range(2 * rank, 2 * rank + 2)
                received = sum(ROUTED[step][src][layer][e] for src in ROUTED[step] for e in mine)
                counters.append(Counter(rank, counter_name(layer, "received"), t, received))
        counters.append(Counter(0, "memory.params", start + 0.5, 123.0))  # not a MoE counter: ignored
    return Trace(spans=spans, counters=counters)


def test_the_reader_sums_counters_into_their_steps():
    load = expert_load(hand_written_trace())
    assert (load.steps, load.ranks, load.layers, load.experts) == ([0, 1], [0, 1], [0, 1], 4)
    assert load.tokens_per_expert(1) == [39, 15, 6, 4]
    assert load.tokens_per_expert(1, layer=0) == [22, 0, 6, 4]
    assert load.dropped_per_step() == [0, 6]  # two layers on rank 1
    assert load.received_per_rank(1) == [22 + 32, 10 + 0]
    assert load.imbalance(0) == pytest.approx((1.0 + 9 / 8) / 2)
    assert load.imbalance(1) == pytest.approx((22 / 8 + 17 / 8) / 2)
    for asked in (load.imbalance, load.tokens_per_expert):  # had read 1.0 and no tokens: a balance
        with pytest.raises(ValueError, match=r"no MoE layer 2 in this trace: its layers are \[0, 1\]"):
            asked(1, layer=2)


def test_expert_load_draws_tokens_per_expert_over_steps_and_the_drops():
    fig = expert_load_figure(hand_written_trace())
    meta = fig.layout.meta
    assert meta["tokens"] == [[17, 15, 16, 16], [39, 15, 6, 4]] and meta["dropped"] == [0, 6]
    heat = fig.data[0]
    # expert rows, step columns
    assert [list(row) for row in heat.z] == [[17, 39], [15, 15], [16, 6], [16, 4]]
    assert list(fig.data[1].y) == [0, 6]
    assert fig.layout.yaxis.title.text == "expert" and fig.layout.yaxis2.title.text == "dropped"
    # its own top by default (the busiest cell), one given where two runs are drawn side by side; from 0
    # either way (plotly.js autoscales from the quietest cell, where a busy expert was drawn white,
    # unless both ends are set)
    assert (heat.zmin, heat.zmax) == (0, 39)
    shared = expert_load_figure(hand_written_trace(), most_tokens=50).data[0]
    assert (shared.zmin, shared.zmax) == (0, 50)


def test_expert_load_draws_one_layer_where_asked():
    """Notebook 11 prints a layer's imbalance (2.76x), which a heatmap of the sum over layers, where two
    layers favour different experts, did not show: ``layer`` draws that layer alone, and says so."""
    fig = expert_load_figure(hand_written_trace(), layer=0)
    meta = fig.layout.meta
    assert meta["tokens"] == [[8, 8, 8, 8], [22, 0, 6, 4]] and meta["layer"] == 0
    assert meta["imbalance"] == pytest.approx([1.0, 22 / 8])
    assert "layer 0" in fig.layout.annotations[0].text and "layer 0" in fig.layout.title.text
    assert "(all layers)" in fig.layout.annotations[1].text  # the drops stay every layer's
    assert "all layers" in expert_load_figure(hand_written_trace()).layout.annotations[0].text
    with pytest.raises(ValueError, match="no MoE layer 5"):
        expert_load_figure(hand_written_trace(), layer=5)


def test_expert_load_leaves_out_the_drops_panel_when_nothing_was_dropped():
    """A dropless run's panel of zeros had taken a third of the figure to say nothing."""
    trace = hand_written_trace()
    trace.spans[:] = [s for s in trace.spans if "dropped" not in getattr(s, "name", "")]
    trace.counters[:] = [c for c in trace.counters if "dropped" not in c.name]
    fig = expert_load_figure(trace)
    assert len(fig.data) == 1 and "no assignment dropped" in fig.layout.annotations[0].text


def test_expert_cost_puts_the_load_beside_the_all_to_all_wait():
    fig = expert_cost(hand_written_trace())
    meta = fig.layout.meta
    assert meta["straggler"] == 0 and meta["ranks"] == [0, 1]
    assert meta["received"] == [54, 10]  # the step after the first
    assert meta["all_to_all_s"] == pytest.approx([0.020, 0.004])
    assert list(fig.data[1].y) == pytest.approx([20.0, 4.0])


def test_expert_cost_draws_tokens_and_milliseconds_in_panels_of_their_own():
    """Tokens and milliseconds share no scale: two bars over one rank on twin axes had read as
    comparable heights. Each quantity gets its own panel and axis from zero; the straggler is named."""
    fig = expert_cost(hand_written_trace())
    tokens, waits = fig.data
    assert (tokens.xaxis, tokens.yaxis, waits.xaxis, waits.yaxis) == ("x", "y", "x2", "y2")
    assert fig.layout.yaxis.rangemode == fig.layout.yaxis2.rangemode == "tozero"
    assert fig.layout.yaxis2.overlaying is None
    assert (fig.layout.yaxis.title.text, fig.layout.yaxis2.title.text) == ("tokens per step", "ms per step")
    assert list(tokens.x) == list(waits.x) == ["rank 0 (straggler)", "rank 1"]
    assert list(tokens.marker.line.color)[1] == "rgba(0,0,0,0)" != list(tokens.marker.line.color)[0]


def test_a_dense_trace_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="no mixture-of-experts counters"):
        expert_load_figure(Trace(spans=[Span(0, "step", "step", 0, 1, step=0)]))


# ------------------------------------------------------------------ the other figures of notebooks 08-14
def test_the_published_figures_say_what_they_compare():
    """The errors' axis had read "predicted / published - 1 (%)", of what it did not say; the scaling
    figure's title had ended "% of the fewest GPUs'", a trailing quote in the reader's eye."""
    from paralab.sim import published
    from paralab.viz.published import published_errors, published_scaling

    compared = published.compare()
    assert "throughput" in published_errors(compared).layout.yaxis.title.text
    title = published_scaling(published.scaling(compared)).layout.title.text
    assert not title.rstrip().endswith("'") and "% of that on the fewest GPUs" in title


def test_the_hiding_figure_labels_at_least_three_powers_of_ten_and_says_log_scale():
    """128 to 65,536 tokens had shown two labels, 1,000 and 10,000, on an axis not said to be a log."""
    import math

    from paralab.viz.overlap import hiding

    tokens = [2.0**k for k in range(7, 17)]
    fig = hiding({"link": [t / 1418 for t in tokens]}, tokens, {"link": 1418.0})
    axis = fig.layout.xaxis
    low, high = axis.range
    assert (low, high) == (2, 5) and axis.dtick == 1  # 100 to 100,000: four powers of ten labelled
    assert low <= math.log10(min(tokens)) and math.log10(max(tokens)) <= high  # nothing cut off
    assert "log scale" in axis.title.text
    narrow = hiding({"link": [1.0, 2.0]}, [1000.0, 2000.0]).layout.xaxis.range
    assert narrow[1] - narrow[0] >= 2


def test_activation_growth_labels_only_powers_of_ten_over_many_decades():
    """Over five decades 1-2-5 ticks had crowded the axis, "2,000" touching "1,000"."""
    import math

    from paralab.sim import get_model
    from paralab.viz.context import activation_growth

    fig = activation_growth(get_model("llama3-8b"), [4096, 8192, 16384, 32768, 65536, 131072], cps=(4, 16))
    ticks = list(fig.layout.yaxis.tickvals)
    assert all(math.log10(t) == pytest.approx(round(math.log10(t))) for t in ticks), ticks
    assert 4 <= len(ticks) <= 8 and "log scale" in fig.layout.yaxis.title.text
    drawn = [y for trace in fig.data for y in trace.y]
    assert ticks[0] <= min(drawn) and max(drawn) <= ticks[-1]
