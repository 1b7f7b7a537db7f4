"""The rank layout of a hybrid run: which global rank holds which (pp, dp, tp) coordinate.

One block per pipeline stage, left to right; inside it one row per data-parallel replica and one
column per tensor-parallel rank, so a row of a block is a tensor-parallel group (neighbouring
ranks), a column of a block a data-parallel group, and the same cell in every block one pipeline.
"""

from __future__ import annotations

from paralab.layout import Layout, mesh_layout
from paralab.viz._common import EXTRA_COLORS, MICROBATCH_COLORS, go, style


def layout_of(obj) -> Layout:
    """A Layout from a Layout, a RunResult, a Trace or a trace's meta dict that holds one (measured
    runs) or records dp, tp and pp (simulated runs), or a mesh dict (``{"shape": [pp, dp, tp]}``)."""
    if isinstance(obj, Layout):
        return obj
    if isinstance(getattr(obj, "layout", None), Layout):
        return obj.layout
    if isinstance(obj, dict) and "shape" in obj:
        pp, dp, tp = obj["shape"]
        return mesh_layout(dp=dp, tp=tp, pp=pp)
    meta = obj if isinstance(obj, dict) else getattr(getattr(obj, "trace", obj), "meta", None)
    if isinstance(meta, dict) and "layout" in meta:
        return Layout.from_dict(meta["layout"])
    if isinstance(meta, dict) and all(k in meta for k in ("dp", "tp", "pp")):
        return mesh_layout(dp=max(int(meta["dp"] or 1), 1), tp=max(int(meta["tp"] or 1), 1),
                           pp=max(int(meta["pp"] or 1), 1))
    raise TypeError(f"expected a Layout, a RunResult or Trace, or a mesh dict, got {type(obj).__name__}")


def mesh(obj, title: str | None = None):
    """Draw the rank grid. ``fig.layout.meta`` holds ``shape`` [pp, dp, tp] and ``coords``
    (global rank -> [pp, dp, tp]), what the cells show."""
    graph = go()
    layout = layout_of(obj)
    coords = layout.coords
    colors = MICROBATCH_COLORS + EXTRA_COLORS
    fig = graph.Figure()
    for p in range(layout.pp):
        ranks = [r for r, c in coords.items() if c[0] == p]
        fig.add_trace(graph.Scatter(
            x=[p * (layout.tp + 1) + coords[r][2] for r in ranks], y=[coords[r][1] for r in ranks],
            mode="markers+text", name=f"stage pp{p}", text=[str(r) for r in ranks],
            textfont=dict(color="white", size=14), marker=dict(symbol="square", size=38, color=colors[p % len(colors)]),
            customdata=[list(coords[r]) for r in ranks],
            hovertemplate="rank %{text}: pp %{customdata[0]}, dp %{customdata[1]}, tp %{customdata[2]}<extra></extra>",
        ))
        fig.add_annotation(x=p * (layout.tp + 1) + (layout.tp - 1) / 2, y=-0.8, text=f"pp{p}", showarrow=False)
    ticks = [(p * (layout.tp + 1) + t, f"tp{t}") for p in range(layout.pp) for t in range(layout.tp)]
    fig.update_xaxes(tickvals=[x for x, _ in ticks], ticktext=[t for _, t in ticks], showgrid=False, zeroline=False)
    fig.update_yaxes(tickvals=list(range(layout.dp)), ticktext=[f"dp{d}" for d in range(layout.dp)],
                     showgrid=False, zeroline=False, range=[layout.dp - 0.4, -1.2])  # dp0 on top
    fig.update_layout(meta={"shape": list(layout.shape), "coords": {str(r): list(c) for r, c in coords.items()}})
    name = f"rank layout: dp={layout.dp} x tp={layout.tp} x pp={layout.pp}"
    return style(fig, title or name, max(260, 90 + 70 * layout.dp))
