"""paralab tp against torch's DTensor tensor parallel (torch_tp), with and without sequence parallel.

Runs are interleaved in one invocation and compared as ratios of median step times (paralab.bench);
paralab's traced communication per step comes with them (torch_tp's collectives run inside DTensor
and are not traced).

    python benchmarks/bench_tensor.py --model small --tp 2 4 --rounds 3
"""

from __future__ import annotations

from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare


def comm_table(result, labels: list[str]) -> str:
    """Traced bytes per step, summed over ranks, for the paralab variants."""
    rows = ["| variant | op | payload bytes / step | wire bytes / step |", "|---|---|---|---|"]
    for label in labels:
        summary = result.summaries[label]
        for op, payload in summary["comm_payload_bytes"].items():
            rows.append(f"| {label} | {op} | {payload:,} | {summary['comm_bytes'][op]:,} |")
    return "\n".join(rows)


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="small", steps=6, global_batch=8, rounds=3)
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4], help="tensor-parallel degrees to run")
    args = parser.parse_args()
    for tp in args.tp:
        common = dict(world_size=tp, tp=tp, steps=args.steps, model=args.model,
                      global_batch=args.global_batch)
        variants = [
            Variant.of("torch_tp", strategy="torch_tp"),
            Variant.of("paralab tp", strategy="tp"),
            Variant.of("torch_tp + SP", strategy="torch_tp", sequence_parallel=True),
            Variant.of("paralab tp + SP", strategy="tp", sequence_parallel=True),
        ]
        result = compare(variants, args.rounds, common)
        print(f"\n### tp {tp}, model {args.model}, global batch {args.global_batch}\n\n{result.table()}\n")
        print(f"paralab tp / torch_tp: {result.ratio('paralab tp', 'torch_tp'):.3f}x; "
              f"with sequence parallel: {result.ratio('paralab tp + SP', 'torch_tp + SP'):.3f}x\n")
        print(comm_table(result, ["paralab tp", "paralab tp + SP"]))


if __name__ == "__main__":
    main()
