"""A mixture of experts' load and what it costs: where the tokens went, and who waited for whom.

Both figures read the ``moe.*`` counters a run's MoE layers record in its trace
(:func:`paralab.moe_load.expert_load`) and, for the cost, the all-to-all spans beside them.

- :func:`expert_load`: tokens per expert over the steps (a heatmap, summed over layers and ranks),
  and the token-to-expert assignments dropped for lack of capacity.
- :func:`expert_cost`: per rank, the tokens its own experts computed beside (in a panel of its own)
  the time it spent in all-to-alls. An all-to-all ends on every rank when the slowest has sent; the
  rank whose experts got the most tokens computes longest, so the others wait for it inside their
  combine: the straggler waits least and makes everyone else wait.
"""

from __future__ import annotations

from paralab.moe_load import expert_load as load_of
from paralab.trace import past_warm_up
from paralab.viz._common import as_trace, go, kind_color, make_subplots, style


def expert_load(trace, title: str | None = None, most_tokens: int | None = None, layer: int | None = None):
    """Heatmap of tokens per expert per step, and dropped assignments per step below it (when any were).

    ``most_tokens``: the top of the colour scale, so that runs drawn side by side share one (by default
    each figure's own busiest cell). The scale starts at 0 either way, so a cell's shade is its share of
    the top: from the quietest cell, an expert given 170 tokens against a mean of 256 had been drawn
    white, as if it had none. ``layer``: that MoE layer's tokens alone (by default
    the sum over the layers, in which two layers that favour different experts even each other out).
    ``fig.layout.meta``: ``tokens`` ([step][expert]), ``dropped`` (per step, all layers),
    ``imbalance`` (per step: the busiest expert over the mean, of the layer drawn, or averaged over
    the layers), ``steps``, ``layer``."""
    go()
    load = load_of(as_trace(trace))
    if not load.routed:
        raise ValueError("this trace has no mixture-of-experts counters (a dense model, or tracing was off)")
    steps = load.steps
    tokens = [load.tokens_per_expert(step, layer) for step in steps]
    dropped = load.dropped_per_step()
    imbalance = [load.imbalance(step, layer) for step in steps]
    where = "all layers and ranks" if layer is None else f"layer {layer}, all ranks"
    heatmap = go().Heatmap(
        x=steps, y=[f"expert {e}" for e in range(load.experts)], z=[list(col) for col in zip(*tokens)],
        colorscale="Blues", colorbar=dict(title="tokens", len=0.7, y=0.64 if any(dropped) else 0.5),
        # both ends set: plotly.js autoscales, ignoring zmin, unless zmax is set too
        zmin=0, zmax=most_tokens if most_tokens is not None else max(1, *(max(step) for step in tokens)),
        hovertemplate="step %{x}, %{y}: %{z} tokens<extra></extra>")
    if not any(dropped):  # dropless, or every assignment within capacity: no panel of zeros
        fig = make_subplots(rows=1, cols=1, subplot_titles=(
            f"tokens per expert ({where}); no assignment dropped",))
        fig.add_trace(heatmap, row=1, col=1)
        fig.update_xaxes(title_text="step", dtick=1)
    else:
        titles = (f"tokens per expert ({where})",
                  "dropped assignments" + ("" if layer is None else " (all layers)"))
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.72, 0.28],
                            vertical_spacing=0.08, subplot_titles=titles)
        fig.add_trace(heatmap, row=1, col=1)
        fig.add_trace(go().Bar(
            x=steps, y=dropped, name="dropped", marker_color="#D62728", showlegend=False,
            customdata=imbalance,
            hovertemplate="step %{x}: %{y} dropped, imbalance %{customdata:.2f}<extra></extra>"),
            row=2, col=1)
        fig.update_xaxes(title_text="step", row=2, col=1, dtick=1)
        fig.update_yaxes(title_text="dropped", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="expert", row=1, col=1)
    fig.layout.meta = {"tokens": tokens, "dropped": dropped, "imbalance": imbalance, "steps": steps,
                       "layer": layer}
    mean = sum(imbalance) / len(imbalance)
    which = "expert load" if layer is None else f"expert load, layer {layer}"
    drops = f"{sum(dropped)} dropped" + ("" if layer is None else " in all layers")  # counted over them all
    return style(fig, title or f"{which}: busiest expert {mean:.2f}x the mean, {drops}", 460)


def expert_cost(trace, title: str | None = None):
    """Per rank, over the steps past warm-up, side by side: the tokens its experts computed (left
    panel) and the milliseconds it spent in all-to-alls (right panel). Two panels, each with its own
    axis from zero, since tokens and milliseconds do not share a scale: compare the ranks within a
    panel, and the order of the ranks across the two. The straggler's bars are outlined.

    ``fig.layout.meta``: ``received`` and ``all_to_all_s`` per rank (means per step), ``ranks`` and
    ``straggler`` (the rank whose experts computed the most)."""
    graph = go()
    trace = as_trace(trace)
    load = load_of(trace)
    if not load.routed:
        raise ValueError("this trace has no mixture-of-experts counters (a dense model, or tracing was off)")
    steps = past_warm_up(load.steps)
    ranks = load.ranks
    received = [sum(load.received_per_rank(step)[i] for step in steps) / len(steps)
                for i in range(len(ranks))]
    waits = []
    for rank in ranks:
        spans = [s for s in trace.select(kind="all_to_all", rank=rank) if s.step in steps]
        waits.append(sum(s.duration for s in spans) / len(steps))
    straggler = ranks[max(range(len(ranks)), key=received.__getitem__)]
    labels = [f"rank {r}" + (" (straggler)" if r == straggler else "") for r in ranks]
    outline = dict(color=["#222" if r == straggler else "rgba(0,0,0,0)" for r in ranks], width=2)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "tokens its experts computed, per step", "time inside all-to-alls, ms per step"))
    fig.add_trace(graph.Bar(x=labels, y=received, name="tokens its experts computed",
                            marker=dict(color="#4C78A8", line=outline), showlegend=False,
                            hovertemplate="%{x}: %{y:.0f} tokens per step<extra></extra>"), row=1, col=1)
    fig.add_trace(graph.Bar(x=labels, y=[w * 1e3 for w in waits], name="time in all-to-all (ms)",
                            marker=dict(color=kind_color("all_to_all"), line=outline), showlegend=False,
                            hovertemplate="%{x}: %{y:.2f} ms per step in all-to-all<extra></extra>"),
                  row=1, col=2)
    fig.update_yaxes(title_text="tokens per step", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="ms per step", rangemode="tozero", row=1, col=2)
    fig.layout.meta = {"received": received, "all_to_all_s": waits, "ranks": ranks, "straggler": straggler}
    return style(fig, title or f"the cost of the load: rank {straggler}'s experts compute the most, "
                               f"the others wait for it", 400)
