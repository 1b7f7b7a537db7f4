"""The simulator against published training runs: the table of docs/simulator.md, from paralab.sim.published.

    python benchmarks/bench_sim_published.py

Prints one markdown row per run (published figure, prediction, error, source), the mean absolute
error over the runs the model reproduces and over all of them, and the scaling losses.
"""

from __future__ import annotations

from paralab.bench import benchmark_parser


def main() -> None:
    from paralab.sim import published

    rows = [
        "| run | GPUs | hardware | metric | published | predicted | error | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    compared = published.compare()
    for c in compared:
        mark = " (miss)" if c.run.known_miss else ""
        rows.append(
            f"| {c.run.label} ({c.run.organisation}) | {c.run.gpus:,} | {c.run.hardware.name} | "
            f"{published.METRICS[c.run.metric]} | {published.as_reported(c.run.published)} | "
            f"{published.as_reported(c.predicted)} | {c.error:+.1%}{mark} | {c.run.source} |"
        )
    print("\n".join(rows))
    covered = [abs(c.error) for c in compared if not c.run.known_miss]
    every = [abs(c.error) for c in compared]
    print(
        f"\nmean absolute error: {sum(covered) / len(covered):.1%} over the {len(covered)} runs reproduced, "
        f"{sum(every) / len(every):.1%} over all {len(every)}"
    )
    print("\n| scaling | published loss | predicted loss |\n|---|---|---|")
    for series in published.scaling(compared):
        print(
            f"| {series.name}, {series.gpus[0]:,} -> {series.gpus[-1]:,} GPUs | "
            f"{series.loss(predicted=False):.1%} | {series.loss(predicted=True):.1%}"
            f"{' (miss)' if series.miss else ''} |"
        )


if __name__ == "__main__":
    benchmark_parser(__doc__).parse_args()  # --help, and no stray flags
    main()
