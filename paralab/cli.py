"""``paralab run | nodes | elastic | merge | report | import | bench | simulate | plan | strategies`` — the
shell face of paralab.

Exit codes (a contract, README "The `--json` contract"): 0 success; 2 invalid configuration or
arguments (message on stderr, no process started); 1 a run that failed (which rank, what it raised);
130 interrupted; 141 stdout's reader gone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import select
import sys
import warnings
from pathlib import Path
from typing import NoReturn

from paralab.cli_args import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_SIGPIPE,
    OneLineErrors,
    OneValueWhateverItsName,
    add_training_args,
    attach_negative_lists,
    build_config,
    int_list,
    json_text,
    said_as_flags,
)
from paralab.config import (
    CP_MODES,
    CP_SPLITS,
    DENSE_ROUTING,
    MODEL_PRESETS,
    ConfigError,
    RunConfig,
    check_int,
    custom_from,
    routing_without_experts,
)
from paralab.schedules import SCHEDULES, V_SHAPED
from paralab.text import count_text
from paralab.trace import not_measured
from paralab.warn import ParalabWarning


def add_run_args(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    p.add_argument("--strategy", default=d.strategy, help="a strategy name; `paralab strategies` lists them")
    p.add_argument("--world-size", type=int,  # None: not given (see refuse_flags_the_launch_sets)
                   help=f"ranks to start (default {d.world_size}; under torchrun: its world, which a value "
                        "given must match)")
    add_training_args(p, d, shapes_help="; a shape of its own: paralab.run(model={...}) from Python")
    p.add_argument("--bucket-mb", type=float,  # None: not given (see refuse_run_flags_without_effect)
                   help=f"gradient bucket cap in MiB (default {d.bucket_mb:g}, torch DDP's)")
    p.add_argument("--hierarchical", action="store_true",
                   help="ddp: reduce-scatter in the node, all-reduce across nodes, all-gather in the node")
    p.add_argument("--zero-prefetch", action="store_true",
                   help="zero3: all-gather the next part while this one computes (one more part held)")
    p.add_argument("--nodes", type=int,  # None: not given (see refuse_flags_the_launch_sets)
                   help=f"emulated nodes for local launches (default {d.nodes}; under torchrun: the nodes "
                        "it started the ranks on, which a value given must match)")
    p.add_argument("--dp", type=int, default=d.dp, help="data-parallel degree (0: from the world size)")
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel degree (0: the strategy's default)")
    p.add_argument("--pp", type=int, default=d.pp, help="pipeline stages (0: the strategy's default)")
    p.add_argument("--cp", type=int, default=d.cp, help="context-parallel degree (0: the strategy's default)")
    p.add_argument("--cp-mode", default=d.cp_mode, choices=CP_MODES,
                   help=f"with cp 2 or more: K/V round a ring, or all-to-all to heads (Ulysses); "
                        f"default {CP_MODES[0]}")
    p.add_argument("--cp-split", default=d.cp_split, choices=CP_SPLITS,
                   help=f"with cp 2 or more: how the sequence is cut over cp ranks (zigzag balances causal "
                        f"attention); default {CP_SPLITS[0]}")
    p.add_argument("--ep", type=int, default=d.ep,
                   help="expert parallel, inside dp (ep, hybrid; 0: the strategy's default)")
    g = p.add_argument_group("mixture of experts (override the model preset's)")
    g.add_argument("--experts", type=int, help="experts per block (0: dense)")
    g.add_argument("--top-k", type=int, help="experts each token goes to")
    g.add_argument("--capacity-factor", type=float,
                   help="tokens an expert takes per sequence, x seq x k / experts (0 or less is refused; "
                        "omit: dropless)")
    p.add_argument("--schedule", default=d.schedule,
                   help=f"pipeline schedule (pp, hybrid): {', '.join(SCHEDULES)} "
                        "(default: the strategy's)")
    p.add_argument("--microbatches", "--accumulate", type=int, default=d.microbatches, metavar="K",
                   action=OneValueWhateverItsName,
                   help="microbatches per replica per step: gradient accumulation "
                        "(a pipeline's microbatches)")
    p.add_argument("--virtual-stages", type=int, default=d.virtual_stages,
                   help="model chunks per pipeline rank: 2 or more for interleaved; "
                        f"{' and '.join(V_SHAPED)} always hold 2 (given as 1 or 2); every other schedule 1")
    p.add_argument("--stage-layers", type=int_list, metavar="N,N,...",
                   help="blocks per pipeline stage in model order, e.g. 1,3,3,1 "
                        "(lighter ends; default: even)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="tp: the norms and dropout on a slice of the sequence")
    p.add_argument("--zero", type=int, default=d.zero,
                   help="hybrid: ZeRO stage over the dp dimension, 0, 1 or 2 (ZeRO-3: strategy zero3)")
    p.add_argument("--trace-dir", metavar="DIR",
                   help="a directory for the run's trace: merged.json from a local run, one file per rank "
                        "under torchrun (`paralab merge DIR` joins them; a rerun overwrites its files)")
    p.add_argument("--report", metavar="PATH", help="write a standalone HTML report of the run")
    p.add_argument("--profile", metavar="DIR", help="record every rank with torch.profiler: DIR/rankN.json")


def config_from_args(args) -> RunConfig:
    """The RunConfig of parsed ``paralab run`` flags; ConfigError for a flag given that it would ignore."""
    bucket = {"bucket_mb": args.bucket_mb} if args.bucket_mb is not None else {}
    given = {k: v for k, v in (("world_size", args.world_size), ("nodes", args.nodes)) if v is not None}
    cfg = build_config(
        RunConfig, args, strategy=args.strategy, **given, **bucket,
        hierarchical=args.hierarchical, dp=args.dp, tp=args.tp,
        pp=args.pp, cp=args.cp, cp_mode=args.cp_mode, cp_split=args.cp_split, ep=args.ep,
        schedule=args.schedule, microbatches=args.microbatches, virtual_stages=args.virtual_stages,
        stage_layers=args.stage_layers,
        sequence_parallel=args.sequence_parallel, zero=args.zero, zero_prefetch=args.zero_prefetch,
        profile_dir=args.profile,
    )
    experts = {k: v for k, v in (("experts", args.experts), ("top_k", args.top_k),
                                 ("capacity_factor", args.capacity_factor)) if v is not None}
    preset = MODEL_PRESETS[cfg.model_name]
    if args.experts == 0:  # a preset's experts taken away take its routing with them (tiny-moe's top-2)
        cfg.model = dataclasses.replace(cfg.model, **DENSE_ROUTING)
    cfg.model = dataclasses.replace(cfg.model, **experts)
    refuse_run_flags_without_effect(args, cfg)  # in the preset's name: "model tiny-moe with --experts 0"
    if any(getattr(cfg.model, k) != getattr(preset, k) for k in experts):  # "model tiny" had named an MoE
        cfg.model_name = custom_from(cfg.model_name)  # (not for --attention: the summary says that)
    return cfg


def refuse_run_flags_without_effect(args, cfg: RunConfig) -> None:
    """ConfigError (exit 2, before any process starts) for a flag given that ``cfg``'s run would ignore,
    saying where it applies: whoever passes one believes it changed something. These flags default to
    None, so only one written on the command line is refused, never a default. (paralab.run keeps
    reporting a ``bucket_mb`` its strategy does not use as unused: a benchmark may hand one to several.)"""
    from paralab.strategies.registry import get_strategy, strategies

    if args.bucket_mb is not None and "bucket_mb" not in get_strategy(cfg.strategy).options:
        users = ", ".join(name for name, s in strategies().items() if "bucket_mb" in s.options)
        raise ConfigError(f"--bucket-mb has no effect with strategy {cfg.strategy}, which reduces no "
                          f"gradients in buckets; it applies to {users}")
    if not cfg.model.experts:
        for flag in ("top_k", "capacity_factor"):
            if getattr(args, flag) is not None:
                dense = f"model {cfg.model_name}" + (" with --experts 0" if args.experts == 0 else "")
                raise ConfigError(routing_without_experts(f"--{flag.replace('_', '-')}", dense))


def refuse_a_bucket_cap_of_one_replica(args, cfg: RunConfig) -> None:
    """ConfigError for ``--bucket-mb`` given to a run whose every gradient has one replica (dp x cp =
    1): paralab's bucketed reduction keeps no buckets then (``ddp.bucketed_sync``), where ZeRO-2
    still cuts its units by it; or to hybrid's ZeRO-1, which keeps one unit. Asked once the world
    size is the run's own: by ``run`` and by ``nodes`` before they launch, not by the torchrun workers
    they start (a run launched by torchrun itself is not asked)."""
    from paralab.layout import resolve_layout
    from paralab.strategies.registry import bucket_cap_applies, get_strategy

    if args.bucket_mb is None or "bucket_mb" not in get_strategy(cfg.strategy).options:
        return  # refused already, as a flag of a strategy without buckets
    layout = resolve_layout(cfg)
    if bucket_cap_applies(cfg.strategy, layout):
        return
    if layout.zero == 1:
        raise ConfigError(f"--bucket-mb has no effect: {cfg.strategy} with --zero 1 reduce-scatters the "
                          "whole model's gradients as one unit; buckets are --zero 0's and --zero 2's")
    raise ConfigError(f"--bucket-mb has no effect: {cfg.strategy} on "
                      f"{count_text(cfg.world_size, 'rank')} with dp {layout.dp} x cp {layout.cp} has one "
                      "replica of each gradient, which averages nothing, so it keeps no buckets; give it "
                      "dp >= 2")


def refuse_flags_the_launch_sets(args, cfg: RunConfig) -> None:
    """ConfigError for ``--world-size`` or ``--nodes`` given to a rank of a torchrun-style launch (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set) that disagree with what it launched: the
    launch decides them. Variables left in a shell make ``paralab run --world-size 4`` one rank of
    a world of WORLD_SIZE, which had run in silence."""
    from paralab.runtime.torchrun import ENV_KEYS, launched_config

    launched = launched_config(cfg)
    for flag, given, actual, read in (
            ("--world-size", args.world_size, launched.world_size, "WORLD_SIZE"),
            ("--nodes", args.nodes, launched.nodes, "GROUP_WORLD_SIZE and LOCAL_WORLD_SIZE")):
        if given is not None and given != actual:
            raise ConfigError(f"{flag} {given} disagrees with this launch, which set {actual} ({read}): "
                              f"leave {flag} out under torchrun, or unset {', '.join(ENV_KEYS)} to start "
                              f"a local run")


def cmd_run(args) -> int:
    from paralab.runtime.torchrun import refuse_half_a_launch, under_torchrun

    refuse_half_a_launch()
    if under_torchrun():
        _run_as_a_torchrun_rank(args)
    from paralab.outputs import check_run_outputs
    from paralab.runtime.launch import launch

    cfg = config_from_args(args)
    check_run_outputs(args)
    refuse_a_bucket_cap_of_one_replica(args, cfg)
    result = launch(cfg)
    if args.trace_dir:  # the summary's trace (--trace, given too, is written after it and named instead)
        result.save_trace(Path(args.trace_dir) / "merged.json")
    _write_outputs(result, args)
    return EXIT_OK


def _run_as_a_torchrun_rank(args) -> NoReturn:
    """This process's rank of a torchrun's run; rank 0 speaks for the run. An error is also written
    where torchrun reads it for its summary."""
    from paralab.outputs import check_run_outputs, check_trace_dir_holds_only
    from paralab.runtime.torchrun import (
        end_rank,
        errors_told_to_torchrun,
        launched_config,
        run_under_torchrun,
    )

    with errors_told_to_torchrun():
        cfg = config_from_args(args)
        check_run_outputs(args)
        refuse_flags_the_launch_sets(args, cfg)
        if args.trace_dir:  # another run's files there would be merged with this one's, or refused then
            check_trace_dir_holds_only(args.trace_dir, launched_config(cfg).world_size)
        result = run_under_torchrun(cfg, args.trace_dir)
        if result is not None:
            _write_outputs(result, args)
    end_rank(EXIT_OK)


def _write_outputs(result, args) -> None:
    """A finished run's trace, report and summary, where ``paralab run``'s options ask for them."""
    from paralab.runtime.torchrun import under_torchrun

    if args.trace:
        result.save_trace(args.trace)
    if args.report:
        from paralab.viz.report import write_report

        result.report_path = str(write_report(result, args.report))
    if args.json:
        print(json_text(result.summary))
    else:
        print(format_summary(result.summary))
        if args.trace_dir and under_torchrun():  # each rank's file there; a local run's trace is named
            print(f"trace folder: {args.trace_dir} (`paralab merge {args.trace_dir} -o merged.json --chrome` "
                  "for Perfetto, `paralab report` reads it as it is)")
        elif args.trace_dir and args.trace:  # the summary names --trace's copy, written last
            print(f"the same trace: {Path(args.trace_dir) / 'merged.json'}")


def format_summary(s: dict) -> str:
    """``paralab run``'s text summary: what ran (the choices that change the numbers below), what it
    measured, and where its files went."""
    cp = f" x cp {s['cp']} ({s['cp_mode']}, {s['cp_split']})" if s.get("cp", 1) > 1 else ""
    lines = [
        f"{s['strategy']} on {count_text(s['world_size'], 'rank')} ({s['device']}), "
        f"model {s['model']} in {s['dtype']}, {count_text(s['steps'], 'step')}",
        f"layout: dp {s['dp']}{cp} x tp {s['tp']} x pp {s['pp']}"
        + (f" (ep {s['ep']} inside dp)" if s.get("ep", 1) > 1 else "")
        + _schedule(s) + f", {count_text(s['microbatches'], 'microbatch', 'microbatches')}"
        + (f", ZeRO-{s['zero']}" if s.get("zero") else "") + _choices(s),
        "losses: " + " ".join(f"{x:.4f}" for x in s["losses"]),
        f"step time ({'median after the first' if s['steps'] > 1 else 'its one step, warm-up included'}): "
        f"{s['step_time_s'] * 1e3:.1f} ms   tokens/s: "
        f"{s['tokens_per_s']:,.0f}",
    ]
    lines += _span_lines(s)
    lines.append("peak memory per rank (MiB): "
                 + " ".join(f"{b / 2**20:.1f}" for b in s["peak_memory_bytes"]))
    if s.get("unused_options"):
        lines.append(f"unused by {s['strategy']}: {', '.join(s['unused_options'])}")
    if s["trace"]:
        lines.append(f"trace: {s['trace']} (open in https://ui.perfetto.dev)")
    if s.get("report"):
        lines.append(f"report: {s['report']} (open in a browser)")
    return "\n".join(lines)


def _schedule(s: dict) -> str:
    """The layout line's schedule, with its virtual stages (model chunks per rank) where there are
    several, as ``paralab simulate`` and ``plan`` say it: ``, schedule interleaved v=4``."""
    if not s["schedule"]:
        return ""
    return f", schedule {s['schedule']}" + (f" v={s['virtual_stages']}" if s["virtual_stages"] > 1 else "")


def _span_lines(s: dict) -> list[str]:
    """What the spans measured: bytes on the wire per op (and split by link on a run over several
    nodes) and a pipeline's bubble; said to be not measured, and why, where the run did not record
    them (the summary's ``unmeasured_why``)."""
    unmeasured = not_measured(s["unmeasured_why"])
    if s["comm_bytes"] is None:
        lines = [f"communication: {unmeasured}"]
    else:  # a receive's bytes are its send's (--json keeps every op)
        lines = [f"{op}: {_mib(nbytes)} on the wire per step (all ranks)"
                 for op, nbytes in s["comm_bytes"].items() if nbytes]
        if s["nodes"] > 1:
            link = s["comm_bytes_by_link"]
            lines.append(f"by link: {_mib(link['intra_node'])} intra-node, {_mib(link['inter_node'])} "
                         "inter-node per step (all ranks)")
    if s["bubble_fraction"] is None:
        lines.append(f"pipeline bubble (measured idle fraction): {unmeasured}")
    elif s["bubble_fraction"]:
        lines.append(f"pipeline bubble (measured idle fraction): {s['bubble_fraction']:.1%}")
    return lines


def _mib(nbytes: float) -> str:
    """Bytes as the summary's lines say them: MiB to the KiB, and a count under a KiB in bytes (the 8
    bytes of fp16's overflow check had read "0.000 MiB")."""
    return f"{nbytes:,.0f} B" if nbytes < 2**10 else f"{nbytes / 2**20:.3f} MiB"


def _choices(s: dict) -> str:
    """The layout line's tail: the bucket cap where the run keeps buckets, and the levers given that
    are not their defaults."""
    said = [
        "prefetching the next part" if s.get("zero_prefetch") else "",
        "hierarchical all-reduce" if s.get("hierarchical") else "",
        f"buckets of {s['bucket_mb']:g} MiB" if s.get("bucket_mb") is not None else "",
        "sequence parallel" if s.get("sequence_parallel") else "",
        f"recompute {s['recompute']}" if s.get("recompute", "none") != "none" else "",
        f"gradients reduced in {s['reduce_dtype']}" if s.get("reduce_dtype", "fp32") != "fp32" else "",
    ]
    return "".join(f", {choice}" for choice in said if choice)


def cmd_strategies(args) -> int:
    """``paralab strategies``: what every --strategy name runs, and its mesh axes."""
    from paralab.strategies.registry import strategies, strategy_table

    if args.json:
        print(json.dumps({name: {"title": s.title, "summary": s.summary, "axes": list(s.axes),
                                 "options": list(s.options), "reference_for": s.reference_for or None}
                          for name, s in strategies().items()}))
    else:
        print(strategy_table())
    return EXIT_OK


def cmd_merge(args) -> int:
    from paralab.outputs import check_file, check_output_reads_no_input, unread_text
    from paralab.trace import load_spans

    try:
        check_file(args.output, "output")
        check_output_reads_no_input(args.output, [("trace", args.path)])
        trace = load_spans(args.path)
    except (OSError, ValueError) as exc:  # ConfigError (the output), TraceFormatError: each says itself
        # an OS error the system explains ("out/: No such file or directory"); else one that says itself
        said = f"cannot read {unread_text(exc, args.path)}" if getattr(exc, "strerror", None) else str(exc)
        print(f"paralab merge: {said}", file=sys.stderr)
        return EXIT_INVALID
    summary = trace.summary()
    if args.chrome:
        trace.save_chrome(args.output)
    else:
        trace.save(args.output)
    print(f"merged {count_text(len(trace.ranks), 'rank')}, {len(trace.spans)} spans -> {args.output}; "
          f"median step {summary['step_time_s'] * 1e3:.1f} ms")
    return EXIT_OK


# what `paralab nodes` sets in the run it starts, which the same flag after -- would not change
NODES_SET = (("world_size", "--world-size", "the world is --nnodes x --nproc-per-node"),
             ("nodes", "--nodes", "the nodes are --nnodes"),
             ("trace_dir", "--trace-dir", "give it before --, to nodes itself"))


def refuse_run_flags_nodes_sets(parsed) -> None:
    """ConfigError for a flag after ``--`` that ``paralab nodes`` sets itself: it had been replaced
    without a word."""
    for dest, flag, instead in NODES_SET:
        if getattr(parsed, dest) is not None:
            raise ConfigError(f"{flag} after -- has no effect: paralab nodes sets it ({instead})")


def cmd_nodes(args) -> int:
    from paralab.outputs import check_run_outputs, check_trace_dir_holds_only
    from paralab.runtime.launch import preflight
    from paralab.runtime.multinode import run_local_nodes

    for option, count in (("--nnodes", args.nnodes), ("--nproc-per-node", args.nproc_per_node)):
        check_int(option, count, low=1)
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    parsed = build_parser().parse_args(["run", *attach_negative_lists(run_args)])
    refuse_run_flags_nodes_sets(parsed)
    if parsed.hierarchical and args.nnodes < 2:  # the run's own refusal names its --nodes, refused above
        raise ConfigError("hierarchical all-reduce needs ranks on at least 2 nodes: give --nnodes 2 or more")
    cfg = config_from_args(parsed)
    # the run's own --trace, --report, --profile and nodes' --trace-dir: before any agent starts
    check_run_outputs(argparse.Namespace(**{**vars(parsed), "trace_dir": args.trace_dir}))
    if args.trace_dir:
        check_trace_dir_holds_only(args.trace_dir, args.nnodes * args.nproc_per_node)
    # every agent's ranks run on this machine: the same checks as one launch of all of them, and the
    # device found for all of them handed to each agent (which would otherwise choose for its own)
    _, cfg = preflight(dataclasses.replace(cfg, world_size=args.nnodes * args.nproc_per_node,
                                           nodes=args.nnodes))
    refuse_a_bucket_cap_of_one_replica(parsed, cfg)
    run = run_local_nodes([*run_args, "--device", cfg.device], args.nnodes, args.nproc_per_node,
                          trace_dir=args.trace_dir)
    print(json_text(run.summary) if args.json or parsed.json else format_summary(run.summary))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    # argparse itself exits 2 on bad arguments, which is paralab's 'invalid' code too.
    parser = OneLineErrors(prog="paralab", description="Run, trace and simulate parallel training.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train with a strategy on real ranks")
    add_run_args(run)
    run.set_defaults(func=cmd_run, said_in=[run])
    merge = sub.add_parser("merge", help="merge per-rank traces (a --trace-dir) into one file")
    merge.add_argument("path", help="a directory of per-rank traces, or one trace file")
    merge.add_argument("-o", "--output", required=True, help="the merged trace's file")
    merge.add_argument("--chrome", action="store_true", help="write Chrome trace format (Perfetto)")
    merge.set_defaults(func=cmd_merge, said_in=[merge])
    nodes = sub.add_parser("nodes", help="run as several local torchrun agents, one per emulated node",
                           description="paralab nodes --nnodes 2 --nproc-per-node 2 "
                                       "-- --strategy ddp --hierarchical")
    nodes.add_argument("--nnodes", type=int, default=2, help="emulated nodes: one torchrun agent each")
    nodes.add_argument("--nproc-per-node", type=int, default=2, help="ranks on each node")
    nodes.add_argument("--trace-dir", help="where the per-rank traces go (default: a temporary directory)")
    nodes.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    nodes.add_argument("run_args", nargs=argparse.REMAINDER, help="options of `paralab run` after --")
    nodes.set_defaults(func=cmd_nodes, said_in=[nodes, run])  # and the run flags it passes on
    listing = sub.add_parser("strategies", help="list the strategies: what each runs, its mesh axes")
    listing.add_argument("--json", action="store_true", help="print one JSON object")
    listing.set_defaults(func=cmd_strategies, said_in=[listing])
    for name, help_text, add_args, command in _subcommands():
        sub_parser = sub.add_parser(name, help=help_text)
        add_args(sub_parser)
        sub_parser.set_defaults(func=command, said_in=[sub_parser])
    return parser


def _subcommands():
    """Commands whose arguments live with their code: (name, help, add_args, main)."""
    from paralab import bench, trace_import
    from paralab.elastic import cli as elastic_cli
    from paralab.sim import cli as sim_cli
    from paralab.viz import report

    return [
        ("elastic", "elastic training: failures, rescaling, load balancing", elastic_cli.add_elastic_args,
         elastic_cli.elastic_main),
        ("report", "write a standalone HTML report of a trace", report.add_report_args, report.report_main),
        ("bench", "compare strategies' speed: interleaved runs, median ratios", bench.add_bench_args,
         bench.bench_main),
        ("simulate", "predict a run with the cost model", sim_cli.add_simulate_args, sim_cli.simulate_main),
        ("plan", "rank parallel layouts for a model on N GPUs", sim_cli.add_plan_args, sim_cli.plan_main),
        ("import", "read torch.profiler traces, one per rank, into a paralab trace",
         trace_import.add_import_args, trace_import.import_main),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run a command; a ConfigError anywhere is exit 2 (nothing started), a RunError exit 1."""
    args = build_parser().parse_args(attach_negative_lists(sys.argv[1:] if argv is None else argv))
    with _warnings_in_one_line():
        return _run_command(args)


def _run_command(args) -> int:
    from paralab.runtime.result import RunError

    try:
        return args.func(args)
    except ConfigError as exc:
        message = str(exc)
        for parser in args.said_in:  # the parsers whose flags the command was given in
            message = said_as_flags(message, parser)
        print(f"paralab: invalid configuration: {message}", file=sys.stderr)
        return EXIT_INVALID
    except RunError as exc:
        print(f"paralab: run failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # the ranks go with their launcher (their finally blocks, the janitor)
        print("paralab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        if not _stdout_reader_gone():  # some other pipe broke: a real error
            raise
        # `paralab plan ... | head`: the reader went away. Point stdout at /dev/null so the flush at
        # exit cannot fail again, and exit as a program killed by SIGPIPE would (128 + 13).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_SIGPIPE


@contextlib.contextmanager
def _warnings_in_one_line():
    """paralab's own warnings (more ranks than cores, a disturbed calibration) said in one line on
    stderr, ``paralab: warning: ...``, as its refusals are: warnings' default format adds the file, the
    line and the source line that raised it, which tell a shell user nothing. Warnings raised
    elsewhere (torch's) keep their format. Only the format changes, so whatever records warnings
    (``catch_warnings(record=True)``, pytest) still records them."""
    plain = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):
        if issubclass(category, ParalabWarning):
            return f"paralab: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = plain


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end has been closed (poll reports an error on it)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
