"""paralab's pipeline executor against torch.distributed.pipelining, and measured against theoretical bubbles.

For each (schedule, pp) the two implementations run the same split, microbatches and world size;
their runs alternate (torch, paralab, paralab, torch, ...) so that a change in machine load hits
both, and the table reports the median of the rounds' step-time ratios (paralab / torch; below 1 is
faster).
A second table sets paralab's measured bubble (idle compute time inside the step) beside the
schedule's closed form for equal-time stages.

    .venv/bin/python benchmarks/bench_pipeline.py [--model small] [--microbatches 8] [--rounds 2]
"""

from __future__ import annotations

import paralab
from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare

CASES = [("gpipe", 2), ("gpipe", 4), ("1f1b", 2), ("1f1b", 4)]
BUBBLE_CASES = [("gpipe", 2, 1, 1), ("gpipe", 2, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 8, 2),
                ("zb-h1", 2, 8, 1), ("zbv", 2, 8, 2)]


def compare_speed(args) -> list[str]:
    rows = ["| schedule | pp | microbatches | paralab step (ms) | torch step (ms) | ratio |",
            "|---|---|---|---|---|---|"]
    for schedule, pp in CASES:
        common = dict(world_size=pp, pp=pp, schedule=schedule, microbatches=args.microbatches,
                      steps=args.steps, model=args.model, global_batch=args.global_batch)
        result = compare([Variant.of("torch", strategy="torch_pp"), Variant.of("paralab", strategy="pp")],
                         args.rounds, common)
        a, b = result.median("paralab"), result.median("torch")
        rows.append(f"| {schedule} | {pp} | {args.microbatches} | {a * 1e3:.1f} | {b * 1e3:.1f} | "
                    f"{result.ratio('paralab', 'torch'):.2f}x |")
    return rows


def bubbles(args) -> list[str]:
    rows = ["| schedule | pp | microbatches | v | measured bubble | theoretical |",
            "|---|---|---|---|---|---|"]
    for schedule, pp, m, v in BUBBLE_CASES:
        s = paralab.run("pp", pp, steps=args.steps, model=args.model, global_batch=args.global_batch, pp=pp,
                        schedule=schedule, microbatches=m, virtual_stages=v).summary
        rows.append(f"| {schedule} | {pp} | {m} | {v} | {s['bubble_fraction']:.3f} | "
                    f"{s['bubble_theoretical']:.3f} |")
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="small", steps=6, global_batch=16, rounds=2)
    parser.add_argument("--microbatches", type=int, default=8, help="microbatches a step, every schedule")
    args = parser.parse_args()
    print(f"model {args.model}, global batch {args.global_batch}, {args.steps} steps per run "
          f"(first dropped), {args.rounds} alternating runs each\n")
    print("\n".join(compare_speed(args)))
    print()
    print("\n".join(bubbles(args)))


if __name__ == "__main__":
    main()
