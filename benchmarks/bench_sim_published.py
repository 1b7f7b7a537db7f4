"""The simulator against published training runs: the table of docs/simulator.md, from paralab.sim.published.

    python benchmarks/bench_sim_published.py

Prints one markdown row per run (published figure, prediction, error, source), the mean absolute
error over the runs the model reproduces and over all of them, and the scaling losses.
"""

from __future__ import annotations

from paralab.bench import benchmark_parser


def main() -> None:
    from paralab.sim import published

    compared = published.compare()
    print("\n".join(published.runs_table(compared)))
    print(f"\nmean absolute error: {', '.join(published.mean_errors(compared))}\n")
    print("\n".join(published.scaling_table(compared)))


if __name__ == "__main__":
    benchmark_parser(__doc__).parse_args()  # --help, and no stray flags
    main()
