"""The rank layout of a hybrid run: which global rank holds which (pp, dp, cp, tp) coordinate.

One block per pipeline stage, left to right; inside it one row per data-parallel replica and one
column per tensor-parallel rank (per (cp, tp) pair with context parallelism: cp0's tp ranks, then
cp1's, ...), so a row of a block holds the tensor- and context-parallel groups (neighbouring
ranks), a column of a block a data-parallel group, and the same cell in every block one pipeline.
"""

from __future__ import annotations

from paralab.layout import Layout, mesh_layout
from paralab.viz._common import EXTRA_COLORS, MICROBATCH_COLORS, go, style


def layout_of(obj) -> Layout:
    """A Layout from a Layout, a RunResult, a Trace or a trace's meta dict that holds one (measured
    runs) or records dp, tp and pp (simulated runs), or a mesh dict (``{"shape": [pp, dp, cp, tp]}``, or
    ``[pp, dp, tp]`` as traces made before the cp axis have it)."""
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
        degrees = {axis: max(int(meta.get(axis) or 1), 1) for axis in ("dp", "tp", "pp", "cp")}
        return mesh_layout(**degrees)
    raise TypeError(f"expected a Layout, a RunResult or Trace, or a mesh dict, got {type(obj).__name__}")


def mesh(obj, title: str | None = None):
    """Draw the rank grid. ``fig.layout.meta`` holds ``shape`` (one degree per axis of
    paralab.layout.AXES) and ``coords`` (global rank -> its coordinate, in AXES order), what the
    cells show."""
    graph = go()
    layout = layout_of(obj)
    coords = layout.coords
    colors = MICROBATCH_COLORS + EXTRA_COLORS
    columns = layout.cp * layout.tp  # (cp, tp) pairs, tp fastest

    def column(rank):
        at = layout.coord(rank)
        return at["pp"] * (columns + 1) + at["cp"] * layout.tp + at["tp"]

    where = "pp %{customdata[0]}, dp %{customdata[1]}, " + ("cp %{customdata[2]}, " if layout.cp > 1 else "")
    fig = graph.Figure()
    for p in range(layout.pp):
        ranks = [r for r in coords if layout.coord(r)["pp"] == p]
        fig.add_trace(graph.Scatter(
            x=[column(r) for r in ranks], y=[layout.coord(r)["dp"] for r in ranks],
            mode="markers+text", name=f"stage pp{p}", text=[str(r) for r in ranks],
            textfont=dict(color="white", size=14), marker=dict(symbol="square", size=38, color=colors[p % len(colors)]),
            customdata=[list(coords[r]) for r in ranks],
            hovertemplate="rank %{text}: " + where + "tp %{customdata[3]}<extra></extra>",
        ))
        fig.add_annotation(x=p * (columns + 1) + (columns - 1) / 2, y=-0.8, text=f"pp{p}", showarrow=False)
    pairs = [(c, t) for c in range(layout.cp) for t in range(layout.tp)]
    names = [f"tp{t}" if layout.cp == 1 else f"cp{c} tp{t}" for c, t in pairs]
    ticks = [(p * (columns + 1) + i, name) for p in range(layout.pp) for i, name in enumerate(names)]
    fig.update_xaxes(tickvals=[x for x, _ in ticks], ticktext=[t for _, t in ticks], showgrid=False, zeroline=False)
    fig.update_yaxes(tickvals=list(range(layout.dp)), ticktext=[f"dp{d}" for d in range(layout.dp)],
                     showgrid=False, zeroline=False, range=[layout.dp - 0.4, -1.2])  # dp0 on top
    fig.update_layout(meta={"shape": list(layout.shape), "coords": {str(r): list(c) for r, c in coords.items()}})
    cp = f" x cp={layout.cp}" if layout.cp > 1 else ""
    name = f"rank layout: dp={layout.dp}{cp} x tp={layout.tp} x pp={layout.pp}"
    return style(fig, title or name, max(260, 90 + 70 * layout.dp))
