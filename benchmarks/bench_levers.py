"""The training levers against the run without them: bf16 against fp32, selective and full
recomputation against none, accumulation K = 4 against K = 1 at the same global batch; step time as
ratios of interleaved runs (paralab.bench), and the peak memory and what it holds, measured and
predicted.

    python benchmarks/bench_levers.py --model small --world-size 2 --rounds 3
"""

from __future__ import annotations

from paralab import RunConfig
from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare
from paralab.sim.bridge import predict_memory

VARIANTS = [
    Variant.of("fp32", dtype="fp32"),
    Variant.of("bf16", dtype="bf16"),
    Variant.of("recompute selective", recompute="selective"),
    Variant.of("recompute full", recompute="full"),
    Variant.of("accumulate 4", microbatches=4),
]


def memory_table(result, common: dict) -> str:
    """Each variant's peak on rank 0 and what it holds then, measured beside the simulator's prediction
    of the same moment (``predict_memory``: the step's peak, by kind), in MiB; and the activations'
    own high-water mark, measured (what a lever saves, whenever in the step it falls)."""
    rows = ["| variant | peak measured | predicted | activations at the peak measured | predicted "
            "| model states at the peak measured | predicted | activations' high-water mark measured |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for v in result.variants:
        summary = result.summaries[v.label]
        at_peak = summary["memory_by_kind"][0]
        options = {k: val for k, val in {**common, **v.options}.items() if k not in ("model",)}
        predicted = predict_memory(RunConfig.build(common["model"], **options))
        states = [sum(d[k] for k in ("params", "grads", "optimizer")) for d in (at_peak, predicted)]
        mib = [summary["peak_memory_bytes"][0], predicted["total"], at_peak["activations"],
               predicted["activations"], *states, summary["memory_max_by_kind"][0]["activations"]]
        rows.append(f"| {v.label} | " + " | ".join(f"{b / 2**20:.1f}" for b in mib) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="small", steps=6, global_batch=16, rounds=3)
    parser.add_argument("--world-size", type=int, default=2, help="ranks of every run")
    parser.add_argument("--strategy", default="ddp", help="the strategy every lever is tried on")
    args = parser.parse_args()
    common = dict(strategy=args.strategy, world_size=args.world_size, steps=args.steps, model=args.model,
                  global_batch=args.global_batch)
    result = compare(VARIANTS, args.rounds, common)
    print(f"\n### {args.strategy} x{args.world_size}, model {args.model}, global batch {args.global_batch}\n")
    print(result.table() + "\n")
    print(memory_table(result, common))


if __name__ == "__main__":
    main()
