"""Elastic training over time: world size, step time and utilisation, with failures and rescales.

Reads the trace's counters (``world_size``, ``step_time_s``, ``cpu_percent`` or ``gpu_percent``,
sampled per rank) and its event lane (spans on lane ``"event"``: kind ``failure``, ``rescale``, ...).
When no ``step_time_s`` counter exists, step times come from the step windows; utilisation is
averaged over the ranks that report at each instant.
"""

from __future__ import annotations

from collections import defaultdict

from paralab.trace import EVENT
from paralab.viz._common import as_trace, go, kind_color, make_subplots, style

UTILISATION = ("cpu_percent", "gpu_percent", "utilisation", "utilization")


def counter_series(trace, name: str, reduce: str = "mean") -> tuple[list[float], list[float]]:
    """(times, values) of a counter, combining ranks that sample at the same instant."""
    at: dict[float, list[float]] = defaultdict(list)
    for c in trace.counters:
        if c.name == name:
            at[round(c.t, 6)].append(c.value)
    ts = sorted(at)
    pick = {"mean": lambda v: sum(v) / len(v), "max": max, "sum": sum}[reduce]
    return ts, [pick(at[t]) for t in ts]


def elastic(trace, title: str | None = None):
    """Three panels over time (s): world size, step time, utilisation; events as vertical lines."""
    graph = go()
    trace = as_trace(trace)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("world size", "step time", "utilisation"))
    t, ws = counter_series(trace, "world_size", "max")
    fig.add_trace(graph.Scatter(x=t, y=ws, mode="lines+markers", line_shape="hv", name="world size",
                                line=dict(color="#4C78A8")), 1, 1)
    t, st = counter_series(trace, "step_time_s", "max")
    if not t:
        windows = trace.step_windows()
        t, st = [hi for _, hi in windows.values()], [hi - lo for lo, hi in windows.values()]
    fig.add_trace(graph.Scatter(x=t, y=[v * 1e3 for v in st], mode="lines+markers", name="step time",
                                line=dict(color="#F58518"), hovertemplate="%{y:.1f} ms at %{x:.2f} s<extra></extra>"), 2, 1)
    util_name = next((n for n in UTILISATION if any(c.name == n for c in trace.counters)), None)
    if util_name:
        t, u = counter_series(trace, util_name)
        fig.add_trace(graph.Scatter(x=t, y=u, mode="lines", name=util_name, line=dict(color="#54A24B")), 3, 1)
    events = trace.select(lane=EVENT)
    for e in events:
        color = kind_color(e.kind)
        for row in (1, 2, 3):
            fig.add_vline(x=e.start, line_color=color, line_dash="dash", row=row, col=1)
        if e.end > e.start:
            fig.add_vrect(x0=e.start, x1=e.end, fillcolor=color, opacity=0.12, line_width=0, row=1, col=1)
    # one invisible marker per event, so events have hover text and a legend entry per kind
    shown = set()
    for e in events:
        fig.add_trace(graph.Scatter(
            x=[e.start], y=[max(ws) if ws else 1], mode="markers", marker=dict(symbol="x", size=11, color=kind_color(e.kind)),
            name=e.kind, legendgroup=e.kind, showlegend=e.kind not in shown,
            hovertemplate=f"{e.kind}: {e.name or ''} (rank {e.rank}) at %{{x:.2f}} s<extra></extra>"), 1, 1)
        shown.add(e.kind)
    fig.update_yaxes(title_text="ranks", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=2, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="%", row=3, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    fig.update_layout(meta={"events": [(e.kind, e.start) for e in events], "world_size": ws})
    return style(fig, title or "elastic training", 620)
