"""Elastic training as a story: phases on the wall clock, and what each step did.

An elastic run is a sequence of worlds (generations); between two of them the membership changed. A
figure of world size and step time against wall-clock time squeezes the steps into clusters at the
ends of a recovery that lasts seconds, and a line drawn from the last step before a failure to the
first after it claims steps that never ran. So :func:`elastic` draws

- on top, the **phases** in order, one row each, with their durations: start, training at n ranks,
  failure, detected, rendezvous (the agents', until the first of them spawned its new worker),
  restore (the new workers start Python and torch, meet, load the checkpoint), training at n-1 ranks
  (a node joining adds a rendezvous and a restore, no failure);
- above them, one line per stretch in which no step ran (from one training phase to the next): how
  long, in steps' worth;
- below on the left, world size, step time and utilisation against wall-clock time, lines only
  inside a training phase: where no step ran there is a gap, shaded in its phase's colour, and a red
  line marks a kill;
- below on the right, the same run step by step: world size, step time, and each rank's samples.

:func:`elastic_balance` draws a balanced run: each rank's share of the global batch per step against
its share of the measured throughput, which the shares follow a step later, and the share in
proportion to speed that a known slowdown alone would give.

Reads the trace's meta (``generations``, ``step_records``: paralab.elastic.history), its event lane
(``failure``, ``failure_detected``, ``worker_start``, ``rendezvous``, ``checkpoint_load``) and its counters
(``cpu_percent`` or ``gpu_percent``). A trace without them (samples pushed to the elastic monitor) is
told apart into worlds by its steps' ranks: a new world where they change (:func:`step_records`).
"""

from __future__ import annotations

import math
from collections import defaultdict

from paralab.elastic.history import seconds
from paralab.text import count_text
from paralab.trace import EVENT, STEP, Trace, typical_step_time
from paralab.viz._common import as_trace, go, make_subplots, rank_color, style

UTILISATION = ("cpu_percent", "gpu_percent", "utilisation", "utilization")
# the phases in a palette of their own, none a rank's: drawn in the ranks' blue, orange and green right
# under the legend of rank 0 (blue), 1 (orange) and 2 (green), the restore had read as rank 0's and the
# training as rank 2's. The start a neutral grey, training the step-time series' dark grey (steps run
# only there), the failure a dark red, the recovery's phases hues apart: shaded behind the wall-clock
# panels at SHADE, a warm grey start and a purple rendezvous had read as one colour
PHASE_COLORS = {"start": "#9E9E9E", "training": "#333333", "failure": "#A50F15", "detected": "#8C564B",
                "rendezvous": "#E7298A", "restore": "#7B3294"}
SHADE = 0.25
# the phases' axis title, under their ticks: the panel ends this much higher, and the figure is as much
# taller, so that it does not sit on the world-size panel's title
AXIS_TITLE_PX = 24
HEIGHT = 860 + AXIS_TITLE_PX
# a phase's text longer than this is said on two lines: on one, the restore's ran past the right edge of
# an 820-pixel figure
TEXT_WRAP = 56
GAP_LINE_PX = 17  # a line of the note on the stretches without steps, 12-pixel type
SUBPLOT_TITLE_PX = 26  # the phases' subplot title, above its panel: the note sits above it
CLOCK = "seconds since the first world formed"
# the run's own series in greys, so that none reads as a rank's
WORLD_COLOR, STEP_COLOR = "#8C8C8C", PHASE_COLORS["training"]


# ------------------------------------------------------------------------------------- the data
def step_records(trace: Trace) -> list[dict]:
    """Every step each world completed, in the order they ran: step, generation, world_size, start
    and end (trace clock), samples and compute_s per rank (None when the trace has no records) and
    ``final`` (False for a step a later world redid). Without records, a step's world is the ranks that
    recorded it (:func:`_worlds_named`)."""
    if trace.meta.get("step_records"):
        return sorted(trace.meta["step_records"], key=lambda r: r["start"])
    if not trace.select(lane=STEP):
        return _records_of_samples(trace)
    ranks = defaultdict(set)
    for s in trace.select(lane=STEP):
        ranks[s.step].add(s.rank)
    windows = trace.step_windows()  # a step ends with its last rank, and takes its ranks' own time
    records = [{"step": k, "generation": "", "world_size": len(ranks[k]), "start": hi - took, "end": hi,
                "samples": None, "compute_s": None, "final": True}
               for (k, (_, hi)), took in zip(windows.items(), trace.step_times())]
    return _worlds_named(records, [ranks[k] for k in windows])


def _records_of_samples(trace: Trace) -> list[dict]:
    """The steps of a trace of step-time samples alone (``step_time_s`` counters pushed to the monitor,
    one per rank and step as it ends), in time order: a step's samples are the run of them until a rank
    samples again, the step ends with the last and took the longest of their times. (The monitor had
    said "4 steps" over a figure that said "no step recorded"; pairing each rank's k-th sample had put a
    node that joined late into the first steps.)"""
    samples = sorted((c for c in trace.counters if c.name == "step_time_s" and math.isfinite(c.value)),
                     key=lambda c: c.t)
    steps: list[list] = []
    ranks: set[int] = set()  # those of the step being read
    for c in samples:
        if not steps or c.rank in ranks:
            steps.append([])
            ranks = set()
        steps[-1].append(c)
        ranks.add(c.rank)
    records = [{"step": k, "generation": "", "world_size": len(step),
                "start": step[-1].t - max(c.value for c in step), "end": step[-1].t, "samples": None,
                "compute_s": None, "final": True} for k, step in enumerate(steps)]
    return _worlds_named(records, [{c.rank for c in step} for step in steps])


def _worlds_named(records: list[dict], rank_sets: list[set]) -> list[dict]:
    """``records`` (in step order) of a trace without the run's history, each named for its world
    ("world 1", "world 2" ...): a new one from each step whose ranks differ from the step's before (a
    rank lost or joined); left unnamed where every step ran on the same ranks. Samples pushed without
    the history had told steps at 3 ranks, then 2, as "training at 3 ranks throughout"."""
    worlds = [0]
    for before, now in zip(rank_sets, rank_sets[1:]):
        worlds.append(worlds[-1] + (now != before))
    if worlds[-1] == 0:
        return records
    return [{**r, "generation": f"world {w + 1}"} for r, w in zip(records, worlds)]


def _generations(trace: Trace, records: list[dict]) -> list[dict]:
    """name, world_size and start on the trace clock of each world, in order: the run's history's, or
    those its steps tell apart (:func:`_worlds_seen`)."""
    gens = trace.meta.get("generations") or []
    if not gens:
        return _worlds_seen(trace, records)
    t0 = gens[0]["wall_start"]
    return [{"name": g["name"], "world_size": g["world_size"], "start": g["wall_start"] - t0} for g in gens]


def _worlds_seen(trace: Trace, records: list[dict]) -> list[dict]:
    """The worlds of a trace without generations, as :func:`step_records` names its steps: each starts
    where the history would start it, when its rendezvous ("rendezvous: world of n") formed it after the
    world before it last stepped, or else at its first step."""
    if not records:
        return [{"name": "", "world_size": len(trace.ranks), "start": 0.0}]
    worlds: dict[str, list[dict]] = {}
    for r in records:
        worlds.setdefault(r["generation"], []).append(r)
    rendezvous = [e for e in trace.select(lane=EVENT) if e.kind == "rendezvous"]
    out, since = [], float("-inf")
    for name, steps in worlds.items():
        size, first = steps[0]["world_size"], steps[0]["start"]
        formed = [e.end for e in rendezvous if e.name.endswith(f"world of {size}") and since < e.end <= first]
        out.append({"name": name, "world_size": size, "start": max(formed, default=first)})
        since = steps[-1]["end"]
    return out


def _lane_noun(trace: Trace) -> str:
    """What a lane of the trace is: paralab elastic's own runs file spans under their worker's node
    (``meta["lanes"]``, paralab.elastic.history), whose rank changes from one world to the next."""
    return "node" if trace.meta.get("lanes") == "node" else "rank"


def _samples_by_lane(final: list[dict], who: str) -> dict[int, list[int]]:
    """Lane -> its samples at each step of ``final``: by the rank a step's world gave it, or, where the
    lanes are nodes, by each rank's node (a record's ``nodes``), 0 where a lane had no worker."""
    if who == "node" and all(r.get("nodes") for r in final):
        lanes = sorted({node for r in final for node in r["nodes"]})
        return {lane: [r["samples"][r["nodes"].index(lane)] if lane in r["nodes"] else 0 for r in final]
                for lane in lanes}
    ranks = max(len(r["samples"]) for r in final)
    return {rank: [r["samples"][rank] if rank < len(r["samples"]) else 0 for r in final]
            for rank in range(ranks)}


def elastic_phases(trace) -> list[dict]:
    """The run's story in order: dicts with ``phase`` (start, training, failure, detected,
    rendezvous, restore), ``label``, ``start``, ``end`` (seconds, trace clock; equal for an instant),
    ``world_size`` (training phases) and ``detail`` (what happened, for the figure)."""
    trace = as_trace(trace)
    records = step_records(trace)
    gens = _generations(trace, records)
    events = sorted(trace.select(lane=EVENT), key=lambda e: e.start)
    phases: list[dict] = []
    first = min((e.start for e in events if e.kind in ("worker_start", "rendezvous")), default=None)
    if first is not None and records and first < records[0]["start"]:
        spawned = any(e.kind == "worker_start" and e.start == first for e in events)
        phases.append(_phase("start", "start", first, records[0]["start"],
                             ("workers start (Python, torch), " if spawned else "")
                             + f"{count_text(gens[0]['world_size'], 'rank')} meet, build the model"))
    for i, gen in enumerate(gens):
        end = gens[i + 1]["start"] if i + 1 < len(gens) else float("inf")
        mine = [r for r in records if (r["generation"] == gen["name"]) or not gen["name"]]
        kill = next((e for e in events if e.kind == "failure" and gen["start"] <= e.start < end), None)
        if i > 0:
            phases += _transition(gen, events, phases[-1]["end"] if phases else gen["start"], mine)
        if mine:
            stop = kill.start if kill is not None else max(r["end"] for r in mine)
            steps = sorted(r["step"] for r in mine)
            detail = f"steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
            lost = [r["step"] for r in mine if not r["final"]]
            if lost:
                detail += f" (step {', '.join(map(str, lost))} lost: redone later)"
            phases.append(_phase("training", f"training at {count_text(gen['world_size'], 'rank')}",
                                 mine[0]["start"], stop,
                                 detail, world_size=gen["world_size"]))
        if kill is not None:
            detected = [e for e in events if e.kind == "failure_detected" and kill.start <= e.start < end]
            phases.append(_phase("failure", "failure", kill.start, kill.start,
                                 f"{_lane_noun(trace)} {kill.rank}: {kill.name}"))
            if detected:
                last = detected[-1].start
                soonest = f"{(detected[0].start - kill.start) * 1e3:.0f} ms"
                said = (f"by the survivor after {soonest}" if len(detected) == 1 else  # not "last of 1"
                        f"first survivor after {soonest}, last of {len(detected)} after "
                        f"{(last - kill.start) * 1e3:.0f} ms")
                phases.append(_phase("detected", "detected", kill.start, last, said))
    return phases


def _transition(gen: dict, events, since: float, mine: list[dict]) -> list[dict]:
    """Rendezvous and restore phases from the end of the previous phase to the new world's first step.

    The rendezvous is the agents' (torchrun's): it ends when the first agent, its new world formed,
    spawned its worker (the worker's ``worker_start`` span begins at its process's start). The restore
    is the rest: the new workers start (Python, torch), meet in their process group, build the model
    and load the checkpoint. A trace without ``worker_start`` spans ends the rendezvous when the
    workers' process group formed: its restore leaves out their start-up, which its rendezvous holds."""
    rendezvous = [e for e in events if e.kind == "rendezvous" and f"world of {gen['world_size']}" in e.name
                  and e.end >= gen["start"] - 1e-3 and e.start >= since - 1e-3]
    formed = max((e.end for e in rendezvous), default=gen["start"])
    spawned = [e for e in events if e.kind == "worker_start" and since - 1e-3 <= e.start
               and e.end <= formed + 1e-3]
    first_step = mine[0]["start"] if mine else formed
    loads = [e for e in events if e.kind == "checkpoint_load" and formed <= e.start <= first_step]
    load = f"load {loads[-1].name.removeprefix('load ')}" if loads else ""
    if spawned:
        agents_done = min(e.start for e in spawned)
        startup = max(e.end - e.start for e in spawned)
        out = [_phase("rendezvous", "rendezvous", since, agents_done,
                      f"the agents form a world of {gen['world_size']}")]
        what = f"workers start (Python, torch: {_duration(startup)}), meet" + (f", {load}" if load else "")
        out.append(_phase("restore", "restore", agents_done, first_step, what))
        return out
    out = [_phase("rendezvous", "rendezvous", since, formed, f"a world of {gen['world_size']} forms, "
                  "its workers started")]
    out.append(_phase("restore", "restore", formed, first_step, load or "build the model"))
    return out


def _phase(phase: str, label: str, start: float, end: float, detail: str,
           world_size: int | None = None) -> dict:
    return {"phase": phase, "label": label, "start": start, "end": max(end, start), "detail": detail,
            "world_size": world_size}


def _duration(value: float) -> str:
    return seconds(value, decimals=2)


def _gapped(records: list[dict], phases: list[dict], value) -> tuple[list, list]:
    """(x, y) at each record's end, with None between records of different training phases: no line
    is drawn across a stretch in which no step ran."""
    training = [p for p in phases if p["phase"] == "training"]

    def phase_of(r):
        return next((i for i, p in enumerate(training)
                     if p["start"] - 1e-3 <= r["end"] <= p["end"] + 1e-3), -1)

    xs, ys, last = [], [], None
    for r in records:
        which = phase_of(r)
        if last is not None and (which != last or which == -1):  # a point outside training stands alone
            xs.append(None)
            ys.append(None)
        xs.append(r["end"])
        ys.append(value(r))
        last = which
    return xs, ys


# ------------------------------------------------------------------------------------- figures
def elastic(trace, title: str | None = None):
    """Phases on top; wall-clock panels (left) and step-indexed panels (right) below (see the module
    docstring). ``fig.layout.meta``: ``phases`` (label, start, end), ``world_size`` (per final step),
    ``steps`` (the final steps, in order)."""
    graph = go()
    trace = as_trace(trace)
    records = step_records(trace)
    phases = elastic_phases(trace)
    final = sorted((r for r in records if r["final"]), key=lambda r: r["step"])
    lane = _lane_noun(trace)
    fig = make_subplots(
        rows=4, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.1, vertical_spacing=0.07,
        row_heights=[0.37, 0.21, 0.21, 0.21], specs=[[{}, None], [{}, {}], [{}, {}], [{}, {}]],
        subplot_titles=("what happened, in order", "world size", "world size per step",
                        "step time", "step time per step", "utilisation", f"samples per {lane} per step"))
    _draw_phases(fig, graph, phases)
    _draw_wall_clock(fig, graph, trace, records, phases, lane)
    _draw_steps(fig, graph, records, final, lane)
    if not records:  # nothing pushed yet: plotly's empty axes had run from step -1 and -1 s
        fig.update_xaxes(rangemode="nonnegative")
    fig.update_layout(barmode="stack", legend=dict(traceorder="normal"), meta={
        "phases": [(p["label"], p["start"], p["end"]) for p in phases],
        "world_size": [r["world_size"] for r in final], "steps": [r["step"] for r in final]})
    style(fig, title or "elastic training", HEIGHT)
    # the stretches without steps, one line each, between the legend and the phases: in the corner of
    # the phases' panel the box had covered the end of a row's text
    gaps = _gaps_said(phases, final)
    top = fig.layout.margin.t + GAP_LINE_PX * len(gaps) + 4
    fig.update_layout(margin=dict(t=top))
    plot_height = HEIGHT - top - fig.layout.margin.b
    low, high = fig.layout.yaxis.domain
    fig.update_yaxes(domain=[low + AXIS_TITLE_PX / plot_height, high], row=1, col=1)
    fig.add_annotation(text="<br>".join(gaps), xref="paper", yref="paper", x=0.0,
                       y=1.0 + SUBPLOT_TITLE_PX / plot_height, xanchor="left", yanchor="bottom", align="left",
                       showarrow=False, bgcolor="#F7F7F7", font=dict(size=12))
    return fig


def _gaps_said(phases: list[dict], final: list[dict]) -> list[str]:
    """One line per stretch between two training phases: how long no step ran between them, in steps'
    worth (of the run's typical step, as its summary counts it)."""
    step = typical_step_time({r["step"]: r["end"] - r["start"] for r in final})
    training = [p for p in phases if p["phase"] == "training"]
    if not training:
        return ["no step recorded"]
    if len(training) == 1:
        return [f"<b>{training[0]['label']}</b> throughout"]
    lines = []
    for before, after in zip(training, training[1:]):
        gap = after["start"] - before["end"]
        worth = f" ({gap / step:,.0f} steps' worth)" if step > 0 else ""
        lines.append(f"<b>{before['label']}</b>, then no step ran for {_duration(gap)}{worth}, "
                     f"then <b>{after['label']}</b>")
    return lines


def _wrapped(text: str, width: int = TEXT_WRAP) -> str:
    """``text`` on two lines when it is longer than ``width``: broken at the ", " nearest its middle
    that is outside brackets ("(Python, torch)" stays whole)."""
    if len(text) <= width:
        return text
    depth, breaks = 0, []
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(", ", i):
            breaks.append(i)
    if not breaks:
        return text
    cut = min(breaks, key=lambda i: abs(i - len(text) / 2))
    return f"{text[:cut + 1]}<br>  {text[cut + 2:]}"


def _draw_phases(fig, graph, phases: list[dict]) -> None:
    """One row per phase, top to bottom in order: a bar for a stretch, a diamond for an instant."""
    labels = [f"{i + 1}. {p['label']}" for i, p in enumerate(phases)]
    for p, label in zip(phases, labels):
        color = PHASE_COLORS[p["phase"]]
        length = p["end"] - p["start"]
        text = _wrapped(f"{_duration(length)}: {p['detail']}" if length > 0 else p["detail"])
        hover = (f"<b>{label}</b><br>{p['start']:.3f} s → {p['end']:.3f} s ({_duration(length)})"
                 f"<br>{p['detail']}")
        fig.add_trace(graph.Bar(
            y=[label], x=[max(length, 0.0)], base=[p["start"]], orientation="h",
            marker_color=color, width=0.7, showlegend=False, name=label, hovertext=[hover],
            hovertemplate="%{hovertext}<extra></extra>"), 1, 1)
        fig.add_trace(graph.Scatter(
            y=[label], x=[p["end"]], mode="markers+text", text=[f"  {text}"], textposition="middle right",
            marker=dict(symbol="diamond", size=11 if length == 0 else 7, color=color), cliponaxis=False,
            showlegend=False, hovertext=[hover], hovertemplate="%{hovertext}<extra></extra>"), 1, 1)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=labels,
                     autorange="reversed", row=1, col=1)
    # the clock the panels below share, said here too: the phases' ticks had no unit
    fig.update_xaxes(title_text=CLOCK, title_standoff=4, row=1, col=1)
    for p in phases:  # the gaps, shaded in the wall-clock panels below; the kill, a line
        for row in (2, 3, 4):
            if p["phase"] == "failure":  # an instant, and its detection may be too short to see
                fig.add_vline(x=p["start"], line=dict(color=PHASE_COLORS["failure"], width=1.5),
                              row=row, col=1, exclude_empty_subplots=False)
            elif p["phase"] != "training" and p["end"] > p["start"]:
                fig.add_vrect(x0=p["start"], x1=p["end"], fillcolor=PHASE_COLORS[p["phase"]], opacity=SHADE,
                              line_width=0, row=row, col=1, exclude_empty_subplots=False)


def _draw_wall_clock(fig, graph, trace: Trace, records: list[dict], phases: list[dict], who: str) -> None:
    final = [r for r in records if r["final"]]
    lost = [r for r in records if not r["final"]]
    x, y = _gapped(final, phases, lambda r: r["world_size"])
    fig.add_trace(graph.Scatter(x=x, y=y, mode="lines+markers", line_shape="hv", name="world size",
                                line=dict(color=WORLD_COLOR), showlegend=False,
                                hovertemplate="world of %{y} at %{x:.2f} s<extra></extra>"), 2, 1)
    x, y = _gapped(final, phases, lambda r: (r["end"] - r["start"]) * 1e3)
    fig.add_trace(graph.Scatter(x=x, y=y, mode="lines+markers", name="step time", line=dict(color=STEP_COLOR),
                                showlegend=False,
                                hovertemplate="step ending at %{x:.2f} s: %{y:.1f} ms<extra></extra>"), 3, 1)
    if lost:
        fig.add_trace(graph.Scatter(
            x=[r["end"] for r in lost], y=[(r["end"] - r["start"]) * 1e3 for r in lost], mode="markers",
            name="step lost (redone later)", marker=dict(symbol="x", size=9, color=PHASE_COLORS["failure"]),
            hovertemplate="lost step ending at %{x:.2f} s: %{y:.1f} ms<extra></extra>"), 3, 1)
    name = next((n for n in UTILISATION if any(c.name == n for c in trace.counters)), None)
    if name:  # one line per lane (``who``: rank, or an elastic run's node): each samples at its own instants
        samples = sorted((c for c in trace.counters if c.name == name), key=lambda c: c.t)
        for rank in sorted({c.rank for c in samples}):
            points = [{"end": c.t, "value": c.value} for c in samples if c.rank == rank]
            x, y = _gapped(points, phases, lambda r: r["value"])
            fig.add_trace(graph.Scatter(x=x, y=y, mode="lines+markers", name=f"{who} {rank}",
                                        legendgroup="ranks",
                                        line=dict(color=rank_color(rank), width=1.5),
                                        marker=dict(size=4), showlegend=False,
                                        hovertemplate=f"{who} {rank}: "
                                                      f"%{{y:.0f}}% at %{{x:.2f}} s<extra></extra>"), 4, 1)
    fig.update_yaxes(title_text="ranks", rangemode="tozero", dtick=1, row=2, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=3, col=1)
    fig.update_yaxes(title_text="% of a core" if name == "cpu_percent" else "%",
                     rangemode="tozero", row=4, col=1)
    for row in (2, 3, 4):  # one wall clock, the phases' own
        fig.update_xaxes(matches="x", row=row, col=1)
    fig.update_xaxes(title_text=f"{CLOCK}<br>shaded: no step ran; red line: the kill", row=4, col=1)


def _draw_steps(fig, graph, records: list[dict], final: list[dict], who: str) -> None:
    """World size, step time and each lane's samples, step by step (``who``: "rank", or "node" where the
    trace's lanes are nodes, so a worker keeps one colour throughout)."""
    steps = [r["step"] for r in final]
    fig.add_trace(graph.Bar(x=steps, y=[r["world_size"] for r in final], marker_color=WORLD_COLOR,
                            showlegend=False, hovertemplate="step %{x}: %{y} ranks<extra></extra>"), 2, 2)
    fig.add_trace(graph.Bar(x=steps, y=[(r["end"] - r["start"]) * 1e3 for r in final],
                            marker_color=STEP_COLOR,
                            showlegend=False, hovertemplate="step %{x}: %{y:.1f} ms<extra></extra>"), 3, 2)
    lost = [r for r in records if not r["final"]]
    if lost:
        fig.add_trace(graph.Scatter(x=[r["step"] for r in lost],
                                    y=[(r["end"] - r["start"]) * 1e3 for r in lost],
                                    mode="markers",
                                    marker=dict(symbol="x", size=9, color=PHASE_COLORS["failure"]),
                                    showlegend=False,
                                    hovertemplate="step %{x}, lost: %{y:.1f} ms<extra></extra>"), 3, 2)
    if final and final[0]["samples"] is not None:
        for lane, samples in _samples_by_lane(final, who).items():
            fig.add_trace(graph.Bar(
                x=steps, y=samples, name=f"{who} {lane}", marker_color=rank_color(lane), legendgroup="ranks",
                hovertemplate=f"step %{{x}}: {who} {lane} trained on %{{y}} samples<extra></extra>"), 4, 2)
    # from zero: with nothing pushed yet, plotly's empty axes had read negative ranks
    fig.update_yaxes(title_text="ranks", dtick=1, rangemode="tozero", row=2, col=2)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=3, col=2)
    fig.update_yaxes(title_text="samples", rangemode="tozero", row=4, col=2)
    steps_axis = fig.get_subplot(2, 2).xaxis.plotly_name.replace("axis", "")
    for row in (2, 3, 4):
        fig.update_xaxes(dtick=1, matches=None if row == 2 else steps_axis, row=row, col=2)
    fig.update_xaxes(title_text="training step", row=4, col=2)


def balance_shares(trace) -> list[dict]:
    """Per final step: ``step``, each rank's ``share`` of the global batch and its ``throughput_share``
    (its samples per compute second over the sum of all ranks'), and ``compute_s`` per rank."""
    out = []
    for r in sorted((r for r in step_records(as_trace(trace)) if r["final"]), key=lambda r: r["step"]):
        if r["samples"] is None:
            continue
        total = sum(r["samples"])
        rates = [n / s if s > 0 else 0.0 for n, s in zip(r["samples"], r["compute_s"])]
        out.append({"step": r["step"], "share": [n / total for n in r["samples"]],
                    "throughput_share": [v / sum(rates) for v in rates], "compute_s": r["compute_s"]})
    return out


def proportional_shares(ranks: int, slow: dict | None) -> list[float] | None:
    """Each rank's share of the global batch in proportion to its speed when only the slowdown of
    ``slow`` ({"rank", "factor"}: ``--slow``) set it: weight 1 per rank, 1/factor for the slow one. None
    without a slowdown."""
    if not slow or ranks == 0 or not 0 <= int(slow["rank"]) < ranks:
        return None
    weights = [1.0 / float(slow["factor"]) if r == int(slow["rank"]) else 1.0 for r in range(ranks)]
    return [w / sum(weights) for w in weights]


def elastic_balance(trace, title: str | None = None, slow: dict | None = None):
    """Left: each rank's share of the global batch per step (solid), its share of the throughput
    measured in that step (dashed), which the balancer's shares follow a step later (a step is cut by
    the rates smoothed over the steps before it), and, dotted, the share in proportion to speed that
    the slowdown alone would give (``slow``, or the run's own when ``trace`` is an elastic result).
    Right: each rank's compute time per step, which balancing evens out. ``fig.layout.meta``:
    ``steps``, ``share`` and ``throughput_share`` (per step, per rank), ``proportional`` (per rank,
    or None)."""
    graph = go()
    if slow is None:
        config = getattr(trace, "config", None)
        slow = getattr(config, "slow", None)
    rows = balance_shares(trace)
    # short enough for an 820-pixel figure's half: the longer one was cut at both ends
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("batch share (solid), throughput share (dashed)",
                                        "compute time per step"))
    steps = [r["step"] for r in rows]
    ranks = max((len(r["share"]) for r in rows), default=0)
    proportional = proportional_shares(ranks, slow) if steps else None
    for rank in range(ranks):
        color = rank_color(rank)
        fig.add_trace(graph.Scatter(x=steps, y=[r["share"][rank] for r in rows], mode="lines+markers",
                                    name=f"rank {rank}: batch share", line=dict(color=color),
                                    legendgroup=str(rank),
                                    hovertemplate=f"step %{{x}}: rank {rank} trained on %{{y:.0%}} of the "
                                                  "batch<extra></extra>"), 1, 1)
        fig.add_trace(graph.Scatter(x=steps, y=[r["throughput_share"][rank] for r in rows],
                                    mode="lines+markers",
                                    name=f"rank {rank}: throughput share", legendgroup=str(rank),
                                    line=dict(color=color, dash="dash"), marker=dict(symbol="circle-open"),
                                    hovertemplate=f"step %{{x}}: rank {rank} did %{{y:.0%}} of the samples "
                                                  "per second<extra></extra>"), 1, 1)
        fig.add_trace(graph.Bar(x=steps, y=[r["compute_s"][rank] * 1e3 for r in rows], name=f"rank {rank}",
                                marker_color=color, legendgroup=str(rank), showlegend=False,
                                hovertemplate=f"step %{{x}}: "
                                              f"rank {rank} computed %{{y:.1f}} ms<extra></extra>"), 1, 2)
    # a legend entry per dotted line, in its rank's group: with one entry, in rank 0's colour, for all of
    # them, the slow rank's line (25%) had none, and read as nothing the legend named
    for rank, share in enumerate(proportional or []):
        slower = f", {float(slow['factor']):g}x slower" if rank == int(slow["rank"]) else ""
        fig.add_trace(graph.Scatter(
            x=[steps[0], steps[-1]], y=[share, share], mode="lines", legendgroup=str(rank),
            name=f"rank {rank}: in proportion to speed ({share:.0%}{slower})",
            line=dict(color=rank_color(rank), dash="dot", width=1.5),
            hovertemplate=f"rank {rank}: {share:.0%} of the batch in proportion to "
                          "speed<extra></extra>"), 1, 1)
    fig.update_yaxes(title_text="share", tickformat=".0%", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="training step", dtick=1)
    fig.update_layout(barmode="group", meta={"steps": steps, "share": [r["share"] for r in rows],
                                             "throughput_share": [r["throughput_share"] for r in rows],
                                             "proportional": proportional})
    style(fig, title or "load balancing: each rank's batch share follows its throughput", 420)
    # a rank's two or three legend entries stack in a column at 820 pixels: room for them above the
    # subplot titles
    legend_rows = 3 if proportional else 2
    fig.update_layout(margin=dict(t=fig.layout.margin.t + 22 + 17 * (legend_rows - 2)))
    return fig
