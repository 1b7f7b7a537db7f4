"""Elastic training: recovery after a SIGKILL, and what load balancing buys with a slow rank.

1. Recovery: ``--nodes`` local nodes, the worker of rank 1 is SIGKILLed at ``--fail-step``. Reported:
   kill -> first survivor noticing (detection), detection -> first resumed step completed (recovery,
   which includes the keep-alive expiry, the rendezvous's last call and the new workers' start-up),
   and the steps redone from the last checkpoint.
2. Balancing: 2 nodes, rank 1 slowed by each factor; the step time with the even split over the one
   with ``--balance``, from runs interleaved in the same invocation (``paralab.bench.compare``:
   ``--rounds`` of each, the order reversed every other round, the median of the rounds' own ratios),
   so that a machine shared with other work compares fairly.

    python benchmarks/bench_elastic.py --model small --global-batch 24 --micro-batch 4 --rounds 2
"""

from __future__ import annotations

from paralab import elastic
from paralab.bench import Variant, add_benchmark_args, benchmark_parser, compare


def recovery(args) -> None:
    res = elastic.run(nodes=args.nodes, min_nodes=args.nodes - 1, max_nodes=args.nodes, steps=args.steps,
                      model=args.model, global_batch=args.global_batch,
                      checkpoint_every=args.checkpoint_every, fault={"rank": 1, "step": args.fail_step})
    (t,) = res.transitions
    print(f"\n### recovery: {args.nodes} nodes -> {t['world_size']}, SIGKILL at step {args.fail_step}, "
          f"checkpoint every {args.checkpoint_every} steps\n")
    print("| kill -> detection (s) | detection -> first resumed step (s) | steps redone | resumed from |")
    print("|---:|---:|---:|---|")
    print(f"| {t.get('detection_s', float('nan')):.2f} | {t.get('recovery_s', float('nan')):.2f} "
          f"| {t['steps_redone']} | {t['checkpoint']} |")


def balancing(args) -> None:
    print(f"\n### balancing: 2 nodes, rank 1 slowed, model {args.model}, global batch {args.global_batch}\n")
    print("| slow factor | even split step (ms) | balanced step (ms) | gain (even / balanced) "
          "| ideal (1+F)/2 | slow rank's share | ideal 1/(1+F) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    common = dict(nodes=2, min_nodes=2, max_nodes=2, steps=args.steps, model=args.model,
                  global_batch=args.global_batch, micro_batch=args.micro_batch, trace=False)
    variants = [Variant.of("even"), Variant.of("balanced", balance=True)]
    for factor in args.factors:
        result = compare(variants, args.rounds, {**common, "slow": {"rank": 1, "factor": factor}},
                         run=elastic.run)
        share = result.summaries["balanced"]["samples_per_rank"][-1][1] / args.global_batch
        print(f"| {factor:g} | {result.median('even') * 1e3:.1f} | {result.median('balanced') * 1e3:.1f} "
              f"| {result.ratio('even', 'balanced'):.2f}x | {(1 + factor) / 2:.2f}x | {share:.0%} "
              f"| {1 / (1 + factor):.0%} |")


def main() -> None:
    parser = benchmark_parser(__doc__)
    add_benchmark_args(parser, model="tiny", steps=10, global_batch=48, rounds=1)
    parser.add_argument("--nodes", type=int, default=4, help="local nodes of the recovery run")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples a rank computes at once")
    parser.add_argument("--checkpoint-every", type=int, default=2, help="steps between checkpoints")
    parser.add_argument("--fail-step", type=int, default=5, help="the step rank 1's node is SIGKILLed at")
    parser.add_argument("--factors", type=float, nargs="+", default=[1.5, 2.0, 3.0],
                        help="how many times slower rank 1 runs, one balancing comparison each")
    parser.add_argument("--skip", choices=("recovery", "balancing"), help="leave one part out")
    args = parser.parse_args()
    if args.skip != "recovery":
        recovery(args)
    if args.skip != "balancing":
        balancing(args)


if __name__ == "__main__":
    main()
