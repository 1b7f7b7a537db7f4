"""Context parallel at a sequence where memory matters: paralab cp (ring and all-to-all, cp 2 and 4)
against single-device training, in step time, tokens/s and peak memory per rank.

Runs are interleaved in one invocation and compared as ratios of median step times (paralab.bench).
torch's own context parallel (torch.distributed.tensor.experimental.context_parallel) is not among
them: on CPU it refuses causal attention (its ring handles only the CUDA attention kernels; see
tests/test_context.py, which tries it and says why).

    python benchmarks/bench_context.py --seq 4096 --cp 2 4 --rounds 3

``--balance`` times the causal balance instead: each rank's attention CPU seconds per step with the
zig-zag and the contiguous split, beside the query-key pairs its tiles computed (the count the tests
hold).

    python benchmarks/bench_context.py --balance --cp 2 4 --steps 7
"""

from __future__ import annotations

import paralab
from paralab.bench import Variant, benchmark_parser, compare
from paralab.strategies.sequence_split import DIAGONAL_TILES
from paralab.viz.context import attention_per_step

BALANCE = dict(layers=1, hidden=64, heads=2, vocab=64, seq_len=2048)


def balance(cps: list[int], steps: int) -> None:
    """The causal balance table: attention CPU seconds per rank (median over the steps after the
    first; one torch thread per rank) against the query-key pairs each rank computed."""
    print(f"\n### causal balance: {BALANCE}, {steps} steps, diagonal tiles {DIAGONAL_TILES}\n")
    print("| cp | split | ms per rank | max / min | query-key pairs, max / min |\n|---|---|---|---|---|")
    for n in cps:
        for split in ("zigzag", "contiguous"):
            run = paralab.run("cp", n, steps=steps, model=BALANCE, global_batch=1, cp_split=split,
                              threads_per_rank=1)
            seconds, pairs = attention_per_step(run), attention_per_step(run, "attention_pairs")
            ms = ", ".join(f"{s * 1e3:.1f}" for s in seconds)
            ratios = max(seconds) / min(seconds), max(pairs) / min(pairs)
            print(f"| {n} | {split} | {ms} | {ratios[0]:.2f} | {ratios[1]:.2f} |")


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks of the model")
    parser.add_argument("--hidden", type=int, default=64, help="the model's hidden size")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--cp", type=int, nargs="+", default=[2, 4], help="context-parallel degrees to run")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps a run")
    parser.add_argument("--global-batch", type=int, default=1, help="sequences a step")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each variant")
    parser.add_argument("--balance", action="store_true", help="time the causal balance instead")
    args = parser.parse_args()
    if args.balance:
        balance(args.cp, args.steps)
        return
    model = dict(layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=256, seq_len=args.seq)
    common = dict(steps=args.steps, model=model, global_batch=args.global_batch)
    variants = [Variant.of("single device", strategy="single", world_size=1)]
    for n in args.cp:
        for mode in ("ring", "alltoall"):
            variants.append(Variant.of(f"cp {n} {mode}", strategy="cp", world_size=n, cp_mode=mode))
    result = compare(variants, args.rounds, common)
    tokens = args.global_batch * args.seq
    print(f"\n### {args.seq} tokens, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
          f"global batch {args.global_batch}\n")
    rows = ["| variant | median step (s) | tokens/s | ratio to one device | peak memory per rank (MiB) | "
            "activations per rank (MiB) | cp wire bytes / step |", "|---|---|---|---|---|---|---|"]
    for v in variants:
        s = result.summaries[v.label]
        peak = max(s["peak_memory_bytes"]) / 2**20
        activations = max(m["activations"] for m in s["memory_by_kind"]) / 2**20
        wire = s["comm_bytes"].get("send", 0) + s["comm_bytes"].get("all_to_all", 0)
        step = result.median(v.label)
        rows.append(f"| {v.label} | {step:.4f} | {tokens / step:,.0f} | {result.ratio(v.label):.3f}x | "
                    f"{peak:.1f} | {activations:.1f} | {wire:,} |")
    print("\n".join(rows))
    for n in args.cp:
        ratio = result.ratio(f"cp {n} alltoall", f"cp {n} ring")
        print(f"\ncp {n}: all-to-all / ring step time {ratio:.3f}x")


if __name__ == "__main__":
    main()
