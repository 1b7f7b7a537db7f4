"""Pipeline bubbles: how much of each step every rank sits idle, against what the schedule promises.

The measured (or simulated) idle fraction comes from :meth:`Trace.idle_fraction` (the steps past the
job's warm-up: :meth:`Trace.typical_steps`); the theoretical bubble from
:func:`paralab.schedules.theoretical_bubble`, which assumes equal stages and free point-to-point
transfers, so the gap between bars and line is what real stage imbalance and communication cost.
"""

from __future__ import annotations

from paralab.schedules import ScheduleError, build_schedule, theoretical_bubble
from paralab.sim.events import simulate_schedule
from paralab.trace import pipelined
from paralab.viz._common import as_trace, go, kind_color, note_overlaps, overlapping, style

DEFAULT_TIMES = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}
SCHEDULE_COLORS = {"naive": "#7F7F7F", "gpipe": "#4C78A8", "1f1b": "#F58518", "interleaved": "#54A24B",
                   "zb-h1": "#E45756", "zbv": "#B279A2", "dualpipev": "#9D755D"}


def schedule_of(trace) -> tuple[str, int, int, int] | None:
    """(schedule, stages, microbatches, virtual stages) recorded in a trace's meta, if it is a pipeline."""
    m = trace.meta
    if not (pipelined(m) and m.get("schedule")):
        return None
    stages = m.get("stages") or m["pp"]
    return m["schedule"], int(stages), int(m.get("microbatches") or 1), int(m.get("virtual_stages") or 1)


def bubble(trace, schedule: tuple[str, int, int, int] | None = None, title: str | None = None):
    """Per-rank idle fraction bars; dashed line at the schedule's theoretical bubble, dotted at the mean.

    Each bar's value is written under it, beside its rank, and the lines are named in the legend: a
    value over a bar, or a line's label inside the plot, sat on a line that ran close by (a mean is
    always close to some bar's top), and a label at the plot's edge on the axis's ticks.
    ``schedule`` = (name, stages, microbatches, virtual_stages) overrides what the trace's meta says.
    ``fig.layout.meta`` holds ``idle`` (rank -> fraction) and ``theoretical`` (or None).
    """
    graph = go()
    trace = as_trace(trace)
    idle = trace.idle_fraction()
    ranks = sorted(idle)
    at = list(range(len(ranks)))  # bar positions: a numeric axis lets the lines span its whole width
    fig = graph.Figure(graph.Bar(
        x=at, y=[idle[r] for r in ranks], name="idle fraction", marker_color=kind_color("recv"),
        customdata=[f"r{r}" for r in ranks],
        hovertemplate="%{customdata}: idle %{y:.1%} of the step<extra></extra>",
    ))
    theory = None
    schedule = schedule or schedule_of(trace)
    if schedule is not None:
        try:
            theory = theoretical_bubble(*schedule)
        except (ScheduleError, ValueError):
            theory = None
    mean = sum(idle.values()) / len(idle) if idle else 0.0
    lines = [(f"mean {mean:.1%}", mean, dict(dash="dot", color="#555"))]
    if theory is not None:
        lines.append((f"{schedule[0]} theory {theory:.1%}", theory, dict(dash="dash", color="#D62728")))
    edges = [-0.5, len(ranks) - 0.5]
    for name, y, line in lines:
        fig.add_trace(graph.Scatter(x=edges, y=[y, y], mode="lines", name=name, line=line,
                                    hovertemplate=f"{name}<extra></extra>"))
    # a tenth above the tallest bar or line: autoranged, the tallest bar and the mean on it had sat on
    # the plot's top edge
    top = 1.1 * max([*idle.values(), *(y for _, y, _ in lines)]) or 1.0
    fig.update_yaxes(title_text="idle fraction of step", tickformat=".0%", range=[0, top])
    fig.update_xaxes(title_text="rank", range=edges, tickvals=at, showgrid=False,
                     ticktext=[f"r{r}: {idle[r]:.0%}" for r in ranks])
    fig.update_layout(meta={"idle": {str(r): idle[r] for r in ranks}, "theoretical": theory})
    return style(fig, title or "pipeline bubble per rank", 360)


def lower_bound(name: str, stages: int, microbatches: int) -> bool:
    """Whether :func:`theoretical_bubble` is only a lower bound for this shape: ZB-V's closed form counts
    only its start-up ramp, and with fewer microbatches than stages the gradients' way back up the
    pipeline is longer (paralab.schedules.theoretical_bubble). The other schedules' forms are exact for
    equal stages and free transfers in every shape they build."""
    return name == "zbv" and microbatches < stages


def bubble_curve(name: str, stages: int, microbatches, virtual_stages: int = 1,
                 compute_time=None, p2p_time: float = 0.0) -> tuple[list[int], list[float], list[float]]:
    """(microbatches, simulated bubble, theoretical bubble) for one schedule, skipping invalid m.

    Chunk times are divided by the schedule's virtual stages, so every schedule does the same work
    per microbatch and the curves compare schedules, not model sizes.
    """
    ms, sim, theory = [], [], []
    base = dict(DEFAULT_TIMES, **(compute_time or {}))
    for m in microbatches:
        try:
            sched = build_schedule(name, stages, m, virtual_stages)
        except (ScheduleError, ValueError):
            continue
        v = sched.virtual_stages
        times = {op: t / v for op, t in base.items()}
        ms.append(m)
        sim.append(simulate_schedule(sched, times, p2p_time).bubble_fraction())
        theory.append(theoretical_bubble(name, stages, m, v))
    return ms, sim, theory


def bubble_vs_microbatches(schedules=("gpipe", "1f1b", "interleaved", "zb-h1", "zbv"), stages: int = 4,
                           microbatches=(1, 2, 4, 8, 16, 32), virtual_stages: int = 2, compute_time=None,
                           p2p_time: float = 0.0, title: str | None = None):
    """Bubble fraction against microbatches for several schedules: simulated (solid) and theory (dashed).

    Combinations a schedule cannot build (interleaved needs m divisible by the stages, ...) are left
    out of its curve. ``virtual_stages`` applies to the interleaved schedule (zbv always has 2). Curves
    that coincide (a simulation equal to its closed form, two schedules with one bubble) are said to
    on the figure; ``fig.layout.meta["overlap"]`` lists them.
    """
    graph = go()
    fig = graph.Figure()
    ys: dict[str, list[float]] = {}
    xs: dict[str, list[int]] = {}
    for name in schedules:
        v = virtual_stages if name == "interleaved" else 1
        ms, sim, theory = bubble_curve(name, stages, microbatches, v, compute_time, p2p_time)
        color = SCHEDULE_COLORS.get(name, kind_color(name))
        label = f"{name} (v={v})" if name == "interleaved" else name
        fig.add_trace(graph.Scatter(x=ms, y=sim, mode="lines+markers", name=label, legendgroup=name,
                                    line=dict(color=color),
                                    hovertemplate=f"{label}, m=%{{x}}: simulated %{{y:.1%}}<extra></extra>"))
        fig.add_trace(graph.Scatter(x=ms, y=theory, mode="lines", name=f"{label} theory", legendgroup=name,
                                    line=dict(color=color, dash="dash"), showlegend=False,
                                    hovertemplate=f"{label}, m=%{{x}}: theory %{{y:.1%}}<extra></extra>"))
        ys.update({label: sim, f"{label} theory": theory})
        xs.update({label: ms, f"{label} theory": ms})
    groups = overlapping(ys, xs)
    # ZB-V's closed form counts only its start-up ramp, with equal F, B and W: with fewer microbatches
    # than stages the gradient's way back is longer (paralab.schedules.theoretical_bubble), and with
    # other pass times its ramp is another
    bound = ()
    if "zbv" in schedules and compute_time is not None:
        bound = ("zbv's closed form assumes equal forward, input- and weight-gradient passes",)
    elif "zbv" in schedules and lower_bound("zbv", stages, min(microbatches)):
        bound = (f"zbv's closed form is a lower bound below {stages} microbatches",)
    note_overlaps(fig, groups, len(ys), also=bound)
    fig.update_layout(meta={"overlap": groups, "notes": list(bound)})
    fig.update_xaxes(title_text="microbatches per step", type="log", dtick=0.30103)
    fig.update_yaxes(title_text="bubble fraction", tickformat=".0%", rangemode="tozero")
    return style(fig, title or f"bubble vs microbatches, {stages} stages (dashed: closed form)", 420)
