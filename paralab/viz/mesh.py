"""The device mesh of a run: which global rank holds which (pp, dp, cp, tp) coordinate, which ranks
form each group, and where the nodes end.

One panel per parallel dimension in use (dp, cp, tp, pp, and ep when experts are sharded). Every
panel draws the same grid: one block per pipeline stage, left to right; inside it one row per
data-parallel replica and one column per tensor-parallel rank (per (cp, tp) pair with context
parallelism: cp0's tp ranks, then cp1's, ...). In a panel, the ranks of one group share a colour and
a line joins them: the tp panel's groups all-reduce inside every layer, the dp panel's reduce
gradients, the pp panel's groups are pipelines (the same cell of every block). Dashed boxes are the
nodes (ranks numbered node by node). Given a trace, hovering a rank shows its group's traffic.
"""

from __future__ import annotations

from paralab.layout import AXES, Layout
from paralab.text import count_text
from paralab.viz._common import (
    as_trace,
    fmt_bytes,
    go,
    layout_of,
    make_subplots,
    rank_color,
    recorded_nodes,
    style,
)
from paralab.viz.comm import DIMENSION_ORDER, bytes_by_group

WHAT = {"dp": "data parallel: model replicas", "cp": "context parallel: attention across the sequence",
        "tp": "tensor parallel: all-reduces in every layer", "pp": "pipelines: activations stage to stage",
        "ep": "expert parallel: tokens all-to-all"}
CELL = 0.8  # a rank's square, in grid units (1 between neighbours)


def _what(layout: Layout, axis: str) -> str:
    """What a panel's groups do; sequence parallel turns tp's all-reduces into their two halves."""
    if axis == "tp" and layout.sequence_parallel:
        return "tensor parallel: all-gathers and reduce-scatters in every layer"
    return WHAT[axis]


def axes_drawn(layout: Layout) -> list[str]:
    """The dimensions with more than one rank per group, in the order dp, cp, tp, pp, ep."""
    axes = [axis for axis in DIMENSION_ORDER if axis in AXES and layout.degree(axis) > 1]
    return axes + (["ep"] if layout.ep > 1 else []) or ["dp"]


def groups_of(layout: Layout, axis: str) -> list[list[int]]:
    return layout.expert_groups() if axis == "ep" else layout.groups(axis)


def _nodes(layout: Layout, trace, nodes: int | None) -> dict[int, int]:
    """rank -> node: as the trace recorded it, else ``nodes`` (or the layout's) of consecutive ranks."""
    if recorded := recorded_nodes(trace.meta if trace is not None else {}, layout.world_size):
        return recorded
    per_node = max(layout.world_size // max(nodes or layout.nodes or 1, 1), 1)
    return {r: r // per_node for r in range(layout.world_size)}


def mesh(obj, trace=None, nodes: int | None = None, title: str | None = None):
    """Draw the mesh of a Layout, a RunResult or a Trace (its meta), one panel per dimension.

    ``trace`` (default: the run's own) adds each group's traffic to the hover; ``nodes`` splits the
    ranks into that many nodes when the layout or trace does not say. ``fig.layout.meta``: ``shape``
    (one degree per axis of paralab.layout.AXES), ``coords`` (rank -> coordinate, AXES order),
    ``groups`` (axis -> the groups drawn, each a list of ranks) and ``nodes`` (node -> ranks)."""
    graph = go()
    layout = layout_of(obj)
    if trace is None and not isinstance(obj, (dict, Layout)):
        try:
            trace = as_trace(obj)
        except TypeError:  # nothing traced to show
            trace = None
    trace = as_trace(trace) if trace is not None else None
    traffic = bytes_by_group(trace) if trace is not None else {}
    node_of = _nodes(layout, trace, nodes)
    axes = axes_drawn(layout)
    columns = layout.cp * layout.tp  # (cp, tp) pairs, tp fastest

    def cell(rank):
        at = layout.coord(rank)
        return at["pp"] * (columns + 1) + at["cp"] * layout.tp + at["tp"], at["dp"]

    per_row = len(axes) if len(axes) <= 3 else 2
    rows = -(-len(axes) // per_row)
    titles = [f"<b>{axis}</b>: {count_text(len(groups_of(layout, axis)), 'group')} of "
              f"{len(groups_of(layout, axis)[0])}<br><sup>{_what(layout, axis)}</sup>" for axis in axes]
    fig = make_subplots(rows=rows, cols=per_row, horizontal_spacing=0.05, vertical_spacing=0.12,
                        subplot_titles=titles)
    drawn: dict[str, list[list[int]]] = {}
    # grid units across a panel: from the first cell's centre (0) to the last's (a column's gap between
    # stages, none after the last), and a 0.7 margin each side, so a panel's title stands over its grid
    # (a trailing stage gap had pushed it right)
    width = layout.pp * (columns + 1) - 2 + 1.4
    for i, axis in enumerate(axes):
        row, col = divmod(i, per_row)
        row, col = row + 1, col + 1
        drawn[axis] = []
        for g, group in enumerate(groups_of(layout, axis)):
            color = rank_color(g)
            for rank in group:
                x, y = cell(rank)
                fig.add_shape(type="rect", x0=x - CELL / 2, x1=x + CELL / 2, y0=y - CELL / 2, y1=y + CELL / 2,
                              fillcolor=color, line_width=0, layer="below", row=row, col=col)
            xs, ys = _path([cell(r) for r in group], bend=axis in ("pp", "cp"))
            fig.add_trace(graph.Scatter(x=xs, y=ys, mode="lines",
                                        line=dict(color="#333", width=1.5, shape="spline"),
                                        hoverinfo="skip", showlegend=False), row, col)
            hover = _group_hover(axis, group, traffic, node_of)
            fig.add_trace(graph.Scatter(
                x=[cell(r)[0] for r in group], y=[cell(r)[1] for r in group], mode="text",
                text=[str(r) for r in group], textfont=dict(color="white", size=15), showlegend=False,
                name=f"{axis} group {g}", meta={"axis": axis, "ranks": group},
                hovertext=[f"rank {r} ({_where(layout, r)})<br>{hover}" for r in group],
                hovertemplate="%{hovertext}<extra></extra>"), row, col)
            drawn[axis].append(list(group))
        _draw_nodes(fig, node_of, cell, row, col)
        names = [f"tp{t}" if layout.cp == 1 else f"cp{c}tp{t}" for c in range(layout.cp)
                 for t in range(layout.tp)]
        ticks = [(p * (columns + 1) + i, n) for p in range(layout.pp) for i, n in enumerate(names)]
        fig.update_xaxes(tickvals=[x for x, _ in ticks], ticktext=[t for _, t in ticks], showgrid=False,
                         zeroline=False, range=[-0.7, width - 0.7], row=row, col=col)
        fig.update_yaxes(tickvals=list(range(layout.dp)), ticktext=[f"dp{d}" for d in range(layout.dp)],
                         showgrid=False, zeroline=False, range=[layout.dp + 0.05, -1.0], row=row, col=col,
                         showticklabels=col == 1)
        for p in range(layout.pp):
            fig.add_annotation(x=p * (columns + 1) + (columns - 1) / 2, y=-0.75, text=f"stage pp{p}",
                               showarrow=False, font=dict(size=12, color="#444"), row=row, col=col)
    nodes_meta: dict[int, list[int]] = {}
    for rank, node in sorted(node_of.items()):
        nodes_meta.setdefault(node, []).append(rank)
    fig.update_layout(meta={"shape": list(layout.shape),
                            "coords": {str(r): list(c) for r, c in layout.coords.items()},
                            "groups": drawn, "nodes": {str(n): ranks for n, ranks in nodes_meta.items()}})
    cp = f" x cp={layout.cp}" if layout.cp > 1 else ""
    ep = f" (ep={layout.ep} inside dp)" if layout.ep > 1 else ""
    node_text = f", {len(nodes_meta)} nodes (dashed)" if len(nodes_meta) > 1 else ""
    name = f"device mesh: dp={layout.dp}{cp} x tp={layout.tp} x pp={layout.pp}{ep}{node_text}"
    unit_px = 1000 / per_row / width  # the cells stay square: a panel is as tall as its grid needs
    fig = style(fig, title or name, int(130 + rows * (70 + (layout.dp + 1.05) * min(unit_px, 90))))
    fig.update_layout(margin=dict(t=110))
    return fig


def _path(cells: list[tuple[float, float]], bend: bool) -> tuple[list[float], list[float]]:
    """A line through the cells in rank order; ``bend``: arcs above the row (cells that are not
    neighbours, whose straight line would cross other ranks)."""
    xs, ys = [cells[0][0]], [cells[0][1]]
    for (x0, y0), (x1, y1) in zip(cells, cells[1:]):
        if bend and y0 == y1:
            xs.append((x0 + x1) / 2)
            ys.append(y0 - 0.55)
        xs.append(x1)
        ys.append(y1)
    return xs, ys


def _where(layout: Layout, rank: int) -> str:
    at = layout.coord(rank)
    return ", ".join(f"{axis} {at[axis]}" for axis in AXES if layout.degree(axis) > 1) or "alone"


def _group_hover(axis: str, group: list[int], traffic: dict, node_of: dict[int, int]) -> str:
    """The group, its nodes, and its traffic: what every traced group inside it moved per step."""
    nodes = sorted({node_of[r] for r in group})
    where = f"inside node {nodes[0]}" if len(nodes) == 1 else f"across nodes {', '.join(map(str, nodes))}"
    lines = [f"{axis} group {group}, {where}"]
    members = set(group)
    ops: dict[str, int] = {}
    for traced, per_op in traffic.items():
        if len(traced) > 1 and set(traced) <= members:
            for op, b in per_op.items():
                ops[op] = ops.get(op, 0) + b
    if ops:
        lines += [f"{op}: {fmt_bytes(b)} per step (wire, all members)" for op, b in sorted(ops.items()) if b]
    elif traffic:
        lines.append("no traffic of its own in this run")
    return "<br>".join(lines)


def _draw_nodes(fig, node_of: dict[int, int], cell, row: int, col: int) -> None:
    """A dashed box around each node's ranks, one per run of cells a row shares (boxes of rows with the
    same columns merged)."""
    if len(set(node_of.values())) < 2:
        return
    by_node: dict[int, dict[float, list[float]]] = {}
    for rank, node in node_of.items():
        x, y = cell(rank)
        by_node.setdefault(node, {}).setdefault(y, []).append(x)
    pad = CELL / 2 + 0.08
    for node, rows in sorted(by_node.items()):
        boxes: list[list[float]] = []  # [x0, x1, y0, y1]
        for y in sorted(rows):
            for x0, x1 in _runs(sorted(rows[y])):
                if boxes and boxes[-1][0] == x0 and boxes[-1][1] == x1 and boxes[-1][3] == y - 1:
                    boxes[-1][3] = y
                else:
                    boxes.append([x0, x1, y, y])
        for i, (x0, x1, y0, y1) in enumerate(boxes):
            fig.add_shape(type="rect", x0=x0 - pad, x1=x1 + pad, y0=y0 - pad, y1=y1 + pad, line=dict(
                color="#555", width=1.5, dash="dash"), fillcolor="rgba(0,0,0,0)", row=row, col=col)
            if i == 0:
                fig.add_annotation(x=x1 + pad, y=y1 + pad, text=f"node {node}", showarrow=False,
                                   xanchor="right", yanchor="top", font=dict(size=10, color="#555"),
                                   row=row, col=col)


def _runs(xs: list[float]) -> list[tuple[float, float]]:
    """Consecutive integers as (first, last) runs: [0, 1, 3] -> [(0, 1), (3, 3)]."""
    runs: list[tuple[float, float]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return runs
