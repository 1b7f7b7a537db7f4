"""Context-parallel figures: attention work per rank (the causal balance), activation memory against
the sequence length, and ring against all-to-all as the cp degree grows (bytes, predicted time)."""

from __future__ import annotations

import statistics

from paralab.trace import past_warm_up
from paralab.viz._common import (
    byte_scale,
    fmt_bytes,
    go,
    make_subplots,
    rank_color,
    style,
    uncrowded_log_ticks,
)

MODE_COLORS = {"ring": rank_color(0), "alltoall": rank_color(1)}
MODE_NAMES = {"ring": "ring", "alltoall": "all-to-all"}  # cp_mode values, as the text names them
# predicted step times closer than this (relative) draw as one line: the figure says so
CLOSE_STEPS = 0.02
# which of the sequence's 2N chunks rank r of N holds, in words, per cp_split (paralab.strategies.
# sequence_split.rank_chunks)
SPLIT_CHUNKS = {"zigzag": "zig-zag: chunks r and 2N−1−r of the 2N",
                "contiguous": "contiguous: chunks 2r and 2r+1, first to last"}


def attention_per_step(run, key: str = "attention_cpu_s") -> list[float]:
    """Per rank of a cp run: its attention work per step, the median over the steps past warm-up
    (:func:`paralab.trace.past_warm_up`).
    ``key``: ``attention_cpu_s`` (its own thread's CPU seconds, waits for a core excluded) or
    ``attention_pairs`` (the query-key pairs its tiles computed, the same every step)."""
    out = []
    for result in run.rank_results:
        per_step = result[key]
        steps = past_warm_up(sorted(map(int, per_step)))
        out.append(statistics.median(per_step[str(s)] for s in steps))
    return out


def cp_split_of(run) -> str | None:
    """The split (``zigzag``, ``contiguous``) of a run whose ranks are one cp group, else None."""
    layout = getattr(run, "layout", None)
    if getattr(layout, "cp", None) != len(run.rank_results):
        return None
    return layout.cp_split


def attention_per_rank(runs: dict, title: str | None = None):
    """Grouped bars per rank, two per run (``{label: run}``, one colour each): the attention CPU
    milliseconds per step it measured (solid) and the query-key pairs its tiles computed (hatched),
    scaled so the run's pairs add up to its measured total: where a hatched bar stands above its solid
    one, that rank's tiles ran faster per pair than the run's average. The x axis says which chunks
    of the sequence rank r holds under each run's split (a zig-zag rank holds an early and a late one),
    and a bar's hover its chunks. ``fig.layout.meta``: ``seconds`` and ``pairs`` per label and rank,
    ``imbalance`` (max over min seconds) and ``pair_imbalance`` (max over min pairs) per label."""
    from paralab.strategies.sequence_split import rank_chunks

    graph = go()
    fig = graph.Figure()
    seconds = {label: attention_per_step(run) for label, run in runs.items()}
    pairs = {label: attention_per_step(run, "attention_pairs") for label, run in runs.items()}
    splits = {label: cp_split_of(run) for label, run in runs.items()}
    for i, (label, values) in enumerate(seconds.items()):
        ranks = [f"r{r}" for r in range(len(values))]
        split, size = splits[label], len(values)
        held = ([" (chunks {} and {})".format(*rank_chunks(r, size, split)) for r in range(size)]
                if split in SPLIT_CHUNKS else [""] * size)
        ms_per_pair = sum(values) * 1e3 / sum(pairs[label])
        fig.add_trace(graph.Bar(x=ranks, y=[v * 1e3 for v in values], name=f"{label}: CPU time, measured",
                                marker_color=rank_color(i), customdata=held,
                                hovertemplate=f"{label}, %{{x}}%{{customdata}}: %{{y:.2f}} ms per step"
                                              "<extra></extra>"))
        fig.add_trace(graph.Bar(x=ranks, y=[n * ms_per_pair for n in pairs[label]],
                                name=f"{label}: query-key pairs counted, x its mean ms a pair",
                                marker_color=rank_color(i), marker_pattern_shape="/", opacity=0.55,
                                customdata=pairs[label],
                                hovertemplate=f"{label}, %{{x}}: %{{customdata:,}} query-key pairs per step "
                                              "(%{y:.2f} ms at the run's mean rate)<extra></extra>"))
    fig.update_layout(barmode="group", meta={
        "seconds": seconds, "imbalance": {label: max(v) / min(v) for label, v in seconds.items()},
        "pairs": pairs, "pair_imbalance": {label: max(v) / min(v) for label, v in pairs.items()}})
    known = [SPLIT_CHUNKS[split] for split in dict.fromkeys(splits.values()) if split in SPLIT_CHUNKS]
    fig.update_xaxes(title_text=f"rank r ({'; '.join(known)})" if known else "rank")
    fig.update_yaxes(title_text="attention per step (ms)")
    return style(fig, title or "attention work per rank: timed and counted", 400)


def activation_growth(model, seqs: list[int], cps: tuple[int, ...] = (2, 4, 8), micro_batch: int = 1,
                      title: str | None = None):
    """Activation bytes one layer keeps on one GPU against the sequence length (log-log), from
    paralab.sim.counting (Korthikanti et al. 2022, Table 2): the whole sequence with the attention
    scores kept (standard attention: grows as s^2), without them (a flash kernel: grows as s), and
    split over cp GPUs (ring attention keeps no scores: s / cp). ``fig.layout.meta["bytes"]``: per line."""
    from paralab.sim import counting

    graph = go()

    def per_layer(seq: int, attention: str) -> float:  # no recomputation: what the kernel itself keeps
        return counting.activation_bytes_per_layer(model.replace(seq=seq, attention=attention), micro_batch)

    lines = {"whole sequence, scores kept": [per_layer(s, "standard") for s in seqs],
             "whole sequence, no scores (flash)": [per_layer(s, "fused") for s in seqs]}
    lines.update({f"cp {cp} (ring)": [per_layer(s // cp, "fused") for s in seqs] for cp in cps})
    fig = graph.Figure()
    for i, (name, values) in enumerate(lines.items()):
        fig.add_trace(graph.Scatter(
            x=seqs, y=[v / 2**30 for v in values], name=name, mode="lines+markers",
            line=dict(dash="dot" if i == 0 else "solid"), customdata=[fmt_bytes(v) for v in values],
            hovertemplate=f"{name}: %{{x:,}} tokens, %{{customdata}} per layer<extra></extra>"))
    fig.update_xaxes(title_text="sequence length (tokens)", type="log", tickvals=list(seqs),
                     ticktext=[f"{s // 1024}k" if s % 1024 == 0 else f"{s:,}" for s in seqs])
    gib = [v / 2**30 for values in lines.values() for v in values]
    fig.update_yaxes(title_text="activations per layer per GPU (GiB, log scale)", type="log",
                     tickvals=uncrowded_log_ticks(min(gib), max(gib), decades=3), tickformat=",~g")
    fig.update_layout(meta={"bytes": lines, "seqs": list(seqs)})
    return style(fig, title or f"{model.name}: activations per layer against the sequence", 420)


def cp_modes(model, hw, cps: list[int], title: str | None = None, **spec):
    """Ring against all-to-all for each cp degree: wire bytes one GPU sends per step for context
    parallelism (left) and the predicted step time (right), from paralab.sim. Where the two step times
    lie within :data:`CLOSE_STEPS` of each other the lines would read as one: the ring's is drawn
    wider, under the dashed all-to-all, and a note on the panel gives the largest difference there.
    ``spec``: the other ParallelSpec fields. ``fig.layout.meta``: ``bytes`` and ``step_s`` per mode,
    a list per degree, and ``step_rel_diff``: per degree, |ring - all-to-all| / the shorter."""
    from paralab.sim import context, cost
    from paralab.sim.specs import ParallelSpec

    graph = go()
    titles = ("cp wire bytes per GPU per step", "predicted step time")
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles)
    meta = {"cps": list(cps), "bytes": {}, "step_s": {}}
    for mode in ("ring", "alltoall"):
        specs = [ParallelSpec(**{**spec, "cp": cp, "cp_mode": mode}) for cp in cps]
        wire = [context.comm_bytes_per_gpu(model, p) for p in specs]
        meta["bytes"][mode] = [sum(v for k, v in sent.items() if k.startswith("cp_")) for sent in wire]
        meta["step_s"][mode] = [cost.predict(model, p, hw).step_time_s for p in specs]
    scale, unit = byte_scale(max(max(sent) for sent in meta["bytes"].values()))
    for mode in ("ring", "alltoall"):
        sent, steps, name = meta["bytes"][mode], meta["step_s"][mode], MODE_NAMES[mode]
        x = [f"cp {cp}" for cp in cps]
        fig.add_trace(graph.Bar(x=x, y=[v / scale for v in sent], name=name, marker_color=MODE_COLORS[mode],
                                legendgroup=mode, customdata=[fmt_bytes(v) for v in sent],
                                hovertemplate=f"{name} %{{x}}: %{{customdata}}<extra></extra>"), row=1, col=1)
        # the ring's line wide and drawn first, the all-to-all's dashed and narrow over it: both show
        wide = mode == "ring"
        fig.add_trace(graph.Scatter(x=x, y=steps, name=name, mode="lines+markers",
                                    marker=dict(color=MODE_COLORS[mode], size=11 if wide else 6),
                                    line=dict(color=MODE_COLORS[mode], width=6 if wide else 2,
                                              dash="solid" if wide else "dash"),
                                    legendgroup=mode, showlegend=False,
                                    hovertemplate=f"{name} %{{x}}: %{{y:.3f}} s<extra></extra>"),
                      row=1, col=2)
    ring, a2a = meta["step_s"]["ring"], meta["step_s"]["alltoall"]
    meta["step_rel_diff"] = [abs(r - a) / min(r, a) for r, a in zip(ring, a2a)]
    close = [f"cp {cp}" for cp, rel in zip(cps, meta["step_rel_diff"]) if rel <= CLOSE_STEPS]
    if close:
        where = "at every degree" if len(close) == len(cps) else "at " + ", ".join(close)
        largest = max(rel for rel in meta["step_rel_diff"] if rel <= CLOSE_STEPS)
        fig.add_annotation(text=f"ring (wide) and all-to-all (dashed) within<br>{largest:.1%} of each "
                                f"other {where}:<br>the lines overlap (hover for each)",
                           xref="x2 domain", yref="y2 domain", x=1, y=0.96, xanchor="right", yanchor="top",
                           align="right", showarrow=False, font=dict(size=12, color="#333"),
                           bgcolor="rgba(247,247,247,0.9)")
    fig.update_layout(barmode="group", meta=meta)
    fig.update_yaxes(title_text=unit, row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=2)
    return style(fig, title or f"{model.name}: ring against all-to-all on {hw.name}", 400)
