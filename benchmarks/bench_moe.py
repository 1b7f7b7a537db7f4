"""Mixture of experts: expert parallel against one device, dropless against a capacity, and DualPipeV
against ZB-V and 1F1B.

Every table compares runs made in the same invocation, interleaved round by round
(:func:`paralab.bench.compare`), as ratios of median step times (or tokens/s) against the first row.

1. ``ep`` on 2 ranks against ``single`` with the same MoE model and global batch: tokens per second
   (each ep rank trains on half of the batch and holds half of the experts).
2. ``ep`` 2, dropless against a capacity factor of 1.25 (what the capacity saves on the busiest
   expert's rank, and how many assignments it drops).
3. The pipeline schedules at the same p and m on the MoE model: dualpipev, zbv and 1f1b (step time
   and measured bubble). paralab's executor runs a DualPipeV slot's forward and backward one after
   the other (the overlap inside a slot needs GPU streams), so on CPU ranks this compares the
   schedules' orders and bubbles, not the overlap.

    .venv/bin/python benchmarks/bench_moe.py [--model small-moe] [--rounds 3]
"""

from __future__ import annotations

import dataclasses

from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare
from paralab.config import MODEL_PRESETS
from paralab.moe_load import expert_load


def ep_against_single(args) -> list[str]:
    common = dict(steps=args.steps, model=args.model, global_batch=args.global_batch)
    result = compare([Variant.of("single", strategy="single", world_size=1),
                      Variant.of("ep 2", strategy="ep", world_size=2)], args.rounds, common)
    tokens = args.global_batch * MODEL_PRESETS[args.model].seq_len  # per step, whatever the ranks
    rows = ["| run | median step (ms) | tokens/s | tokens/s ratio to single |", "|---|---|---|---|"]
    for label in ("single", "ep 2"):
        rows.append(f"| {label} | {result.median(label) * 1e3:.1f} | {tokens / result.median(label):.0f} | "
                    f"{1 / result.ratio(label, 'single'):.2f}x |")
    return rows


def dropless_against_capacity(args) -> list[str]:
    base = MODEL_PRESETS[args.model]
    models = {"dropless": dataclasses.replace(base, capacity_factor=None),
              "capacity 1.25": dataclasses.replace(base, capacity_factor=1.25)}
    common = dict(strategy="ep", world_size=2, steps=args.steps, global_batch=args.global_batch)
    result = compare([Variant.of(label, model=model) for label, model in models.items()], args.rounds, common)
    rows = ["| ep 2 | median step (ms) | ratio to dropless | dropped assignments per step |",
            "|---|---|---|---|"]
    for label, model in models.items():
        run_dropped = _dropped(args, model)
        rows.append(f"| {label} | {result.median(label) * 1e3:.1f} | "
                    f"{result.ratio(label, 'dropless'):.2f}x | {run_dropped:.0f} of "
                    f"{args.global_batch * model.seq_len * model.top_k * model.layers} |")
    return rows


def _dropped(args, model) -> float:
    import paralab

    run = paralab.run("ep", 2, model=model, steps=args.steps, global_batch=args.global_batch)
    dropped = expert_load(run.trace).dropped_per_step()
    return sum(dropped) / len(dropped)


def schedules(args) -> list[str]:
    common = dict(strategy="pp", world_size=args.pp, pp=args.pp, microbatches=args.microbatches,
                  steps=args.steps, model=args.model, global_batch=args.global_batch)
    names = ("dualpipev", "zbv", "1f1b")
    result = compare([Variant.of(name, schedule=name) for name in names], args.rounds, common)
    rows = [f"| schedule (pp {args.pp}, m {args.microbatches}) | median step (ms) | ratio to dualpipev | "
            "measured bubble | closed form |", "|---|---|---|---|---|"]
    for name in names:
        s = result.summaries[name]
        rows.append(f"| {name} | {result.median(name) * 1e3:.1f} | {result.ratio(name, 'dualpipev'):.2f}x | "
                    f"{s['bubble_fraction']:.3f} | {s['bubble_theoretical']:.3f} |")
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="small-moe", steps=5, global_batch=8, rounds=3)
    parser.add_argument("--pp", type=int, default=2, help="pipeline ranks of the schedule comparison")
    parser.add_argument("--microbatches", type=int, default=8, help="microbatches of the schedule comparison")
    args = parser.parse_args()
    print(f"model {args.model}, global batch {args.global_batch}, "
          f"{args.steps} steps per run (first dropped), {args.rounds} interleaved rounds\n")
    for table in (ep_against_single, dropless_against_capacity, schedules):
        print("\n".join(table(args)))
        print()


if __name__ == "__main__":
    main()
