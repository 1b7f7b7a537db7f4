"""The timeline: what every rank did, when, on its compute and communication lanes.

Each span is one horizontal bar (``go.Bar`` with ``base`` = start and ``x`` = duration,
``orientation='h'``). One plotly trace per span kind keeps the legend meaningful and the figure
fast: a 64-rank pipeline has tens of thousands of spans but only a handful of traces, and the
browser draws bars far faster than it draws thousands of shapes. Gaps between bars are idle time.

Each collective and receive is split where its last participant entered (Trace.comm_arrivals): the
part before is drawn over the call, whitened and hatched ("waiting"), the part after is the transfer.
Where a rank sat inside a communication call during one of its compute spans (Span.in_call: a
tensor-parallel layer's all-reduce, a prefetched gather waited for late), the compute bar is whitened
and dotted over that stretch ("blocked"): the span covers the pass, but the rank computed nothing there.

Calls a rank has in flight together (prefetched gathers, small buckets' all-reduces) share its comm
row one above the other, each thinner, with a gap between (:func:`call_slots`): drawn over one
another they had read as one call. A rank with more than :data:`SUBROWS_PER_ROW` in flight gets
unlabelled filler rows under its comm row, so each call keeps a sixth of a row or more (a fifth past
four): 22 small buckets' all-reduces had been hairlines.
The labels of microbatch bars that a blocked stretch whitens are written by a trace of their own drawn
last (:data:`LABELS`), in ink chosen against the fill under them, whitened or not (:func:`lift_labels`).

Rows are ``r{rank} {lane}`` and sorted rank-major, so a rank's compute and comm lanes sit together
and rank 0 is on top. Times are shown in milliseconds from the start of the shown spans, so a
measured step and a simulated one line up when stacked (``predicted=``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache

from paralab.schedules import PASS_LETTERS, pass_label
from paralab.stage_split import split_text
from paralab.text import count_text
from paralab.trace import (
    COMM,
    COMPUTE,
    EVENT,
    Span,
    Trace,
    past_warm_up,
    pipelined,
    rows_in_flight,
    typical_step_time,
)
from paralab.viz._common import (
    BLOCKED,
    BLOCKED_LABEL,
    KIND_COLORS,
    TIMELINE_MICROBATCH_COLORS,
    WAITING,
    WAITING_LABEL,
    WHITENING,
    as_trace,
    fmt_bytes,
    go,
    hardware_said,
    kind_color,
    make_subplots,
    style,
)

DEFAULT_LANES = (COMPUTE, COMM, EVENT)
BAR_WIDTH = 0.8  # of a row
# an instant on the event lane (a failure, its detection) drawn this share of the time axis wide: at its
# true width of 0 it had had a legend entry and no bar
INSTANT_SHARE = 0.004
TEXT_LIMIT = 2000  # above this many bars, labels on bars cost more than they tell
OUTLINE_LIMIT = 400  # above this many bars, a bar's white edge would whiten the narrow ones
SUBROWS_PER_ROW = 4  # calls in flight one row holds before filler rows are added under it
SUBROW_GAP = 0.15  # of a sub-row, left empty between calls in flight together
FILLER = " …"  # a filler row's label: its comm row's, then this and a number; drawn without a tick label
LABELS = "labels"  # the trace that writes the microbatch bars' labels, over every bar and whitening
PASS_WORDS = {"forward": "forward", "backward": "backward", "backward_input": "input-gradient backward",
              "backward_weight": "weight-gradient backward"}  # what a bar's pass label stands for
# each backward pass's hatch: plotly's shape, and the key's words for it in glyphs drawn as the hatch is
# (a split backward's Bi and W had been left out of a key that said only "backwards hatched")
_HATCHES = {"backward": ("/", f"╱ {PASS_WORDS['backward']}"),
            "backward_input": ("\\", f"╲ {PASS_WORDS['backward_input']} (Bi)"),
            "backward_weight": ("x", f"╳ {PASS_WORDS['backward_weight']} (W)")}
HOVER = "%{hovertext}<extra></extra>"
LEGEND_NAMES = {WAITING: WAITING_LABEL, BLOCKED: BLOCKED_LABEL}
MEDIAN_NOTE = " ({:.1f} ms, the step nearest the {:.1f} ms median)"
# one line each: one line had run past a 930-pixel notebook cell's edge
MICROBATCH_KEY = "time (ms); compute bars coloured by microbatch{hatching}<br>{example}"


def row_label(rank: int, lane: str) -> str:
    return f"r{rank} {lane}"


def select_spans(trace: Trace, lanes=DEFAULT_LANES, steps=None) -> list[Span]:
    """The spans a timeline draws: chosen lanes, and (if ``steps`` is given) chosen steps only."""
    if isinstance(steps, str):  # set("last") would have drawn nothing, in silence
        raise ValueError(f"steps are step numbers (timeline's steps also takes 'median'), got {steps!r}")
    wanted = set(steps) if steps is not None else None
    return [s for s in trace.spans if s.lane in lanes and (wanted is None or s.step in wanted)]


def kind_order(kinds) -> list[str]:
    """Known kinds in a fixed order (stable legends and widget traces), then the rest sorted."""
    known = [k for k in KIND_COLORS if k in kinds]
    return known + sorted(k for k in kinds if k not in KIND_COLORS)


def bars_by_kind(spans: list[Span], color_by: str = "kind", suffix: str = "", t0: float | None = None,
                 text: bool = False, waits: dict[int, float] | None = None,
                 slots: dict[int, tuple[int, int]] | None = None) -> dict[str, dict]:
    """kind -> columns of one bar trace as numpy arrays (y, base, x, hovertext, color, text, width,
    offset); ms.

    Split out of :func:`timeline` so widgets can push new columns into an existing FigureWidget
    instead of building a new figure. The column shapes are chosen for speed: plotly validates
    Python lists element by element but takes numpy arrays whole, numeric arrays travel to the
    browser as binary buffers, and one hover string per bar serialises several times faster than a
    per-bar customdata row. ``color`` is a colour string for the whole kind, or one microbatch colour
    per bar (:data:`TIMELINE_MICROBATCH_COLORS`) when compute spans are coloured by microbatch: given as
    numbers on a colour scale, plotly.js logged "Invalid color specifier" for every bar. ``waits`` (id
    of a span -> seconds it waited for its last participant, see :func:`waiting_spans`) goes into the
    hover; ``slots`` (id of a span -> its sub-row and the sub-rows of its row, see :func:`call_slots`)
    sets the bars' width and offset, spread over the filler rows under a busy row (:func:`rows_held`).
    """
    import numpy as np

    def placed(s: Span) -> tuple[float, float]:
        slot, count = (slots or {}).get(id(s), (0, 1))
        height = (rows_held(count) - 1 + BAR_WIDTH) / count
        if count == 1:
            return height, -BAR_WIDTH / 2
        # a gap between sub-rows, where their calls have no white edge: two calls that start and end
        # together had read as one bar twice as thick
        return height * (1 - SUBROW_GAP), slot * height - BAR_WIDTH / 2 + height * SUBROW_GAP / 2

    if t0 is None:
        t0 = min((s.start for s in spans), default=0.0)
    instant_ms = INSTANT_SHARE * (max((s.end for s in spans), default=t0) - t0) * 1e3
    groups: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        groups[s.kind].append(s)
    out = {}
    for kind in kind_order(groups):
        group = groups[kind]
        by_microbatch = (color_by == "microbatch"
                         and all(s.lane == COMPUTE and s.microbatch is not None for s in group))
        rows = [row_label(s.rank, s.lane) + suffix for s in group]
        out[kind] = {
            "y": np.array(rows),
            "base": np.array([(s.start - t0) * 1e3 for s in group]),
            "x": np.array([max((s.end - s.start) * 1e3, instant_ms if s.lane == EVENT else 0.0)
                           for s in group]),  # the hover says the span's own time
            "hovertext": np.array([_hover(s, row, t0, (waits or {}).get(id(s)), (slots or {}).get(id(s)))
                                   for s, row in zip(group, rows)]),
            "color": (np.array([microbatch_color(s.microbatch) for s in group]) if by_microbatch
                      else kind_color(kind)),
            "text": np.array([_bar_text(s) for s in group]) if text else None,
        }
        out[kind]["width"], out[kind]["offset"] = np.array([placed(s) for s in group]).T
    return out


def microbatch_color(microbatch: int) -> str:
    return TIMELINE_MICROBATCH_COLORS[microbatch % len(TIMELINE_MICROBATCH_COLORS)]


def rows_held(calls: int) -> int:
    """Rows a comm row with ``calls`` sub-rows takes: itself and the filler rows under it."""
    return math.ceil(calls / SUBROWS_PER_ROW)


def call_slots(spans: list[Span], waits: dict[int, Span] | None = None) -> dict[int, tuple[int, int]]:
    """id(span) -> (sub-row, sub-rows) for the communication calls among ``spans`` (a trace's own,
    without the waits drawn over them) that a rank had in flight together: each run of overlapping
    calls is laid out on as few sub-rows of the comm row as keep them apart, a call on the first free
    one. A call alone has the whole row, (0, 1). A call's drawn wait (``waits``: id(call) -> its
    :func:`waiting_spans` span) shares its sub-row."""
    calls = [s for s in spans if s.lane == COMM]
    slot = rows_in_flight(calls)  # a run's first call, with nothing in flight, on row 0
    by_rank: dict[int, list[Span]] = defaultdict(list)
    for s in calls:
        by_rank[s.rank].append(s)
    out: dict[int, tuple[int, int]] = {}

    def lay_out(run: list[Span]) -> None:
        rows = 1 + max((slot[id(call)] for call in run), default=0)
        out.update({id(call): (slot[id(call)], rows) for call in run})

    for mine in by_rank.values():
        run, reach = [], -math.inf
        for call in sorted(mine, key=lambda c: (c.start, c.end)):
            if call.start >= reach:  # nothing in flight: a new run
                lay_out(run)
                run, reach = [], call.end
            run.append(call)
            reach = max(reach, call.end)
        lay_out(run)
    out.update({id(wait): out[call] for call, wait in (waits or {}).items() if call in out})
    return out


def _hover(s: Span, row: str, t0: float, wait: float | None = None,
           slot: tuple[int, int] | None = None) -> str:
    """Hover text of one bar: name, kind and row, start and duration (ms), a call's bytes (human and exact),
    for a split call its wait and transfer, and for a call in flight beside others its sub-row
    (``slot``: sub-row, sub-rows; :func:`call_slots`)."""
    if s.kind == WAITING:  # a receive waits for its send; a collective for its last participant
        whom = ("its send had not been posted yet" if s.peer is not None
                else "the others had not all entered yet")
        return (f"<b>{s.name}</b><br>on {row}, from {(s.start - t0) * 1e3:.3f} ms for "
                f"{(s.end - s.start) * 1e3:.3f} ms: {whom}")
    if s.kind == BLOCKED:
        return (f"<b>{s.name}</b><br>on {row}, from {(s.start - t0) * 1e3:.3f} ms for "
                f"{(s.end - s.start) * 1e3:.3f} ms: computing nothing until the call returned")
    out = (f"<b>{s.name or s.kind}</b><br>{s.kind} on {row}<br>start {(s.start - t0) * 1e3:.3f} ms, "
           f"duration {(s.end - s.start) * 1e3:.3f} ms")
    if s.kind == "recv":  # its wire bytes are its send's: "bytes 0 B" had read as if nothing came
        out += "<br>wire bytes counted on its send"
    elif s.bytes or (s.lane == COMM and s.peer is None):  # a pass moves none, nor a p2p drawn without sizes
        out += f"<br>wire bytes {_bytes_label(s.bytes)}"
    if wait is not None:
        whom = "its send" if s.peer is not None else "the last participant"
        out += (f"<br>waited {wait * 1e3:.3f} ms for {whom}, then moved data for "
                f"{(s.end - s.start - wait) * 1e3:.3f} ms")
    if s.microbatch is not None:
        out += f"<br>microbatch {s.microbatch}" + (f", stage {s.stage}" if s.stage is not None else "")
    if s.peer is not None:
        out += f"<br>peer r{s.peer}"
    if s.group_size:
        out += f"<br>group of {s.group_size}"
    if s.payload_bytes and s.payload_bytes != s.bytes:
        out += f"<br>payload (the tensors' bytes) {_bytes_label(s.payload_bytes)}"
    if s.inter_node:
        out += "<br>crosses nodes"
    if slot and slot[1] > 1:  # however thin its bar, what it shares the row with
        out += f"<br>sub-row {slot[0] + 1} of {slot[1]}: up to {slot[1]} calls in flight at once here"
    return out


@lru_cache(maxsize=4096)
def _bytes_label(n: int) -> str:
    """"32.0 KiB (32,768 B)"; "16 B", not "16 B (16 B)"."""
    short = fmt_bytes(n)
    return short if short == f"{n} B" else f"{short} ({n:,} B)"


def marker_of(kind: str, color, edge=0) -> dict:
    """Bar marker: one colour, or one microbatch colour per bar (+ hatching); ``edge``: the width of a
    white edge (one per bar, or one for all), so that calls back to back (a ring's hops) read as several
    bars, not one long transfer."""
    if kind in (WAITING, BLOCKED):  # whitens and hatches (dots) the call (the compute) it lies on
        return dict(color=color, line=dict(width=0),
                    pattern=dict(shape="/" if kind == WAITING else ".", fgcolor="#444", size=6, solidity=0.2))
    marker = dict(color=color, line=dict(width=edge, color="white"))
    if kind in _HATCHES and not isinstance(color, str):
        # plotly.js draws an "overlay" hatch on a bar of its own colour in that colour's contrast, whatever
        # the pattern's colours say; but left unset, the background defaults to the colour array, whose
        # contrast() logged "Invalid color specifier" in the browser console 6 times a trace: a single
        # colour here is never drawn and keeps the array out of it
        marker["pattern"] = dict(shape=_HATCHES[kind][0], fillmode="overlay", bgcolor="white")
    return marker


@lru_cache(maxsize=256)  # a few fills, asked once a bar
def ink(fill: str, whitened: bool = False) -> str:
    """The colour of a label on a ``fill`` (#rrggbb): dark on a light fill, white on a dark one (white
    had been all but lost on the light microbatch colours). ``whitened``: the fill lies under the
    white of a blocked stretch (:data:`KIND_COLORS` [BLOCKED]), where a white label had vanished."""
    red, green, blue = (int(fill[i:i + 2], 16) / 255 for i in (1, 3, 5))
    luma = 0.299 * red + 0.587 * green + 0.114 * blue
    if whitened:
        luma += (1 - luma) * WHITENING
    return "#222" if luma > 0.6 else "white"


def lift_labels(by_kind: dict[str, dict], opacity: float = 1.0) -> dict | None:
    """A text-only bar trace, drawn last, of the labels of ``by_kind``'s bars (:func:`bars_by_kind`)
    that its blocked stretches (its BLOCKED bars) whiten, each inked against the fill under most of the
    bar, whitened or not; those labels are taken off their own bars, under the white of which they had
    faded to nothing. None where no labelled bar is blocked (the labels then stay on their bars)."""
    import numpy as np

    from paralab.trace import Covered

    blocked = by_kind.get(BLOCKED)
    if blocked is None:
        return None
    stretches = defaultdict(list)  # row -> (start, end) of its blocked stretches, ms
    for row, start, length in zip(blocked["y"], blocked["base"], blocked["x"]):
        stretches[row].append((start, start + length))
    whitened = {row: Covered(pairs) for row, pairs in stretches.items()}
    lifted: dict[str, list] = defaultdict(list)
    for c in by_kind.values():
        if c["text"] is None or isinstance(c["color"], str):
            continue
        for i, (row, start, length) in enumerate(zip(c["y"], c["base"], c["x"])):
            washed = whitened[row].covered(start, start + length) if row in whitened else 0.0
            if washed > 0 and c["text"][i]:
                for key in ("y", "base", "x", "width", "offset", "text"):
                    lifted[key].append(c[key][i])
                # whitened where most of the bar is: a tensor-parallel forward's many short stretches had
                # left its middle in a gap between two, and its label white on a bar mostly washed out
                lifted["ink"].append(ink(c["color"][i], washed >= length / 2))
                c["text"][i] = ""
    if not lifted:
        return None
    inks = lifted.pop("ink")
    return dict(type="bar", name=LABELS, orientation="h",
                marker=dict(color="rgba(0,0,0,0)", line=dict(width=0)),
                textposition="inside", insidetextanchor="middle", insidetextfont=dict(color=inks),
                textangle=0,  # a label that does not fit a bar is hidden (uniformtext), never turned on end
                hoverinfo="skip", showlegend=False, opacity=opacity, legendgroup=LABELS,
                **{key: np.array(values) for key, values in lifted.items()})


def _bar_text(s: Span) -> str:
    """A microbatch's bar says which pass of which microbatch it is, as the schedule names it ("F3
    s1": microbatch 3's forward on stage 1); a measured span named only by its kind had read "forward",
    cut to "orwar" inside a narrow bar, and did not match its predicted twin."""
    if s.lane != COMPUTE or s.microbatch is None:
        return ""
    if (s.name and s.name != s.kind) or s.kind not in PASS_LETTERS:  # a recompute keeps its name
        return s.name or s.kind
    return pass_label(PASS_LETTERS[s.kind], s.microbatch, s.stage)


def rows_of(trace: Trace, spans: list[Span], suffix: str = "", slots: dict[int, tuple[int, int]] | None = None
            ) -> list[str]:
    """Row labels rank-major (every rank of the trace appears, even one with nothing to show); under a
    comm row whose calls take more sub-rows (``slots``, :func:`call_slots`) than one row holds, the
    filler rows they spread over (:func:`rows_held`)."""
    lanes_present = [lane for lane in (COMPUTE, COMM, EVENT) if any(s.lane == lane for s in spans)]
    lanes_present += sorted({s.lane for s in spans} - set(lanes_present))
    held: dict[int, int] = defaultdict(lambda: 1)  # rank -> rows its comm row takes
    for s in spans:
        if id(s) in (slots or {}):
            held[s.rank] = max(held[s.rank], rows_held(slots[id(s)][1]))
    return [row_label(r, lane) + suffix + (f"{FILLER}{k}" if k else "") for r in trace.ranks
            for lane in (lanes_present or [COMPUTE]) for k in range(held[r] if lane == COMM else 1)]


def resolve_color_by(spans: list[Span], color_by: str, meta: dict | None = None) -> str:
    """"auto": by microbatch where the compute spans say theirs, unless ``meta`` says the run had no
    pipeline (a hybrid run at pp 1 tags its one microbatch: its bars had all read "F0 s0" in one
    colour, and the forward and backward legend had gone)."""
    if color_by == "auto":
        one_stage = bool(meta) and ("pp" in meta or "stages" in meta) and not pipelined(meta)
        tagged = any(s.microbatch is not None and s.lane == COMPUTE for s in spans)
        return "microbatch" if tagged and not one_stage else "kind"
    if color_by not in ("kind", "microbatch"):
        raise ValueError(f"color_by must be 'auto', 'kind' or 'microbatch', got {color_by!r}")
    return color_by


def waiting_spans(trace: Trace, spans: list[Span]) -> tuple[dict[int, Span], dict[int, float]]:
    """For the communication spans among ``spans`` that waited for a last participant: id(span) -> a
    ``waiting`` span over its wait, and id(span) -> its wait in seconds (for the hover)."""
    shown = {id(s) for s in spans if s.lane == COMM}
    if not shown:
        return {}, {}
    waits = {id(a.span): a.wait_s for a in trace.comm_arrivals()
             if id(a.span) in shown and a.last_entry is not None}
    over = {id(s): Span(s.rank, s.lane, WAITING, s.start, s.start + waits[id(s)],
                        name=f"{s.name or s.kind}: waiting", step=s.step, peer=s.peer)
            for s in spans if waits.get(id(s), 0) > 0}
    return over, waits


def blocked_spans(trace: Trace, spans: list[Span]) -> list[Span]:
    """One ``blocked`` span over each stretch of a drawn compute span in which its rank was inside a
    communication call (:meth:`Trace.blocked`): a tensor-parallel forward stopped at its all-reduce."""
    drawn = Trace(spans=[s for s in spans if s.lane == COMPUTE] + trace.select(lane=COMM))
    return [Span(call.rank, COMPUTE, BLOCKED, lo, hi, name=f"{call.name or call.kind}: blocked",
                 step=call.step) for call, lo, hi in drawn.blocked()]


def bar_traces(trace: Trace, *, lanes=DEFAULT_LANES, steps=None, color_by: str = "auto", text="auto",
               suffix: str = "", opacity: float = 1.0, legend: bool = True, waits: bool = True
               ) -> tuple[list[dict], list[str]]:
    """(bar traces as plotly dicts, row labels) for one Trace; the building block of :func:`timeline`.
    ``waits=False`` leaves out the hatched waits for peers and the dotted compute blocked on a call (a
    third more bars on a long pipeline)."""
    spans = select_spans(trace, lanes, steps)
    mode = resolve_color_by(spans, color_by, trace.meta)
    show_text = (len(spans) <= TEXT_LIMIT) if text == "auto" else bool(text)
    over, wait_of = waiting_spans(trace, spans) if waits else ({}, {})
    extra = list(over.values()) + (blocked_spans(trace, spans) if waits else [])
    # calls of one kind back to back on a comm row are told apart by a white edge, where the bars are
    # few enough to be wider than it
    outlined = {s.kind for s in spans if s.lane == COMM} if len(spans) <= OUTLINE_LIMIT else set()
    slots = call_slots(spans, over)
    t0 = min((s.start for s in spans), default=0.0)
    by_kind = bars_by_kind(spans + extra, mode, suffix, t0=t0, text=show_text and mode == "microbatch",
                           waits=wait_of, slots=slots)
    labels = lift_labels(by_kind, opacity)
    out = []
    for kind, c in by_kind.items():
        # a call with a row to itself keeps its edge; one of many in flight loses it: 1 white pixel a
        # side had washed out the thin bars of 22 all-reduces at once
        edge = (c["width"] >= BAR_WIDTH).astype(int) if kind in outlined else 0
        out.append(dict(
            type="bar", name=LEGEND_NAMES.get(kind, kind), y=c["y"], x=c["x"],
            base=c["base"], orientation="h", hovertext=c["hovertext"],
            marker=marker_of(kind, c["color"], edge), opacity=opacity,
            hovertemplate=HOVER, text=c["text"], textposition="inside", insidetextanchor="middle",
            textangle=0,  # a label that does not fit a bar is hidden (uniformtext), never turned on end
            # only bars coloured by microbatch carry labels
            insidetextfont=dict(color=None if isinstance(c["color"], str) else [ink(f) for f in c["color"]]),
            # bars coloured by microbatch stay out of the legend: plotly's swatch for them is one
            # microbatch's colour (a beige "forward" that matched no bar); the x axis's title says
            # what their colours and hatching mean
            legendgroup=kind, showlegend=legend and isinstance(c["color"], str),
            width=c["width"], offset=c["offset"],
        ))
    return out + ([labels] if labels else []), rows_of(trace, spans, suffix, slots)


def steps_beside(predicted: Trace, steps: list[int]) -> list[int]:
    """The predicted steps to draw beside measured ``steps``: the same ones where the prediction has
    them, else as many as ``steps`` from its first (a prediction's steps are alike)."""
    have = sorted({span.step for span in predicted.spans if span.step is not None})
    return [s for s in steps if s in have] or have[:len(steps)] or None


def timeline(trace, predicted=None, *, lanes=DEFAULT_LANES, steps=None, predicted_steps=None,
             color_by: str = "auto", text="auto", layout: str = "stacked", title: str | None = None,
             height: int | None = None, waits: bool = True):
    """Timeline figure of a Trace (or RunResult), optionally with a predicted Trace beside it.

    ``layout="stacked"``: measured on top, predicted below, two subplots sharing the time axis.
    ``layout="overlay"``: one axis; each rank's predicted rows (suffix " pred", faded) sit right under
    its measured rows. ``steps`` restricts the measured spans to those steps (``predicted_steps`` the
    predicted ones; by default the same steps, where the prediction has them, as
    ``paralab.sim.bridge.predict_run_trace`` numbers its steps as the run's, else as many from its
    first: one measured step had been drawn over every predicted one, reading three times as slow),
    e.g. ``steps=[2]`` to compare one warm step with a simulated step;
    ``steps="median"`` draws the step whose time is nearest the run's median (:func:`median_step`),
    and its default title says so.
    ``color_by``: "kind", "microbatch" (pipeline runs; kinds then differ by hatching), or "auto".
    ``waits``: hatch each call's wait for its last participant, and dot the compute a call blocked
    (see the module docstring).
    ``fig.layout.meta`` records ``ranks`` and ``rows`` (and ``predicted_rows``) for callers and tests.
    """
    graph = go()
    trace = as_trace(trace)
    typical = steps == "median"
    if typical:
        steps = [median_step(trace)]
    kwargs = dict(lanes=lanes, color_by=color_by, text=text, waits=waits)
    bars, rows = bar_traces(trace, steps=steps, **kwargs)
    meta = {"ranks": len(trace.ranks), "rows": rows, "source": trace.meta.get("source", "")}
    if predicted is None:
        fig = graph.Figure(bars)
        rows_axis(fig, rows, "yaxis")
        fig.update_xaxes(title_text="time (ms)")
    else:
        predicted = as_trace(predicted)
        if predicted_steps is None and steps is not None:
            predicted_steps = steps_beside(predicted, steps)
        if layout == "overlay":
            pbars, prows = bar_traces(predicted, steps=predicted_steps, suffix=" pred",
                                      opacity=0.55, **kwargs)
            _legend_once(bars, pbars)
            fig = graph.Figure(bars + pbars)
            rows_axis(fig, _interleave(rows, prows), "yaxis")
            fig.update_xaxes(title_text="time (ms)")
        elif layout == "stacked":
            pbars, prows = bar_traces(predicted, steps=predicted_steps, **kwargs)
            _legend_once(bars, pbars)
            fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                                row_heights=[max(len(rows), 1), max(len(prows), 1)],
                                subplot_titles=("measured", "predicted"))
            fig.add_traces(bars + pbars, rows=[1] * len(bars) + [2] * len(pbars),
                           cols=[1] * (len(bars) + len(pbars)))
            rows_axis(fig, rows, "yaxis")
            rows_axis(fig, prows, "yaxis2")
            fig.update_xaxes(title_text="time (ms)", row=2, col=1)
        else:
            raise ValueError(f"layout must be 'stacked' or 'overlay', got {layout!r}")
        meta["predicted_rows"] = prows
        meta["predicted_ranks"] = len(predicted.ranks)
    fig.update_layout(barmode="overlay", bargap=0.15, meta=meta, uniformtext=dict(minsize=7, mode="hide"))
    if any(not isinstance(bar.marker.color, str) for bar in fig.data):  # the legend's swatches cannot say it
        key = microbatch_key(select_spans(trace, lanes, steps))
        fig.for_each_xaxis(lambda axis: axis.update(title_text=key) if axis.title.text else None)
    n_rows = len(rows) + len(meta.get("predicted_rows", []))
    if typical:  # the steps' times walked once more, not twice (a trace may hold a million spans)
        times = trace.step_times_by_step()
        note = MEDIAN_NOTE.format(times[steps[0]] * 1e3, typical_step_time(times) * 1e3)
    title = title or _default_title(trace, steps, predicted) + (note if typical else "")
    return style(fig, title, height or min(200 + 22 * n_rows, 1600))


def median_step(trace: Trace) -> int:
    """The step, of the trace's typical ones (past warm-up), whose time is nearest the median step
    time: the step a timeline shows as typical. The last step need not be: one noisy send had
    stretched notebook 02's last step to 103 ms against a 58 ms median."""
    times = trace.step_times_by_step()
    if not times:
        raise ValueError("steps='median' needs a trace with step spans (a measured or simulated run's)")
    median = typical_step_time(times)  # of the times just read: Trace.median_step_time would walk them again
    return min(past_warm_up(list(times)), key=lambda step: abs(times[step] - median))


def microbatch_key(spans: list[Span]) -> str:
    """The time axis's title where bars are coloured by microbatch (:data:`MICROBATCH_KEY`), with how to
    read a bar's label told on one of ``spans``, the bars drawn (a key about microbatch 3 on stage 1 had
    stood under runs of two microbatches on one stage): :func:`_label_example`. Where a backward is split
    (Bi and W), a line says what each of the three hatches means."""
    passes = {s.kind for s in spans if s.microbatch is not None}
    hatching = (f"<br>hatched: {', '.join(said for k, (_, said) in _HATCHES.items() if k in passes)}"
                if passes & {"backward_input", "backward_weight"} else ", backwards hatched")
    return MICROBATCH_KEY.format(hatching=hatching, example=_label_example(spans))


def _label_example(spans: list[Span]) -> str:
    """A bar's label read out, on the widest pass bar drawn (the latest of equals): plotly hides a label
    its bar cannot hold, and the key had read out a forward's label under bars where only the
    backwards, twice as wide, showed theirs, so that it read as a stray line."""
    bars = [s for s in spans if s.lane == COMPUTE and s.microbatch is not None and s.kind in PASS_WORDS]
    if not bars:
        return ""
    widest = max(bars, key=lambda s: (round(s.end - s.start, 9), s.microbatch, s.stage or 0))
    stage = f" on stage {widest.stage}" if widest.stage is not None else ""
    said = f"microbatch {widest.microbatch}'s {PASS_WORDS[widest.kind]}{stage}"
    return f"a bar's label: {_bar_text(widest)} is {said}"


def _legend_once(bars: list[dict], pbars: list[dict]) -> None:
    """A kind drawn in both traces gets one legend entry (legendgroup toggles both)."""
    shown = {b["name"] for b in bars if b["showlegend"]}
    for b in pbars:
        b["showlegend"] = b["showlegend"] and b["name"] not in shown


def rows_axis(fig, rows: list[str], axis: str) -> None:
    """Rows top to bottom as ``rows`` orders them; a filler row (:data:`FILLER`) has no tick label. The
    ticks are listed, so a figure redrawn with other rows (a widget's) must set them here again."""
    fig.layout[axis].update(type="category", categoryorder="array", categoryarray=rows, autorange="reversed",
                            range=None, tickmode="array", tickvals=rows,
                            ticktext=["" if FILLER in row else row for row in rows])


def _interleave(rows: list[str], prows: list[str]) -> list[str]:
    """Measured rows of each rank followed by its predicted rows (ranks missing on one side kept)."""
    def rank_of(label: str) -> int:
        return int(label.split()[0][1:])

    by_rank: dict[int, list[str]] = defaultdict(list)
    for label in rows + prows:
        by_rank[rank_of(label)].append(label)
    return [label for r in sorted(by_rank) for label in by_rank[r]]


def _replica_said(replica: dict | None) -> list[str]:
    """What a simulated step's ranks are one replica of (``predict_trace``'s ``replica_of``): its
    micro-batch and, where uneven, its layers per chunk, which its bars' lengths follow ("zb-h1 p=2
    m=4" had said nothing of microbatches of 6 sequences, or of 17 + 15 layers)."""
    if not replica:
        return []
    said = [f"microbatches of {count_text(replica['micro_batch'], 'sequence')}"]
    if replica.get("stage_layers"):
        said.append(f"layers per chunk {split_text(replica['stage_layers'])}")
    return said


def _default_title(trace: Trace, steps=None, predicted: Trace | None = None) -> str:
    """What ran, and which steps the figure shows where it shows some (steps count from 0); a
    prediction drawn with it is named beside the trace's own source ("measured and simulated")."""
    m = trace.meta
    source = m.get("source", "") or "trace"
    if predicted is not None:
        source += f" and {predicted.meta.get('source') or 'predicted'}{hardware_said(predicted.meta)}"
    parts = [source, m.get("strategy", "")]
    if m.get("schedule"):
        v = f" v={m['virtual_stages']}" if (m.get("virtual_stages") or 1) > 1 else ""
        stages, microbatches = m.get("stages", m.get("pp", "?")), m.get("microbatches", "?")
        parts.append(f"{m['schedule']} p={stages}{v} m={microbatches}")
    parts += _replica_said(m.get("replica_of"))
    if steps is not None:
        shown = sorted(steps)
        parts.append(("step " if len(shown) == 1 else "steps ") + ", ".join(map(str, shown)))
    return "timeline: " + " · ".join(p for p in parts if p)
