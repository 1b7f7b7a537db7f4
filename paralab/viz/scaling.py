"""Speedup and scaling: does adding ranks pay, and how far from ideal is it?

Speedup is measured in throughput (tokens per second) relative to a series' smallest world size,
which is right for both strong scaling (fixed global batch: throughput ratio = step time ratio)
and weak scaling (batch grows with ranks). When a point has no throughput, step times are used.
The ideal line is world size / that smallest world size (one per smallest size the series start at).
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from collections.abc import Iterable, Mapping

from paralab.config import finite_number
from paralab.viz._common import as_summary, as_trace, go, make_subplots, style

MEASURED, PREDICTED = "#4C78A8", "#F58518"
LEGEND_ROW_PX = 25  # a horizontal legend's row
LEGEND_GAP_PX = 10  # between a legend's last row and the subplot titles under it
SECONDS_FROM_S = 10.0  # scaling() draws step times in seconds when the slowest exceeds this, else in ms


# what scaling_points reads, as its TypeError says it
RUNS_WANTED = "RunResults, Predictions or summary dicts, or {world size: step time in s, or one of those}"


def scaling_points(runs) -> list[dict]:
    """Normalise runs to sorted points {world_size, step_time_s, tokens_per_s}.

    ``runs``: RunResults, Predictions, summary dicts, or a mapping world_size -> step time (seconds)
    or -> any of those. Anything else is a TypeError, a world size not a whole number >= 1 or a step
    time not a number > 0 a ValueError, naming what was given: a bare int had been "not iterable", a
    key "a" an int() parse error, and a step of -1 s had been drawn as a speedup of -1.
    """
    if isinstance(runs, Mapping):
        pairs = list(runs.items())
    elif isinstance(runs, Iterable) and not isinstance(runs, str | bytes):
        pairs = [(None, run) for run in runs]
    else:
        raise TypeError(f"runs must be {RUNS_WANTED}, got {type(runs).__name__}")
    items = []
    for world, run in pairs:
        if isinstance(run, numbers.Real) and not isinstance(run, bool):  # a step time (numpy's too)
            point = {"world_size": world, "step_time_s": run, "tokens_per_s": 0.0}
        else:
            s = as_summary(run)
            point = {"world_size": s["world_size"] if world is None else world,
                     "step_time_s": s["step_time_s"], "tokens_per_s": s.get("tokens_per_s") or 0.0}
        items.append(checked_point(point))
    return sorted(items, key=lambda p: p["world_size"])


def checked_point(point: dict) -> dict:
    """``point`` with its world size an int, where it is a whole number >= 1 (or its digits, as JSON keys
    it) and its step time a number > 0 (a ValueError naming them otherwise)."""
    world, step = point["world_size"], point["step_time_s"]
    if isinstance(world, str) and world.isdigit():  # a mapping read back from JSON keys its sizes so
        world = int(world)
    world, step = _as_python(world), _as_python(step)
    if not (finite_number(world) and world == int(world) and world >= 1):
        raise ValueError(f"a run's world size must be a whole number >= 1, got {world!r}")
    if not (finite_number(step) and step > 0):
        raise ValueError(f"the run at world size {world} needs a step time of a number of seconds > 0, "
                         f"got {step!r}")
    return dict(point, world_size=int(world), step_time_s=float(step))


def _as_python(value):
    """A number as Python's (numpy's np.int64(8), from an array, is no int to finite_number); anything
    else, a bool included, as given."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    return value


def speedups(points: list[dict]) -> list[float]:
    """Speedup of each point over the first (smallest world size); see the module docstring."""
    if not points:
        return []
    base = points[0]
    if all(p["tokens_per_s"] > 0 for p in points):
        return [p["tokens_per_s"] / base["tokens_per_s"] for p in points]
    return [base["step_time_s"] / p["step_time_s"] for p in points]


def scaling(measured=None, predicted=None, title: str | None = None):
    """Two panels sharing the world-size axis: step time, and speedup with the ideal line. Step times
    are in ms, or in seconds (the axis says which) when the slowest is over :data:`SECONDS_FROM_S`."""
    graph = go()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("step time", "speedup"), horizontal_spacing=0.12)
    sizes_from: dict[int, set[int]] = defaultdict(set)  # each series' world sizes, by its smallest
    meta = {}
    curves = [(label, scaling_points(runs), color, dash)
              for label, runs, color, dash in (("measured", measured, MEASURED, "solid"),
                                               ("predicted", predicted, PREDICTED, "dash"))
              if runs is not None]
    # steps of over SECONDS_FROM_S are drawn in seconds: gpt3-1.3b's 25 s step on one GPU had read 25k ms
    slowest = max((p["step_time_s"] for _, pts, _, _ in curves for p in pts), default=0.0)
    unit, scale = ("s", 1.0) if slowest > SECONDS_FROM_S else ("ms", 1e3)
    for label, pts, color, dash in curves:
        ws = [p["world_size"] for p in pts]
        if ws:
            sizes_from[ws[0]].update(ws)
        sp = speedups(pts)
        meta[label] = {"world_size": ws, "step_time_s": [p["step_time_s"] for p in pts], "speedup": sp}
        line = dict(color=color, dash=dash)
        fig.add_trace(graph.Scatter(x=ws, y=[p["step_time_s"] * scale for p in pts],
                                    mode="lines+markers", name=label, legendgroup=label, line=line,
                                    hovertemplate=f"{label}: world size %{{x}}, "
                                                  f"%{{y:,.2f}} {unit}/step<extra></extra>"), 1, 1)
        fig.add_trace(graph.Scatter(x=ws, y=sp, mode="lines+markers", name=label,
                                    legendgroup=label, line=line, showlegend=False,
                                    hovertemplate=f"{label}: world size %{{x}}, "
                                                  f"speedup %{{y:.2f}}x<extra></extra>"), 1, 2)
    # a series' speedups are over its own smallest size, so is its ideal: one line per such size
    for (base, sizes), dash in zip(sorted(sizes_from.items()), ("dot", "dashdot")):
        ws = sorted(sizes)
        name = "ideal" if len(sizes_from) == 1 else f"ideal from {base} rank{'s' * (base > 1)}"
        fig.add_trace(graph.Scatter(x=ws, y=[w / base for w in ws], mode="lines", name=name,
                                    line=dict(color="#999", dash=dash), hoverinfo="skip"), 1, 2)
    # ticks at the sizes drawn and at the powers of two the speedups and ideals span: with a dtick alone
    # a panel with nothing (or little) drawn autoscaled to ticks from 0.125 to 524.2881k ranks
    drawn = sorted({w for series in meta.values() for w in series["world_size"]})
    fig.update_xaxes(title_text="world size (ranks)", type="log", tickvals=drawn,
                     ticktext=[f"{w:,}" for w in drawn])
    fig.update_yaxes(title_text="seconds per step" if unit == "s" else "ms per step", row=1, col=1,
                     rangemode="tozero")
    # log-log, so that the ideal is the diagonal and a shortfall reads as the same gap at any size
    spans = [s for series in meta.values() for s in series["speedup"] if s > 0] + drawn  # ideals <= sizes
    ticks = [2.0**k for k in range(math.floor(math.log2(min(spans, default=1))),
                                   math.ceil(math.log2(max(spans, default=1))) + 1)]
    fig.update_yaxes(title_text=speedup_title(sorted(sizes_from)), row=1, col=2, type="log", tickvals=ticks,
                     ticktext=[f"{t:,g}" for t in ticks])
    fig.update_layout(meta=meta)
    return style(fig, title or "scaling with world size", 380)


def speedup_title(bases: list[int]) -> str:
    """The speedup axis's title, naming what it is over: a curve that starts at 4 ranks (the
    smallest that fits) had read "speedup (x)", so 1.45 at 8 ranks looked like 1.45 times one GPU."""
    if len(bases) > 1:  # each curve has its own ideal, named by the size it starts at
        return "speedup over each curve's first size (x)"
    return f"speedup over {bases[0]:,} rank{'s' * (bases[0] > 1)} (x)" if bases else "speedup (x)"


def speedup_timeline(runs, baseline=None, title: str | None = None):
    """Per training step: throughput of each run and, given a baseline, speedup over it.

    ``runs``: a Trace/RunResult or {label: Trace/RunResult}. ``baseline``: a Trace/RunResult (its
    median step time) or a step time in seconds. Step 0 pays for warm-up; it is shown, not hidden.
    """
    graph = go()
    if not isinstance(runs, Mapping):
        runs = {as_trace(runs).meta.get("strategy") or "run": runs}
    base_time = None
    if baseline is not None:
        base_time = (float(baseline) if isinstance(baseline, (int, float))
                     else as_trace(baseline).median_step_time())
    rows = 2 if base_time else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("throughput", "speedup over baseline")[:rows])
    meta = {}
    for i, (label, run) in enumerate(runs.items()):
        trace = as_trace(run)
        times = trace.step_times()
        steps = list(trace.step_windows())
        tokens = trace.meta.get("tokens_per_step", 0)
        color = f"hsl({(i * 67) % 360},60%,45%)"
        y = [tokens / t if t > 0 and tokens else (1 / t if t > 0 else 0) for t in times]
        unit = "tokens/s" if tokens else "steps/s"
        fig.add_trace(graph.Scatter(x=steps, y=y, mode="lines+markers", name=label, legendgroup=label,
                                    line=dict(color=color),
                                    hovertemplate=f"{label} step %{{x}}: "
                                                  f"%{{y:,.0f}} {unit}<extra></extra>"), 1, 1)
        meta[label] = {"steps": steps, "step_time_s": times}
        if base_time:
            sp = [base_time / t if t > 0 else 0 for t in times]
            meta[label]["speedup"] = sp
            fig.add_trace(graph.Scatter(x=steps, y=sp, mode="lines+markers", name=label, legendgroup=label,
                                        showlegend=False, line=dict(color=color),
                                        hovertemplate=f"{label} step %{{x}}: "
                                                      f"%{{y:.2f}}x<extra></extra>"), 2, 1)
    if base_time:
        fig.add_hline(y=1.0, line_dash="dot", line_color="#999", row=2, col=1,
                      annotation_text="1x: the baseline", annotation_position="bottom right",
                      annotation_font=dict(size=11, color="#555"))
        # from 0, with ticks enough to read runs far below the baseline (0.09x and 0.2x had stood under
        # the only ticks, 0.5 and 1)
        fig.update_yaxes(title_text="speedup (x)", rangemode="tozero", nticks=8, row=2, col=1)
    unit = "tokens/s" if any(as_trace(r).meta.get("tokens_per_step") for r in runs.values()) else "steps/s"
    fig.update_yaxes(title_text=f"throughput ({unit})", row=1, col=1, rangemode="tozero")
    fig.update_xaxes(dtick=1)
    fig.update_xaxes(title_text="training step", row=rows, col=1)
    fig.update_layout(meta=meta)
    return style(fig, title or "throughput over training steps", 320 + 180 * (rows - 1))


IDEAL, HERE = "#999", "#54A24B"
RUN_COLORS = ["#7F7F7F", "#9467BD", "#D62728", "#17BECF", "#8C564B", "#BCBD22", "#E377C2"]


def speedup_steps(runs: Mapping, baseline, predicted: Mapping | None = None, curve=None,
                  ideal_here: Mapping | None = None, curve_label: str = "predicted",
                  title: str | None = None):
    """Step time and speedup over the steps of each run, and speedup against world size.

    ``runs``: {world size: RunResult or Trace}; ``baseline``: the one-rank run (its median step time is
    what every speedup divides). ``predicted``: {world size: predicted step time (s)} on the measuring
    machine, drawn as a dashed line in the step panels. ``curve``: predicted points against world size
    (anything :func:`scaling_points` reads), its speedups over its own smallest size. ``ideal_here``:
    {world size: speedup} that the measuring machine allows (on CPU, the cores the ranks can use).
    The ideal line, n devices, n times faster, is always drawn. In the step panels each run's predicted
    step is a dashed line, its predicted speedup the predicted one-rank step over it. Step 0 pays for
    warm-up; it is shown.
    """
    graph = go()
    # the gap between the columns holds the right panel's ticks and axis title: at 0.1 of a notebook's
    # width its title had run into the left panels' ticks and subplot title
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {"rowspan": 2}], [{}, None]], shared_xaxes=False,
                        column_widths=[0.58, 0.42], horizontal_spacing=0.15, vertical_spacing=0.14,
                        subplot_titles=("step time, step by step", "speedup against world size",
                                        # the one-rank run's own steps scatter around 1 over its median;
                                        # short enough to stay over its panel at a notebook's 700 px
                                        # ("..., step by step" had run under the right panel's axis title)
                                        "speedup over the one-rank median"))
    base = as_trace(baseline).median_step_time()
    sizes = sorted(runs)
    predicted = dict(predicted or {})
    base_predicted = predicted.get(min(sizes))
    meta: dict = {"baseline_s": base, "runs": {}}
    for i, n in enumerate(sizes):
        trace = as_trace(runs[n])
        times = trace.step_times()
        steps = list(trace.step_windows())
        color = RUN_COLORS[i % len(RUN_COLORS)]
        label = f"{n} rank{'s' if n > 1 else ''}"
        speedup = [base / t if t > 0 else 0.0 for t in times]
        fig.add_trace(graph.Scatter(x=steps, y=[t * 1e3 for t in times], mode="lines+markers", name=label,
                                    legendgroup=label, line=dict(color=color),
                                    hovertemplate=f"{label}, step %{{x}}: "
                                                  f"%{{y:.1f}} ms<extra></extra>"), 1, 1)
        fig.add_trace(graph.Scatter(x=steps, y=speedup, mode="lines+markers", name=label, legendgroup=label,
                                    showlegend=False, line=dict(color=color),
                                    hovertemplate=f"{label}, step %{{x}}: %{{y:.2f}}x<extra></extra>"), 2, 1)
        run_meta = {"steps": steps, "step_time_s": times, "speedup": speedup}
        if n in predicted:
            t = predicted[n]
            run_meta["predicted_s"] = t
            rows = [(1, t * 1e3, "ms")] + ([(2, base_predicted / t, "x")] if base_predicted else [])
            for row, y, unit in rows:
                fig.add_trace(graph.Scatter(x=[steps[0], steps[-1]], y=[y, y], mode="lines",
                                            name=f"{label}, predicted",
                                            legendgroup=label, showlegend=False,
                                            line=dict(color=color, dash="dash"),
                                            hovertemplate=f"{label}, predicted: "
                                                          f"%{{y:.2f}} {unit}<extra></extra>"),
                              row, 1)
        meta["runs"][n] = run_meta
    if predicted:  # one legend entry says what the dashed lines are
        fig.add_trace(graph.Scatter(x=[None], y=[None], mode="lines", name="dashed: each run as predicted",
                                    line=dict(color="#777", dash="dash")), 1, 1)
    medians = [base / as_trace(runs[n]).median_step_time() for n in sizes]
    fig.add_trace(graph.Scatter(x=sizes, y=medians, mode="lines+markers", name="measured (median step)",
                                line=dict(color=MEASURED), marker=dict(size=9),
                                hovertemplate="measured: world size %{x}, %{y:.2f}x<extra></extra>"), 1, 2)
    meta["measured"] = dict(zip(sizes, medians))
    every = set(sizes)
    if curve is not None:
        pts = scaling_points(curve)
        ws, sp = [p["world_size"] for p in pts], speedups(pts)
        every.update(ws)
        fig.add_trace(graph.Scatter(x=ws, y=sp, mode="lines+markers", name=curve_label,
                                    line=dict(color=PREDICTED, dash="dash"),
                                    hovertemplate=f"{curve_label}: world size %{{x}}, "
                                                  f"%{{y:.2f}}x<extra></extra>"), 1, 2)
        meta["predicted"] = dict(zip(ws, sp))
    if ideal_here:
        xs = sorted(ideal_here)
        fig.add_trace(graph.Scatter(x=xs, y=[ideal_here[x] for x in xs], mode="lines",
                                    name="what this machine allows",
                                    line=dict(color=HERE, dash="dot", width=3),
                                    hovertemplate="this machine allows at most %{y:.2f}x at world size "
                                                  "%{x}<extra></extra>"), 1, 2)
        meta["ideal_here"] = dict(ideal_here)
        every.update(xs)
    xs = sorted(every)
    fig.add_trace(graph.Scatter(x=xs, y=[x / xs[0] for x in xs], mode="lines", name="ideal: n devices, n x",
                                line=dict(color=IDEAL, dash="dot"), hoverinfo="skip"), 1, 2)
    fig.update_xaxes(title_text="training step", dtick=1, row=2, col=1)
    fig.update_xaxes(dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="world size (ranks)", type="log", dtick=0.30103, row=1, col=2)
    fig.update_yaxes(title_text="ms per step", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="speedup (x)", rangemode="tozero", row=2, col=1)
    # from the power of two at or below the slowest point, so that one labelled tick lies under it (a
    # 4-rank run at 0.67x had sat on the panel's floor, the lowest tick 1), to the one at or above the
    # fastest, a tick at each
    drawn = [y for t in fig.select_traces(row=1, col=2) for y in t.y if y is not None and y > 0]
    low, high = math.floor(math.log2(min(drawn))), math.ceil(math.log2(max(drawn)))
    ticks = [2.0**k for k in range(low, high + 1)]
    fig.update_yaxes(title_text="speedup over one rank (x)", type="log", tickvals=ticks,
                     ticktext=[f"{t:g}" for t in ticks], row=1, col=2,
                     range=[math.log10(2.0**low) - 0.05, math.log10(2.0**high) + 0.05])
    fig.update_layout(meta=meta)
    style(fig, title or "speedup: step by step, and against world size", 640)
    # room for the legend's rows (three entries or so to a row in a notebook cell, whose long names fill
    # one), and a little under the last: its third row had touched the first subplot titles
    entries = sum(trace.showlegend is not False for trace in fig.data)
    rows = math.ceil(entries / 3)
    fig.update_layout(margin=dict(t=fig.layout.margin.t + LEGEND_ROW_PX * (rows - 1) + LEGEND_GAP_PX))
    return fig
