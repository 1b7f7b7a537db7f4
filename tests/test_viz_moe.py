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


def test_expert_load_draws_tokens_per_expert_over_steps_and_the_drops():
    fig = expert_load_figure(hand_written_trace())
    meta = fig.layout.meta
    assert meta["tokens"] == [[17, 15, 16, 16], [39, 15, 6, 4]] and meta["dropped"] == [0, 6]
    heat = fig.data[0]
    # expert rows, step columns
    assert [list(row) for row in heat.z] == [[17, 39], [15, 15], [16, 6], [16, 4]]
    assert list(fig.data[1].y) == [0, 6]
    assert fig.layout.yaxis.title.text == "expert" and fig.layout.yaxis2.title.text == "dropped"
    # its own colour scale by default; one given from 0 where two runs are drawn side by side
    assert heat.zmax is None
    shared = expert_load_figure(hand_written_trace(), most_tokens=50).data[0]
    assert (shared.zmin, shared.zmax) == (0, 50)


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
