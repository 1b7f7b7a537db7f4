"""Memory per rank, stacked by what holds it: parameters, gradients, optimizer states, activations.

The input is what a run measured (``RunResult.summary["memory_by_kind"]``, one dict per rank, peaks
per kind) or what the cost model predicts (``memory_bytes_per_gpu`` of a Prediction, one "GPU").
Several runs side by side (one per strategy or ZeRO stage) use a two-level x axis: run, then rank.
"""

from __future__ import annotations

from collections.abc import Mapping

from paralab.viz._common import MEMORY_COLORS, MEMORY_KINDS, as_summary, fmt_bytes, go, log_ticks, style

_RUN_KEYS = ("memory_by_kind", "memory_bytes_per_gpu")
UNIT_BYTES = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def memory_by_rank(run) -> list[dict[str, float]]:
    """One {kind: bytes} per rank from a RunResult, summary dict, Prediction or per-kind dict."""
    return _memory_of(run)[0]


def _memory_of(run) -> tuple[list[dict[str, float]], bool]:
    """:func:`memory_by_rank`'s dicts, and whether they are a prediction's one GPU (a prediction, or one
    per-kind dict such as its memory_bytes_per_gpu): the fullest GPU, not rank 0 (a prediction's bar had
    been labelled "r0", where the fullest of a pipeline is often another)."""
    if _per_kind(run):
        return [dict(run)], True
    if isinstance(run, list):
        return [dict(r) for r in run], False
    s = as_summary(run)
    if "memory_by_kind" in s:
        return [dict(r) for r in s["memory_by_kind"]], False
    if "memory_bytes_per_gpu" in s:
        return [dict(s["memory_bytes_per_gpu"])], True
    raise ValueError("no memory in this run: expected memory_by_kind (measured) "
                     "or memory_bytes_per_gpu (predicted)")


def _per_kind(run) -> bool:
    """Whether ``run`` is one {kind: bytes} dict, not a summary (a prediction's to_dict also has a
    "params", its parameter count, and had been drawn as one)."""
    return (isinstance(run, Mapping) and not {"memory_by_kind", "memory_bytes_per_gpu"} & set(run)
            and any(k in run for k in MEMORY_KINDS))


def _rank_numbers(run) -> list[int] | None:
    """The ranks memory_by_rank's entries belong to, where a trace imported from some ranks' profiles
    names them (``memory_ranks``); None when they are every rank in order."""
    summary = run if isinstance(run, Mapping) else getattr(run, "summary", None)
    return summary.get("memory_ranks") if isinstance(summary, Mapping) else None


def memory(runs, title: str | None = None, unit: str = "MiB", what: str = "peak memory"):
    """Stacked bars per rank of one run, or of several runs given as {label: run}; ``what`` names the
    moment the bars are of on the y axis (a run's peak; ``resident memory`` for what stays between
    steps). A kind no bar holds is left out of the legend, where it would name nothing drawn.

    ``fig.layout.meta["totals"]`` lists the per-bar totals in bytes, in drawing order.
    """
    graph = go()
    scale = UNIT_BYTES[unit]
    single = not isinstance(runs, Mapping) or any(k in runs for k in (*MEMORY_KINDS, *_RUN_KEYS))
    labelled = {"": runs} if single else dict(runs)
    runs_x, ranks_x, per_bar = [], [], []
    for label, run in labelled.items():
        by_rank, predicted = _memory_of(run)
        for rank, kinds in zip(_rank_numbers(run) or range(len(by_rank)), by_rank, strict=True):
            runs_x.append(label)
            ranks_x.append("the fullest GPU" if predicted else f"r{rank}")
            per_bar.append(kinds)
    if not any(runs_x):
        x = ranks_x
    elif len(set(runs_x)) == len(runs_x):  # one bar per run (predictions: "per GPU"): label only
        x = runs_x
    else:
        x = [runs_x, ranks_x]
    kinds = [k for k in MEMORY_KINDS if any(b.get(k) for b in per_bar)]
    kinds += sorted({k for b in per_bar for k, v in b.items() if v} - set(kinds) - {"total"})
    fig = graph.Figure()
    for kind in kinds:
        values = [b.get(kind, 0) for b in per_bar]
        fig.add_trace(graph.Bar(
            x=x, y=[v / scale for v in values], name=kind, marker_color=MEMORY_COLORS.get(kind, "#999"),
            customdata=[[fmt_bytes(v), int(v)] for v in values],
            hovertemplate=f"{kind}: %{{customdata[0]}} (%{{customdata[1]:,.0f}} B)<extra></extra>",
        ))
    totals = [sum(v for k, v in b.items() if k != "total") for b in per_bar]
    fig.update_layout(barmode="stack", showlegend=True,  # name the kind even when there is one
                      meta={"totals": totals, "bars": len(per_bar)})
    fig.update_yaxes(title_text=f"{what} ({unit})")
    return style(fig, title or "memory per rank by kind", 380)


def measured_vs_predicted(rows: list[dict], title: str, unit: str = "MiB", y_title: str = "bytes"):
    """Grouped bars, one pair per row: what a run measured beside what the simulator predicts.

    ``rows``: dicts with ``label``, ``measured`` and ``predicted`` (bytes). The hover and
    ``fig.layout.meta["ratios"]`` give measured / predicted per row, the number a reader checks."""
    graph = go()
    scale = UNIT_BYTES[unit]
    labels = [r["label"] for r in rows]
    ratios = [r["measured"] / r["predicted"] if r["predicted"] else float("nan") for r in rows]
    fig = graph.Figure()
    for key, color in (("measured", MEMORY_COLORS["activations"]), ("predicted", "#BAB0AC")):
        values = [r[key] for r in rows]
        fig.add_trace(graph.Bar(
            x=labels, y=[v / scale for v in values], name=key, marker_color=color,
            customdata=[[fmt_bytes(v), ratio] for v, ratio in zip(values, ratios)],
            hovertemplate=f"%{{x}}, {key}: %{{customdata[0]}} (measured / predicted %{{customdata[1]:.2f}})"
                          "<extra></extra>",
        ))
    fig.update_layout(barmode="group", meta={"labels": labels, "ratios": ratios})
    fig.update_yaxes(title_text=f"{y_title} ({unit})")
    return style(fig, title, 400)


def memory_vs(points: dict[str, list[tuple[float, float, float]]], x_title: str, title: str,
              unit: str = "MiB", y_title: str = "activations per layer"):
    """How memory grows with one quantity (sequence length, micro-batch): per series, measured points
    over the predicted line. ``points``: {series: [(x, measured bytes, predicted bytes), ...]}."""
    graph = go()
    scale = UNIT_BYTES[unit]
    fig = graph.Figure()
    palette = [MEMORY_COLORS["activations"], MEMORY_COLORS["params"], MEMORY_COLORS["optimizer"],
               MEMORY_COLORS["grads"], "#9467BD", "#8C564B"]
    for i, (series, rows) in enumerate(points.items()):
        color = palette[i % len(palette)]
        xs = [r[0] for r in rows]
        fig.add_trace(graph.Scatter(
            x=xs, y=[r[2] / scale for r in rows], mode="lines", name=f"{series}, predicted",
            line=dict(color=color, dash="dash"), customdata=[fmt_bytes(r[2]) for r in rows],
            hovertemplate=f"{series}: %{{x:,}} -> %{{customdata}} predicted<extra></extra>"))
        fig.add_trace(graph.Scatter(
            x=xs, y=[r[1] / scale for r in rows], mode="markers", name=f"{series}, measured",
            marker=dict(color=color, size=10), customdata=[fmt_bytes(r[1]) for r in rows],
            hovertemplate=f"{series}: %{{x:,}} -> %{{customdata}} measured<extra></extra>"))
    xs = sorted({r[0] for rows in points.values() for r in rows})
    ys = [v / scale for rows in points.values() for r in rows for v in r[1:]]
    fig.update_xaxes(title_text=x_title, type="log", tickvals=xs, ticktext=[f"{x:,g}" for x in xs])
    fig.update_yaxes(title_text=f"{y_title} ({unit})", type="log", tickvals=log_ticks(min(ys), max(ys)),
                     tickformat=",~g")
    fig.update_layout(meta={"series": list(points)})
    return style(fig, title, 420)
