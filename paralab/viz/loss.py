"""Loss curves: the first check that a parallel strategy trains like single-device training.

When it does, the curves lie on top of one another and a reader sees one line and several legend
entries. So lines that coincide are drawn in decreasing widths (each stays visible as a rim around
the next) and the figure says which overlap and by how little they differ.
"""

from __future__ import annotations

from paralab.viz._common import go, style

# Lines closer than this fraction of the plot's height everywhere cannot be told apart by eye.
OVERLAP = 0.005
NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def overlapping(runs: dict[str, list[float]]) -> list[dict]:
    """Groups of curves that coincide on the plot: ``lines`` (labels, at least two) and
    ``max_rel_diff`` (the largest relative difference between any two of them at any step)."""
    values = [v for losses in runs.values() for v in losses]
    span = (max(values) - min(values)) if values else 0.0
    groups: list[list[str]] = []
    for label, losses in runs.items():
        for group in groups:
            first = runs[group[0]]
            if len(first) == len(losses) and all(abs(a - b) <= OVERLAP * span for a, b in zip(first, losses)):
                group.append(label)
                break
        else:
            groups.append([label])
    out = []
    for group in groups:
        if len(group) > 1:
            rel = max(abs(a - b) / max(abs(b), 1e-30) for x in group for y in group
                      for a, b in zip(runs[x], runs[y]))
            out.append({"lines": group, "max_rel_diff": rel})
    return out


def overlap_note(groups: list[dict], total: int) -> str:
    """'all four lines overlap: max relative difference 3e-08', or which ones do."""
    notes = []
    for g in groups:
        n = len(g["lines"])
        who = (f"all {NUMBERS[n] if n < len(NUMBERS) else n} lines" if n == total
               else ", ".join(g["lines"][:-1]) + " and " + g["lines"][-1])
        notes.append(f"{who} overlap: max relative difference {g['max_rel_diff']:.0e}")
    return "; ".join(notes)


def loss_curves(runs: dict, title: str | None = None, log_y: bool = False):
    """One line per run: ``{label: losses}`` where losses is a list of floats or a RunResult.
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
    note = overlap_note(groups, len(series))
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=1, y=1, xanchor="right", yanchor="bottom",
                           showarrow=False, font=dict(size=12, color="#333"), bgcolor="#F7F7F7")
    fig.update_xaxes(title_text="step", dtick=1 if max(map(len, series.values()), default=0) <= 20 else None)
    fig.update_yaxes(title_text="loss", type="log" if log_y else "linear")
    fig.update_layout(meta={"overlap": groups})
    return style(fig, title or "training loss", 360)
