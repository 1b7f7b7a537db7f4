"""The overlap lesson's figure (notebook 14): how much of a step's communication can hide behind its
compute, against the tokens each GPU computes per step."""

from __future__ import annotations

import math

from paralab.viz._common import SERIES_COLORS, go, powers_of_ten, style

# each curve's own dash: past their thresholds the curves all lie at 100%, where a solid line drawn
# over another had hidden it (the "8 per node" curve had seemed to stop at its threshold)
DASHES = ("solid", "dash", "dot", "dashdot")


def hiding(curves: dict, tokens: list[float], thresholds: dict | None = None, title: str | None = None):
    """``curves`` {label: [compute over communication time at each of ``tokens``]}: the share of the
    communication that can hide, min(1, ratio), against tokens per GPU per step; ``thresholds``
    {label: tokens} where each curve reaches 1, marked."""
    graph = go()
    fig = graph.Figure()
    for i, (label, ratios) in enumerate(curves.items()):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        points = sorted(zip(tokens, (min(1.0, r) for r in ratios)))
        if thresholds and label in thresholds:  # the curve's kink, where it reaches 1, between the samples
            points = sorted({*points, (thresholds[label], 1.0)})
        fig.add_trace(graph.Scatter(x=[t for t, _ in points], y=[r for _, r in points], mode="lines",
                                    name=label, line=dict(color=color, width=3,
                                                          dash=DASHES[i % len(DASHES)]),
                                    hovertemplate=f"{label}: %{{x:,.0f}} tokens per GPU, "
                                                  f"%{{y:.0%}} can hide<extra></extra>"))
        if thresholds and label in thresholds:
            fig.add_vline(x=thresholds[label], line_dash="dot", line_color=color)
            # on a log axis an annotation's x is the exponent (add_vline's own label lands at 10^x)
            fig.add_annotation(x=math.log10(thresholds[label]), y=1, yref="y domain", yanchor="bottom",
                               text=f"{thresholds[label]:,.0f}", showarrow=False, font=dict(color=color))
    # powers of ten only: a log axis's minor labels ("2", "5") read as counts of tokens of their own; the
    # axis runs from the power of ten at or below the fewest tokens to the one at or above the most, so
    # that at least three are labelled (128 to 65,536 tokens had shown 1,000 and 10,000 alone)
    drawn = [t for t in tokens if t > 0] or [1.0]
    ticks = powers_of_ten(min(drawn), max(drawn))
    low = math.log10(ticks[0])
    fig.update_xaxes(type="log", dtick=1, tickformat=",.0f", range=[low, max(math.log10(ticks[-1]), low + 2)],
                     title_text="tokens each GPU computes per step (log scale)")
    # 0% a little above the x axis: at its foot it had met the x axis's first label ("100") in the corner
    fig.update_yaxes(title_text="share of the communication that can hide", tickformat=".0%",
                     range=[-0.06, 1.05])
    fig.update_layout(meta={"curves": curves, "tokens": tokens, "thresholds": thresholds or {}})
    return style(fig, title or "when communication can hide behind compute", 380)
