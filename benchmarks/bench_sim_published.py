"""The simulator against published training runs: the table of docs/simulator.md, from paralab.sim.published.

    python benchmarks/bench_sim_published.py

Prints one markdown row per run (published figure, prediction, error, source), the mean absolute
error over the runs the model reproduces and over all of them, and the scaling losses.
"""

from __future__ import annotations


def number(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def main() -> None:
    from paralab.sim import published

    rows = [
        "| run | GPUs | hardware | metric | published | predicted | error | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    covered, every = [], []
    for run in published.RUNS:
        value = run.predicted(run.predict())
        error = value / run.published - 1
        every.append(abs(error))
        if not run.known_miss:
            covered.append(abs(error))
        mark = " (miss)" if run.known_miss else ""
        rows.append(
            f"| {run.label} ({run.organisation}) | {run.gpus:,} | {run.hardware.name} | "
            f"{published.METRICS[run.metric]} | {number(run.published)} | {number(value)} | "
            f"{error:+.1%}{mark} | "
            f"{run.source} |"
        )
    print("\n".join(rows))
    print(
        f"\nmean absolute error: {sum(covered) / len(covered):.1%} over the {len(covered)} runs reproduced, "
        f"{sum(every) / len(every):.1%} over all {len(every)}"
    )
    print("\n| scaling | published loss | predicted loss |\n|---|---|---|")
    for name, first, last, miss in published.SCALING:
        a, b = published.find(name, first), published.find(name, last)
        loss = 1 - published.per_gpu(b, b.published) / published.per_gpu(a, a.published)
        predicted = 1 - published.per_gpu(b, b.predicted(b.predict())) / published.per_gpu(
            a, a.predicted(a.predict())
        )
        print(
            f"| {name}, {first:,} -> {last:,} GPUs | {loss:.1%} | "
            f"{predicted:.1%}{' (miss)' if miss else ''} |"
        )


if __name__ == "__main__":
    main()
