"""Memory per rank, stacked by what holds it: parameters, gradients, optimizer states, activations.

The input is what a run measured (``RunResult.summary["memory_by_kind"]``, one dict per rank, peaks
per kind) or what the cost model predicts (``memory_bytes_per_gpu`` of a Prediction, one "GPU").
Several runs side by side (one per strategy or ZeRO stage) use a two-level x axis: run, then rank.
"""

from __future__ import annotations

from collections.abc import Mapping

from paralab.viz._common import MEMORY_COLORS, MEMORY_KINDS, as_summary, fmt_bytes, go, style

_RUN_KEYS = ("memory_by_kind", "memory_bytes_per_gpu")


def memory_by_rank(run) -> list[dict[str, float]]:
    """One {kind: bytes} per rank from a RunResult, summary dict, Prediction or per-kind dict."""
    if isinstance(run, Mapping) and any(k in run for k in MEMORY_KINDS):
        return [dict(run)]  # already one per-kind dict (e.g. a prediction's memory_bytes_per_gpu)
    if isinstance(run, list):
        return [dict(r) for r in run]
    s = as_summary(run)
    if "memory_by_kind" in s:
        return [dict(r) for r in s["memory_by_kind"]]
    if "memory_bytes_per_gpu" in s:
        return [dict(s["memory_bytes_per_gpu"])]
    raise ValueError("no memory in this run: expected memory_by_kind (measured) or memory_bytes_per_gpu (predicted)")


def memory(runs, title: str | None = None, unit: str = "MiB"):
    """Stacked bars per rank of one run, or of several runs given as {label: run}.

    ``fig.layout.meta["totals"]`` lists the per-bar totals in bytes, in drawing order.
    """
    graph = go()
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    single = not isinstance(runs, Mapping) or any(k in runs for k in (*MEMORY_KINDS, *_RUN_KEYS))
    labelled = {"": runs} if single else dict(runs)
    runs_x, ranks_x, per_bar = [], [], []
    for label, run in labelled.items():
        for r, kinds in enumerate(memory_by_rank(run)):
            runs_x.append(label)
            ranks_x.append(f"r{r}")
            per_bar.append(kinds)
    if not any(runs_x):
        x = ranks_x
    elif len(set(runs_x)) == len(runs_x):  # one bar per run (predictions: "per GPU"): label only
        x = runs_x
    else:
        x = [runs_x, ranks_x]
    kinds = [k for k in MEMORY_KINDS if any(k in b for b in per_bar)]
    kinds += sorted({k for b in per_bar for k in b} - set(kinds) - {"total"})
    fig = graph.Figure()
    for kind in kinds:
        values = [b.get(kind, 0) for b in per_bar]
        fig.add_trace(graph.Bar(
            x=x, y=[v / scale for v in values], name=kind, marker_color=MEMORY_COLORS.get(kind, "#999"),
            customdata=[[fmt_bytes(v), int(v)] for v in values],
            hovertemplate=f"{kind}: %{{customdata[0]}} (%{{customdata[1]}} B)<extra></extra>",
        ))
    totals = [sum(v for k, v in b.items() if k != "total") for b in per_bar]
    fig.update_layout(barmode="stack", showlegend=True,  # name the kind even when there is one
                      meta={"totals": totals, "bars": len(per_bar)})
    fig.update_yaxes(title_text=f"peak memory ({unit})")
    return style(fig, title or "memory per rank by kind", 380)
