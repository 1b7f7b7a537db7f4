"""Scaling, communication and memory explorers: sliders over the cost model, figures from paralab.viz.

Each explorer predicts with :mod:`paralab.sim` (instant, any size) and can show measured runs beside
the prediction (``measured=`` arguments). A split the cost model refuses (SpecError: tp not dividing
the heads, a batch that does not split, ...) shows its message; the figure keeps the last good state
(the comm explorer draws the run and its prediction without the refused grown one).
The scaling explorer leaves out, and names, the sizes that do not fit in memory: they cannot run.
"""

from __future__ import annotations

import functools
import re

from paralab.widgets._common import (
    attach,
    figure_widget,
    lines_below_title,
    message,
    refuse,
    replace_figure,
    row,
    select,
    toggle,
    up_to,
    whole_labels,
    widgets,
)

POW2 = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
# Two menus this wide and a row of buttons each as wide as its text (``toggle``) fit a notebook's 930 px
# output on one line: at ipywidgets' own widths the buttons had wrapped under their label.
MENU = {"width": "15em"}


def _sim():
    from paralab.sim import cost, hardware, presets, specs

    return cost, hardware, presets, specs


# ------------------------------------------------------------------------------------------ scaling
def scaling_points(model_name: str, hw_name: str, dim: str, max_gpus: int, global_batch: int,
                   base: dict | None = None, micro_batch: int = 1) -> tuple[list[dict], list[str]]:
    """Predicted points along one parallel dimension (dp, tp or pp = 1, 2, 4 ... max_gpus), each
    replica running ``micro_batch`` sequences at a time (the rest of its share of the global batch as
    gradient accumulation, as a run that must fit does).

    Returns (points for paralab.viz.scaling, reasons for the sizes left out): a size the cost model
    refuses, or one that does not fit in the GPU's memory (it cannot run, so it has no step time),
    each reason said once (:func:`said_once`). A batch that does not split into the replicas'
    micro-batches is refused before the cost model is asked. A pipeline whose stages the layers do not
    divide into splits them unevenly, as the simulator's refusal suggests; its point says how
    (``split``, beside the degree it scales, ``size``).
    """
    from paralab.stage_split import split_text, uneven_split

    cost, hardware, presets, specs = _sim()
    model, hw = presets.get_model(model_name), hardware.get_hardware(hw_name)
    usable = cost.usable_memory(hw)
    points, refused = [], []  # (size, why)
    for n in [g for g in POW2 if g <= max_gpus]:
        fields = {"micro_batch": micro_batch, **(base or {}), dim: n, "global_batch": global_batch}
        per_step = fields.get("dp", 1) * fields["micro_batch"]
        if global_batch > 0 and global_batch % per_step:
            refused.append((n, f"global batch {global_batch} is not a whole number of micro-batches of "
                               f"{fields['micro_batch']} per replica"))
            continue
        split = None
        if dim == "pp":  # a split fits one depth only: each depth takes its own, or none
            fields["stage_layers"] = split = uneven_split(model.layers, n)
        spec = specs.ParallelSpec(**fields)
        try:
            pred = cost.predict(model, spec, hw)
        except specs.SpecError as exc:
            refused.append((n, str(exc)))
            continue
        if not pred.fits:
            need = pred.memory_bytes_per_gpu["total"]
            refused.append((n, f"does not fit, {need / 2**30:,.1f} GiB per GPU against "
                               f"{usable / 2**30:.1f} GiB usable"))
            continue
        points.append({"world_size": spec.world_size, "step_time_s": pred.step_time_s, "size": n,
                       "tokens_per_s": pred.tokens_per_s, "split": split_text(split) if split else ""})
    return points, said_once(dim, refused)


# a number as the reasons write it: 7, 120.3, 100,000 (a comma that a space follows is punctuation)
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def said_once(dim: str, refused: list[tuple[int, str]]) -> list[str]:
    """Each reason once, after the sizes it applies to ("dp=1, 2, 4: does not fit, ..."): ten sizes
    refused alike had made a block of ten repeats. Reasons that differ only in their numbers (each
    size's memory, its GPUs) are one reason, each number that differs written as the range the sizes
    span ("tp=1, 2: does not fit, 120.3 to 236.5 GiB per GPU"): seven sizes refused by one limit of the
    simulator had each said it with their own count of GPUs."""
    alike: dict[str, list[tuple[int, str]]] = {}
    for n, why in refused:
        alike.setdefault(NUMBER.sub("#", why), []).append((n, why))
    return [f"{dim}={', '.join(str(n) for n, _ in group)}: {merged([why for _, why in group])}"
            for group in alike.values()]


def merged(reasons: list[str]) -> str:
    """Reasons alike but for their numbers as one: each number that differs as "lowest to highest"."""
    spans = iter(number_span(texts) for texts in zip(*map(NUMBER.findall, reasons)))
    return NUMBER.sub(lambda _: next(spans), reasons[0])


def number_span(texts: tuple[str, ...]) -> str:
    """One number of a reason as the sizes give it: the number, or "lowest to highest"."""
    values = [float(t.replace(",", "")) for t in texts]
    low, high = texts[values.index(min(values))], texts[values.index(max(values))]
    return low if min(values) == max(values) else f"{low} to {high}"


def scaling_explorer(model: str = "gpt3-1.3b", hardware: str = "h100", dim: str = "dp", max_gpus: int = 64,
                     global_batch: int = 512, micro_batch: int = 1, measured=None):
    """Predicted step time and speedup against world size, for the sizes that fit in memory;
    ``measured`` runs (RunResults, summaries or {world_size: step time}) drawn beside. Attributes:
    ``controls``, ``figure``, ``message``, ``redraw()``.

    Settings under which no size can run keep the last figure, marked not redrawn (an empty one had
    autoscaled its log axes to ticks from 0.125 to 524,288 ranks). A global batch under 1 is refused:
    the spec would read 0 as "a micro-batch per replica", a batch growing with dp, unasked."""
    from paralab.sim import hardware as hw_mod
    from paralab.sim import presets
    from paralab.viz.scaling import scaling

    w = widgets()
    controls = whole_labels({
        "model": select(w.Dropdown, "model", list(presets.MODELS), model, description="model", layout=MENU),
        "hardware": select(w.Dropdown, "hardware", list(hw_mod.PRESETS), hardware, description="hardware",
                           layout=MENU),
        "dim": toggle(["dp", "tp", "pp"], dim, "scale", argument="dim"),
        "max_gpus": up_to(POW2[1:], max_gpus, "GPU", argument="max_gpus"),
        "global_batch": w.IntText(value=global_batch, description="global batch"),
        "micro_batch": select(w.SelectionSlider, "micro_batch", POW2[:6], micro_batch,
                              description="micro-batch"),
    })
    msg = w.HTML()
    fw = figure_widget(scaling(measured=measured, title="nothing drawn for these settings (see the message)"))

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        if c["global_batch"] < 1:
            refuse(msg, fw, f"global batch {c['global_batch']}: give the sequences per step, 1 or more")
            return
        try:
            points, skipped = scaling_points(c["model"], c["hardware"], c["dim"], c["max_gpus"],
                                             c["global_batch"], micro_batch=c["micro_batch"])
        except Exception as exc:  # an unknown preset or a cost-model error: say it, keep the figure
            refuse(msg, fw, str(exc))
            return
        if not points:
            refuse(msg, fw, "\n  ".join(["no size can run, none drawn:", *skipped]))
            return
        uneven = [f"pp={p['size']} splits the layers {p['split']}" for p in points if p["split"]]
        notes = (["not drawn:\n  " + "\n  ".join(skipped)] if skipped else []) + uneven
        msg.value = message("\n".join(notes), "info") if notes else ""
        title = (f"{c['model']} on {c['hardware']}, scaling {c['dim']} (global batch {c['global_batch']}, "
                 f"micro-batch {c['micro_batch']})")
        replace_figure(fw, scaling(measured=measured, predicted=points, title=title))

    for c in controls.values():
        c.observe(redraw, names="value")
    app = w.VBox([row(controls["model"], controls["hardware"], controls["dim"]),
                  row(controls["max_gpus"], controls["global_batch"], controls["micro_batch"]), msg, fw])
    attach(app, controls=controls, figure=fw, message=msg, redraw=redraw)
    redraw()
    return app


# ------------------------------------------------------------------------------------------- memory
def memory_by_zero(model_name: str, dp: int, tp: int, pp: int, micro_batch: int, recompute: str,
                   microbatches: int) -> dict[str, dict]:
    """ZeRO stage label -> predicted bytes per GPU by kind, for the stages the split allows (layers that
    do not divide into ``pp`` split as the simulator's refusal suggests,
    :func:`paralab.stage_split.uneven_split`)."""
    from paralab.stage_split import uneven_split

    cost, _hardware, presets, specs = _sim()
    model = presets.get_model(model_name)
    split = uneven_split(model.layers, pp)
    out = {}
    for zero in (0, 1, 2, 3):
        spec = specs.ParallelSpec(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro_batch,
                                  recompute=recompute, microbatches=microbatches, stage_layers=split)
        if spec.problems(model):
            continue
        out[zero_label(zero)] = cost.memory_per_gpu(model, spec)
    return out


def zero_label(stage: int) -> str:
    """How the memory figures name a ZeRO stage: "no ZeRO", "ZeRO-1" ..."""
    return f"ZeRO-{stage}" if stage else "no ZeRO"


def memory_against_limit(bars: dict[str, dict], hw, title: str):
    """Stacked bars of :func:`memory_by_zero` against what a plan may fill (``cost.usable_memory``,
    the line ``fits`` is tested against) and the part's capacity above it, each bar's total and
    whether it fits written above it (a ZeRO-3 bar of 70.7 GiB had sat on the 71.7 GiB line, its
    side of it for the eye to guess). A model far under the line (the lab's CPU presets) is drawn in
    MiB and the title says how far under it is, since at the line's scale its bars would not show.
    ``fig.layout.meta["fits"]``: per bar, in drawing order, as :func:`paralab.sim.cost.predict` says."""
    from paralab.sim.cost import usable_memory
    from paralab.viz._common import fmt_bytes, go
    from paralab.viz.memory import memory

    usable, capacity = usable_memory(hw), hw.memory_bytes
    tallest = max(sum(v for k, v in kinds.items() if k != "total") for kinds in bars.values())
    if tallest < usable / 10:
        # on a line of its own: plotly does not wrap a title, and after a long first line it ran past
        # the figure's right edge
        title += f"<br>at most {fmt_bytes(tallest)}, far below the {usable / 2**30:.1f} GiB a GPU can fill"
        return lines_below_title(memory(bars, unit="MiB" if tallest < 2**30 else "GiB", title=title))
    fig = lines_below_title(memory(bars, unit="GiB", title=title))
    lines = ((usable, f"fits below: {usable / 2**30:.1f} GiB usable", "dash", "#D62728"),
             (capacity, f"{hw.name} capacity {capacity / 2**30:.1f} GiB", "dot", "#999"))
    for rank, (nbytes, name, dash, color) in enumerate(lines):
        fig.add_hline(y=nbytes / 2**30, line_dash=dash, line_color=color)
        # named in the legend: written on the line, a name had sat on the bars, and on the axis beside
        # the other's where bars of 10,000 GiB flatten the two lines into one. After the kinds: the
        # stacked bars' legend runs in reverse, the higher ranks first (plotly's default rank is 1000)
        fig.add_trace(go().Scatter(x=[None], y=[None], mode="lines", name=name, legendrank=999 - rank,
                                   line=dict(color=color, dash=dash), hoverinfo="skip"))
    fits = []
    for label, total in zip(bars, fig.layout.meta["totals"], strict=True):  # one bar a layout
        fits.append(total <= usable)
        # on a white ground: a total just under the line is written across it, and must read whole
        fig.add_annotation(x=label, y=total / 2**30, yanchor="bottom", showarrow=False, yshift=2,
                           text=f"{total / 2**30:,.1f} GiB<br><b>{'fits' if fits[-1] else 'over'}</b>",
                           font=dict(size=12, color="#2CA02C" if fits[-1] else "#D62728"),
                           bgcolor="rgba(255,255,255,0.85)")
    top = max(tallest, capacity) / 2**30
    # room above the tallest bar for what is written on it; thousands as "15,000", not plotly's "15k" GiB
    fig.update_yaxes(range=[0, top * 1.18], tickformat=",")
    fig.update_layout(meta={**fig.layout.meta, "fits": fits})
    return fig


def _zero_label(summary: dict) -> str | None:
    """A measured run's ZeRO stage as :func:`memory_by_zero` names it ("no ZeRO" for ddp), or None
    where its strategy does not say one."""
    if summary.get("zero") or summary.get("strategy") == "ddp":
        return zero_label(summary.get("zero", 0))
    return None


def measured_memory(measured: dict):
    """(figure, note) for measured runs ({label: RunResult or summary}) shown under a prediction of
    other settings: titled with the runs' own model, ranks, micro-batch and unit, their bars named as
    the predicted ones where the strategy gives a ZeRO stage (two runs of one stage keep the caller's
    names). The note says what a bar holds, the kinds at the moment the rank's total peaked (a ddp
    run's may come after its backward: no activations, its gradients beside the bucket copies it
    all-reduces), and sets each run's measured peak beside the cost model's for that run
    (``paralab.sim.bridge``): the figure above prices the controls' model and micro-batch instead."""
    from paralab.sim.bridge import predict_memory
    from paralab.viz._common import as_summary, fmt_bytes
    from paralab.viz.memory import memory, memory_by_rank

    if not isinstance(measured, dict):  # a str had been "no attribute 'items'"
        raise TypeError(f"measured must be {{label: RunResult or summary}}, got {type(measured).__name__}")
    summaries = {label: as_summary(run) for label, run in measured.items()}
    names = {label: _zero_label(s) or label for label, s in summaries.items()}
    if len(set(names.values())) < len(names):
        names = {label: label for label in measured}
    ranks = {label: memory_by_rank(run) for label, run in measured.items()}

    def said(key: str) -> str:
        return ", ".join(dict.fromkeys(str(s[key]) for s in summaries.values() if key in s)) or "?"

    runs = f"{said('model')}, {said('world_size')} ranks, micro-batch {said('micro_batch')}"
    fig = memory({names[label]: run for label, run in measured.items()},
                 title=f"measured: {runs} - peak memory per rank (MiB)")
    note = "Bars: what a rank held when its total peaked"
    after_backward = [names[label] for label, s in summaries.items()
                      if s.get("strategy") == "ddp" and not ranks[label][0].get("activations")]
    if after_backward:
        note += f" ({', '.join(after_backward)}: after backward, gradients beside their bucket copies)"
    peaks = {label: max(sum(v for k, v in kinds.items() if k != "total") for kinds in by_rank)
             for label, by_rank in ranks.items()}
    compared = [f"{names[label]} {fmt_bytes(predict_memory(run.config)['total'])} (measured "
                f"{fmt_bytes(peaks[label])})" for label, run in measured.items()
                if getattr(run, "config", None) is not None]
    if compared:
        note += ". Predicted for these runs: " + ", ".join(compared)
    return fig, note + "."


def memory_explorer(model: str = "gpt3-1.3b", hardware: str = "h100", dp: int = 8, tp: int = 1, pp: int = 1,
                    measured: dict | None = None):
    """Predicted memory per GPU for each ZeRO stage of a split, against the GPU's memory line.

    ``measured``: {label: RunResult or summary} of real runs (one per strategy or ZeRO stage), drawn
    per rank in a second figure with a line under it (:func:`measured_memory`). Attributes:
    ``controls``, ``figure``, ``measured_figure``, ``measured_note``, ``message``.
    """
    from paralab.sim import hardware as hw_mod
    from paralab.sim import presets
    from paralab.stage_split import split_text, uneven_split
    from paralab.viz.memory import memory

    w = widgets()
    controls = whole_labels({
        "model": select(w.Dropdown, "model", list(presets.MODELS), model, description="model", layout=MENU),
        "hardware": select(w.Dropdown, "hardware", list(hw_mod.PRESETS), hardware, description="hardware",
                           layout=MENU),
        "dp": select(w.SelectionSlider, "dp", POW2, dp, description="dp"),
        "tp": select(w.SelectionSlider, "tp", POW2[:5], tp, description="tp"),
        "pp": select(w.SelectionSlider, "pp", POW2[:7], pp, description="pp"),
        "micro_batch": w.SelectionSlider(options=POW2[:6], value=1, description="micro-batch"),
        "recompute": toggle(["none", "selective", "full"], "none", "recompute"),
    })
    msg = w.HTML()
    fw = figure_widget(memory({zero_label(0): {"params": 0}}))
    measured_fw = measured_note = None
    if measured:
        measured_fig, note = measured_memory(measured)
        measured_fw, measured_note = figure_widget(measured_fig), w.HTML(message(note))

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        try:
            bars = memory_by_zero(c["model"], c["dp"], c["tp"], c["pp"], c["micro_batch"], c["recompute"],
                                  microbatches=max(c["pp"], 1) * 2 if c["pp"] > 1 else 1)
        except Exception as exc:
            refuse(msg, fw, str(exc))
            return
        chosen = presets.get_model(c["model"])
        split = uneven_split(chosen.layers, c["pp"])  # as memory_by_zero splits them
        if not bars:
            from paralab.sim.specs import ParallelSpec

            spec = ParallelSpec(dp=c["dp"], tp=c["tp"], pp=c["pp"], micro_batch=c["micro_batch"],
                                stage_layers=split)
            refuse(msg, fw, "; ".join(spec.problems(chosen)))
            return
        msg.value = ""
        # a line of its own (plotly does not wrap a title): after "dp=1024 tp=8 pp=64" the 405B model's
        # "(layers per stage 1 + 62 x 2 + 1)" had run past the figure's right edge
        layers = f"<br>layers per stage {split_text(split)}" if split else ""
        replace_figure(fw, memory_against_limit(bars, hw_mod.get_hardware(c["hardware"]),
                                                f"{c['model']}: predicted memory per GPU, "
                                                f"dp={c['dp']} tp={c['tp']} pp={c['pp']}{layers}"))

    for c in controls.values():
        c.observe(redraw, names="value")
    children = [row(controls["model"], controls["hardware"], controls["recompute"]),
                row(controls["dp"], controls["tp"], controls["pp"], controls["micro_batch"]), msg, fw]
    app = w.VBox(children + ([measured_fw, measured_note] if measured_fw else []))
    attach(app, controls=controls, figure=fw, measured_figure=measured_fw, measured_note=measured_note,
           message=msg, redraw=redraw)
    redraw()
    return app


# -------------------------------------------------------------------------------------------- comm
# What only the grown prediction reads: the comm explorer disables them where it is not drawn.
GROWN_RUN_CONTROLS = ("world_size", "tp", "pp", "gpus_per_node", "model")


def collective_rows(op: str, payload: float, max_group: int, hw_name: str) -> list[dict]:
    """Per group size: the ring's wire bytes per rank, and its time inside one node (on NVLink; None
    for a group larger than a node) and with one rank per node (on each GPU's InfiniBand).

    The ring alone, as the calculator's title and its bytes say (paralab.collectives.ring_time on the
    links of the collectives explorer): the cost model's collective_time takes the faster of the ring and
    NCCL's tree, and its 8 ranks across nodes had read faster than 8 inside one."""
    from paralab.collectives import ring_time
    from paralab.sim.counting import ring_wire_bytes

    nvlink, network = node_links(hw_name)
    return [{"group": n, "wire_bytes": ring_wire_bytes(op, payload, n),
             "intra_s": (ring_time(op, payload, n, nvlink.alpha, nvlink.bandwidth) if n <= nvlink.reach
                         else None),
             "inter_s": ring_time(op, payload, n, network.alpha, network.bandwidth)}
            for n in POW2 if 2 <= n <= max_group]


def node_links(hw_name: str):
    """A hardware preset's NVLink and InfiniBand links, as the collectives explorer draws them."""
    from paralab.widgets.collectives import links

    every = links()
    return every[f"{hw_name} NVLink"], every[f"{hw_name} InfiniBand"]


def comm_explorer(run=None, hardware: str = "h100", world_size: int | None = None, gpus_per_node: int = 8):
    """Communication of a run, measured beside predicted, and a ring-collective calculator.

    ``run``: a RunResult (measured views and the cost model's prediction of the same run and, named
    "what if", of the run grown to another size: sliders for world size, tp, pp, GPUs per node and the
    model; the per-rank batch, cp and ep are kept, dp fills the rest), a Trace (measured views only) or
    None (the calculator alone). Views: bytes by op (measured beside predicted, per rank and step), by
    step (measured), the rank-by-rank matrix and inside against across nodes. ``world_size``: where the
    size slider starts (default 4x the run).

    Attributes: ``controls``, ``figure`` (the run's view, or None), ``calculator`` (FigureWidget),
    ``message``, ``sources()`` (label -> Trace drawn), ``redraw()``.
    """
    from paralab.config import CUSTOM_MODEL
    from paralab.sim import hardware as hw_mod
    from paralab.viz import comm as viz_comm
    from paralab.viz import comm_compare
    from paralab.viz._common import as_trace

    w = widgets()
    controls = {
        "view": toggle(["by op", "by step", "rank matrix", "intra vs inter"], "by op", "view"),
        "payload": w.Checkbox(value=False, description="payload bytes (not wire)"),
        "op": w.Dropdown(options=["all_reduce", "all_gather", "reduce_scatter"], value="all_reduce",
                         description="op"),
        "size_mb": w.FloatLogSlider(value=100.0, base=10, min=-2, max=4, description="tensor MiB"),
        "max_group": up_to(POW2[1:], 64, "GPU"),
        "hardware": select(w.Dropdown, "hardware", list(hw_mod.PRESETS), hardware, description="hardware"),
    }
    msg = w.HTML()
    trace = as_trace(run) if run is not None else None
    predictor = _RunPredictor(run.config) if getattr(run, "config", None) is not None else None
    if predictor is not None:
        start = world_size or min(4 * predictor.world_size, 64)

        def slider(options: list[int], value: int, description: str):
            """Powers of two, and the run's own value where it is not one (a world of 6, tp 3)."""
            return w.SelectionSlider(options=sorted({*options, value}), value=value, description=description)

        controls.update(
            world_size=slider(POW2[1:7], start, "world size"),
            tp=slider(POW2[:5], predictor.parallel.tp, "tp"),
            pp=slider(POW2[:5], predictor.parallel.pp, "pp"),
            gpus_per_node=slider(POW2[:4], gpus_per_node, "GPUs/node"),
            model=w.Dropdown(options=predictor.models(), value=predictor.model_name, description="model"),
        )
    whole_labels(controls)
    state: dict = {"sources": {}}

    def sources(c, grown: bool = True) -> dict:
        """The traces the view draws: the run; in the views that compare (all but "by step"), its
        prediction and the prediction at the sliders' settings (``grown``), named "what if": at the
        run's own size it had shared the run's prediction's name, and its bar had stacked on that one."""
        out = {f"measured, {trace.meta.get('world_size') or len(trace.ranks)} ranks": trace}
        if predictor is None or c["view"] == "by step":
            return out
        out[f"predicted, {predictor.world_size} ranks"] = predictor.same_run
        if grown:
            bigger = predictor.grown(c["model"], c["world_size"], c["tp"], c["pp"], c["gpus_per_node"])
            model = "the run's model" if c["model"] == CUSTOM_MODEL else c["model"]  # a shape of its own
            label = (f"what if, {c['world_size']} ranks ({_mesh_text(bigger.meta)}, {model} in "
                     f"{predictor.model.dtype}, {c['gpus_per_node']}/node)")
            out[label] = bigger
        return out

    def view_figure(c):
        if c["view"] == "by step":
            return viz_comm.comm_by_op(trace, payload=c["payload"],
                                       title="measured: bytes by op and step, all ranks")
        figure = {"by op": comm_compare.compare_by_op, "rank matrix": comm_compare.compare_matrix,
                  "intra vs inter": comm_compare.compare_links}[c["view"]]
        return figure(state["sources"], payload=c["payload"])

    def drawable_sources(c) -> dict:
        """:func:`sources`, or without the grown prediction when the cost model refuses its split
        (the message says so): the run and its prediction are still drawn. A run that traced no
        collective (torch's own strategies run theirs inside torch) is said to be one.

        The sliders of the grown run are disabled in the view that draws the run alone ("by step"): they
        had looked live there, and a split they chose was refused in red beside a figure it is not in."""
        from paralab.sim.specs import SpecError

        for name in GROWN_RUN_CONTROLS:
            if name in controls:
                controls[name].disabled = c["view"] == "by step"
        if not trace.select(lane="comm"):
            strategy = trace.meta.get("strategy") or "this run"
            compared = c["view"] != "by step"
            why = ("one rank has no peer to send to" if len(trace.ranks) <= 1 else
                   "torch's own strategies run theirs inside torch, out of paralab's sight")
            msg.value = message(f"{strategy} traced no collective ({why})"
                                + (": the bars are the cost model's count alone" if compared else ""))
        try:
            return sources(c)
        except SpecError as exc:
            msg.value = message(f"{exc} (the grown prediction is left out)", "error")
            return sources(c, grown=False)

    trace_fw = None
    if trace is not None:
        state["sources"] = drawable_sources({k: v.value for k, v in controls.items()})
        trace_fw = figure_widget(view_figure({k: v.value for k, v in controls.items()}))
    calc_fw = figure_widget(_collective_figure({k: v.value for k, v in controls.items()}))

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        msg.value = ""
        replace_figure(calc_fw, _collective_figure(c))  # the calculator reads none of the run's sliders
        if trace_fw is None:
            return
        state["sources"] = drawable_sources(c)
        replace_figure(trace_fw, view_figure(c))

    for c in controls.values():
        c.observe(redraw, names="value")
    parts = []
    if trace_fw is not None:
        parts.append(row(controls["view"], controls["payload"]))
        if predictor is not None:
            parts += [row(controls["world_size"], controls["tp"], controls["pp"]),
                      row(controls["gpus_per_node"], controls["model"])]
        parts += [msg, trace_fw]
    parts += [w.HTML("<b>A ring collective, calculated</b>"),
              row(controls["op"], controls["size_mb"], controls["max_group"], controls["hardware"]), calc_fw]
    if trace_fw is None:
        parts.insert(-1, msg)
    app = w.VBox(parts)
    attach(app, controls=controls, figure=trace_fw, calculator=calc_fw, message=msg, redraw=redraw,
           sources=lambda: dict(state["sources"]))
    return app


def _mesh_text(meta: dict) -> str:
    """A predicted trace's mesh, e.g. "4 dp x 2 cp x 1 tp x 1 pp" (cp when used; ep, carved from dp,
    after; a hierarchical gradient all-reduce last)."""
    used = [axis for axis in ("dp", "cp", "tp", "pp") if axis != "cp" or meta[axis] > 1]
    axes = " x ".join(f"{meta[axis]} {axis}" for axis in used)
    return (axes + (f", ep {meta['ep']}" if meta["ep"] > 1 else "")
            + (", hierarchical all-reduce" if meta.get("hierarchical_dp") else ""))


class _RunPredictor:
    """The cost model's communication for a run's config, and for the same run on another mesh or
    model with the per-rank batch kept (paralab.viz.comm_compare draws them)."""

    def __init__(self, cfg):
        from paralab.layout import resolve_layout
        from paralab.sim.bridge import specs_from_run

        self.cfg, self.model_name = cfg, cfg.model_name
        self.model, self.parallel = specs_from_run(cfg)
        layout = resolve_layout(cfg)
        self.world_size = layout.world_size
        self.gpus_per_node = max(layout.world_size // max(layout.nodes, 1), 1)

    def models(self) -> list[str]:
        """The run's model, then the presets its layout can run: with expert parallelism, only the
        mixtures of experts (a dense model has no experts to shard)."""
        from paralab.config import MODEL_PRESETS
        from paralab.sim.presets import MODELS

        moe_only = self.parallel.ep > 1
        names = [name for name, m in [*MODEL_PRESETS.items(), *MODELS.items()] if m.experts or not moe_only]
        return list(dict.fromkeys([self.model_name, *names]))

    def model_spec(self, name: str):
        from paralab.config import MODEL_PRESETS
        from paralab.sim.presets import get_model, lab_model

        if name == self.model_name:
            return self.model
        spec = lab_model(MODEL_PRESETS[name], name) if name in MODEL_PRESETS else get_model(name)
        return spec.replace(dtype=self.model.dtype)

    @functools.cached_property
    def same_run(self):
        """The run as the cost model counts it (it never changes: computed once)."""
        from paralab.viz.comm_compare import predicted_comm_trace

        return predicted_comm_trace(self.model, self.parallel, self.gpus_per_node)

    def grown(self, model_name: str, world_size: int, tp: int, pp: int, gpus_per_node: int):
        from paralab.sim.specs import SpecError
        from paralab.stage_split import uneven_split
        from paralab.viz.comm_compare import predicted_comm_trace

        p = self.parallel.resolved()
        if world_size % (tp * pp * p.cp):  # cp named only where the run has it: there is no cp control
            names = "tp x pp x cp (the run's)" if p.cp > 1 else "tp x pp"
            raise SpecError(f"world size {world_size} is not a multiple of {names} = {tp * pp * p.cp}")
        dp = world_size // (tp * pp * p.cp)
        if dp % p.ep:  # ep had gone to 1 in silence, its all-to-alls with it
            raise SpecError(f"the run's ep {p.ep} shards experts over data-parallel ranks: dp {dp} (world "
                            f"size {world_size} over tp x pp) must be a multiple of it")
        model = self.model_spec(model_name)
        chunks = pp * p.virtual_stages
        # the run's split where it still fits, else one made for this depth, as the scaling and memory
        # explorers make theirs: the refusal had asked for a stage_layers this explorer has no control for
        kept = (p.stage_layers is not None and len(p.stage_layers) == chunks
                and sum(p.stage_layers) == model.layers)
        spec = p.replace(dp=dp, tp=tp, pp=pp, global_batch=0,
                         sequence_parallel=p.sequence_parallel and tp > 1,
                         stage_layers=p.stage_layers if kept else uneven_split(model.layers, chunks),
                         microbatches=(p.microbatches if pp == p.pp
                                       else max(p.microbatches, 2 * pp) if pp > 1 else 1))
        if p.hierarchical_dp:  # over the dp ranks a node holds now (tp and cp are inner)
            spec = spec.hierarchy_over(gpus_per_node // (tp * p.cp))
        problems = spec.problems(model)
        if problems:
            raise SpecError("; ".join(problems))
        return predicted_comm_trace(model, spec, gpus_per_node)


def _collective_figure(c):
    """Bytes each rank sends and predicted time of one ring collective against the group size; for an
    all-reduce, where NCCL's tree would beat that ring across nodes (:func:`_tree_note`)."""
    from paralab.viz._common import byte_scale, fmt_bytes, go, make_subplots, style
    from paralab.viz.collectives import size_label

    payload = c["size_mb"] * 2**20
    rows = collective_rows(c["op"], payload, c["max_group"], c["hardware"])
    groups = [r["group"] for r in rows]
    # the bytes in a unit that keeps them under 1024: plotly's own "20k" (MiB) read as twenty thousand
    scale, unit = byte_scale(max(r["wire_bytes"] for r in rows))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes each rank sends", "time"))
    # the bars' groups as text: a category axis whatever the browser makes of an update (a live
    # widget's had turned numeric, with a tick at 1.5)
    fig.add_trace(go().Bar(x=[str(g) for g in groups], y=[r["wire_bytes"] / scale for r in rows],
                           name="wire bytes per rank",
                           customdata=[fmt_bytes(r["wire_bytes"]) for r in rows],
                           hovertemplate="group %{x}: %{customdata}<extra></extra>"), 1, 1)
    # inside a node as far as a node reaches: a line held flat past it had read as 64 ranks in one node
    inside = [r for r in rows if r["intra_s"] is not None]
    fig.add_trace(go().Scatter(x=[r["group"] for r in inside], y=[r["intra_s"] * 1e3 for r in inside],
                               name=f"inside a node (up to {node_links(c['hardware'])[0].reach} GPUs)",
                               mode="lines+markers",
                               hovertemplate="inside a node, %{x} ranks: %{y:,.3f} ms<extra></extra>"), 1, 2)
    fig.add_trace(go().Scatter(x=groups, y=[r["inter_s"] * 1e3 for r in rows], name="one rank per node",
                               mode="lines+markers",
                               hovertemplate="one rank per node, %{x} ranks: %{y:,.3f} ms<extra></extra>"),
                  1, 2)
    fig.update_xaxes(type="category", title_text="group size", row=1, col=1)
    # ticks at the group sizes drawn only: a dtick alone put 0.25, 0.5 and 1 beside a lone group of 2
    fig.update_xaxes(type="log", tickvals=groups, ticktext=[str(g) for g in groups], title_text="group size",
                     row=1, col=2)
    fig.update_yaxes(title_text=unit, row=1, col=1)  # plotly's own "10B" would read as ten bytes
    fig.update_yaxes(title_text="ms", tickformat=",", row=1, col=2)
    fig = style(fig, f"ring {c['op']} of {size_label(payload)} on {c['hardware']}", 360)
    if c["op"] == "all_reduce":  # under the plots: inside the time panel it had covered a curve
        note = _tree_note(payload, groups, c["hardware"])
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0,
                           y=0, xanchor="left", yanchor="top", yshift=-50, align="left", showarrow=False,
                           font=dict(size=12, color="#555"))
        lines = 1 + note.count("<br>")
        fig.update_layout(margin_b=fig.layout.margin.b + 20 * lines, height=fig.layout.height + 20 * lines)
    return fig


def _tree_note(payload: float, groups: list[int], hw_name: str) -> str:
    """Where NCCL, which runs the faster of its ring and its tree, would leave the ring drawn here for
    the tree across nodes (:func:`paralab.widgets.collectives.tree_takes_over`)."""
    from paralab.widgets.collectives import tree_takes_over

    from_ranks = tree_takes_over(payload, groups, node_links(hw_name)[1])
    if from_ranks is None:
        return "across nodes this ring beats NCCL's tree at every group shown"
    # on two lines: on one, its end had run past a notebook's figure, cut off
    return (f"across nodes NCCL's tree beats this ring from {from_ranks} ranks on:<br>NCCL picks the faster "
            "(the collectives explorer draws both)")
