"""Communication figures: bytes by op and step, who talks to whom, and what crosses nodes.

Bytes are wire bytes (ring accounting, what each rank puts on the network) unless ``payload=True``,
in which case they are the tensor sizes the calls were given; see :class:`paralab.trace.Span`.

Rank-by-rank matrix convention (``comm_matrix_data``), row = sender, column = receiver:

- point-to-point: a span with a ``peer`` counts its wire bytes from its rank to the peer. Receives
  put nothing on the wire (0 wire bytes), so each transfer is counted once, by its send.
- collectives: a rank's wire bytes are spread evenly over the other members of its group. That is
  an algorithm-neutral picture of "who exchanged with whom" (a ring sends everything to one
  neighbour, a tree to two); row sums are exact, individual cells are the even-spread view.
  The group is taken from ``span.group_ranks`` when a trace records it; otherwise it is inferred
  from the run's layout in ``trace.meta`` (tp fastest, then dp, then pp, as Megatron lays ranks out),
  matching ``group_size`` against tp, then dp, then pp, then the whole world, and falling back to
  the aligned block of ``group_size`` ranks that holds the rank.
"""

from __future__ import annotations

from collections import defaultdict

from paralab.layout import AXES
from paralab.trace import COMM, Span, Trace
from paralab.viz._common import as_trace, fmt_bytes, go, kind_color, style
from paralab.viz.mesh import layout_of


def _span_bytes(s: Span, payload: bool) -> int:
    return s.payload_bytes if payload else s.bytes


def bytes_by_op_and_step(trace: Trace, payload: bool = False) -> dict[str, dict[int | None, int]]:
    """op -> step -> bytes summed over ranks (spans outside a step under ``None``)."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    for s in trace.select(lane=COMM):
        out[s.kind][s.step] += _span_bytes(s, payload)
    return {op: dict(steps) for op, steps in sorted(out.items())}


def comm_by_op(trace, payload: bool = False, title: str | None = None):
    """Stacked bars: bytes per step, one colour per op; hover gives exact bytes."""
    graph = go()
    trace = as_trace(trace)
    data = bytes_by_op_and_step(trace, payload)
    steps = sorted({k for per in data.values() for k in per}, key=lambda k: (k is None, k if k is not None else 0))
    labels = [f"step {k}" if k is not None else "outside steps" for k in steps]
    fig = graph.Figure()
    for op, per in data.items():
        values = [per.get(k, 0) for k in steps]
        fig.add_trace(graph.Bar(
            x=labels, y=values, name=op, marker_color=kind_color(op),
            customdata=[[fmt_bytes(v), v] for v in values],
            hovertemplate=f"{op}, %{{x}}: %{{customdata[0]}} (%{{customdata[1]}} B)<extra></extra>",
        ))
    kind = "payload" if payload else "wire"
    fig.update_layout(barmode="stack", showlegend=True,  # the legend names the op even when there is one
                      meta={"bytes": {op: sum(per.values()) for op, per in data.items()}})
    fig.update_yaxes(title_text=f"{kind} bytes (all ranks)")
    return style(fig, title or f"communication by op and step ({kind} bytes)", 380)


def group_of(s: Span, world: int, meta: dict) -> list[int]:
    """The ranks a collective span ran among (see the module docstring for the convention)."""
    recorded = getattr(s, "group_ranks", None)
    if recorded:
        return list(recorded)
    n = s.group_size or world
    if n >= world:
        return list(range(world))
    try:
        layout = layout_of(meta)
    except TypeError:
        layout = None
    if layout is not None and layout.world_size == world:
        for axis in reversed(AXES):  # innermost first: tp, cp, dp, then the pipeline
            if layout.degree(axis) == n:
                return layout.group_of(axis, s.rank)
    start = (s.rank // n) * n
    return list(range(start, min(start + n, world)))


def comm_matrix_data(trace, payload: bool = False) -> list[list[float]]:
    """matrix[src][dst] = bytes per run from rank src to rank dst (see the module docstring)."""
    trace = as_trace(trace)
    world = max(trace.ranks, default=-1) + 1
    world = max(world, int(trace.meta.get("world_size") or 0))
    matrix = [[0.0] * world for _ in range(world)]
    for s in trace.select(lane=COMM):
        b = _span_bytes(s, payload)
        if not b:
            continue
        if s.peer is not None:
            if s.kind == "recv" and payload:
                continue  # the matching send counts the transfer
            if 0 <= s.peer < world:
                matrix[s.rank][s.peer] += b
            continue
        others = [q for q in group_of(s, world, trace.meta) if q != s.rank]
        for q in others:
            matrix[s.rank][q] += b / len(others)
    return matrix


def comm_matrix(trace, payload: bool = False, title: str | None = None):
    """Heatmap of bytes sent from each rank (rows) to each rank (columns), over the whole trace."""
    graph = go()
    matrix = comm_matrix_data(trace, payload)
    labels = [f"r{r}" for r in range(len(matrix))]
    text = [[fmt_bytes(v) if v else "" for v in row] for row in matrix]
    fig = graph.Figure(graph.Heatmap(
        z=matrix, x=labels, y=labels, colorscale="Blues", text=text,
        texttemplate="%{text}" if len(matrix) <= 16 else None,
        hovertemplate="r%{y} → %{x}: %{text} (%{z:.0f} B)<extra></extra>", colorbar=dict(title="bytes"),
    ))
    fig.update_yaxes(title_text="from rank", autorange="reversed")
    fig.update_xaxes(title_text="to rank", side="top")
    fig.update_layout(meta={"ranks": len(matrix), "total_bytes": sum(map(sum, matrix))})
    return style(fig, title or "bytes exchanged, rank by rank", max(320, 40 + 28 * len(matrix)))


def link_split_data(trace, payload: bool = False) -> dict[str, dict[str, int]]:
    """op -> {"intra_node": bytes, "inter_node": bytes} over the whole trace."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"intra_node": 0, "inter_node": 0})
    for s in as_trace(trace).select(lane=COMM):
        out[s.kind]["inter_node" if s.inter_node else "intra_node"] += _span_bytes(s, payload)
    return dict(sorted(out.items()))


def comm_link_split(trace, payload: bool = False, title: str | None = None):
    """Grouped bars per op: bytes that stay inside a node against bytes that cross nodes."""
    graph = go()
    data = link_split_data(trace, payload)
    ops = list(data)
    fig = graph.Figure()
    for link, color in (("intra_node", "#4C78A8"), ("inter_node", "#D62728")):
        values = [data[op][link] for op in ops]
        fig.add_trace(graph.Bar(
            x=ops, y=values, name=link.replace("_", "-"), marker_color=color,
            customdata=[[fmt_bytes(v), v] for v in values],
            hovertemplate=f"%{{x}} {link}: %{{customdata[0]}} (%{{customdata[1]}} B)<extra></extra>",
        ))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="bytes (all ranks, whole trace)")
    return style(fig, title or "intra-node vs inter-node traffic", 340)
