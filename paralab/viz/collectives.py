"""Figures of the collectives lesson (notebook 13): time and bandwidth against tensor size under the
alpha-beta model (paralab.collectives), measured beside fitted, and ring against tree."""

from __future__ import annotations

import math

from paralab.collectives import bus_bandwidth, ring_time, tree_time
from paralab.viz._common import (
    SERIES_COLORS,
    byte_scale,
    go,
    make_subplots,
    powers_of_ten,
    style,
    uncrowded_log_ticks,
)

SIZES = [2.0**k for k in range(2, 31)]  # 4 B to 1 GiB
LEGEND_ROW_PX = 20  # a row of a vertical legend
MOST_SIZE_TICKS = 6  # on a size axis: more, and an 820-pixel figure's half had turned them on their side


def size_label(nbytes: float) -> str:
    """A size in :func:`byte_scale`'s unit, whole where it is (65536 -> '64 KiB', 2**30 -> '1 GiB'),
    else to 3 significant digits (100608 -> '98.2 KiB'), as a size axis's ticks read."""
    scale, unit = byte_scale(nbytes)
    value = nbytes / scale
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def size_ticks(low: float, high: float, most: int = MOST_SIZE_TICKS) -> list[float]:
    """Powers of two from ``low`` / 2 to ``high`` * 2, every 1, 2, 5 or 10 binary orders, the closest
    that gives ``most`` ticks at most: read flat ("32 KiB", "1 MiB") on a half-width panel."""
    for every in (1, 2, 5, 10):
        ticks = [2.0**k for k in range(0, 64, every) if low / 2 <= 2.0**k <= high * 2]
        if len(ticks) <= most:
            return ticks
    return ticks


def knee(group: int, alpha: float, bandwidth: float) -> float:
    """The tensor size S = n alpha B at which a ring's latency term equals its bandwidth term: each of
    its messages (S / n bytes) takes as long to send as to start (alpha B bytes)."""
    return group * alpha * bandwidth


def alpha_beta(measured: dict, fits: dict, op: str = "all_reduce", title: str | None = None,
               knees: bool = False):
    """Left: time against size, log-log: ``measured`` {label: (group, [(bytes, s)])} as markers, each
    ``fits`` {label: (group, alpha, bandwidth)} as the model's line; with ``knees``, each fit's knee
    (:func:`knee`) a dotted vertical line on it, labelled. Right: bus bandwidth of both.
    ``fig.layout.meta``: ``measured``, ``fits`` (each with its ``knee_bytes``)."""
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
        rates = [bus_bandwidth(op, p, group, t) for p, t in points]
        fig.add_trace(graph.Scatter(x=xs, y=rates, mode="markers", name=label, legendgroup=label,
                                    showlegend=False, marker=dict(color=color, size=8),
                                    customdata=list(zip(sized, map(rate_label, rates))),
                                    hovertemplate=f"{label}: %{{customdata[0]}}, "
                                                  "%{customdata[1]}<extra></extra>"), 1, 2)
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
        rates = [bus_bandwidth(op, s, group, t) for s, t in zip(sizes, ts)]
        fig.add_trace(graph.Scatter(x=sizes, y=rates, mode="lines", name=label, legendgroup=label,
                                    showlegend=False, line=dict(color=color, dash="dash"),
                                    customdata=list(zip(sized, map(rate_label, rates))),
                                    hovertemplate=f"{label}: %{{customdata[0]}}, "
                                                  "%{customdata[1]}<extra></extra>"), 1, 2)
        at = knee(group, alpha, bandwidth)
        meta["fits"][label] = {"group": group, "alpha_s": alpha, "bandwidth": bandwidth, "knee_bytes": at}
        if knees:
            fig.add_vline(x=at, line=dict(color=color, dash="dot", width=1.5), row=1, col=1)
            fig.add_annotation(text=f"knee S = nαB<br>= {size_label(at)}", x=math.log10(at), xanchor="right",
                               xref="x", yref="y domain", y=0.97 - 0.14 * i, yanchor="top", align="right",
                               showarrow=False, font=dict(size=11, color=color),
                               bgcolor="rgba(255,255,255,0.8)")
    drawn = [p for _, points in measured.values() for p, _ in points] + sizes
    ticks = size_ticks(min(drawn), max(drawn))
    # binary sizes on the size axis (plotly's SI "1k" would be 1,000 bytes), powers of ten on the others
    # (its SI "100µ" on a rate axis reads as a unit); flat, few enough to stay so
    fig.update_xaxes(type="log", title_text="tensor size S", tickvals=ticks,
                     ticktext=list(map(size_label, ticks)), tickangle=0)
    for col, (axis, unit) in enumerate((("y", "ms"), ("y2", "bytes a second")), start=1):
        values = [y for trace in fig.data if (trace.yaxis or "y") == axis for y in trace.y]
        tickvals, ticktext = power_ticks(values)
        if axis == "y2":  # rates in the units a table of them uses: 10⁻⁶ GB/s had meant 1 kB/s
            ticktext = list(map(rate_label, tickvals))
        fig.update_yaxes(type="log", title_text=unit, tickvals=tickvals, ticktext=ticktext, row=1, col=col)
    fig.update_layout(meta=meta)
    entries = len(measured) + len(fits)
    extra = LEGEND_ROW_PX * (entries - 1) if entries > 2 else 0
    style(fig, title or f"{op.replace('_', '-')}: time and bus bandwidth against size", 420 + extra)
    if extra:  # one entry a row: a horizontal legend of long names had wrapped onto the subplot titles
        fig.update_layout(legend=dict(orientation="v", tracegroupgap=0),
                          margin=dict(t=fig.layout.margin.t + extra))
    return fig


# rate units, largest first: a rate is said in the first that keeps its number 1 or more (decimal, as
# nccl-tests and link datasheets state rates)
RATE_UNITS = ((1e15, "PB/s"), (1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s"))


def rate_label(bytes_per_s: float) -> str:
    """A rate to three significant figures in the largest unit that keeps its number 1 or more, the unit
    chosen after rounding (999.6 MB/s is 1 GB/s, not "1e+03 MB/s")."""
    rounded = float(f"{bytes_per_s:.3g}")
    scale, unit = next(((s, u) for s, u in RATE_UNITS if rounded >= s), RATE_UNITS[-1])
    return f"{rounded / scale:.3g} {unit}"


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_ticks(values: list[float]) -> tuple[list[float], list[str]]:
    """A log axis's ticks at every power of ten over the positive ``values``, labelled one way: as plain
    numbers where all read short (0.01 to 1000), else all as powers (10⁻³). Plotly's power format mixes
    the two on one axis ("1", "10", "10²"), and its SI format reads "100µ" on a GB/s axis as a unit."""
    shown = [v for v in values if v > 0] or [1.0]
    ticks = powers_of_ten(min(shown), max(shown))
    powers = [round(math.log10(t)) for t in ticks]
    plain = -2 <= powers[0] and powers[-1] <= 3
    return ticks, [f"{t:g}" if plain else f"10{str(e).translate(SUPERSCRIPT)}" for t, e in zip(ticks, powers)]


# units of a time axis, largest first: the first whose numbers stay below 1000 over what is drawn
TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))


def time_axis(times: list[float]) -> tuple[float, str, list[float]]:
    """(seconds per unit, unit, ticks in that unit) of a log axis over ``times`` (s): the unit that draws
    the longest below 1000, and ticks over what is drawn (1, 2 and 5 over four decades at most, else the
    powers of ten). (plotly's own ticks on a log axis narrower than a decade are bare digits, and
    with ``dtick=1`` there are none between two powers of ten.)"""
    scale, unit = next(((s, u) for s, u in TIME_UNITS if max(times) >= s), TIME_UNITS[-1])
    low, high = min(times) / scale, max(times) / scale
    return scale, unit, uncrowded_log_ticks(low, high, decades=4)


def beyond_reach(reach: int) -> str:
    """Why a node's NVLink is drawn up to ``reach`` ranks only: said on :func:`ring_against_tree`'s
    figure and by the collectives explorer."""
    return (f"NVLink joins the {reach} GPUs of a node, so its groups stop there (beyond it an all-reduce "
            "crosses InfiniBand)")


def ring_against_tree(links: dict, payload: float, groups: list[int], title: str | None = None,
                      reach: dict | None = None):
    """Predicted all-reduce time of ``payload`` bytes against the group size, ring and tree, on each
    of ``links`` {label: (alpha, bandwidth)}; times in the unit :func:`time_axis` picks for them.
    ``reach`` {label: the most ranks that link joins}: a node's NVLink drawn out to 1,024 ranks had
    priced groups no node holds; its lines stop at the node, and a note on the plot says why."""
    graph = go()
    fig = graph.Figure()
    meta: dict = {}
    reach = reach or {}
    joined = {label: [n for n in groups if n <= reach.get(label, n)] for label in links}
    curves = {label: {"ring": [ring_time("all_reduce", payload, n, alpha, bandwidth) for n in joined[label]],
                      "tree": [tree_time(payload, n, alpha, bandwidth) for n in joined[label]]}
              for label, (alpha, bandwidth) in links.items()}
    scale, unit, ticks = time_axis([t for algos in curves.values() for ts in algos.values() for t in ts])
    for i, (label, algos) in enumerate(curves.items()):
        for algo, times in algos.items():
            name = f"{label}, {algo}"
            fig.add_trace(graph.Scatter(x=joined[label], y=[t / scale for t in times], mode="lines+markers",
                                        name=name, line=dict(color=SERIES_COLORS[i % len(SERIES_COLORS)],
                                                             dash="dot" if algo == "tree" else "solid"),
                                        hovertemplate=f"{name}: %{{x}} ranks, "
                                                      f"%{{y:.3g}} {unit}<extra></extra>"))
            meta[name] = times
    cut = sorted({reach[label] for label in links if joined[label] != groups})
    if cut:  # top left, inside the plot: times grow with the ranks, so the lines leave it free
        fig.add_annotation(text="<br>".join(map(beyond_reach, cut)), xref="paper", yref="paper", x=0.01, y=1,
                           xanchor="left", yanchor="top", align="left", showarrow=False,
                           font=dict(size=12, color="#333"), bgcolor="rgba(247,247,247,0.9)")
    fig.update_xaxes(type="log", dtick=0.30103, tickformat=",", title_text="ranks in the all-reduce")
    low, high = math.log10(ticks[0]), math.log10(ticks[-1])
    pad = 0.03 * (high - low)  # a marker on the first or last tick is drawn whole
    fig.update_yaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks],
                     range=[low - pad, high + pad], title_text=f"time ({unit})")
    fig.update_layout(meta=meta)
    return style(fig, title or f"all-reduce of {size_label(payload)}: ring against tree", 400)
