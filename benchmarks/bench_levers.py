"""The training levers against the run without them: bf16 against fp32, selective and full
recomputation against none, accumulation K = 4 against K = 1 at the same global batch; step time as
ratios of interleaved runs (paralab.bench), and peak memory by kind, measured and predicted.

    python benchmarks/bench_levers.py --model small --world-size 2 --rounds 3
"""

from __future__ import annotations

import argparse

from paralab import RunConfig
from paralab.bench import Variant, add_benchmark_args, compare
from paralab.sim.bridge import predict_memory

VARIANTS = [
    Variant.of("fp32", dtype="fp32"),
    Variant.of("bf16", dtype="bf16"),
    Variant.of("recompute selective", recompute="selective"),
    Variant.of("recompute full", recompute="full"),
    Variant.of("accumulate 4", microbatches=4),
]


def memory_table(result, common: dict) -> str:
    """Each variant's measured high-water marks (rank 0) beside the simulator's prediction, in MiB."""
    rows = ["| variant | activations measured | predicted | model states measured | predicted |",
            "|---|---:|---:|---:|---:|"]
    for v in result.variants:
        measured = result.summaries[v.label]["memory_max_by_kind"][0]
        options = {k: val for k, val in {**common, **v.options}.items() if k not in ("model",)}
        predicted = predict_memory(RunConfig.build(common["model"], **options))
        states = [sum(d[k] for k in ("params", "grads", "optimizer")) for d in (measured, predicted)]
        rows.append(f"| {v.label} | {measured['activations'] / 2**20:.1f} | "
                    f"{predicted['activations'] / 2**20:.1f} | {states[0] / 2**20:.1f} | "
                    f"{states[1] / 2**20:.1f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_benchmark_args(parser, model="small", steps=6, global_batch=16, rounds=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--strategy", default="ddp")
    args = parser.parse_args()
    common = dict(strategy=args.strategy, world_size=args.world_size, steps=args.steps, model=args.model,
                  global_batch=args.global_batch)
    result = compare(VARIANTS, args.rounds, common)
    print(f"\n### {args.strategy} x{args.world_size}, model {args.model}, global batch {args.global_batch}\n")
    print(result.table() + "\n")
    print(memory_table(result, common))


if __name__ == "__main__":
    main()
