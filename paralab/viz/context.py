"""Context-parallel figures: attention work per rank (the causal balance), activation memory against
the sequence length, and ring against all-to-all as the cp degree grows (bytes, predicted time)."""

from __future__ import annotations

import statistics

from paralab.viz._common import (
    EXTRA_COLORS,
    MICROBATCH_COLORS,
    byte_scale,
    fmt_bytes,
    go,
    log_ticks,
    make_subplots,
    style,
)

MODE_COLORS = {"ring": MICROBATCH_COLORS[0], "alltoall": MICROBATCH_COLORS[1]}
MODE_NAMES = {"ring": "ring", "alltoall": "all-to-all"}  # cp_mode values, as the text names them


def attention_per_step(run, key: str = "attention_cpu_s") -> list[float]:
    """Per rank of a cp run: its attention work per step, the median over the steps after the first.
    ``key``: ``attention_cpu_s`` (its own thread's CPU seconds, waits for a core excluded) or
    ``attention_pairs`` (the query-key pairs its tiles computed, the same every step)."""
    out = []
    for result in run.rank_results:
        per_step = result[key]
        steps = sorted(per_step, key=int)
        out.append(statistics.median(per_step[s] for s in (steps[1:] or steps)))
    return out


def attention_per_rank(runs: dict, title: str | None = None):
    """Grouped bars per rank, two per run (``{label: run}``, one colour each): the attention CPU
    milliseconds per step it measured (solid) and the query-key pairs its tiles computed (hatched),
    scaled so the run's pairs add up to its measured total: where a hatched bar stands above its solid
    one, that rank's tiles ran faster per pair than the run's average. ``fig.layout.meta``:
    ``seconds`` and ``pairs`` per label and rank, ``imbalance`` (max over min seconds) and
    ``pair_imbalance`` (max over min pairs) per label."""
    graph = go()
    fig = graph.Figure()
    seconds = {label: attention_per_step(run) for label, run in runs.items()}
    pairs = {label: attention_per_step(run, "attention_pairs") for label, run in runs.items()}
    colors = MICROBATCH_COLORS + EXTRA_COLORS
    for i, (label, values) in enumerate(seconds.items()):
        ranks = [f"r{r}" for r in range(len(values))]
        ms_per_pair = sum(values) * 1e3 / sum(pairs[label])
        fig.add_trace(graph.Bar(x=ranks, y=[v * 1e3 for v in values], name=f"{label}: CPU time, measured",
                                marker_color=colors[i % len(colors)],
                                hovertemplate=f"{label}, %{{x}}: %{{y:.2f}} ms per step<extra></extra>"))
        fig.add_trace(graph.Bar(x=ranks, y=[n * ms_per_pair for n in pairs[label]],
                                name=f"{label}: query-key pairs counted, x its mean ms a pair",
                                marker_color=colors[i % len(colors)], marker_pattern_shape="/", opacity=0.55,
                                customdata=pairs[label],
                                hovertemplate=f"{label}, %{{x}}: %{{customdata:,}} query-key pairs per step "
                                              "(%{y:.2f} ms at the run's mean rate)<extra></extra>"))
    fig.update_layout(barmode="group", meta={
        "seconds": seconds, "imbalance": {label: max(v) / min(v) for label, v in seconds.items()},
        "pairs": pairs, "pair_imbalance": {label: max(v) / min(v) for label, v in pairs.items()}})
    fig.update_xaxes(title_text="rank (its place in the sequence: first to last)")
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
    fig.update_yaxes(title_text="activations per layer per GPU (GiB)", type="log",
                     tickvals=log_ticks(min(gib), max(gib)), tickformat=",~g")
    fig.update_layout(meta={"bytes": lines, "seqs": list(seqs)})
    return style(fig, title or f"{model.name}: activations per layer against the sequence", 420)


def cp_modes(model, hw, cps: list[int], title: str | None = None, **spec):
    """Ring against all-to-all for each cp degree: wire bytes one GPU sends per step for context
    parallelism (left) and the predicted step time (right), from paralab.sim. ``spec``: the other
    ParallelSpec fields. ``fig.layout.meta``: ``bytes`` and ``step_s`` per mode, a list per degree."""
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
        fig.add_trace(graph.Scatter(x=x, y=steps, name=name, mode="lines+markers",
                                    marker_color=MODE_COLORS[mode],
                                    line=dict(dash="dash" if mode == "alltoall" else "solid"),
                                    legendgroup=mode, showlegend=False,
                                    hovertemplate=f"{name} %{{x}}: %{{y:.3f}} s<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(barmode="group", meta=meta)
    fig.update_yaxes(title_text=unit, row=1, col=1)
    fig.update_yaxes(title_text="seconds", row=1, col=2)
    return style(fig, title or f"{model.name}: ring against all-to-all on {hw.name}", 400)
