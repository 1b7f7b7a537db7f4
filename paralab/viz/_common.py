"""Shared helpers of the figure builders: lazy plotly import, colours, byte formatting, inputs.

plotly is imported inside :func:`go` so that ``import paralab.viz`` (and the headless core that may
import it for type names) works on a machine without plotly; only drawing needs it.
"""

from __future__ import annotations

import math

from paralab.layout import Layout, mesh_layout
from paralab.trace import Trace

WAITING = "waiting"  # the part of a communication call spent waiting for the last participant
WAITING_LABEL = "waiting for peers"  # its name in a timeline's legend
BLOCKED = "blocked"  # the part of a compute span in which its rank waited for a communication call
BLOCKED_LABEL = "compute blocked on comm"
WHITENING = 0.7  # the white drawn over a blocked stretch: how far its compute's colour fades to white

# One colour per span kind, so the same operation looks the same in every figure.
KIND_COLORS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "backward_input": "#E45756",
    "backward_weight": "#72B7B2",
    "optimizer": "#555555",  # dark grey: never mistaken for a microbatch colour
    "all_reduce": "#B279A2",
    "all_gather": "#9D755D",
    "reduce_scatter": "#FF9DA6",
    "broadcast": "#BAB0AC",
    "send": "#EECA3B",
    "recv": "#D4A6C8",
    "recompute": "#00D084",  # the forward again inside backward: an emerald far from every other kind
    "overflow": "#D62728",  # an fp16 step skipped by the loss scaler
    "failure": "#D62728",
    "failure_detected": "#843C39",  # a darker red: what the failure led to
    "rescale": "#1F77B4",
    # elastic training's events and ring attention's blocks: named, so that no two share the colour
    # EXTRA_COLORS's hash gave them (a checkpoint's load had read as a worker's start)
    "worker_start": "#7F7F7F",
    "rendezvous": "#637939",
    "checkpoint_save": "#393B79",
    "checkpoint_load": "#8C6D31",
    "slowdown": "#BCBD22",
    "attention": "#17BECF",
    # imported torch.profiler traces (paralab.trace_import)
    "other": "#C7C7C7",  # light grey: work that is none of the above (making the batch, bookkeeping)
    "memcpy": "#54A24B",
    "memset": "#A0D88F",
    "all_to_all": "#9B30FF",  # a vivid violet: the pinks beside it (all-reduce, receive) had read as one
    "barrier": "#79706E",
    # drawn over the first part of a collective or receive: waiting for its last participant; and over
    # a compute span where its rank sat in a call (last in this order, so each lies on top of its bar)
    WAITING: "rgba(255,255,255,0.6)",
    BLOCKED: f"rgba(255,255,255,{WHITENING})",  # whitens the compute it lies on, dotted
}
EXTRA_COLORS = ["#8C564B", "#17BECF", "#BCBD22", "#7F7F7F", "#393B79", "#637939", "#8C6D31", "#843C39"]
MEMORY_KINDS = ("params", "grads", "optimizer", "activations")
MEMORY_COLORS = {"params": "#4C78A8", "grads": "#F58518", "optimizer": "#54A24B", "activations": "#E45756"}
# one colour per compared series (sources, hardware, fits), in the order they are drawn
SERIES_COLORS = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2"]
# Qualitative shades for ranks, groups and modes (elastic's ranks, the mesh's groups, context parallel's
# runs and its ring and all-to-all): first blues, oranges, greens, reds and teals, none a communication
# kind's colour (yellow send, purple all-reduce, pinks, browns, greys), then EXTRA_COLORS; repeating
# past its end (rank_color). (A timeline's microbatches have shades of their own, below: these open
# with the forward's and the backward's.)
RANK_COLORS = [
    "#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#9ECAE9",
    "#FFBF79", "#88D27A", "#C0392B", "#2F6B68", "#1F3A68", "#B35806",
    *EXTRA_COLORS,
]  # fmt: skip
# Microbatch shades of the timelines' compute bars. Not RANK_COLORS (the ranks' colours elsewhere),
# which opens with the forward blue and the backward orange: a pipeline's F0, F1, B0, B1 had read as
# forward, backward, forward, backward to a reader of every other timeline. Each of these lies 20 or
# more CIE76 units from every kind's colour and every one of EXTRA_COLORS; neighbours differ most.
TIMELINE_MICROBATCH_COLORS = [
    "#6A3D9A", "#1B9E77", "#CF1C90", "#E7CB94", "#332288", "#B3DE69",
    "#882255", "#88CCEE", "#B15928", "#9C9EDE", "#008695", "#999933",
]  # fmt: skip


def rank_color(i: int) -> str:
    """Rank (group, run) ``i``'s colour of :data:`RANK_COLORS`, repeating past its end."""
    return RANK_COLORS[i % len(RANK_COLORS)]


def go():
    """plotly.graph_objects, imported on first use with a message that says how to get it."""
    try:
        import plotly.graph_objects as graph_objects
    except ImportError as exc:
        from paralab.outputs import PLOTLY_MISSING

        raise ImportError(PLOTLY_MISSING) from exc
    return graph_objects


def make_subplots(**kwargs):
    go()  # same friendly error
    from plotly.subplots import make_subplots as _make

    return _make(**kwargs)


def kind_color(kind: str) -> str:
    if kind in KIND_COLORS:
        return KIND_COLORS[kind]
    return EXTRA_COLORS[sum(map(ord, kind)) % len(EXTRA_COLORS)]


def fmt_bytes(n: float) -> str:
    """Human bytes with binary prefixes: 100608 -> '98.2 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def byte_scale(largest: float) -> tuple[int, str]:
    """(divisor, unit) that draws sizes up to ``largest`` bytes as numbers below 1024: an axis in
    KiB reads as the text beside it does, where plotly's own "100k" would mean 100,000."""
    for power, unit in enumerate(("B", "KiB", "MiB", "GiB")):
        if largest < 1024 ** (power + 1) or unit == "GiB":
            return 1024**power, unit
    return 1, "B"  # pragma: no cover


def as_trace(obj) -> Trace:
    """Accept a Trace or anything carrying one (RunResult)."""
    if isinstance(obj, Trace):
        return obj
    trace = getattr(obj, "trace", None)
    if isinstance(trace, Trace):
        return trace
    raise TypeError(f"expected a paralab Trace or RunResult, got {type(obj).__name__}")


def as_summary(obj) -> dict:
    """The summary dict of a RunResult, a Prediction (to_dict) or a plain dict."""
    if isinstance(obj, dict):
        return obj
    summary = getattr(obj, "summary", None)
    if isinstance(summary, dict):
        return summary
    if hasattr(obj, "to_dict"):
        out = obj.to_dict()
        parallel = getattr(obj, "parallel", None)
        if parallel is not None and "world_size" not in out:
            out["world_size"] = parallel.world_size
        return out
    if isinstance(obj, Trace):
        return dict(obj.summary(), world_size=obj.meta.get("world_size", len(obj.ranks)))
    raise TypeError(f"expected a RunResult, Prediction or summary dict, got {type(obj).__name__}")


def hardware_said(meta: dict) -> str:
    """" on h100" for a prediction that names its hardware ("this machine, calibrated" for the local
    calibration), "" where it names none: what a page says the simulated half of a figure assumes."""
    name = meta.get("hardware")
    if not isinstance(name, str) or not name:
        return ""
    return " on this machine, calibrated" if name == "local" else f" on {name}"


def recorded_nodes(meta: dict, world: int) -> dict[int, int] | None:
    """rank -> node as a measured run recorded them (``meta["ranks"]``, every rank with its node);
    None where the trace does not record them all (a prediction, a trace of another tool)."""
    recorded = meta.get("ranks") or {}
    if len(recorded) == world and all("node" in v for v in recorded.values()):
        return {int(r): int(v["node"]) for r, v in recorded.items()}
    return None


def layout_of(obj) -> Layout:
    """A Layout from a Layout, a RunResult, a Trace or a trace's meta dict that holds one (measured
    runs) or records dp, tp and pp (simulated runs; cp and ep too where they have them), or a mesh
    dict (``{"shape": [pp, dp, cp, tp]}``, or ``[pp, dp, tp]`` as traces made before the cp axis have
    it)."""
    if isinstance(obj, Layout):
        return obj
    if isinstance(getattr(obj, "layout", None), Layout):
        return obj.layout
    if isinstance(obj, dict) and "shape" in obj:
        pp, dp, *cp, tp = obj["shape"]
        return mesh_layout(dp=dp, tp=tp, pp=pp, cp=cp[0] if cp else 1)
    meta = obj if isinstance(obj, dict) else getattr(getattr(obj, "trace", obj), "meta", None)
    if isinstance(meta, dict) and "layout" in meta:
        return Layout.from_dict(meta["layout"])
    if isinstance(meta, dict) and all(k in meta for k in ("dp", "tp", "pp")):
        degrees = {axis: max(int(meta.get(axis) or 1), 1) for axis in ("dp", "tp", "pp", "cp", "ep")}
        return mesh_layout(**degrees)
    if isinstance(meta, dict):
        raise TypeError("this trace carries no layout (an imported profile has none): give a Layout, a "
                        "RunResult or a mesh dict ({'shape': [pp, dp, cp, tp]})")
    raise TypeError(f"expected a Layout, a RunResult or Trace, or a mesh dict, got {type(obj).__name__}")


# ------------------------------------------------------------------ lines that coincide
# Lines closer than this fraction of the plot's height everywhere cannot be told apart by eye.
OVERLAP = 0.005
NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def overlapping(runs: dict[str, list[float]], xs: dict[str, list] | None = None) -> list[dict]:
    """Groups of curves that coincide on the plot: ``lines`` (labels, at least two) and
    ``max_rel_diff`` (the largest relative difference between any two of them at any point). Curves
    are compared point by point: with ``xs`` (label -> x values) only curves drawn at the same x."""
    values = [v for losses in runs.values() for v in losses]
    span = (max(values) - min(values)) if values else 0.0
    groups: list[list[str]] = []
    for label, losses in runs.items():
        for group in groups:
            first = runs[group[0]]
            same_x = xs is None or xs[group[0]] == xs[label]
            if same_x and len(first) == len(losses) and all(abs(a - b) <= OVERLAP * span
                                                            for a, b in zip(first, losses)):
                group.append(label)
                break
        else:
            groups.append([label])
    out = []
    for group in groups:
        if len(group) > 1:
            rel = max(abs(a - b) / max(abs(b), 1e-30) for x in group for y in group
                      for a, b in zip(runs[x], runs[y]))
            out.append({"lines": group, "max_rel_diff": rel})
    return out


def note_overlaps(fig, groups: list[dict], total: int, also: tuple[str, ...] = ()) -> None:
    """Say on the figure which lines overlap (see :func:`overlap_note`), and the notes ``also`` gives
    under it; nothing when there is neither."""
    note = "; ".join(n for n in (overlap_note(groups, total), *also) if n)
    if note:  # top right, inside the plot: where falling curves leave room
        fig.add_annotation(text=note.replace("; ", "<br>"), xref="paper", yref="paper", x=1, y=1,
                           xanchor="right", yanchor="top", align="right", showarrow=False,
                           font=dict(size=12, color="#333"),
                           bgcolor="rgba(247,247,247,0.9)")


def overlap_note(groups: list[dict], total: int) -> str:
    """'all four lines overlap: max relative difference 3e-08', or which ones do."""
    notes = []
    for g in groups:
        n = len(g["lines"])
        if n == total:
            who = "both lines" if n == 2 else f"all {NUMBERS[n] if n < len(NUMBERS) else n} lines"
        else:
            who = ", ".join(g["lines"][:-1]) + " and " + g["lines"][-1]
        notes.append(f"{who} overlap: max relative difference {g['max_rel_diff']:.0e}")
    return "; ".join(notes)


TOOLBAR_PX = 36  # the right margin, which holds plotly's toolbar standing down it


def style(fig, title: str | None = None, height: int | None = None):
    """The house look: white background; title, then legend, then (subplot titles and) the plot.

    Title and legend are pinned in pixels from the top of the figure (container coordinates), so
    they never sit on subplot titles whatever the height. plotly's toolbar (shown while the pointer is
    over a figure) stands down the right margin: across the top it had covered the end of long titles,
    the explorers' "not redrawn" marks among them.
    """
    height = height or fig.layout.height or 450
    fig.update_layout(
        template="plotly_white",
        height=height,
        title=dict(text=title, y=1 - 8 / height, yref="container", yanchor="top", x=0.01, xanchor="left"),
        margin=dict(l=60, r=TOOLBAR_PX, t=95, b=45),
        legend=dict(orientation="h", yref="container", y=1 - 38 / height, yanchor="top", x=0),
        modebar=dict(orientation="v"),
    )
    return fig


def powers_of_ten(low: float, high: float) -> list[float]:
    """The powers of ten from the one at or below ``low`` to the one at or above ``high``: a log axis's
    ticks where 1, 2 and 5 between them (:func:`log_ticks`) would crowd."""
    return [10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]


def log_ticks(low: float, high: float) -> list[float]:
    """1, 2, 5 times the powers of ten from the one at or below ``low`` to the one at or above ``high``
    (so two ticks at least bracket what is drawn): a log axis read in whole numbers rather than
    plotly's bare 2, 3, 4 between the decades, or nothing at all on one narrower than a decade."""
    steps = [m * 10.0**e for e in range(math.floor(math.log10(low)), math.floor(math.log10(high)) + 2)
             for m in (1, 2, 5)]
    first, last = max(t for t in steps if t <= low), min(t for t in steps if t >= high)
    return [t for t in steps if first <= t <= last]


def uncrowded_log_ticks(low: float, high: float, decades: int) -> list[float]:
    """:func:`log_ticks` over an axis spanning at most ``decades`` decades, beyond which 1, 2 and 5 crowd
    an axis of its length ("2,000" touched "1,000"): there :func:`powers_of_ten` alone."""
    return powers_of_ten(low, high) if high > 10.0**decades * low else log_ticks(low, high)
