"""Speed comparisons that survive a noisy machine: interleaved runs, medians, ratios.

Timings of the same run drift by 10-40% from launch to launch on a shared machine, so paralab never
compares two numbers measured at different times. :func:`compare` runs every variant once per round,
in turn, the order reversed every other round (A, B, C, C, B, A, A, ...: no variant always runs first
or last), and takes each run's median step time (steps after the first). A variant's step time is the
median over rounds; its ratio to another is the median over rounds of the two runs' ratio in that
round, so the machine drifting between rounds cancels within each pair.

    paralab bench --variants ddp torch_ddp --world-size 2 --model small --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field


@dataclass
class Variant:
    label: str
    options: dict  # arguments of paralab.run

    @classmethod
    def of(cls, label: str | None = None, **options) -> Variant:
        return cls(label or options.get("strategy", "run"), options)


@dataclass
class Comparison:
    variants: list[Variant]
    step_times: dict[str, list[float]] = field(default_factory=dict)  # label -> one median per round
    summaries: dict[str, dict] = field(default_factory=dict)  # label -> summary of its last run

    def median(self, label: str) -> float:
        return statistics.median(self.step_times[label])

    def ratio(self, label: str, reference: str | None = None) -> float:
        """The median over rounds of ``label``'s step time over ``reference``'s (the first variant's)
        in the same round."""
        return statistics.median(self.round_ratios(label, reference))

    def round_ratios(self, label: str, reference: str | None = None) -> list[float]:
        """``label``'s step time over ``reference``'s (the first variant's), round by round."""
        ours, theirs = self.step_times[label], self.step_times[reference or self.variants[0].label]
        return [a / b for a, b in zip(ours, theirs, strict=True)]

    def table(self) -> str:
        """A markdown table: median step time, the ratio to the first variant and its range over the
        rounds (a median ratio alone had read as settled on three rounds, or on one)."""
        ref = self.variants[0].label
        rows = [f"| variant | median step (s) | rounds | over {ref}, median of the rounds (< 1: faster) "
                "| its range over the rounds |", "|---|---|---|---|---|"]
        for v in self.variants:
            ratios = self.round_ratios(v.label)
            spread = (f"{min(ratios):.3f}-{max(ratios):.3f}x" if len(ratios) > 1 else "one round: none")
            rows.append(f"| {v.label} | {self.median(v.label):.4f} | {len(ratios)} | "
                        f"{self.ratio(v.label):.3f}x | {spread} |")
        return "\n".join(rows)


def compare(variants: list[Variant], rounds: int = 3, common: dict | None = None, run=None) -> Comparison:
    """Run each variant ``rounds`` times, interleaved; ``common`` options apply to every run. ``run``
    starts one (``paralab.run`` unless given; ``paralab.elastic.run`` for elastic training): whatever
    it returns has a ``summary`` with ``step_time_s``. ConfigError (before any run) for fewer than one
    round, fewer than two variants, two variants of one label, or a run of fewer than two steps."""
    import paralab
    from paralab.config import ConfigError

    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1 (interleaved runs of each variant), got {rounds}")
    labels = [v.label for v in variants]
    if len(labels) < 2:
        raise ConfigError(f"a comparison takes two variants or more (the first is the reference of the "
                          f"ratios), got {labels}")
    if len(set(labels)) != len(labels):
        raise ConfigError(f"variant labels must differ (a variant is not compared with itself), "
                          f"got {labels}")
    for v in variants:  # a run of one step would be timed on its warm-up alone
        steps = {**(common or {}), **v.options}.get("steps")
        if steps is not None and steps < 2:
            raise ConfigError(f"--steps must be >= 2 in a comparison: a run's step time is the median of "
                              f"its steps after the first, which warms up; got {steps}")
    result = Comparison(variants, {v.label: [] for v in variants})
    for round_ in range(rounds):
        for v in variants if round_ % 2 == 0 else variants[::-1]:
            summary = (run or paralab.run)(**{**(common or {}), **v.options}).summary
            result.step_times[v.label].append(summary["step_time_s"])
            result.summaries[v.label] = summary
    return result


def benchmark_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark script's parser, its --help opening with the script's docstring's first paragraph
    (the first line alone had stopped mid-sentence); flags spelled whole, as ``paralab``'s are."""
    return argparse.ArgumentParser(description=" ".join(doc.split("\n\n")[0].split()), allow_abbrev=False)


def add_benchmark_args(parser, model: str = "tiny", steps: int = 6, global_batch: int = 8,
                       rounds: int = 3) -> None:
    """The options every benchmark shares, with its own defaults: --model, --steps, --global-batch
    and --rounds of interleaved runs."""
    parser.add_argument("--model", default=model, help="a model preset")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps a run trains")
    parser.add_argument("--global-batch", type=int, default=global_batch,
                        help="samples per step over all ranks")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved runs of each variant")


def add_bench_args(parser) -> None:
    parser.add_argument("--variants", nargs="+", required=True, metavar="STRATEGY",
                        help="strategies to compare; the first is the reference of the ratios")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks each run starts, the same for every variant (so `single`, one rank, "
                             "cannot be one)")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="start more local ranks than the cores and memory hold (refused otherwise); "
                             "the ratios then measure the ranks' contention as much as the strategies")
    add_benchmark_args(parser)
    # the layout every variant shares (a pipeline against torch's needs its microbatches: `pp torch_pp`
    # had been refused, naming a --microbatches bench did not take)
    for flag, kind, what in LAYOUT_FLAGS:
        parser.add_argument(flag, type=kind, help=f"{what}, the same for every variant (default: the run's)")


LAYOUT_FLAGS = (("--microbatches", int, "microbatches per step"),
                ("--schedule", str, "the pipeline schedule"),
                ("--dp", int, "data-parallel degree (hybrid)"),
                ("--tp", int, "tensor-parallel degree (hybrid)"),
                ("--pp", int, "pipeline stages (hybrid)"), ("--dtype", str, "fp32, bf16 or fp16"))


def bench_main(args) -> int:
    """``paralab bench``: every variant is checked as a launch checks it (layout, device, dtype, this
    machine's capacity) before the first run starts (ConfigError: exit 2)."""
    from paralab.config import RunConfig
    from paralab.runtime.launch import preflight

    layout = {name: getattr(args, name) for name in (flag[2:] for flag, _, _ in LAYOUT_FLAGS)
              if getattr(args, name) is not None}
    common = dict(world_size=args.world_size, steps=args.steps, model=args.model,
                  global_batch=args.global_batch, oversubscribe=args.oversubscribe, **layout)
    for strategy in args.variants:
        opts = {k: v for k, v in common.items() if k != "model"}
        preflight(RunConfig.build(args.model, strategy=strategy, **opts))
    print(compare([Variant.of(strategy=s) for s in args.variants], args.rounds, common).table())
    return 0
