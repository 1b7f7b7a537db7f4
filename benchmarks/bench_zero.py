"""ZeRO benchmark: paralab's zero3 against torch's FSDP2, and per-rank memory of zero1/2/3 against ddp.

    .venv/bin/python benchmarks/bench_zero.py [--model tiny] [--sizes 2 4] [--rounds 3] [--steps 6]

Speed: torch_fsdp and zero3 run alternately (fsdp, zero3, zero3, fsdp, ...) in one invocation, so
a machine that gets busier or quieter during the benchmark affects both alike; each run's step time
is the median over its steps after the first, and the ratio the median of the rounds' zero3 / fsdp.

Memory: each strategy's peak per rank, from the tensors held (paralab.memory), split by kind at the
moment of the peak; the largest rank is shown. ddp and zero2 use a small bucket cap (--bucket-mb)
so that zero2's transient full gradients are a bucket's, not the whole tiny model's. Printed as
markdown tables.
"""

from __future__ import annotations

import paralab
from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare


def speed(model: str, sizes: list[int], rounds: int, steps: int, batch: int) -> list[str]:
    rows = ["| dp | zero3 step (s) | torch_fsdp step (s) | zero3 / fsdp |", "|---:|---:|---:|---:|"]
    for n in sizes:
        result = compare([Variant.of(strategy="torch_fsdp"), Variant.of(strategy="zero3")], rounds,
                         dict(world_size=n, steps=steps, model=model, global_batch=batch))
        rows.append(f"| {n} | {result.median('zero3'):.4f} | {result.median('torch_fsdp'):.4f} | "
                    f"{result.ratio('zero3'):.2f}x |")
    return rows


def memory(model: str, sizes: list[int], steps: int, batch: int, bucket_mb: float) -> list[str]:
    mib = 2**20
    rows = ["| dp | strategy | params (MiB) | grads (MiB) | optimizer (MiB) | activations (MiB) "
            "| peak (MiB) |",
            "|---:|---|---:|---:|---:|---:|---:|"]
    for n in sizes:
        for strategy in ("ddp", "zero1", "zero2", "zero3", "torch_fsdp"):
            run = paralab.run(strategy, n, steps=steps, model=model, global_batch=batch, bucket_mb=bucket_mb)
            s = run.summary
            worst = max(range(n), key=lambda r: s["peak_memory_bytes"][r])
            kinds = s["memory_by_kind"][worst]
            cells = " | ".join(f"{kinds[k] / mib:.2f}"
                               for k in ("params", "grads", "optimizer", "activations"))
            rows.append(f"| {n} | {strategy} | {cells} | {s['peak_memory_bytes'][worst] / mib:.2f} |")
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="tiny", steps=6, global_batch=16, rounds=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4], help="world sizes to run")
    parser.add_argument("--bucket-mb", type=float, default=0.25,
                        help="ddp and zero2 bucket cap; small, so zero2 holds a bucket's full gradients, "
                             "not the model's")
    args = parser.parse_args()
    params = paralab.MODEL_PRESETS[args.model].param_count()
    print(f"model {args.model} ({params:,} parameters), global batch {args.global_batch}, "
          f"{args.steps} steps per run\n")
    print("\n".join(speed(args.model, args.sizes, args.rounds, args.steps, args.global_batch)))
    print()
    print("\n".join(memory(args.model, args.sizes, args.steps, args.global_batch, args.bucket_mb)))


if __name__ == "__main__":
    main()
