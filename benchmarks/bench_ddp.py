"""paralab ddp against torch's DistributedDataParallel, and traced against untraced paralab ddp.

Speed is only ever compared as a ratio of runs made in the same invocation, interleaved (A, B, A, B,
...), because timings on a shared machine drift by 10-40% between launches. Each figure is the
median over rounds of each run's median step time (the first step of every run is warm-up).

    python benchmarks/bench_ddp.py --model small --world-sizes 2 4 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics

import paralab


def median_step(strategy: str, world_size: int, args, **options) -> float:
    run = paralab.run(strategy, world_size, steps=args.steps, model=args.model, global_batch=args.global_batch,
                      bucket_mb=args.bucket_mb, **options)
    return run.summary["step_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    print("| world size | paralab ddp (s) | torch DDP (s) | ratio paralab/torch | untraced (s) | tracing overhead |")
    print("|---|---|---|---|---|---|")
    for ws in args.world_sizes:
        ours, torchs, untraced = [], [], []
        for _ in range(args.rounds):
            ours.append(median_step("ddp", ws, args))
            torchs.append(median_step("torch_ddp", ws, args))
            untraced.append(median_step("ddp", ws, args, trace=False))
        o, t, u = (statistics.median(x) for x in (ours, torchs, untraced))
        print(f"| {ws} | {o:.4f} | {t:.4f} | {o / t:.3f}x | {u:.4f} | {o / u - 1:+.1%} |")


if __name__ == "__main__":
    main()
