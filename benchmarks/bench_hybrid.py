"""paralab hybrid (dp x tp, pp = 1) against torch's own: DistributedDataParallel over DTensor tensor
parallel on a 2D mesh (torch_hybrid).

Runs are interleaved in one invocation and compared as ratios of median step times (paralab.bench),
so drift on a shared machine hits both alike. paralab's traced communication per step comes with
them (torch_hybrid's collectives run inside torch and are not traced).

    python benchmarks/bench_hybrid.py --model small --dp 2 --tp 2 --rounds 3
"""

from __future__ import annotations

from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare
from paralab.layout import mesh_layout


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="small", steps=6, global_batch=8, rounds=3)
    parser.add_argument("--dp", type=int, default=2, help="data-parallel degree")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree")
    args = parser.parse_args()
    world = args.dp * args.tp
    common = dict(world_size=world, dp=args.dp, tp=args.tp, steps=args.steps, model=args.model,
                  global_batch=args.global_batch)
    variants = [Variant.of("torch_hybrid", strategy="torch_hybrid"),
                Variant.of("paralab hybrid", strategy="hybrid")]
    result = compare(variants, args.rounds, common)
    print(f"### hybrid {args.dp}x{args.tp}x1, model {args.model}, global batch {args.global_batch}\n")
    print(mesh_layout(dp=args.dp, tp=args.tp).text() + "\n")
    print(result.table() + "\n")
    print(f"paralab hybrid / torch_hybrid: {result.ratio('paralab hybrid', 'torch_hybrid'):.3f}x\n")
    summary = result.summaries["paralab hybrid"]
    rows = ["| op | payload bytes / step | wire bytes / step |", "|---|---|---|"]
    for op, payload in summary["comm_payload_bytes"].items():
        rows.append(f"| {op} | {payload:,} | {summary['comm_bytes'][op]:,} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
