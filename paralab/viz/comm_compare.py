"""Communication measured beside predicted: bytes by op, rank by rank, and inside against across nodes,
for a run's trace and for the cost model's count of the same run, or of the run grown to another size.

The prediction is a Trace too (one trace type): :func:`predicted_comm_trace` lays the collectives the
cost model counts for a GPU of each pipeline stage (``paralab.sim.counting.comm_payloads``: family, op,
payload, group size, count per step; with context parallel the slice run's and
``paralab.sim.context.comm_payloads``, the ring's hops or the all-to-alls) on every rank of that stage,
each on its own group as ``paralab.layout`` lays ranks out (tp innermost, then cp, dp, pp; gradients
over dp and cp; a mixture of experts' all-to-alls on its expert groups), its ranks numbered as the spec's
``rank_order`` says (the lab's order, or Llama 3's tp, pp, dp), inter-node when the rank's
ring successor (its peer, for a send) sits on another node of ``gpus_per_node`` ranks, the rule
paralab.comm applies to measured spans. So one figure draws both, with the same conventions as
:mod:`paralab.viz.comm`.

Units: bytes per rank and per step (wire bytes unless ``payload=True``), so a two-rank run and a
64-rank prediction share one axis. The cost model counts what a transformer block, the model's ends
under tensor parallel (the embedding, output layer and loss), the pipeline and the gradient
reduction move; what a real run adds around them shows as the difference between the two bars.
"""

from __future__ import annotations

import math
from collections import defaultdict

from paralab.comm import ring_next
from paralab.layout import mesh_layout
from paralab.trace import COMM, Span, Trace
from paralab.viz._common import SERIES_COLORS, as_trace, byte_scale, fmt_bytes, go, make_subplots, style
from paralab.viz.comm import (
    LINKS,
    _unit_label,
    comm_matrix_per_step,
    draw_node_boxes,
    link_legend,
    rank_numbering,
    say_matrix_rule,
)

# columns of cells across the figure (ranks times panels) that leave a cell room for its label
# ("465.8") at 820-1100 px: plotly shrinks a label to its cell, and three panels, one of 8 ranks,
# had shrunk them to 5 px; past this the values are in the hover and the colour bar
CELLS_WITH_TEXT = 12
MATRIX_MAX_PX = 560  # the tallest rank-by-rank comparison (compare_matrix)
COLOUR_BAR_PX = 60  # a heatmap's colour bar with its ticks, beside the right margin's toolbar

# the mesh axes each of the cost model's collective families runs over (gradients: dp and cp together;
# a hierarchical all-reduce's steps split dp: _groups)
FAMILY_AXES = {"tp": ("tp",), "dp": ("dp", "cp"), "zero": ("dp", "cp"), "cp": ("cp",), "pp": ("pp",)}


def predicted_comm_trace(model, parallel, gpus_per_node: int = 8) -> Trace:
    """One predicted step of communication: a comm span per rank and collective the cost model
    counts, on the rank's group of the mesh (see the module docstring). ``model``, ``parallel``: the
    simulator's ModelSpec and ParallelSpec (``paralab.sim.bridge.specs_from_run`` makes them from a
    run's config)."""
    from paralab.sim.counting import pipeline_hops, ring_wire_bytes

    p = parallel.resolved()
    hops = pipeline_hops(p)
    layout = mesh_layout(dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep if p.dp % p.ep == 0 else 1)
    world = layout.world_size
    number = rank_numbering(layout, p.rank_order)

    def node(rank: int) -> int:
        return rank // max(gpus_per_node, 1)

    stage_of = {number[rank]: layout.coord(rank)["pp"] for rank in range(world)}
    spans = []
    groups: dict[tuple[str, str, int], list[list[int]]] = {}  # every stage's rows run on the same groups
    for stage, family, op, payload, size, count in _payloads(model, p):
        if (family, op, size) not in groups:
            groups[family, op, size] = [[number[r] for r in g] for g in _groups(layout, family, op, size)]
        for group in groups[family, op, size]:
            for rank in (r for r in group if stage_of[r] == stage):
                if op == "send":
                    for peer, share in _send_peers(family, rank, group, count, hops, p.microbatches):
                        spans.append(Span(rank, COMM, op, 0.0, 0.0, name=f"{family} {op}", step=0,
                                          bytes=int(share * ring_wire_bytes(op, payload, 2)),
                                          payload_bytes=int(share * payload), group_size=2, peer=peer,
                                          inter_node=node(peer) != node(rank)))
                    continue
                spans.append(Span(rank, COMM, op, 0.0, 0.0, name=f"{family} {op}", step=0,
                                  bytes=int(count * ring_wire_bytes(op, payload, size)),
                                  payload_bytes=int(count * payload), group_size=size,
                                  group_ranks=group if len(group) < world else None,
                                  inter_node=node(ring_next(rank, group)) != node(rank)))
    meta = {"source": "predicted", "world_size": world, "dp": p.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp,
            "ep": layout.ep, "model": getattr(model, "name", ""), "gpus_per_node": gpus_per_node,
            "hierarchical_dp": p.hierarchical_dp, "rank_order": p.rank_order}
    return Trace(spans=spans, meta=meta)


def _payloads(model, p) -> list[tuple[int, str, str, float, int, float]]:
    """The cost model's rows for a GPU of each pipeline stage, (stage, *row) (paralab.sim.counting.
    comm_payloads: stages differ in their blocks, and the ends in the embedding and output layer); with
    context parallel the slice run's and the ring's or all-to-all's (paralab.sim.context), as its
    prediction counts."""
    from paralab.sim import context, counting

    rows_of = counting.comm_payloads if p.cp == 1 else context.gpu_payloads
    return [(stage, *row) for stage in range(p.pp) for row in rows_of(model, p, stage)]


def _send_peers(family: str, rank: int, line: list[int], count: float, hops: list[tuple[int, int]],
                microbatches: int) -> list[tuple[int, float]]:
    """(peer, sends per step) of a rank's point-to-point traffic: a pipeline rank sends each
    microbatch's activations and gradients where its chunks' neighbours sit
    (paralab.sim.counting.pipeline_hops); a context-parallel rank sends every hop to the ring's next
    rank."""
    if family == "cp":
        return [(ring_next(rank, line), count)]
    at = line.index(rank)
    peers: dict[int, float] = defaultdict(float)
    for sender, receiver in hops:
        if sender == at:
            peers[line[receiver]] += microbatches
    return list(peers.items())


def _groups(layout, family: str, op: str, size: int) -> list[list[int]]:
    """The groups a family's collectives run on: its mesh axes' (FAMILY_AXES), for a mixture of experts
    the expert groups (all-to-all) and the expert-data groups (the experts' own gradient reduction),
    for a tied embedding the two ends of each pipeline, for a pipeline's received slices (Megatron-LM's
    scatter/gather) the receiving stage's tp group; a hierarchical all-reduce's steps run on a dp
    group's nodes of consecutive ranks (``dp_intra``, ``size`` of them) and on the ranks of one local
    index across them (``dp_inter``), as paralab's ddp lays them out."""
    if family == "dp_intra":
        return [line[i : i + size] for line in layout.groups("dp") for i in range(0, len(line), size)]
    if family == "dp_inter":
        local = len(layout.groups("dp")[0]) // size  # ranks of one local index are this far apart
        return [line[i::local] for line in layout.groups("dp") for i in range(local)]
    if family == "ep":
        return layout.expert_groups()
    if family == "embedding":  # a tied embedding's two copies: each pipeline's first and last stage
        return [[line[0], line[-1]] for line in layout.groups("pp")]
    if family == "pp" and op == "all_gather":
        return layout.groups("tp")
    groups = layout.groups(*FAMILY_AXES.get(family, ("dp", "cp")))
    return groups if family in ("pp", "cp") or len(groups[0]) == size else layout.expert_data_groups()


def per_rank_step(trace, payload: bool = False) -> dict[str, float]:
    """op -> bytes per rank and per step: :meth:`paralab.trace.Trace.comm_bytes`'s rule (each rank's
    bytes over the steps it has), shared among the ranks."""
    trace = as_trace(trace)
    totals = trace.per_step_bytes(lambda s: s.kind, payload)
    return {op: float(total) / _ranks(trace) for op, total in sorted(totals.items())}


def links_per_rank_step(trace, payload: bool = False) -> dict[str, float]:
    """{"intra_node": bytes, "inter_node": bytes} per rank and per step (the rule of
    :func:`per_rank_step`)."""
    trace = as_trace(trace)
    split = trace.per_step_bytes(lambda s: "inter_node" if s.inter_node else "intra_node", payload)
    return {link: float(split[link]) / _ranks(trace) for link in ("intra_node", "inter_node")}


def _ranks(trace: Trace) -> int:
    return max(trace.world_size, 1)


LOG_SPREAD = 100  # the largest bar over the smallest above which bars go on a log axis (_y_axis_for_spread)


def compare_by_op(sources: dict, payload: bool = False, title: str | None = None):
    """Grouped bars, one group per op and one bar per source ({label: Trace or RunResult})."""
    graph = go()
    data = {label: per_rank_step(t, payload) for label, t in sources.items()}
    # the ops that moved bytes (a receive puts none on the wire)
    ops = sorted({op for per in data.values() for op, value in per.items() if value})
    scale, unit = byte_scale(max((v for per in data.values() for v in per.values()), default=0))
    fig = graph.Figure()
    for i, (label, per) in enumerate(data.items()):
        values = [per.get(op, 0.0) for op in ops]
        fig.add_trace(graph.Bar(
            x=ops, y=[v / scale for v in values], name=label, marker_color=_source_color(i),
            marker_pattern_shape="/" if i else "", customdata=[fmt_bytes(v) for v in values],
            hovertemplate=f"{label}<br>%{{x}}: %{{customdata}} per rank and step<extra></extra>",
        ))
    kind = _unit_label(payload)
    fig.update_layout(barmode="group", meta={"bytes": data, "unit": unit})
    _y_axis_for_spread(fig, data, scale, f"{kind} {unit} per rank and step")
    return style(fig, title or f"communication by op: measured beside predicted ({kind} bytes)", 380)


def _y_axis_for_spread(fig, data: dict, scale: float, title: str) -> bool:
    """A log y axis where the largest bar of ``data`` ({source: {key: bytes}}, drawn over ``scale``) is
    over LOG_SPREAD times the smallest above zero, and says so in its ``title``: a what-if run of a large
    model sends GiB where the measured one sent KiB, and on a linear axis the measured and predicted bars
    had shrunk to nothing beside it. It starts a decade under the smallest bar, so that one stands a
    decade tall, not a sliver. Returns whether the axis is logarithmic."""
    bars = [v / scale for per in data.values() for v in per.values() if v > 0]
    log = bool(bars) and max(bars) / min(bars) > LOG_SPREAD
    fig.update_yaxes(title_text=title + (" (log scale)" if log else ""), type="log" if log else "linear")
    if log:
        fig.update_yaxes(range=[math.log10(min(bars)) - 1, math.log10(max(bars)) + 0.2],
                         tickformat="~g")  # 0.0001, not plotly's "100µ" of a GiB
    return log


def compare_matrix(sources: dict, payload: bool = False, title: str | None = None):
    """One rank-by-rank heatmap per source (row = sender, column = receiver, as
    :func:`paralab.viz.comm.comm_matrix_data` credits bytes: the rule is said under the title), bytes
    per step, each with a colour bar in its own unit: a 64-rank panel is too small for text in its
    cells. Panels are titled by the sources' short names (:func:`short_names`)."""
    graph = go()
    names = short_names(sources)
    fig = make_subplots(rows=1, cols=len(sources), subplot_titles=names, horizontal_spacing=0.16)
    meta, boxed = {}, False
    for i, (label, t) in enumerate(sources.items(), 1):
        trace = as_trace(t)
        matrix = comm_matrix_per_step(trace, payload)
        scale, unit = byte_scale(max((max(row) for row in matrix), default=0))
        labels = [f"r{r}" for r in range(len(matrix))]
        # in a cell the number alone, in the colour bar's unit: "854.0 KiB" had been fitted into a third
        # of the width at some 6 px
        text = [[f"{v / scale:,.4g}" if v else "" for v in row] for row in matrix]  # 1,000 not 1e+03
        right = fig.get_subplot(1, i).xaxis.domain[1]
        fig.add_trace(graph.Heatmap(
            z=[[v / scale for v in row] for row in matrix], x=labels, y=labels, colorscale="Blues", text=text,
            customdata=[[fmt_bytes(v) for v in row] for row in matrix],
            name=label, texttemplate="%{text}" if len(matrix) * len(sources) <= CELLS_WITH_TEXT else None,
            # the unit alone, over the bar (the title says "per step"): "KiB per step" down its right side
            # had run over the next panel's rank labels
            colorbar=dict(title=dict(text=unit, side="top"), x=right + 0.01, xanchor="left", thickness=10),
            hovertemplate=f"{label}<br>%{{y}} → %{{x}}: %{{customdata}} per step<extra></extra>",
        ), 1, i)
        fig.update_yaxes(autorange="reversed", row=1, col=i, title_text="from rank" if i == 1 else None)
        fig.update_xaxes(title_text="to rank", row=1, col=i)
        boxed = draw_node_boxes(fig, trace, 1, i) or boxed
        meta[label] = {"ranks": len(matrix), "bytes_per_step": sum(map(sum, matrix)), "unit": unit}
    fig.update_layout(meta=meta)
    size = max(m["ranks"] for m in meta.values()) if meta else 1
    # taller with the ranks, to a cap: side by side the panels are a third of the width each, and a
    # 64-rank what-if had made them 1,000 px tall, its 4-rank neighbours narrow columns (a 64-rank panel
    # draws no text in its cells, and a colour map of 7 px rows reads)
    fig = style(fig, title or "bytes per step, rank by rank: measured beside predicted",
                max(380, min(120 + 14 * size, MATRIX_MAX_PX)))
    # the last panel's colour bar stands in the right margin: room for it beside the toolbar there
    fig.update_layout(margin_r=fig.layout.margin.r + COLOUR_BAR_PX)
    note_details(fig, sources)
    return say_matrix_rule(fig, boxed)


def compare_links(sources: dict, payload: bool = False, title: str | None = None):
    """Per source, the bytes each rank sends per step inside its node and across nodes (stacked, or
    side by side where the bars spread over a log axis: :func:`_y_axis_for_spread`), each bar under its
    source's short name (:func:`short_names`): a grown run's whole label, as a category,
    had turned to slant and squeezed the plot to a strip."""
    graph = go()
    data = {label: links_per_rank_step(t, payload) for label, t in sources.items()}
    scale, unit = byte_scale(max((sum(per.values()) for per in data.values()), default=0))
    names = short_names(data)
    fig = graph.Figure()
    for link, name, color in LINKS:
        values = [per[link] for per in data.values()]
        fig.add_trace(graph.Bar(
            x=names, y=[v / scale for v in values], name=link_legend(name, values), marker_color=color,
            customdata=[[label, fmt_bytes(v)] for label, v in zip(data, values)],
            hovertemplate=f"%{{customdata[0]}}<br>{name}: %{{customdata[1]}} per rank and step"
                          "<extra></extra>",
        ))
    fig.update_layout(barmode="stack", meta={"bytes": data, "unit": unit})
    # stacked heights mislead on a log axis: there each link gets its own bar beside the other
    if _y_axis_for_spread(fig, data, scale, f"{_unit_label(payload)} {unit} per rank and step"):
        fig.update_layout(barmode="group")
    fig = style(fig, title or "inside a node against across nodes: measured beside predicted", 360)
    note_details(fig, sources)
    return fig


def split_label(label: str) -> tuple[str, str]:
    """A source's label as its short name and the details in brackets after it ("predicted, 8 ranks
    (8 dp x 1 tp x 1 pp, tiny in fp32, 4/node)": "predicted, 8 ranks" and "8 dp x 1 tp x 1 pp, tiny
    in fp32, 4/node"): the name fits a panel's title or a bar's category at 820 px, the details go
    under the figure (:func:`note_details`) and on hover."""
    name, _, details = label.partition(" (")
    return name, details.removesuffix(")")


def short_names(labels) -> list[str]:
    """Each label's short name (:func:`split_label`), numbered where two would be the same ("predicted,
    4 ranks" and "predicted, 4 ranks #2"): plotly draws one category or panel title per name, and two
    sources of one name had been stacked into a single bar twice the height of either."""
    names: list[str] = []
    for label in labels:
        name = split_label(label)[0]
        number, unique = 1, name
        while unique in names:
            number += 1
            unique = f"{name} #{number}"
        names.append(unique)
    return names


def note_details(fig, sources: dict) -> None:
    """Under the plot, one line per source whose label has details (:func:`split_label`), under its
    short name (:func:`short_names`), with the bottom margin grown to hold them."""
    details = [split_label(label)[1] for label in sources]
    lines = [f"{name}: {said}" for name, said in zip(short_names(sources), details) if said]
    if not lines:
        return
    fig.add_annotation(text="<br>".join(lines), xref="paper", yref="paper", x=0, y=0, xanchor="left",
                       yanchor="top", yshift=-50, align="left", showarrow=False,
                       font=dict(size=12, color="#555"))
    fig.update_layout(margin_b=60 + 18 * len(lines), height=fig.layout.height + 18 * len(lines))


def _source_color(i: int) -> str:
    return SERIES_COLORS[i % len(SERIES_COLORS)]
