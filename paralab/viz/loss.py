"""Loss curves: the first check that a parallel strategy trains like single-device training.

When it does, the curves lie on top of one another and a reader sees one line and several legend
entries. So lines that coincide are drawn in decreasing widths (each stays visible as a rim around
the next) and the figure says which overlap and by how little they differ.
"""

from __future__ import annotations

from paralab.viz._common import go, note_overlaps, overlapping, style

# every model the lab trains is a language model scored by mean cross-entropy per token, natural log
LOSS_AXIS = "loss (cross-entropy, nats per token)"


def loss_curves(runs: dict, title: str | None = None, log_y: bool = False, y_title: str = LOSS_AXIS):
    """One line per run: ``{label: losses}`` where losses is a list of floats or a RunResult.
    ``y_title``: the loss axis's title, for losses of another kind than the lab's models'.
    ``fig.layout.meta["overlap"]``: see :func:`overlapping`."""
    graph = go()
    series = {str(label): list(getattr(run, "losses", run)) for label, run in runs.items()}
    groups = overlapping(series)
    rank_in_group = {label: (i, len(g["lines"])) for g in groups for i, label in enumerate(g["lines"])}
    fig = graph.Figure()
    for label, losses in series.items():
        i, n = rank_in_group.get(label, (0, 1))
        width = 2 + 3 * (n - 1 - i)  # the first of n overlapping lines widest, the last 2 px on top
        fig.add_trace(graph.Scatter(x=list(range(len(losses))), y=losses, mode="lines+markers", name=label,
                                    line=dict(width=width), marker=dict(size=4 + width),
                                    hovertemplate=f"{label} step %{{x}}: loss %{{y:.6f}}<extra></extra>"))
    note_overlaps(fig, groups, len(series))
    fig.update_xaxes(title_text="step", dtick=1 if max(map(len, series.values()), default=0) <= 20 else None)
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "linear")
    fig.update_layout(meta={"overlap": groups})
    return style(fig, title or "training loss", 360)
