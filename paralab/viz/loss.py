"""Loss curves: the first check that a parallel strategy trains like single-device training."""

from __future__ import annotations

from paralab.viz._common import go, style


def loss_curves(runs: dict, title: str | None = None, log_y: bool = False):
    """One line per run: ``{label: losses}`` where losses is a list of floats or a RunResult."""
    graph = go()
    fig = graph.Figure()
    for label, run in runs.items():
        losses = list(getattr(run, "losses", run))
        fig.add_trace(graph.Scatter(x=list(range(len(losses))), y=losses, mode="lines+markers", name=str(label),
                                    hovertemplate=f"{label} step %{{x}}: loss %{{y:.4f}}<extra></extra>"))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss", type="log" if log_y else "linear")
    return style(fig, title or "training loss", 340)
