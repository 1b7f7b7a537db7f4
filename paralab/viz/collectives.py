"""Figures of the collectives lesson (notebook 13): time and bandwidth against message size under the
alpha-beta model (paralab.collectives), measured beside fitted, and ring against tree."""

from __future__ import annotations

from paralab.collectives import bus_bandwidth, ring_time, tree_time
from paralab.viz._common import SERIES_COLORS, byte_scale, go, make_subplots, style

SIZES = [2.0**k for k in range(2, 31)]  # 4 B to 1 GiB


def size_label(nbytes: float) -> str:
    """A size in :func:`byte_scale`'s unit, whole where it is (65536 -> '64 KiB', 2**30 -> '1 GiB'),
    else to 3 significant digits (100608 -> '98.2 KiB'), as a size axis's ticks read."""
    scale, unit = byte_scale(nbytes)
    value = nbytes / scale
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def alpha_beta(measured: dict, fits: dict, op: str = "all_reduce", title: str | None = None):
    """Left: time against size, log-log: ``measured`` {label: (group, [(bytes, s)])} as markers, each
    ``fits`` {label: (group, alpha, bandwidth)} as the model's line. Right: bus bandwidth of both."""
    graph = go()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time", "bus bandwidth (nccl-tests' busbw)"),
                        horizontal_spacing=0.12)
    meta: dict = {"measured": {}, "fits": {}}
    for i, (label, (group, points)) in enumerate(measured.items()):
        xs, ts = [p for p, _ in points], [t for _, t in points]
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        sized = [size_label(x) for x in xs]
        fig.add_trace(graph.Scatter(x=xs, y=[t * 1e3 for t in ts], mode="markers", name=label,
                                    legendgroup=label, marker=dict(color=color, size=8), customdata=sized,
                                    hovertemplate=f"{label}: "
                                                  f"%{{customdata}} in %{{y:.3f}} ms<extra></extra>"), 1, 1)
        fig.add_trace(graph.Scatter(x=xs, y=[bus_bandwidth(op, p, group, t) / 1e9 for p, t in points],
                                    mode="markers", name=label, legendgroup=label, showlegend=False,
                                    marker=dict(color=color, size=8), customdata=sized,
                                    hovertemplate=f"{label}: %{{customdata}}, "
                                                  f"%{{y:.3f}} GB/s<extra></extra>"), 1, 2)
        meta["measured"][label] = points
    largest = max((p for _, points in measured.values() for p, _ in points), default=SIZES[-1])
    # the model drawn where it was measured, and a little beyond
    sizes = [s for s in SIZES if s <= 4 * largest]
    for i, (label, (group, alpha, bandwidth)) in enumerate(fits.items()):
        color = SERIES_COLORS[(i + len(measured)) % len(SERIES_COLORS)]
        ts = [ring_time(op, s, group, alpha, bandwidth) for s in sizes]
        sized = [size_label(x) for x in sizes]
        fig.add_trace(graph.Scatter(x=sizes, y=[t * 1e3 for t in ts], mode="lines", name=label,
                                    legendgroup=label, line=dict(color=color, dash="dash"), customdata=sized,
                                    hovertemplate=f"{label}: "
                                                  f"%{{customdata}} in %{{y:.4g}} ms<extra></extra>"), 1, 1)
        fig.add_trace(graph.Scatter(x=sizes,
                                    y=[bus_bandwidth(op, s, group, t) / 1e9 for s, t in zip(sizes, ts)],
                                    mode="lines", name=label, legendgroup=label, showlegend=False,
                                    line=dict(color=color, dash="dash"), customdata=sized,
                                    hovertemplate=f"{label}: %{{customdata}}, "
                                                  f"%{{y:.3f}} GB/s<extra></extra>"), 1, 2)
        meta["fits"][label] = {"group": group, "alpha_s": alpha, "bandwidth": bandwidth}
    drawn = [p for _, points in measured.values() for p, _ in points] + sizes
    ticks = [4.0**k for k in range(1, 16) if min(drawn) / 2 <= 4.0**k <= max(drawn) * 2]
    # binary sizes on the size axis (plotly's SI "1k" would be 1,000 bytes), powers of ten on the others
    # (its SI "100µ" on a GB/s axis reads as a unit)
    fig.update_xaxes(type="log", title_text="message size", tickvals=ticks,
                     ticktext=list(map(size_label, ticks)))
    fig.update_yaxes(type="log", dtick=1, exponentformat="power", title_text="ms", row=1, col=1)
    fig.update_yaxes(type="log", dtick=1, exponentformat="power", title_text="GB/s", row=1, col=2)
    fig.update_layout(meta=meta)
    return style(fig, title or f"{op.replace('_', '-')}: time and bus bandwidth against size", 420)


def ring_against_tree(links: dict, payload: float, groups: list[int], title: str | None = None):
    """Predicted all-reduce time of ``payload`` bytes against the group size, ring and tree, on each
    of ``links`` {label: (alpha, bandwidth)}."""
    graph = go()
    fig = graph.Figure()
    meta: dict = {}
    for i, (label, (alpha, bandwidth)) in enumerate(links.items()):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        for name, dash, times in (
            ("ring", "solid", [ring_time("all_reduce", payload, n, alpha, bandwidth) for n in groups]),
            ("tree", "dot", [tree_time(payload, n, alpha, bandwidth) for n in groups]),
        ):
            fig.add_trace(graph.Scatter(x=groups, y=[t * 1e6 for t in times], mode="lines+markers",
                                        name=f"{label}, {name}", line=dict(color=color, dash=dash),
                                        hovertemplate=f"{label}, {name}: %{{x}} ranks, "
                                                      f"%{{y:.1f}} us<extra></extra>"))
            meta[f"{label}, {name}"] = times
    fig.update_xaxes(type="log", dtick=0.30103, title_text="ranks in the all-reduce")
    fig.update_yaxes(type="log", dtick=1, title_text="microseconds")
    fig.update_layout(meta=meta)
    return style(fig, title or f"all-reduce of {size_label(payload)}: ring against tree", 400)
