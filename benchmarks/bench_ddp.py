"""paralab ddp against torch's DistributedDataParallel, and traced against untraced paralab ddp.

Runs are interleaved in one invocation and compared as ratios of median step times (paralab.bench).

    python benchmarks/bench_ddp.py --model small --world-sizes 2 4 --rounds 3
"""

from __future__ import annotations

from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare
from paralab.text import count_text


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="small", steps=6, global_batch=8, rounds=3)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4], help="ranks of each comparison")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket cap (MiB), both DDPs")
    args = parser.parse_args()
    for ws in args.world_sizes:
        common = dict(world_size=ws, steps=args.steps, model=args.model, global_batch=args.global_batch,
                      bucket_mb=args.bucket_mb)
        variants = [Variant.of("torch DDP", strategy="torch_ddp"), Variant.of("paralab ddp", strategy="ddp"),
                    Variant.of("paralab ddp, untraced", strategy="ddp", trace=False)]
        result = compare(variants, args.rounds, common)
        print(f"\n### world size {ws}, model {args.model}\n\n{result.table()}")
        overhead = result.ratio("paralab ddp", "paralab ddp, untraced") - 1
        rounds = count_text(args.rounds, "round")
        print(f"\ntracing overhead: {overhead:+.1%} (median over {rounds}; launches on a shared machine "
              "differ by 10-40%, so a figure inside that, below zero too, is noise)")


if __name__ == "__main__":
    main()
