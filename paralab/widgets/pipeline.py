"""The pipeline explorer: pick a schedule and shape, see the simulated step at once, then run it.

Sliders drive :func:`paralab.sim.events.simulate_schedule` on the same schedule data the real
executor runs; the timeline redraws in place (new bar columns pushed into the FigureWidget, no new
figure), which keeps a 64-rank pipeline interactive. Combinations a schedule cannot build show the
schedule's own error text instead of raising. For DualPipeV an "F&B hides" slider says how much of a
slot's time the overlap of one microbatch's forward with another's backward saves (the communication
one hides behind the other's compute), and the bubble follows. "Run for real" launches the pp
strategy on local ranks with a progress bar, then draws the measured last step above a prediction
re-timed with the durations it measured (so the two share real units).
"""

from __future__ import annotations

import dataclasses
import os
import time
from functools import lru_cache

from paralab.schedules import (
    SCHEDULES,
    ScheduleError,
    build_schedule,
    chunks_per_rank,
    shape_problems,
    theoretical_bubble,
)
from paralab.sim.events import simulate_schedule
from paralab.trace import COMPUTE, Trace, past_warm_up
from paralab.viz.bubble import lower_bound
from paralab.viz.timeline import microbatch_key, rows_axis
from paralab.widgets._common import (
    EARLIER_RUN,
    attach,
    figure_widget,
    mark,
    message,
    redrawn,
    refuse,
    replace_figure,
    row,
    select,
    unmark,
    widgets,
    within,
)

UNIT_TIMES = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}
# The most (chunk, microbatch) pairs drawn: some 6,000 bars (64 stages of 16 microbatches, 8 of 128),
# which a browser draws in a second or two. Python builds more in a second, but 64 stages of 128
# (50,000 bars, a 12 MB figure) had taken a JupyterLab tab 12 s to draw.
MAX_DRAWN = 1024
# The most ranks "Run for real" starts, one process a stage: the notebooks hold to 4 ranks so that they
# run on a Binder box (1 CPU, 2 GB), and the slider's 64 stages had been let through up to the capacity
# check's 8 ranks a core. Past it the simulated figure is the answer.
MAX_RUN_RANKS = 4


@lru_cache(maxsize=128)
def simulate(name: str, stages: int, microbatches: int, virtual_stages: int, p2p: float,
             overlap: float = 0.0) -> Trace:
    """Simulated step in forward-time units (F = 1 ms per chunk of one whole stage, B = 2, Bi = W = 1);
    ``overlap``: what an F&B slot saves, in the same units (DualPipeV).

    Cached: going back to a shape seen before costs nothing. Raises ScheduleError/ValueError for
    shapes the schedule cannot build.
    """
    sched = build_schedule(name, stages, microbatches, virtual_stages)
    v = sched.virtual_stages
    times = {op: t * 1e-3 / v for op, t in UNIT_TIMES.items()}
    return simulate_schedule(sched, times, p2p * 1e-3, overlap_saving=overlap * 1e-3 / v)


def drawable(stages: int, microbatches: int, chunks_per_rank: int) -> bool:
    """Whether the explorer draws this shape: at most :data:`MAX_DRAWN` chunk-microbatches."""
    return stages * chunks_per_rank * microbatches <= MAX_DRAWN


def measured_times(trace: Trace) -> dict[str, float]:
    """Mean seconds per compute op in a measured trace (steps past warm-up), for re-timing the sim."""
    later = set(past_warm_up(sorted({s.step for s in trace.spans if s.step is not None})))
    sums: dict[str, list[float]] = {}
    for s in trace.select(lane=COMPUTE):
        if s.step in later and s.kind in UNIT_TIMES:
            sums.setdefault(s.kind, []).append(s.duration)
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    if "forward" in out:  # fill ops the run did not have (e.g. no split backward) from the forward
        for op, unit in UNIT_TIMES.items():
            out.setdefault(op, out["forward"] * unit)
    return out


def deep_enough(model, chunks: int):
    """(model, note): a preset with fewer layers than the schedule has model chunks (the tiny model's 4
    on 4 ranks of DualPipeV's 2 chunks) deepened to one layer per chunk, so every shape the explorer
    draws can run; the note says so."""
    from paralab.config import MODEL_PRESETS

    preset = MODEL_PRESETS.get(model) if isinstance(model, str) else None
    if preset is None or preset.layers >= chunks:
        return model, ""
    return dataclasses.replace(preset, layers=chunks), f" (the {model} model deepened to {chunks} layers)"


def most_drawn_stages(name: str, chunks: int, max_stages: int, max_microbatches: int) -> int:
    """The most stages (up to ``max_stages``) at which the explorer draws schedule ``name`` with
    ``chunks`` model chunks a rank: where the fewest microbatches it builds for (up to
    ``max_microbatches``) are :func:`drawable`. DualPipeV's 2 a stage stop at 16 of the 64: at 17 its
    34 microbatches make 1,156 chunk-microbatches. At least 2, the stages slider's least."""
    return max((p for p in range(2, max_stages + 1) if drawn_at(name, p, chunks, max_microbatches)),
               default=2)


def drawn_at(name: str, stages: int, chunks: int, max_microbatches: int) -> bool:
    """Whether some microbatch count up to ``max_microbatches`` builds and is drawn (the fewest is the
    one drawn if any is)."""
    fewest = fewest_microbatches(name, stages, chunks)
    return fewest is not None and fewest <= max_microbatches and drawable(stages, fewest, chunks)


def stage_limit(name: str, most: int, chunks: int, max_microbatches: int) -> str:
    """Why the explorer draws schedule ``name`` (``chunks`` model chunks a rank) up to ``most`` stages:
    what one stage more would need."""
    more = most + 1
    fewest = fewest_microbatches(name, more, chunks)
    if fewest is None or fewest > max_microbatches:
        return (f"the explorer draws {name} up to {most} pipeline ranks: {more} need more microbatches "
                "than it offers")
    return (f"the explorer draws {name} up to {most} pipeline ranks: {more} need at least {fewest} "
            f"microbatches, {more * chunks * fewest:,} chunk-microbatches, past the {MAX_DRAWN:,} it draws "
            "(paralab.sim prices a step of any size)")


def refusal(name: str, stages: int, microbatches: int, chunks: int, exc: Exception) -> str:
    """Why the explorer cannot draw this shape. Too few microbatches are said in the sliders' terms:
    DualPipeV's own rule counts the model stages of its V ("as many microbatches as stages (2 x pp =
    8)"), which had stood beside a slider of 4 ranks. The slider counts pipeline ranks; a stage is a
    model chunk, as the timeline's "s7" names it. (A rank count whose fewest microbatches are more
    than the explorer draws is not offered: the slider stops before it.)"""
    fewest = fewest_microbatches(name, stages, chunks)
    if fewest is not None and microbatches < fewest:
        return (f"{name} on {stages} pipeline ranks needs at least {fewest} microbatches ({chunks} model "
                f"chunks on each rank, {stages * chunks} stages in its pipeline), got {microbatches}")
    return f"{name} on {stages} pipeline ranks, {microbatches} microbatches, v={chunks}: {exc}"


def fewest_microbatches(name: str, stages: int, chunks: int) -> int | None:
    """The fewest microbatches schedule ``name`` builds for on ``stages`` ranks of ``chunks`` model chunks
    (:func:`paralab.schedules.shape_problems`), or None where no count up to one a chunk would do."""
    counts = range(1, stages * chunks + 1)
    return next((m for m in counts if not shape_problems(name, stages, m, chunks)), None)


def beyond_binder(stages: int) -> str:
    """Why "Run for real" starts no run of more than :data:`MAX_RUN_RANKS` pipeline ranks."""
    return (f"Run for real starts at most {MAX_RUN_RANKS} ranks, one process each: a notebook must run on a "
            f"Binder box (1 CPU, 2 GB). {stages} pipeline ranks are simulated only, in the figure below")


def load_average() -> float:
    """This machine's 1-minute load average: the processes running or waiting for a core (0 where the
    system keeps none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return 0.0


def crowded(cfg, ranks: int, load: float = 0.0) -> str:
    """A line saying that ``ranks`` CPU ranks of ``cfg`` took turns on the cores, or "": a rank waiting
    for a core holds up its neighbours, and the measured bubble counts their wait, so it comes out far
    above the schedule's (79% against 29% for 1F1B's 4 ranks on 2 cores). They take turns when their
    threads outnumber the cores they may use, or when the work already running (``load``: the machine's
    1-minute load average before the run) leaves too few of the machine's cores, which the load average
    counts, free for them: on a machine other jobs kept busy, 64% measured against 20% predicted had
    stood without a word."""
    from paralab.runtime.worker import threads_for, usable_cores

    if cfg.device == "cuda":
        return ""
    cores, threads = usable_cores(), ranks * threads_for(cfg, ranks)
    wait = "a rank waiting for a core holds up its neighbours, and the measured bubble counts their wait"
    if threads > cores:
        return f"\nthe {ranks} ranks shared this machine's {cores} core{'s' if cores > 1 else ''}: {wait}"
    machine = max(os.cpu_count() or 1, cores)  # the load average counts every core of the machine
    if threads + load > machine:
        return (f"\nthe {ranks} ranks shared this machine with other work (load average {load:.1f} on its "
                f"{machine} cores before the run): {wait}")
    return ""


def pipeline_explorer(schedule: str = "1f1b", stages: int = 4, microbatches: int = 8, virtual_stages: int = 2,
                      p2p: float = 0.05, max_stages: int = 64, max_microbatches: int = 128, steps: int = 3,
                      model: str = "tiny", run_options: dict | None = None, overlap: float = 0.0):
    """Schedule dropdown and stages / microbatches / virtual-stages / p2p sliders over a simulated timeline.
    A control that does not apply to the chosen schedule (virtual stages outside interleaved, what an
    F&B slot hides outside DualPipeV) is hidden.

    Attributes: ``controls`` (dict of widgets), ``figure`` (prediction FigureWidget), ``measured``
    (FigureWidget after a real run, else None), ``message``, ``progress``, ``redraw()``,
    ``run_for_real()``, ``last_update_ms``. ``p2p`` is the transfer latency in forward times,
    ``overlap`` what a DualPipeV F&B slot saves, in forward times.
    """
    import paralab
    from paralab.viz._common import go, style
    from paralab.viz.timeline import bar_traces, timeline

    for argument, value, low, high in (("stages", stages, 2, max_stages),
                                       ("microbatches", microbatches, 1, max_microbatches),
                                       ("virtual_stages", virtual_stages, 2, 8)):
        within(argument, value, low, high, whole=True)  # the sliders' ranges, which had clamped them
    within("p2p", p2p, 0.0, 2.0)
    within("overlap", overlap, 0.0, 1.0)
    w = widgets()
    whole = dict(style={"description_width": "initial"})  # labels in full, never "microbatc…"
    controls = {
        "schedule": select(w.Dropdown, "schedule", list(SCHEDULES), schedule, description="schedule",
                           **whole),
        # pipeline ranks: a rank of a multi-chunk schedule holds several stages (model chunks, "s7")
        "stages": w.IntSlider(value=stages, min=2, max=max_stages, description="pipeline ranks (p)",
                              continuous_update=False, **whole),
        "microbatches": w.IntSlider(value=microbatches, min=1, max=max_microbatches,
                                    description="microbatches", continuous_update=False, **whole),
        # shown for interleaved only, which needs 2 chunks a rank at least (with one it is 1f1b)
        "virtual_stages": w.IntSlider(value=virtual_stages, min=2, max=8,
                                      description="virtual stages per rank",
                                      continuous_update=False, **whole),
        # wide enough for a track beside its long name: squeezed in their row, the F&B slider's had gone
        "p2p": w.FloatSlider(value=p2p, min=0.0, max=2.0, step=0.05, description="p2p time / forward time",
                             continuous_update=False, layout=w.Layout(min_width="380px"), **whole),
        # a slot can hide at most the shorter pass's worth (the forward): past it the slot would run
        # shorter than its backward alone
        "overlap": w.FloatSlider(value=overlap, min=0.0, max=1.0, step=0.1,
                                 description="F&B slot hides (forward times)",
                                 continuous_update=False, layout=w.Layout(min_width="420px"), **whole),
    }
    # the schedules each control applies to; for the others it is hidden (its value would mean nothing)
    applies = {"virtual_stages": ("interleaved",), "overlap": ("dualpipev",)}
    info = w.HTML()
    msg = w.HTML()
    button = w.Button(description="Run for real", button_style="primary", icon="play")
    progress = w.IntProgress(value=0, min=0, max=steps, description="steps",
                             layout=w.Layout(visibility="hidden"))
    measured_box = w.VBox([])

    def shape():
        c = {k: v.value for k, v in controls.items()}
        v = chunks_per_rank(c["schedule"], c["virtual_stages"] if c["schedule"] == "interleaved" else 1)
        return (c["schedule"], c["stages"], c["microbatches"], v, c["p2p"],
                c["overlap"] * (c["schedule"] == "dualpipev"))

    try:
        first = simulate(*shape()) if drawable(*shape()[1:4]) else Trace()
    except (ScheduleError, ValueError):
        first = Trace()
    # the schedule's shape, redrawn live: without the hatched waits on the comm lanes (a third more bars)
    fw = figure_widget(timeline(first, title="predicted step (time in forward units: F = 1 ms)", waits=False))

    def capped() -> str:
        """Stop the stages slider where the chosen schedule stops being drawn (DualPipeV at 16: the
        microbatches it needs past that are more than the explorer draws, and its 17 to 64 had each
        refused); "" or why it stops."""
        name, _p, _m, v, _lat, _overlap = shape()
        most = most_drawn_stages(name, v, max_stages, max_microbatches)
        if controls["stages"].max != most:
            controls["stages"].max = most  # a value past it comes down to it (and redraws)
        return stage_limit(name, most, v, max_microbatches) if most < max_stages else ""

    def redraw(*_):
        started = time.perf_counter()
        asked = controls["stages"].value
        stops = capped()
        if controls["stages"].value != asked:
            return  # brought down to the cap, which redrew through the slider's observer
        name, p, m, v, lat, overlap = shape()
        if app.measured is not None:  # a run of other settings than these is said to be one
            (unmark if (name, p, m, v) == app.measured_shape else mark)(app.measured, EARLIER_RUN)
        for key, schedules in applies.items():
            controls[key].layout.display = None if name in schedules else "none"
        button.disabled = p > MAX_RUN_RANKS
        button.tooltip = beyond_binder(p) if button.disabled else ""
        try:
            if not drawable(p, m, v):
                raise ValueError(f"the explorer draws up to {MAX_DRAWN:,} chunk-microbatches (pipeline "
                                 f"ranks x chunks per rank x microbatches), this shape has {p * v * m:,}; "
                                 "paralab.sim prices a step of any size")
            sim = simulate(name, p, m, v, lat, overlap)
        except (ScheduleError, ValueError) as exc:
            refuse(msg, fw, refusal(name, p, m, v, exc))
            info.value = ""  # the figure keeps the last shape drawn; its figures would read as this one's
            return
        msg.value = ""
        bars, rows = bar_traces(sim, waits=False)
        with fw.batch_update():
            redrawn(fw)
            if [t.name for t in fw.data] == [b["name"] for b in bars]:
                for trace, b in zip(fw.data, bars):
                    trace.update(y=b["y"], x=b["x"], base=b["base"], hovertext=b["hovertext"],
                                 marker=b["marker"], text=b["text"], width=b["width"], offset=b["offset"],
                                 insidetextfont=b["insidetextfont"])  # each label's ink is its bar's
            else:
                fw.data = ()
                fw.add_traces(bars)
            rows_axis(fw, rows, "yaxis")
            height = min(200 + 22 * len(rows), 1600)
            # style() pins the title and the legend in pixels from the top, as fractions of the height:
            # kept for the old height, 64 ranks' legend had sat 150 px below the title
            pinned = style(go().Figure(), height=height).layout
            fw.layout.height, fw.layout.title.y, fw.layout.legend.y = height, pinned.title.y, pinned.legend.y
            fw.layout.meta = {"ranks": p, "rows": rows, "source": "simulated"}
            # the key's example, a bar this shape draws: the first shape's had stayed under every other
            fw.layout.xaxis.title.text = microbatch_key(sim.spans)
        theory = theoretical_bubble(name, p, m, v)
        # Python's part only: the browser draws the bars after this (MAX_DRAWN keeps that short)
        app.last_update_ms = (time.perf_counter() - started) * 1e3
        hidden = f", F&B hides {overlap:g} F" if name == "dualpipev" else ""
        # the p2p time the simulated step pays: unsaid, a step longer than the closed form's had read as
        # a bug after the slider had moved under another schedule
        hidden += f", p2p {lat:g} F" if lat else ""
        # the closed form knows neither a slot's overlap nor the p2p latency the simulation pays
        assumes = ", ".join(what for what, applies in (("nothing hidden", overlap), ("free p2p", lat))
                            if applies)
        bound = " (only a lower bound with fewer microbatches than stages)" if lower_bound(name, p, m) else ""
        step = max((s.end for s in sim.spans), default=0.0) * 1e3
        info.value = (f"<b>{name}</b> p={p} m={m} v={v}{hidden}: step {step:.1f} F, bubble simulated "
                      f"{sim.bubble_fraction():.1%}, closed form{f' ({assumes})' if assumes else ''} "
                      f"{theory:.1%}{bound}"
                      + (f"<br>{beyond_binder(p)}" if p > MAX_RUN_RANKS else "")
                      # said where the slider stops: at 4 ranks, "up to 16" had read as a problem there
                      + (f"<br>{stops}" if stops and p == controls["stages"].max else ""))

    def on_progress(step: int, total: int) -> None:
        progress.max = total
        progress.value = step + 1

    def run_for_real(*_):
        name, p, m, v, _lat, _overlap = shape()
        if p > MAX_RUN_RANKS:
            msg.value = message(beyond_binder(p), "error")
            return None
        progress.value, progress.layout.visibility = 0, "visible"
        chosen, deepened = deep_enough(model, p * v)
        msg.value = message(f"running {name} on {p} local ranks{deepened} ...")
        load = load_average()  # before the ranks start: the work they will share the machine with
        try:
            result = paralab.run(strategy="pp", world_size=p, pp=p, schedule=name, microbatches=m,
                                 virtual_stages=v, steps=steps, model=chosen, progress=on_progress,
                                 **{"global_batch": m, **(run_options or {})})
        except Exception as exc:  # ConfigError (e.g. pp not available), RunError: show, don't raise
            msg.value = message(f"{type(exc).__name__}: {exc}", "error")
            return None
        trace = result.trace
        last = max((s.step for s in trace.spans if s.step is not None), default=None)
        unit = measured_times(trace)
        sched = build_schedule(name, p, m, v)
        predicted = simulate_schedule(sched, unit or UNIT_TIMES)
        # the shape in the title: the figure stays when the controls move on to another
        shape_named = f"{name}, {p} ranks, {m} microbatches" + (f", v={v}" if name == "interleaved" else "")
        fig = timeline(trace, predicted=predicted, steps=[last] if last is not None else None,
                       title=f"run for real, {shape_named}: step {last}")
        if app.measured is None:
            app.measured = figure_widget(fig)
            measured_box.children = [app.measured]
        else:
            replace_figure(app.measured, fig)
        app.result, app.measured_shape = result, (name, p, m, v)
        msg.value = message(f"measured step time {result.summary['step_time_s'] * 1e3:.1f} ms, bubble "
                            f"{result.summary['bubble_fraction']:.1%}; predicted below with the op times it "
                            f"measured: bubble {predicted.bubble_fraction():.1%}"
                            + crowded(result.config, p, load), "ok")
        return result

    for c in controls.values():
        c.observe(redraw, names="value")
    button.on_click(run_for_real)
    app = w.VBox([
        row(controls["schedule"], controls["stages"], controls["microbatches"]),
        row(controls["virtual_stages"], controls["p2p"], controls["overlap"]),
        row(button, progress),
        info, msg, fw, measured_box,
    ])
    attach(app, controls=controls, figure=fw, measured=None, message=msg, info=info, progress=progress,
           button=button, redraw=redraw, run_for_real=run_for_real, last_update_ms=0.0, result=None,
           measured_shape=None)
    redraw()
    return app
