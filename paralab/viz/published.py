"""How far to trust the simulator: its predictions of published training runs (paralab.sim.published),
run by run and as one model spreads over more GPUs (notebook 08).

Both take what :func:`paralab.sim.published.compare` and :func:`~paralab.sim.published.scaling` return,
so a figure draws the numbers the tests hold, not a copy of them.
"""

from __future__ import annotations

from paralab.sim.published import BOUND, METRICS, as_reported
from paralab.viz._common import SERIES_COLORS, go, log_ticks, make_subplots, style

SYMBOLS = ["circle", "diamond", "square", "triangle-up", "star", "cross"]
SPREAD = 1.12  # x factor between organisations drawn at one GPU count (log axis): ~9 px at 820 px wide


def spread(compared) -> list[float]:
    """Where each run is drawn on the log GPU axis: its GPU count times SPREAD ** k, the organisations
    with runs at that count spread evenly about it in the order they first appear (k = 0 for one
    alone), so that markers of several at one count sit side by side, not on top of each other."""
    organisations = list(dict.fromkeys(c.run.organisation for c in compared))
    at: dict[int, list[str]] = {}
    for c in compared:
        at.setdefault(c.run.gpus, [])
        if c.run.organisation not in at[c.run.gpus]:
            at[c.run.gpus].append(c.run.organisation)
    for names in at.values():
        names.sort(key=organisations.index)
    return [c.run.gpus * SPREAD ** (at[c.run.gpus].index(c.run.organisation) - (len(at[c.run.gpus]) - 1) / 2)
            for c in compared]


def published_errors(compared, title: str | None = None):
    """Each run's error (predicted over published, less one, in %) against its GPU count (log axis),
    one colour and symbol per organisation, the +-20% band shaded; organisations with runs at the
    same count are drawn a little apart (:func:`spread`), the hover saying the true count. Runs the
    model is known to miss (``known_miss``) are drawn open. ``fig.layout.meta`` holds the errors and
    the true GPU counts in drawing order."""
    graph = go()
    fig = graph.Figure()
    organisations = list(dict.fromkeys(c.run.organisation for c in compared))
    placed = list(zip(compared, spread(compared)))
    meta: dict = {"band": BOUND, "runs": [], "errors": [], "gpus": []}
    for i, organisation in enumerate(organisations):
        rows = [c for c in compared if c.run.organisation == organisation]
        symbol = SYMBOLS[i % len(SYMBOLS)]
        fig.add_trace(graph.Scatter(
            x=[x for c, x in placed if c.run.organisation == organisation], y=[100 * c.error for c in rows],
            mode="markers", name=organisation,
            marker=dict(color=SERIES_COLORS[i % len(SERIES_COLORS)], size=11, line=dict(width=2),
                        symbol=[symbol + ("-open" if c.run.known_miss else "") for c in rows]),
            customdata=[[c.run.label, c.run.hardware.name, as_reported(c.run.published),
                         as_reported(c.predicted), f"{c.run.gpus:,}", METRICS[c.run.metric]] for c in rows],
            # each run's metric named: one reports tokens/s, another MFU %, and bare figures (1.327e+05
            # beside 49.2) had not said which
            hovertemplate="%{customdata[0]}<br>%{customdata[4]} GPUs (%{customdata[1]}), %{customdata[5]}: "
                          "published %{customdata[2]}, predicted %{customdata[3]}, %{y:+.1f}%<extra></extra>",
        ))
        meta["runs"] += [c.run.label for c in rows]
        meta["errors"] += [c.error for c in rows]
        meta["gpus"] += [c.run.gpus for c in rows]
    fig.add_hrect(y0=-100 * BOUND, y1=100 * BOUND, fillcolor="#54A24B", opacity=0.12, line_width=0)
    fig.add_hline(y=0, line=dict(color="#555555", width=1))
    gpus = meta["gpus"]
    fig.update_xaxes(type="log", tickvals=log_ticks(min(gpus), max(gpus)), tickformat=",",
                     title_text="GPUs in the run (log scale)")
    errors = [100 * e for e in meta["errors"]]
    fig.update_yaxes(title_text="throughput error: predicted / published - 1", ticksuffix="%", zeroline=False,
                     range=[min(-125 * BOUND, min(errors) - 5), max(125 * BOUND, max(errors) + 5)])
    covered = [abs(c.error) for c in compared if not c.run.known_miss]
    meta["mean_abs_error"] = sum(abs(e) for e in meta["errors"]) / len(compared)
    meta["mean_abs_error_covered"] = sum(covered) / len(covered)
    fig.update_layout(meta=meta)
    return style(fig, title or (  # short enough not to be cut in a notebook 820 px wide
        f"{len(compared)} published runs: mean |error| {meta['mean_abs_error_covered']:.1%} over the "
        f"{len(covered)} inside ±{BOUND:.0%}; open: the {len(compared) - len(covered)} known misses"
    ), 460)


def batches(series) -> list[int]:
    """A scaling series' global batch (sequences per step) at each of its GPU counts."""
    return [c.run.parallel.resolved().global_batch for c in series.points]


def batch_text(series) -> str:
    """Whether a series keeps its global batch as the GPUs grow, or grows it with them (weak
    scaling: each GPU's compute stays the same)."""
    sizes = batches(series)
    if len(set(sizes)) == 1:
        return f"global batch fixed: {sizes[0]:,} sequences"
    per_gpu = {b / g for b, g in zip(sizes, series.gpus)}
    if len(per_gpu) == 1:
        n = per_gpu.pop()
        return f"weak scaling: {n:,g} sequence{'s' * (n != 1)} per GPU"
    return f"global batch growing: {sizes[0]:,} to {sizes[-1]:,} sequences"


def published_scaling(series, title: str | None = None):
    """One panel per model run at several GPU counts: the per-GPU throughput each count keeps, as a
    share of the fewest GPUs', published (solid) against predicted (dashed). A panel's title says
    whether its global batch is fixed or grows with the GPUs (:func:`batch_text`) and gives both
    losses from its fewest GPUs to its most. ``fig.layout.meta["series"]`` holds the shares and the
    batches."""
    graph = go()
    cols = 3
    rows = -(-len(series) // cols)
    titles = [
        # the second line says weak scaling where it is, so a name that says it too is not repeated
        f"{s.name.removesuffix(', weak scaling')}<br>{batch_text(s)}<br>lost: published "
        f"{s.loss(predicted=False):.1%}, predicted {s.loss(predicted=True):.1%}"
        + (" (miss)" if s.miss else "")
        for s in series
    ]
    height = 300 * rows + 145
    # ~125 px between rows for a panel's three-line title and the ticks above it, however many rows
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=125 / (height - 190))
    meta: dict = {"series": []}
    lowest = 1.0
    for i, s in enumerate(series):
        row, col = i // cols + 1, i % cols + 1
        for predicted, name, color, dash in ((False, "published", SERIES_COLORS[0], "solid"),
                                             (True, "predicted", SERIES_COLORS[1], "dash")):
            kept = s.kept(predicted=predicted)
            lowest = min(lowest, *kept)
            fig.add_trace(graph.Scatter(
                x=s.gpus, y=[100 * k for k in kept], mode="lines+markers", name=name, legendgroup=name,
                showlegend=i == 0, line=dict(color=color, dash=dash, width=2.5),
                marker=dict(color=color, size=8),
                hovertemplate=f"{name}: %{{x:,}} GPUs keep %{{y:.1f}}% of the fewest's per-GPU "
                              "throughput<extra></extra>",
            ), row, col)
        fig.update_xaxes(type="log", tickvals=s.gpus, tickformat=",", row=row, col=col)
        meta["series"].append({"name": s.name, "gpus": s.gpus, "published": s.kept(predicted=False),
                               "predicted": s.kept(predicted=True), "miss": bool(s.miss),
                               "global_batch": batches(s)})
    for i in range(len(series), rows * cols):  # a last row's empty cells: no axes to read as a plot
        fig.update_xaxes(visible=False, row=rows, col=i % cols + 1)
        fig.update_yaxes(visible=False, row=rows, col=i % cols + 1)
    for col in range(1, min(cols, len(series)) + 1):  # the axis title under each column's lowest panel
        fig.update_xaxes(title_text="GPUs (log scale)", row=(len(series) - col) // cols + 1, col=col)
    fig.update_yaxes(range=[100 * lowest - 2, 101.5], ticksuffix="%")
    for row in range(1, rows + 1):
        fig.update_yaxes(title_text="per-GPU throughput kept", row=row, col=1)
    fig.update_annotations(font_size=11)
    fig.update_layout(meta=meta)
    # short enough not to be cut in a notebook 820 px wide; the legend says published and predicted
    style(fig, title or "Scaling out: per-GPU throughput at each GPU count, as % of that on the fewest GPUs",
          height)
    fig.update_layout(margin=dict(l=70, t=140, b=50))
    return fig
