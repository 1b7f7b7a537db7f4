"""Communication figures: bytes by op and step, by parallel dimension, who talks to whom, and what
crosses nodes.

Units: bytes per training step, summed over the ranks (as ``Trace.comm_bytes`` and the run summary
count them), shown in KiB, MiB or GiB as the sizes call for, exact bytes on hover. Bytes are wire
bytes (ring accounting, what each rank puts on the network) unless ``payload=True``, in which case
they are the tensor sizes the calls were given; see :class:`paralab.trace.Span`.

Parallel dimension: the mesh axis of a span's process group, read from the run's layout: the axes
along which the group's members' coordinates vary (``tp`` for a tensor-parallel pair, ``dp×cp`` for
gradients reduced over both, ``pp`` for a send between two stages), ``ep`` for the tokens'
all-to-all of an expert-parallel group. A trace without a layout names its groups by size.

Rank-by-rank matrix convention (``comm_matrix_data``), row = sender, column = receiver:

- point-to-point: a span with a ``peer`` counts its wire bytes from its rank to the peer. Receives
  put nothing on the wire (0 wire bytes), so each transfer is counted once, by its send.
- ring collectives (all-reduce, all-gather, reduce-scatter, broadcast): a rank's wire bytes go to its
  ring successor in the group (``paralab.comm.ring_next``), as a ring algorithm sends them and as
  the inside/across-nodes split counts them (a span crosses nodes when its successor is on another
  node), so the matrix and that split tell the same story: a ring over 64 ranks in nodes of 8 is a
  band beside the diagonal, one cell in eight of it across nodes, not 63 cells a row.
- all-to-all: no ring, each rank sends every other member its slice, so its wire bytes are spread
  evenly over the other members (exact when the slices are even, as the span records only the sum).
  The group is the one the trace records (``Trace.group_of``); a simulated trace records only a
  group's size, and the group is then inferred from the run's layout in ``trace.meta`` (tp fastest,
  then cp, dp, pp, as paralab lays ranks out), matching ``group_size`` against each axis's degree,
  and falling back to the aligned block of ``group_size`` ranks that holds the rank. A simulated
  step at scale (``paralab.sim.predict_trace``) draws one replica's pipeline ranks: its meta's
  ``replica_of`` names the degrees, a collective of its tp, dp or ep groups is the rank's alone (its
  other members are not drawn, and no bytes of it cross the matrix), named by the axis of its size.
"""

from __future__ import annotations

from collections import defaultdict

from paralab.layout import AXES, Layout
from paralab.trace import COMM, Span, Trace, span_group
from paralab.viz._common import (
    as_trace,
    byte_scale,
    fmt_bytes,
    go,
    kind_color,
    layout_of,
    make_subplots,
    recorded_nodes,
    style,
)

LINKS = (("intra_node", "inside a node", "#4C78A8"), ("inter_node", "across nodes", "#D62728"))


def link_legend(name: str, values) -> str:
    """A link's legend entry, "(none)" added where none of its bars has a byte: a one-node run's
    legend had offered "across nodes" beside bars that hold none of it."""
    return name if any(values) else f"{name} (none)"


# how the rank matrix credits a collective's bytes, said on every matrix (see the module docstring)
MATRIX_RULE = ("row sends, column receives: a ring collective to each rank's ring successor "
               "(as the inside/across-nodes split counts),<br>an all-to-all evenly over its group, "
               "a send to its peer")
NODE_BOX = "dashed boxes: the nodes, so a cell outside them crosses nodes"
RULE_PX = 35  # the rule's two lines under the title: the plot (and a matrix's top axis) moves down by them
# the order dimensions are listed in: data, context, tensor, pipeline, expert, then combinations
DIMENSION_ORDER = ("dp", "cp", "tp", "pp", "ep")
UNSEEN = "\u200b"  # a zero-width space: keeps one run's category labels apart from another's
LABEL_STANDOFF_PX = 8  # a rank matrix's tick labels, off the node boxes drawn along the plot's edges


def _span_bytes(s: Span, payload: bool) -> int:
    return s.payload_bytes if payload else s.bytes


def _unit_label(payload: bool) -> str:
    return "payload" if payload else "wire"


def bytes_by_op_and_step(trace: Trace, payload: bool = False) -> dict[str, dict[int | None, int]]:
    """op -> step -> bytes summed over ranks (spans outside a step under ``None``)."""
    out: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    for s in trace.select(lane=COMM):
        out[s.kind][s.step] += _span_bytes(s, payload)
    return {op: dict(steps) for op, steps in sorted(out.items())}


def comm_by_op(trace, payload: bool = False, title: str | None = None):
    """Stacked bars: bytes of each step, one colour per op; hover gives exact bytes."""
    graph = go()
    trace = as_trace(trace)
    # an op of no bytes has no bar to draw (a receive's wire bytes are its send's): named in the legend,
    # it had read as a bar too thin to see
    data = {op: per for op, per in bytes_by_op_and_step(trace, payload).items() if any(per.values())}
    steps = sorted({k for per in data.values() for k in per},
                   key=lambda k: (k is None, k if k is not None else 0))
    labels = [f"step {k}" if k is not None else "outside steps" for k in steps]
    scale, unit = byte_scale(max((sum(per.get(k, 0) for per in data.values()) for k in steps), default=0))
    fig = graph.Figure()
    for op, per in data.items():
        values = [per.get(k, 0) for k in steps]
        fig.add_trace(graph.Bar(
            x=labels, y=[v / scale for v in values], name=op, marker_color=kind_color(op),
            customdata=[[fmt_bytes(v), v] for v in values],
            hovertemplate=f"{op}, %{{x}}: %{{customdata[0]}} (%{{customdata[1]:,.0f}} B)<extra></extra>",
        ))
    kind = _unit_label(payload)
    fig.update_layout(barmode="stack", showlegend=True,  # the legend names the op even when there is one
                      meta={"bytes": {op: sum(per.values()) for op, per in data.items()}, "unit": unit})
    fig.update_yaxes(title_text=f"{kind} {unit} in the step (all ranks)")
    return style(fig, title or f"communication by op and step ({kind} bytes)", 380)


# ------------------------------------------------------------------------------ groups and dimensions
def group_of(s: Span, world: int, meta: dict) -> list[int]:
    """The ranks a collective span ran among (see the module docstring for the convention); of a
    simulated replica's pipeline (``replica_of``), the span's own rank alone, its peers not drawn."""
    if meta.get("replica_of") and not s.group_ranks and s.peer is None and s.group_size > 1:
        return [s.rank]  # a tp 4 all-gather had been drawn among pipeline ranks 0..3, dp 50's among all
    known = span_group(s, world)
    if known is not None:
        return list(known)
    n = s.group_size or world
    layout = _layout_or_none(meta)
    if layout is not None and layout.world_size == world:
        for axis in reversed(AXES):  # innermost first: tp, cp, dp, then the pipeline
            if layout.degree(axis) == n:
                return layout.group_of(axis, s.rank)
    start = (s.rank // n) * n
    return list(range(start, min(start + n, world)))


def _layout_or_none(meta: dict) -> Layout | None:
    try:
        return layout_of(meta)
    except (TypeError, ValueError):  # no layout; or degrees no mesh has (a hand-made meta's ep 3 of dp 4)
        return None


def rank_numbering(layout: Layout, rank_order: str) -> list[int]:
    """Each mesh rank's global number as a ``rank_order`` ("tp-dp-pp", "tp-pp-dp": innermost axis
    first; context parallel just outside tensor parallel, as the lab lays it) numbers the ranks: the
    identity for the lab's own order, tp-dp-pp; for Llama 3's tp-pp-dp a pipeline's stages are
    neighbours and a data-parallel group is spread widest, which decides which of its rings and sends
    cross nodes."""
    inner_first = rank_order.split("-")
    inner_first.insert(1, "cp")
    out = []
    for rank in range(layout.world_size):
        coord, number = layout.coord(rank), 0
        for axis in reversed(inner_first):
            number = number * layout.degree(axis) + coord[axis]
        out.append(number)
    return out


def _mesh_ranks(layout: Layout | None, meta: dict) -> dict[int, int] | None:
    """Global rank -> mesh rank, for a trace whose ranks are numbered in another order than the lab's
    (a prediction's ``meta["rank_order"]``); None when they are the mesh's own."""
    if layout is None or "rank_order" not in meta:
        return None
    return {number: mesh for mesh, number in enumerate(rank_numbering(layout, meta["rank_order"]))}


def dimension_of(group: list[int] | tuple[int, ...], layout: Layout | None, op: str = "") -> str:
    """The parallel dimension of a process group (see the module docstring) for a call of kind ``op``:
    on an expert group, the tokens' all-to-all is ep's, while the dense gradients' all-reduce over the
    same ranks (ep = dp) is dp's."""
    if layout is None or max(group, default=0) >= layout.world_size:
        return f"group of {len(group)}"
    if layout.ep > 1 and op == "all_to_all" and sorted(group) in layout.expert_groups():
        return "ep"
    coords = [layout.coords[r] for r in group]
    varying = [axis for i, axis in enumerate(AXES) if len({c[i] for c in coords}) > 1]
    varying.sort(key=lambda axis: DIMENSION_ORDER.index(axis))
    return "×".join(varying) or "self"


def axes_of_size(size: int, degrees: dict, op: str) -> str:
    """The mesh axes whose degree is ``size`` ("tp", or "dp or tp" where both are), else "group of N":
    a simulated replica's collective of kind ``op``, whose members the trace does not draw. As in
    :func:`dimension_of`, the all-to-all of an expert group is ep's, and its other calls are not; a
    pipeline's groups are among the ranks drawn, so none of these is pp's."""
    if op == "all_to_all" and degrees.get("ep") == size:
        return "ep"
    axes = [axis for axis in DIMENSION_ORDER if axis not in ("pp", "ep") and degrees.get(axis) == size]
    return " or ".join(axes) or f"group of {size}"


def _dimension_rank(name: str) -> tuple:
    first = name.split("×")[0]
    return (DIMENSION_ORDER.index(first) if first in DIMENSION_ORDER else len(DIMENSION_ORDER), name)


def bytes_by_dimension(trace, payload: bool = False) -> dict[str, dict[str, dict[str, int]]]:
    """dimension -> op -> {"intra_node": bytes, "inter_node": bytes}, per step summed over ranks,
    dimensions in the order dp, cp, tp, pp, ep (then combinations)."""
    trace = as_trace(trace)
    world = trace.world_size
    layout = _layout_or_none(trace.meta)
    mesh = _mesh_ranks(layout, trace.meta)
    found: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: {"intra_node": 0, "inter_node": 0}))

    replica_of = trace.meta.get("replica_of")

    def where(s: Span) -> tuple[str, str, str]:
        group = group_of(s, world, trace.meta)
        if replica_of and len(group) > 1:  # among the replica's stages drawn: a send, the tied embedding's
            dimension = "pp"
        elif replica_of:  # a group among ranks not drawn: named by its size
            dimension = axes_of_size(s.group_size, replica_of, s.kind)
        else:
            dimension = dimension_of([mesh[r] for r in group] if mesh else group, layout, s.kind)
        return dimension, s.kind, "inter_node" if s.inter_node else "intra_node"

    for (dimension, op, link), nbytes in trace.per_step_bytes(where, payload).items():
        found[dimension][op][link] = int(nbytes)
    return {dim: dict(sorted(ops.items()))
            for dim, ops in sorted(found.items(), key=lambda kv: _dimension_rank(kv[0]))}


TOTAL_HEADROOM = 1.15  # y axis over the tallest stack, for the total written over it


def comm_by_dimension(trace, payload: bool = False, title: str | None = None):
    """Bytes per step by parallel dimension: split by op (left) and by link (right).

    ``fig.layout.meta``: ``bytes`` (dimension -> bytes per step, all ranks), ``by_op``, ``by_link``
    (dimension -> op or link -> bytes per step) and ``unit`` (of the y axes)."""
    graph = go()
    data = bytes_by_dimension(trace, payload)
    dims = list(data)
    totals = {d: sum(sum(links.values()) for links in ops.values()) for d, ops in data.items()}
    by_op = {d: {op: sum(links.values()) for op, links in ops.items()} for d, ops in data.items()}
    by_link = {d: {link: sum(links[link] for links in ops.values()) for link, _, _ in LINKS}
               for d, ops in data.items()}
    scale, unit = byte_scale(max(totals.values(), default=0))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("by operation", "by link: inside a node or across nodes"))
    # an op that put no bytes on the wire (a receive, whose send counts them) gets no empty legend entry
    ops = sorted({op for per in by_op.values() for op, n in per.items() if n})
    for op in ops:
        values = [by_op[d].get(op, 0) for d in dims]
        fig.add_trace(graph.Bar(
            x=dims, y=[v / scale for v in values], name=op, marker_color=kind_color(op), legendgroup="op",
            legendgrouptitle_text="operation", customdata=[[fmt_bytes(v), v] for v in values],
            text=[fmt_bytes(v) if v else "" for v in values], textposition="inside",
            hovertemplate=f"%{{x}} {op}: %{{customdata[0]}} per step "
                          "(%{customdata[1]:,.0f} B)<extra></extra>"), 1, 1)
    for link, label, color in LINKS:
        values = [by_link[d][link] for d in dims]
        fig.add_trace(graph.Bar(
            x=dims, y=[v / scale for v in values], name=link_legend(label, values), marker_color=color,
            legendgroup="link",
            legendgrouptitle_text="link", customdata=[[fmt_bytes(v), v] for v in values],
            text=[fmt_bytes(v) if v else "" for v in values], textposition="inside",
            hovertemplate=f"%{{x}} {label}: %{{customdata[0]}} per step "
                          "(%{customdata[1]:,.0f} B)<extra></extra>"), 1, 2)
    # each stack's total over it, in both panels: a segment's label inside had read as the bar's (tp's
    # all-reduce "12.3 GiB" by operation against its "12.4 GiB" inside a node), the panels disagreeing
    for col in (1, 2):
        for d in dims:
            fig.add_annotation(x=d, y=totals[d] / scale, text=f"<b>{fmt_bytes(totals[d])}</b>", yshift=10,
                               showarrow=False, row=1, col=col)
    top = max(totals.values(), default=0) / scale
    fig.update_yaxes(range=[0, TOTAL_HEADROOM * top] if top else None)
    kind = _unit_label(payload)
    fig.update_layout(barmode="stack",
                      meta={"bytes": totals, "by_op": by_op, "by_link": by_link, "unit": unit})
    fig.update_yaxes(title_text=f"{kind} {unit} per step (all ranks)", row=1, col=1)
    fig.update_xaxes(title_text="parallel dimension (mesh axis of the group)")
    fig = style(fig, title or f"communication by parallel dimension ({kind} bytes per step)", 430)
    fig.update_layout(margin=dict(t=135), legend=dict(traceorder="grouped"))
    return fig


# ------------------------------------------------------------------------------------- rank matrix
def comm_matrix_data(trace, payload: bool = False) -> list[list[float]]:
    """matrix[src][dst] = bytes from rank src to rank dst over the whole trace (see the module
    docstring); :func:`comm_matrix` draws it per step."""
    from paralab.comm import ring_next  # imports torch, which drawing anything else does not need

    trace = as_trace(trace)
    world = trace.world_size
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
        group = group_of(s, world, trace.meta)
        if s.kind == "all_to_all" or s.rank not in group:  # no ring to follow: spread over the others
            others = [q for q in group if q != s.rank]
            for q in others:
                matrix[s.rank][q] += b / len(others)
        elif len(group) > 1:  # a group of one sends nothing, whatever payload it was given
            matrix[s.rank][ring_next(s.rank, group)] += b
    return matrix


def comm_matrix_per_step(trace, payload: bool = False) -> list[list[float]]:
    """:func:`comm_matrix_data` per step: a row is its sender's bytes over the steps that rank has
    (:meth:`paralab.trace.Trace.step_counts`), as every bytes-per-step figure reads them."""
    steps = as_trace(trace).step_counts()
    return [[v / steps.get(src, 1) for v in row] for src, row in enumerate(comm_matrix_data(trace, payload))]


def comm_matrix(trace, payload: bool = False, title: str | None = None):
    """Heatmap of bytes per step sent from each rank (rows) to each rank (columns)."""
    graph = go()
    matrix = comm_matrix_per_step(trace, payload)
    scale, unit = byte_scale(max((max(row) for row in matrix), default=0))
    labels = [f"r{r}" for r in range(len(matrix))]
    text = [[fmt_bytes(v) if v else "" for v in row] for row in matrix]
    fig = graph.Figure(graph.Heatmap(
        z=[[v / scale for v in row] for row in matrix], x=labels, y=labels, colorscale="Blues", text=text,
        customdata=matrix, texttemplate="%{text}" if len(matrix) <= 16 else None,
        # the labels are "r0" already ("rr1 → r1" had been written), a cell of none says 0 B
        hovertext=[[fmt_bytes(v) for v in row] for row in matrix],
        hovertemplate="%{y} → %{x}: %{hovertext} per step (%{customdata:,.0f} B)<extra></extra>",
        colorbar=dict(title=f"{unit}/step"),
    ))
    # the labels stand off the plot's edge, where the first node's dashed box runs: on it, "r0" was clipped
    fig.update_yaxes(title_text="from rank", autorange="reversed", ticklabelstandoff=LABEL_STANDOFF_PX)
    fig.update_xaxes(title_text="to rank", side="top", ticklabelstandoff=LABEL_STANDOFF_PX)
    fig.update_layout(meta={"ranks": len(matrix), "total_bytes": sum(map(sum, matrix)), "unit": unit})
    trace = as_trace(trace)
    boxed = draw_node_boxes(fig, trace)
    drawn = (": one replica's pipeline ranks (its tp, dp and ep groups run among ranks not drawn)"
             if trace.meta.get("replica_of") else "")
    fig = style(fig, title or f"{_unit_label(payload)} bytes per step, rank to rank{drawn}",
                max(320, 40 + 28 * len(matrix)))
    return say_matrix_rule(fig, boxed)


def node_ranks(trace: Trace) -> list[list[int]]:
    """Each node's ranks, as the trace records them (a measured run's ``meta["ranks"]``, a prediction's
    ``gpus_per_node``); one list of all ranks when it records neither."""
    world = trace.world_size
    node_of = recorded_nodes(trace.meta, world)
    if node_of is None:
        per_node = trace.meta.get("gpus_per_node") or world
        node_of = {r: r // per_node for r in range(world)}
    nodes: dict[int, list[int]] = defaultdict(list)
    for rank, node in sorted(node_of.items()):
        nodes[node].append(rank)
    return list(nodes.values())


def draw_node_boxes(fig, trace: Trace, row: int | None = None, col: int | None = None) -> bool:
    """A dashed box around each node's block of a rank matrix (ranks numbered node by node), so the
    cells that cross nodes are those outside the boxes; whether there were several nodes to draw."""
    nodes = node_ranks(trace)
    if len(nodes) < 2:
        return False
    for ranks in nodes:
        low, high = min(ranks) - 0.5, max(ranks) + 0.5
        fig.add_shape(type="rect", x0=low, x1=high, y0=low, y1=high, line=dict(color="#555", dash="dash",
                      width=1), row=row, col=col)
    return True


def say_matrix_rule(fig, boxed: bool):
    """The figure with :data:`MATRIX_RULE` under its title (and :data:`NODE_BOX` when ``boxed``):
    without it an all-reduce's cells could be read as every rank talking to every other, which no
    ring does."""
    rule = MATRIX_RULE + (f"; {NODE_BOX}" if boxed else "")
    fig.update_layout(title_subtitle=dict(text=rule, font=dict(size=12, color="#555")),
                      margin_t=fig.layout.margin.t + RULE_PX, height=fig.layout.height + RULE_PX)
    return fig


# -------------------------------------------------------------------------------------------- links
def link_split_data(trace, payload: bool = False) -> dict[str, dict[str, int]]:
    """op -> {"intra_node": bytes, "inter_node": bytes} per step, summed over ranks; the ops in the order
    a step first runs them (a hierarchical all-reduce's reduce-scatter, all-reduce, all-gather), not
    alphabetically, so the bars read as the algorithm does."""
    trace = as_trace(trace)
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"intra_node": 0, "inter_node": 0})
    split = trace.per_step_bytes(lambda s: (s.kind, "inter_node" if s.inter_node else "intra_node"), payload)
    for (op, link), nbytes in split.items():
        out[op][link] = int(nbytes)
    first: dict[str, tuple] = {}  # op -> (step, start) of its first call
    for s in trace.select(lane=COMM):
        key = (s.step if s.step is not None else -1, s.start)
        if s.kind in out and (s.kind not in first or key < first[s.kind]):
            first[s.kind] = key
    return {op: out[op] for op in sorted(out, key=lambda op: (first.get(op, (float("inf"),)), op))}


def _category_names(data: dict[str, dict]) -> list[str]:
    """Each run's ops as bar categories, in its own order. plotly orders a multicategory axis's inner
    labels by where each first appears in any group, so an op an earlier run names (a flat ring's
    all_reduce) would jump ahead of a later run's own first op (the hierarchy's reduce_scatter): such a
    run's labels are made its own by zero-width spaces, which no one sees."""
    seen: dict[str, int] = {}  # label -> the order plotly gives it
    names = []
    for i, ops in enumerate(map(list, data.values())):
        trial = dict(seen)
        for op in ops:
            trial.setdefault(op, len(trial))
        if all(trial[a] < trial[b] for a, b in zip(ops, ops[1:])):
            seen = trial
            names += ops
        else:
            names += [op + UNSEEN * i for op in ops]
    return names


def comm_link_split(runs, payload: bool = False, title: str | None = None):
    """Bytes per step of each op, those that cross nodes (red, at the base, so bars compare from zero)
    under those that stay inside a node (blue).

    ``runs``: a Trace or RunResult, or several as {label: run}, whose bars then stand side by side,
    each under its label, on one y axis: a flat ring and a hierarchical all-reduce drawn as two figures
    had both reached the top of their own axes, 2.5 MiB across nodes looking like 1.67.
    ``fig.layout.meta["bytes"]``: op -> link -> bytes per step (all ranks); for several runs,
    label -> op -> link -> bytes."""
    graph = go()
    several = isinstance(runs, dict)
    data = {label: link_split_data(run, payload) for label, run in (runs if several else {"": runs}).items()}
    bars = [(label, op, links) for label, per_op in data.items() for op, links in per_op.items()]
    scale, unit = byte_scale(max((sum(links.values()) for _, _, links in bars), default=0))
    ops = _category_names(data)
    fig = graph.Figure()
    for link, name, color in reversed(LINKS):
        values = [links[link] for _, _, links in bars]
        fig.add_trace(graph.Bar(
            x=[[label for label, _, _ in bars], ops] if several else ops, y=[v / scale for v in values],
            name=link_legend(name, values), marker_color=color,
            text=[fmt_bytes(v) if v else "" for v in values],
            textposition="inside",
            customdata=[[f"{label}: {op}" if label else op, fmt_bytes(v), v] for (label, op, _), v in
                        zip(bars, values)],
            hovertemplate=f"%{{customdata[0]}} {name}: %{{customdata[1]}} per step "
                          "(%{customdata[2]:,.0f} B)<extra></extra>",
        ))
    fig.update_layout(barmode="stack", bargap=0.45, meta={"bytes": data if several else data[""],
                                                          "unit": unit},
                      legend_traceorder="reversed")  # inside a node listed first, as it sits on top
    fig.update_yaxes(title_text=f"{_unit_label(payload)} {unit} per step (all ranks)")
    return style(fig, title or "inside a node against across nodes", 360)


def bytes_by_group(trace, payload: bool = False) -> dict[tuple[int, ...], dict[str, int]]:
    """group (its ranks, as :func:`group_of` resolves them) -> op -> bytes per step summed over its
    members: the traffic the mesh figure shows on hover."""
    trace = as_trace(trace)
    world = trace.world_size
    found: dict[tuple[int, ...], dict[str, int]] = defaultdict(dict)
    by = trace.per_step_bytes(lambda s: (tuple(sorted(group_of(s, world, trace.meta))), s.kind), payload)
    for (group, op), nbytes in by.items():
        found[group][op] = int(nbytes)
    return dict(found)
