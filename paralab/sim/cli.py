"""``paralab simulate`` and ``paralab plan``: argparse wiring around predict and plan.

Both print a short report, or one JSON object with ``--json`` (keys as the project design fixes
them, plus ``model_flops_per_step``, ``hardware_flops_per_step``, ``hfu``). ``simulate`` always
prints its prediction once the configuration can be built, and exits 0: one that does not fit in
memory says so (``fits: false``, by how much it is over, and the layouts that fit on the same GPUs),
and ``notes`` say what its numbers could be misread for (MFU above HFU, a cp split that saves nothing).
Input that cannot describe a run (degrees that do not divide, an unknown preset or hardware, a bad
hardware file) prints what is wrong, and what would fit, on one line of stderr and returns 2. ``plan``
with nothing that fits has an answer, not an invalid request: it says why on stdout (with ``--json``,
an empty ``ranked`` and the ``reason``) and returns 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paralab.cli_args import attention_named, below_one, int_list, json_text, said_as_flags
from paralab.config import ATTENTION_AS_SIMULATED
from paralab.cyclic_gc import without_cyclic_gc
from paralab.sim import cost, planner
from paralab.sim.hardware import MEASURING, get_hardware
from paralab.sim.hardware import NAMES as HARDWARE_NAMES
from paralab.sim.presets import MODELS, SHAPE, get_model, override
from paralab.sim.specs import (
    ATTENTION,
    ATTENTION_KERNELS,
    CP_MODES,
    CP_SPLITS,
    DEGREES,
    DTYPE_BYTES,
    KERNELS,
    MAX_GPUS,
    MAX_MICROBATCHES,
    RECOMPUTE,
    SCHEDULES,
    V_SHAPED,
    ModelSpec,
    ParallelSpec,
    SpecError,
)
from paralab.stage_split import ends_split, megatron_split
from paralab.text import count_text
from paralab.viz._common import fmt_bytes  # plotly-free

# the schedule a run without a pipeline is named by (ParallelSpec's default; plan's rows at pp 1)
PIPELINE_FREE_SCHEDULE = ParallelSpec.schedule
HINTED_ROWS = 3  # layouts that fit, offered beside a refusal or a prediction that does not fit
# what a prediction that does not fit keeps in the layouts it offers first: how it splits its GPUs, and
# how cp splits its sequences
KEPT = (*DEGREES, "cp_mode")


def percent(share: float) -> str:
    """MFU and HFU as the report prints them (one rule for the print and for comparing them)."""
    return f"{share:.1%}"


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model (a preset, or a shape)")
    g.add_argument("--model", help=f"preset: {', '.join(MODELS)}")
    helps = {"kv_heads": "GQA KV heads",
             "expert_ffn": "each expert's FFN width, for a mixture-of-experts --model (default: the "
                           "preset's)"}
    for name in SHAPE:
        g.add_argument(f"--{name.replace('_', '-')}", type=int,
                       help=helps.get(name, "overrides the preset's value"))
    g.add_argument("--dtype", choices=sorted(DTYPE_BYTES),
                   help="training dtype (default: the preset's; bf16 for a shape given without --model)")
    g.add_argument("--attention", choices=ATTENTION, type=attention_named(ATTENTION_AS_SIMULATED),
                   help="standard (run's math) keeps the s x s scores; fused (flash; run's sdpa) does not")
    g.add_argument("--attention-kernel", choices=ATTENTION_KERNELS,
                   help="what runs a fused attention: native (as fast as the GEMMs; default) or flash2 "
                        "(FlashAttention-2 at its measured speed: ~30%% of an H100's peak)")
    g.add_argument("--parallel-blocks", action="store_true", default=None,
                   help="attention and MLP side by side (PaLM)")
    g.add_argument("--fp8", action="store_true", default=None,
                   help="linear layers' GEMMs in FP8 (Transformer Engine)")
    g.add_argument("--kernels", choices=KERNELS,
                   help="fused (a kernel library or torch.compile; default) or eager: one kernel per op")
    parser.add_argument("--hardware", default="a100",
                        help=f"one of {', '.join(HARDWARE_NAMES)}, or FILE.json (docs/simulator.md) "
                             "(default a100)")
    parser.add_argument("--global-batch", type=int,
                        help="sequences per step (simulate's default, without --microbatches: one microbatch "
                             "of one sequence a replica, pp x virtual stages of them in a pipeline; plan's: "
                             "from the GPUs and the sequence length, docs/simulator.md)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_simulate_args(parser: argparse.ArgumentParser) -> None:
    _add_model_args(parser)
    parser.set_defaults(said_in=[parser])  # what a refusal of the spec's fields is said in (_refuse)
    parser.add_argument("--gpus", type=int, help="total GPUs; dp defaults to gpus / (tp x pp x cp)")
    parser.add_argument("--micro-batch", type=int,
                        help="sequences per microbatch (default: what --global-batch and --microbatches "
                             "leave; with only --global-batch, all of a replica's share at pp 1, "
                             "1 in a pipeline)")
    parser.add_argument("--dp", type=int, help="data-parallel degree (default: what --gpus leaves)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages")
    parser.add_argument("--ep", type=int, default=1,
                        help="expert parallel, carved out of dp (a mixture of experts)")
    parser.add_argument("--expert-imbalance", type=float, default=1.0,
                        help="busiest expert's tokens over the mean (1: balanced; a measured run's: "
                             "paralab.moe_load)")
    parser.add_argument("--virtual-stages", type=int, default=1, help="model chunks per pipeline GPU")
    parser.add_argument("--stage-layers", type=int_list,
                        metavar="N,N,...", help="blocks per pipeline chunk in model order (default: even)")
    parser.add_argument("--schedule", default=PIPELINE_FREE_SCHEDULE,
                        help=f"with --pp 2 or more: one of {', '.join(SCHEDULES)} (default "
                             f"{PIPELINE_FREE_SCHEDULE})")
    parser.add_argument("--microbatches", type=int,
                        help="per data-parallel rank (default from --global-batch)")
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3),
                        help="ZeRO stage over the data-parallel ranks")
    parser.add_argument("--sequence-parallel", action="store_true",
                        help="with --tp: the norms and dropout on a slice of the sequence")
    parser.add_argument("--recompute", default="none", choices=RECOMPUTE, help="activation recomputation")
    parser.add_argument("--first-stage-layers", type=int,
                        help="an uneven pipeline split: layers of the first stage, the rest shared evenly "
                             "by the other stages (Megatron-LM's option; --stage-layers says it in full)")
    parser.add_argument("--last-stage-layers", type=int,
                        help="an uneven pipeline split: layers of the last stage")
    _add_fp32_grads(parser)
    parser.add_argument("--fsdp-root", action="store_true",
                        help="with --zero 3: the embedding, final norm and output layer are one unit, "
                             "gathered before the forward and reduce-scattered after the backward, as "
                             "PyTorch FSDP runs a model wrapped block by block and then whole (torchtitan, "
                             "Composer)")
    parser.add_argument("--fp32-shards", action="store_true",
                        help="with --zero 3: the shards are fp32 and are the optimizer's weights, gathered "
                             "in 16 bits, as PyTorch FSDP runs mixed precision (16 bytes a parameter over "
                             "dp, with or without --fp32-grads; plain --zero 3 keeps 16, or 18 with "
                             "--fp32-grads)")
    parser.add_argument("--hierarchical", action="store_true",
                        help="reduce gradients in three steps: reduce-scatter inside each node, all-reduce "
                             "of the shards across nodes, all-gather inside the node (paralab's ddp "
                             "--hierarchical; default: NCCL's flat all-reduce)")
    parser.add_argument("--cp", type=int, default=1, help="context parallel: each sequence over cp GPUs")
    # None: not given, the spec's default (a flag given at cp 1 is refused: _flags_without_effect)
    parser.add_argument("--cp-mode", choices=CP_MODES,
                        help=f"with --cp 2 or more: how K/V travel (default {ParallelSpec.cp_mode})")
    parser.add_argument("--cp-split", choices=CP_SPLITS,
                        help=f"with --cp 2 or more: how a sequence is cut (default {ParallelSpec.cp_split})")


def add_plan_args(parser: argparse.ArgumentParser) -> None:
    _add_model_args(parser)
    parser.add_argument("--gpus", type=int, required=True, help="total GPUs to plan for")
    parser.add_argument("--top", type=int, default=10, help="how many configurations to list")
    _add_fp32_grads(parser)


def _add_fp32_grads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fp32-grads", action="store_true",
                        help="accumulate and reduce gradients in fp32 (Megatron's main_grad, its default "
                             "under bf16; with --zero 1, its distributed optimizer); default: in the "
                             "model's dtype, as torch's FSDP")


def _model(args) -> ModelSpec:
    """The preset with what the flags override (re-deriving what follows, see presets.override), or
    a shape built from the flags alone."""
    given = {k: getattr(args, k) for k in SHAPE if getattr(args, k) is not None}
    # ModelSpec reads 0 as "derive it", and a negative hidden had been refused with the ffn derived from it
    below = [f"--{k.replace('_', '-')} must be positive, got {given[k]}" for k in SHAPE
             if given.get(k, 1) < 1]
    if below:
        raise SpecError("; ".join(below))
    flags = ("dtype", "attention", "attention_kernel", "parallel_blocks", "fp8", "kernels")
    given.update({k: getattr(args, k) for k in flags if getattr(args, k) is not None})
    if args.model:
        return override(get_model(args.model), **given)
    if "expert_ffn" in given:
        raise SpecError("--expert-ffn sets the experts' width of a mixture-of-experts preset: give --model "
                        "(" + ", ".join(name for name, m in MODELS.items() if m.experts) + ")")
    missing = [k for k in ("layers", "hidden", "heads") if k not in given]
    if missing:
        raise SpecError(f"give --model PRESET or a shape; missing --{', --'.join(missing)} (presets: "
                        f"{', '.join(MODELS)})")
    return ModelSpec(**given)


def _stage_layers(args, model: ModelSpec) -> tuple[int, ...] | None:
    """--stage-layers, or the split Megatron-LM's --first/--last-stage-layers give: the given end(s)
    as asked, the other stages sharing the rest evenly (ParallelSpec.problems says when they cannot)."""
    first, last = args.first_stage_layers, args.last_stage_layers
    if first is None and last is None:
        return tuple(args.stage_layers) if args.stage_layers is not None else None
    if args.pp < 2:
        raise SpecError("--first/--last-stage-layers split a pipeline: give --pp 2 or more")
    if args.stage_layers is not None:
        raise SpecError("give --stage-layers or --first/--last-stage-layers, not both")
    if args.virtual_stages != 1 or args.schedule in V_SHAPED:
        why = f" (the {args.schedule} schedule runs two per rank)" if args.schedule in V_SHAPED else ""
        raise SpecError("--first/--last-stage-layers split one chunk per stage; give --stage-layers for "
                        f"virtual stages{why}")
    for flag, value in (("first", first), ("last", last)):
        if value is not None and not 0 <= value <= model.layers:
            raise SpecError(f"--{flag}-stage-layers must be 0 to {model.layers} (the model's layers), "
                            f"got {value}")
    if first is None or last is None:  # the other stages share the rest evenly, the missing end one of them
        given, flag = (first, "first") if last is None else (last, "last")
        others = args.pp - 1
        # the middle stages keep a layer each; with two stages the other is an end, which may hold none
        working = [n for n in range(model.layers - (others if others > 1 else 0) + 1)
                   if (model.layers - n) % others == 0]
        if given not in working:
            nearest = {max((n for n in working if n < given), default=None),
                       min((n for n in working if n > given), default=None)} - {None}
            offer = f"try {' or '.join(map(str, sorted(nearest)))}, or " if nearest else ""
            raise SpecError(f"--{flag}-stage-layers {given} leaves {model.layers - given} of {model.layers} "
                            f"layers, which the other {others} stages cannot share evenly, one at least "
                            f"each; {offer}give --stage-layers")
        share = (model.layers - given) // others
        first, last = (first, share) if last is None else (share, last)
    middle, rest = args.pp - 2, model.layers - first - last
    if rest < middle or (rest % middle if middle else rest):
        two_stages = (first, model.layers - first) if not middle else None
        ends = megatron_split(model.layers, args.pp) or two_stages
        offer = f"try --first-stage-layers {ends[0]} --last-stage-layers {ends[-1]}, or " if ends else ""
        if rest < 0:
            why = f"add up to more than the model's {model.layers} layers"
        elif not middle:
            why = f"leave {rest} of {model.layers} layers to no other stage"
        elif rest < middle:
            needs = ("the middle stage needs one" if middle == 1
                     else f"the {middle} middle stages need one each")
            why = f"leave {rest} of {model.layers} layers, and {needs}"
        else:
            why = (f"leave {rest} of {model.layers} layers, which the {middle} middle stages cannot "
                   "share evenly")
        raise SpecError(f"--first-stage-layers {first} and --last-stage-layers {last} {why}; "
                        f"{offer}give --stage-layers")
    return ends_split(model.layers, args.pp, first, last)


def _flags_without_effect(args, model: ModelSpec, dp: int | None = None) -> str:
    """A flag given that changes nothing in this prediction, said with where it applies (empty when
    none is): whoever passes one believes it changed something. The context-parallel flags default to
    None, so only one written on the command line counts. ``plan`` has only --fp32-grads of these;
    ``dp``: simulate's data-parallel degree, None where the degrees do not make up the GPUs (which the
    spec's check says; a dp of 1 for want of a whole number had been told --zero changes nothing)."""
    if args.fp32_grads and model.dtype == "fp32":
        return (f"--fp32-grads has no effect: {model.name} trains in fp32, so its gradients are fp32 "
                "already; it applies to a 16-bit model (--dtype bf16 or fp16)")
    if not hasattr(args, "cp") or dp is None:  # plan; or degrees the spec's check will refuse first
        return ""
    for flag, what in (("cp_mode", "how K/V travel between"), ("cp_split", "how a sequence is cut over")):
        if getattr(args, flag) is not None and args.cp == 1:
            return (f"--{flag.replace('_', '-')} has no effect without context parallelism (cp 1): it "
                    f"says {what} the cp GPUs; it applies with --cp 2 or more")
    if args.pp == 1 and args.schedule != PIPELINE_FREE_SCHEDULE and args.schedule in SCHEDULES:
        return (f"--schedule {args.schedule} has no effect without a pipeline (pp 1): a schedule orders the "
                "microbatches' passes over the pipeline's stages, and one stage runs them one after the "
                f"other whatever it is named ({PIPELINE_FREE_SCHEDULE}, as plan names it at pp 1); it "
                "applies with --pp 2 or more")
    if args.pp == 1 and args.stage_layers is not None:
        return ("--stage-layers has no effect without a pipeline (pp 1): one stage holds every layer; it "
                "applies with --pp 2 or more")
    if args.zero and dp == 1 and args.cp == 1:  # ZeRO shards over dp x cp (the ranks that reduce)
        return (f"--zero {args.zero} has no effect with one data-parallel replica (dp 1) and cp 1: ZeRO "
                "shards the optimizer's states, gradients and parameters over the data- and context-"
                "parallel ranks; it applies with dp x cp of 2 or more")
    if args.recompute not in planner.recompute_policies(model, args.cp):
        return (f"--recompute {args.recompute} has no effect on {model.name} at cp 1: it recomputes the "
                "attention core's s x s scores, which its fused attention never stores; it applies with "
                "--attention standard, or across a context-parallel split (--cp 2 or more)")
    return ""


def _too_many(gpus: int) -> str:
    return f"{gpus:,} GPUs: the simulator models up to {MAX_GPUS:,}"


def _hardware(name: str):
    """The hardware named; the first ``local`` is measured for 10-30 s, which a terminal is told (a
    pipe is not: its stderr stays the one-line refusal or nothing)."""
    return get_hardware(name, on_measure=_say_measuring)


def _say_measuring(cache: Path) -> None:
    if sys.stderr.isatty():
        print(MEASURING.format(cache), file=sys.stderr)


def _fail(message: str) -> int:
    print(f"paralab: {message}", file=sys.stderr)
    return 2


def _refuse(args, problems: list[str], hint: str = "") -> int:
    """Exit 2 for a model or spec that cannot be built, its fields said as the flags that set them."""
    message = "invalid configuration: " + "; ".join(problems)
    for parser in args.said_in:
        message = said_as_flags(message, parser)
    return _fail(message + (". " + hint if hint else ""))


def _with_dp_unsaid(problems: list[str], args, gpus: int) -> list[str]:
    """``problems`` with a dp the user did not give left unnamed: where the other degrees do not divide
    the GPUs, dp stands at 1 for want of a whole number, and "dp x tp x pp = 1 x 3 x 1 = 3 != 8 GPUs"
    had named that 1 as if it were asked for."""
    split = args.tp * args.pp * args.cp
    if args.dp or not gpus % split:
        return problems
    names = [n for n, d in (("tp", args.tp), ("pp", args.pp), ("cp", args.cp)) if d > 1]
    degrees = f"{names[0]} {split}" if len(names) == 1 else f"{' x '.join(names)} = {split}"
    said = f"{degrees} does not divide {count_text(gpus, 'GPU')} (dp would be {gpus / split:,.2f})"
    return [said, *(p for p in problems if not p.startswith("dp x tp x pp"))]


def _batch_of(parallel: ParallelSpec, gpus: int) -> int | None:
    """The global batch a refused spec would have priced: the one asked for, else its own resolved as
    for a spec that builds (so that a refusal and a layout that does not fit offer layouts for the same
    batch); None, the planner's default, where its degrees do not make up the GPUs or it asks for more
    microbatches than the simulator models (its batch would be another run's)."""
    p = parallel.resolved()
    if p.world_size != gpus or p.microbatches > MAX_MICROBATCHES:
        return None
    return parallel.global_batch or p.global_batch


# what a layout the planner offers chooses, and what holds only with some layouts (FSDP's wrapping, a
# hierarchical all-reduce): a refused spec with these in place of its own is that layout
LAYOUT_FIELDS = ("dp", "tp", "pp", "ep", "cp", "cp_mode", "virtual_stages", "schedule", "stage_layers",
                 "microbatches", "micro_batch", "global_batch", "zero", "sequence_parallel", "recompute",
                 "fsdp_root", "fp32_shards", "hierarchical_dp")


def _fits_hint(model: ModelSpec, gpus: int, hw, refused: ParallelSpec) -> str:
    """What would fit: the planner's best few on these GPUs for the batch asked (else the planner's
    default, named), their gradients kept as the refused configuration's, or why nothing does; nothing
    where the refusal is not the layout's (an offered layout would be refused for it too: an expert
    imbalance below 1 had come with three layouts that change nothing of it). A refusal names layouts,
    not their speeds, so only the rows it names are simulated (llama3-405b's own layout refused on
    16,384 GPUs had waited 6 s for ten rows' simulations; 1 s now): where a closed form was
    pessimistic, `paralab plan`, which simulates more rows, can rank them otherwise."""
    global_batch = _batch_of(refused, gpus)
    ranked = planner.plan(model, gpus, hw, global_batch, top=HINTED_ROWS, refine=HINTED_ROWS,
                          fp32_grads=refused.fp32_grads)
    layout = ranked[0].parallel if ranked else ParallelSpec(dp=gpus)  # the plainest, where none fits
    if refused.replace(**{f: getattr(layout, f) for f in LAYOUT_FIELDS}).problems(model, gpus):
        return ""
    if ranked:
        batch = ranked[0].parallel.global_batch
        default = "" if global_batch else ", the planner's default batch"
        return "Configurations that fit on {} at {} a step{}: {}".format(
            count_text(gpus, "GPU"), count_text(batch, "sequence"), default,
            " | ".join(planner.describe(p.parallel) for p in ranked))
    why = planner.why_nothing_fits(model, gpus, hw, global_batch, refused.fp32_grads)
    return f"Nothing fits on {count_text(gpus, 'GPU')}: {why}"


def _alternatives(model: ModelSpec, gpus: int, hw, global_batch: int | None,
                  fp32_grads: bool) -> list[cost.Prediction]:
    """The planner's best three, priced as `paralab plan` prices them (its best rows simulated), so
    that their tokens/s match what `plan` and `simulate` say of the same layouts."""
    return planner.plan(model, gpus, hw, global_batch, top=HINTED_ROWS, fp32_grads=fp32_grads)


def _alternatives_keeping(model: ModelSpec, hw, asked: ParallelSpec) -> list[cost.Prediction]:
    """The planner's best three with the degrees of a layout that does not fit (:data:`KEPT`): what
    else would make it fit, where a learner asked for those degrees (GPT-3 175B at tp 2 x pp 2 on 64
    A100s fits with ZeRO-3 and full recompute, which the best layouts on those GPUs, tp 8 x pp 8, do not
    need). Each row is simulated, as `simulate` prices it; only three, as a refusal's are."""
    return planner.plan(model, asked.world_size, hw, asked.global_batch, top=HINTED_ROWS, refine=HINTED_ROWS,
                        fp32_grads=asked.fp32_grads, keep={k: getattr(asked, k) for k in KEPT})


def simulate_main(args) -> int:
    counts = ("tp", "pp", "cp", "dp", "gpus", "virtual_stages", "ep", "global_batch", "micro_batch",
              "microbatches")
    if problem := below_one(args, counts):  # before a `local` machine is measured for nothing
        return _fail(problem)
    tp, pp, cp = args.tp, args.pp, args.cp
    dp = args.dp or (args.gpus // (tp * pp * cp) if args.gpus and args.gpus % (tp * pp * cp) == 0 else 1)
    gpus = args.gpus or dp * tp * pp * cp
    if gpus > MAX_GPUS:  # before the alternatives a refusal lists are planned for that many
        return _fail(_too_many(gpus))
    try:
        model = _model(args)
        stage_layers = _stage_layers(args, model)
    except SpecError as err:
        return _fail(str(err))
    made_up = dp * tp * pp * cp == gpus  # else dp stands at 1 for want of a whole number
    if problem := _flags_without_effect(args, model, dp if made_up else None):  # before `local` is measured
        return _fail(problem)
    context = {k: getattr(args, k) for k in ("cp_mode", "cp_split") if getattr(args, k) is not None}
    parallel = ParallelSpec(
        dp=dp, tp=tp, pp=pp, ep=args.ep, virtual_stages=args.virtual_stages, schedule=args.schedule,
        stage_layers=stage_layers, expert_imbalance=args.expert_imbalance,
        microbatches=args.microbatches or 0, micro_batch=args.micro_batch or 0,
        global_batch=args.global_batch or 0,
        zero=args.zero, sequence_parallel=args.sequence_parallel, recompute=args.recompute, cp=cp, **context,
        fp32_grads=args.fp32_grads, fsdp_root=args.fsdp_root, fp32_shards=args.fp32_shards,
    )  # fmt: skip
    if problems := model.problems():
        return _refuse(args, problems)
    try:
        hw = _hardware(args.hardware)
    except SpecError as err:
        return _fail(str(err))
    if problems := hw.problems_for(model):
        return _fail("invalid configuration: " + "; ".join(problems))
    if args.hierarchical:  # over the data-parallel ranks each node holds
        local = cost.ranks_per_node(hw, dp, parallel.stride("dp"))
        parallel = parallel.hierarchy_over(local)
        if not parallel.hierarchical_dp:
            why = (f"{local} ranks a node do not divide dp {dp}" if dp % local else
                   f"dp {dp} is {count_text(dp // local, 'node')} of {count_text(local, 'rank')}")
            return _fail(f"a hierarchical all-reduce needs 2 or more data-parallel ranks on each of 2 or "
                         f"more nodes: on {hw.name} ({count_text(hw.gpus_per_node, 'GPU')} a node) {why}")
    if problems := _with_dp_unsaid(parallel.problems(model, gpus), args, gpus):
        hint = _fits_hint(model, gpus, hw, parallel)
        return _refuse(args, problems, hint)
    pred = cost.predict(model, parallel, hw)
    out = pred.to_dict()
    out.update(model=model.name, shape=_shape(model), hardware=hw.name, gpus=gpus,
               config=planner.describe(pred.parallel),
               pipeline_passes=cost.pipeline_passes(pred.parallel), **_degrees(pred.parallel),
               stage_imbalance=cost.stage_imbalance(model, pred.parallel, hw),
               notes=[note for note in (_mfu_note(pred, hw), _cp_micro_batch_note(pred, parallel, model, hw),
                                        _zero3_note(pred)) if note])
    usable = cost.usable_memory(hw)
    over = max(0.0, pred.memory_bytes_per_gpu["total"] - usable)
    # the same keys whether it fits or not (empty when it does): a script reading them had failed on
    # the configurations that fit
    out.update(memory_usable_bytes=int(usable), memory_over_bytes=int(over), alternatives=[],
               alternatives_same_degrees=[], advice="")
    if not pred.fits:  # what fits for the batch just priced, so their tokens/s compare with its
        batch = pred.parallel.global_batch
        ranked = _alternatives(model, gpus, hw, batch, pred.parallel.fp32_grads)
        out["alternatives"] = [_alternative(p) for p in ranked]
        kept = _alternatives_keeping(model, hw, pred.parallel)
        out["alternatives_same_degrees"] = [_alternative(p) for p in kept]
        out["advice"] = "" if ranked else planner.why_nothing_fits(model, gpus, hw, batch,
                                                                   pred.parallel.fp32_grads)
    print(json_text(out) if args.json else _report(out))
    return 0


def _alternative(p: cost.Prediction) -> dict:
    """A layout offered beside a prediction that does not fit, as `--json` gives it."""
    return dict(config=planner.describe(p.parallel), tokens_per_s=p.tokens_per_s, mfu=p.mfu,
                memory_bytes_per_gpu=p.to_dict()["memory_bytes_per_gpu"], **_degrees(p.parallel))


def _alternative_lines(rows: list[dict]) -> list[str]:
    return [f"    {a['config']} ({planner.bytes_text(a['memory_bytes_per_gpu']['total'])}, "
            f"{a['tokens_per_s']:,.0f} tokens/s)" for a in rows]


def _same_degrees_lines(out: dict) -> list[str]:
    """The layouts that fit with the degrees asked, or that none the planner weighs does; nothing where
    they are the layouts that fit on these GPUs anyway."""
    same = out["alternatives_same_degrees"]
    if [a["config"] for a in same] == [a["config"] for a in out["alternatives"]]:
        return []
    kept = planner.degrees_text(ParallelSpec(**{k: out[k] for k in KEPT}), split=False)  # not kept
    if not same:
        return [f"  no layout of {kept} that the planner weighs fits (its schedules, micro-batches, ZeRO "
                f"stages and recompute policies)"]
    return [f"  keeping {kept}, what fits:", *_alternative_lines(same)]


def _mfu_note(pred: cost.Prediction, hw) -> str:
    """Why MFU reads above HFU, where it does: MFU's model FLOPs count attention's whole s x s square, as
    the published MFU figures it is compared with count it (docs/simulator.md), where a causal fused
    kernel computes, and HFU counts, half of it; on a part whose GEMMs reach its whole peak (``local``)
    MFU may then pass 100% (llama3-8b on 2 ranks: 101.9%, HFU 92.4%)."""
    if pred.mfu <= pred.hfu or percent(pred.mfu) == percent(pred.hfu):  # "MFU 0.7%, HFU 0.7%"
        return ""
    beyond = (f", and, with GEMMs at {hw.matmul_max_efficiency:.0%} of {hw.name}'s peak, above 100%"
              if pred.mfu > 1 else "")
    return ("MFU counts attention's whole s x s square, as published MFU figures do (docs/simulator.md); "
            f"the causal fused kernel computes half of it, which HFU counts, so MFU reads above HFU{beyond}")


def _zero3_note(pred: cost.Prediction) -> str:
    """ZeRO-3's per-layer gathers are priced as bytes and latencies that hide under compute; measured
    at scale they have not hidden. Llama 3 405B on 1,000 H100s with ZeRO-3 had read 46% MFU without the
    note the planner's explanation gives a ZeRO-3 winner."""
    p = pred.parallel
    if p.zero != 3 or p.dp * p.cp == 1:
        return ""
    return "ZeRO-3's gathers are priced as hiding under compute where they fit beside it, " + \
        planner.ZERO3_UNSHOWN


def _cp_micro_batch_note(pred: cost.Prediction, asked: ParallelSpec, model: ModelSpec, hw) -> str:
    """Where cp took its GPUs from dp and the micro-batch was derived from the global batch, it grew cp
    times, so each GPU holds as many tokens a microbatch as the same GPUs without cp: the split saves no
    activation memory (llama3-8b, 8 sequences of 131,072 tokens on 64 GPUs at tp 8 with sequence
    parallel: 76.1 GiB at every cp); --micro-batch holds it, and the note says whether that fits (it had
    offered a micro-batch at which llama3-8b at cp 16 still kept 109.5 GiB a GPU)."""
    p = pred.parallel
    if p.cp == 1 or asked.micro_batch:
        return ""
    unsplit = asked.replace(dp=p.dp * p.cp, cp=1).resolved()
    if p.micro_batch != p.cp * unsplit.micro_batch:
        return ""
    held = cost.predict(model, asked.replace(micro_batch=unsplit.micro_batch), hw, simulate=False)
    held_bytes = planner.bytes_text(held.memory_bytes_per_gpu["total"])
    fits = "" if held.fits else f", though at {held_bytes} a GPU that does not fit either"
    return (f"cp {p.cp} takes its GPUs from dp, so the micro-batch derived from the global batch is "
            f"{p.micro_batch} sequences, {p.cp} times the {unsplit.micro_batch} these GPUs would take "
            f"without cp: each GPU holds as many tokens a microbatch as without cp, so the split saves no "
            f"activation memory; --micro-batch {unsplit.micro_batch} keeps it and lets the split save{fits}")


def _shape(model: ModelSpec) -> dict[str, int]:
    """The model's shape as priced (an override re-derives some of it: presets.override), the experts'
    width only where it has experts."""
    return {k: getattr(model, k) for k in SHAPE if k != "expert_ffn" or model.experts}


def _shape_text(shape: dict[str, int]) -> str:
    kv = f" ({shape['kv_heads']:,} KV)" if shape["kv_heads"] != shape["heads"] else ""
    experts = f", experts' MLP {shape['expert_ffn']:,}" if "expert_ffn" in shape else ""
    return (f"  shape: {shape['layers']:,} layers, hidden {shape['hidden']:,}, {shape['heads']:,} heads{kv}, "
            f"MLP {shape['ffn']:,}{experts}, vocabulary {shape['vocab']:,}, {shape['seq']:,} tokens")


def _report(out: dict) -> str:
    mem = out["memory_bytes_per_gpu"]
    lines = [
        f"{out['model']} on {out['gpus']:,} x {out['hardware']}, "
        f"{count_text(out['global_batch'], 'sequence')} a step: {out['config']}",
        # an override re-derives part of the shape: say what was priced
        *([_shape_text(out["shape"])] if out["model"].startswith("custom") else []),
        f"  step {planner.seconds_text(out['step_time_s'])}, {out['tokens_per_s']:,.0f} tokens/s, "
        f"{planner.flops_text(out['tflops_per_gpu'])} per GPU (hardware FLOPs, recompute counted), "
        f"MFU {percent(out['mfu'])}, HFU {percent(out['hfu'])}"
        + (f", pipeline idle {out['bubble_fraction']:.1%}" if out["pp"] > 1 else "")
        + (f" (unequal stages {out['stage_imbalance']:.1%}, the schedule and p2p waits the rest)"
           if out["stage_imbalance"] >= 0.0005 else ""),
        *([f"  pipeline priced by the schedule's closed form: its {out['pipeline_passes']:,} passes are more "
           f"than the {cost.SIMULATED_PASSES:,} simulated one by one"]
          if out["pipeline_pricing"] == "closed form" else []),
        *([f"  pipeline simulated for the microbatches whose passes fit in {cost.SIMULATED_PASSES:,} (of its "
           f"{out['pipeline_passes']:,}), each further microbatch adding the busiest rank's work"]
          if out["pipeline_pricing"] == "extended" else []),
        *(f"  note: {note}" for note in out["notes"]),
        *([f"  parameters {out['params'] / 1e9:.1f}B, {out['active_params'] / 1e9:.1f}B active per token"]
          if out["active_params"] != out["params"] else []),
        "  memory per GPU: " + ", ".join(f"{k} {planner.bytes_text(v)}" for k, v in mem.items()),
        "  wire bytes per step of the GPU that sends the most: "
        + (", ".join(f"{k} {fmt_bytes(v)}" for k, v in out["comm_bytes_per_gpu"].items()) or "none"),
    ]  # fmt: skip
    if not out["fits"]:
        over, usable = out["memory_over_bytes"], out["memory_usable_bytes"]
        lines.append(f"  does not fit: {planner.bytes_text(mem['total'])} per GPU > "
                     f"{planner.bytes_text(usable)} usable on {out['hardware']}, over by "
                     f"{planner.bytes_text(over)} ({over / usable:.0%})")
        if out["alternatives"]:
            lines += _same_degrees_lines(out)
            lines.append(f"  layouts that fit on {count_text(out['gpus'], 'GPU')}, "
                         f"{count_text(out['global_batch'], 'sequence')} a step:")
            lines += _alternative_lines(out["alternatives"])
        else:
            lines.append(f"  nothing fits on {count_text(out['gpus'], 'GPU')}: {out['advice']}")
    return "\n".join(lines)


def plan_main(args) -> int:
    if problem := below_one(args, ("gpus", "global_batch", "top")):  # before a `local` machine is measured
        return _fail(problem)
    if args.gpus > MAX_GPUS:
        return _fail(_too_many(args.gpus))
    try:
        model = _model(args)
        if problems := model.problems():
            return _fail("invalid model: " + "; ".join(problems))
        if problem := _flags_without_effect(args, model):
            return _fail(problem)
        hw = _hardware(args.hardware)
    except SpecError as err:
        return _fail(str(err))
    if problems := hw.problems_for(model):
        return _fail("invalid model: " + "; ".join(problems))
    return _plan_and_say(args, model, hw)


# the explanation too, while the plan's schedules are alive; not the `local` machine's measurement
# above, which times the training loop as runs have it, collector on
@without_cyclic_gc
def _plan_and_say(args, model: ModelSpec, hw) -> int:
    ranked = planner.plan(model, args.gpus, hw, args.global_batch, top=args.top, fp32_grads=args.fp32_grads)
    batch = planner.planned_batch(model, args.gpus, args.global_batch)
    answer = {"model": model.name, "gpus": args.gpus, "hardware": hw.name, "shape": _shape(model),
              "global_batch": batch}
    if not ranked:  # an answer, not an invalid request: said on stdout, exit 0
        reason = planner.why_nothing_fits(model, args.gpus, hw, args.global_batch, args.fp32_grads)
        empty = {**answer, "ranked": [], "explain": [], "notes": [], "reason": reason}
        print(json_text(empty) if args.json else
              f"nothing fits on {count_text(args.gpus, hw.name + ' GPU')}: {reason}")
        return 0
    sentences = planner.explain(ranked, model, hw)
    notes = [note for note in (_mfu_note(p, hw) for p in ranked) if note]
    if args.json:
        rows = [dict(p.to_dict(), config=planner.describe(p.parallel), **_degrees(p.parallel))
                for p in ranked]
        print(json_text({**answer, "ranked": rows, "explain": sentences, "notes": notes[:1]}))
        return 0
    print(f"{model.name} on {count_text(args.gpus, hw.name + ' GPU')}, "
          f"{count_text(batch, 'sequence')} of {model.seq:,} tokens a step"
          + ("" if args.global_batch else f" ({_default_batch_note(model, args.gpus, hw, batch)})"))
    if model.name.startswith("custom"):  # an override re-derives part of the shape: say what was planned
        print(_shape_text(_shape(model)))
    # ranked by tokens/s (the first row the leanest as fast), which MFU follows; hardware TFLOP/s also
    # counts recompute, so it need not
    print(f"    {'tokens/s':>10} {'MFU':>6} {'hardware rate':>15} {'memory':>10}  layout")
    for i, p in enumerate(ranked, 1):
        rate, memory = (planner.flops_text(p.tflops_per_gpu),
                        planner.bytes_text(p.memory_bytes_per_gpu["total"]))
        print(f"{i:2d}. {p.tokens_per_s:>10,.0f} {p.mfu:>6.1%} {rate:>15} {memory:>10}  "
              f"{planner.describe(p.parallel)}")
    print("\n".join([*sentences, *(["note: " + notes[0]] if notes else [])]))
    return 0


def _default_batch_note(model: ModelSpec, gpus: int, hw, batch: int) -> str:
    """Says the batch is the default, and which replicas it leaves out (a batch of 512 on 7 GPUs shuts
    out dp 7, whose plan is 7% faster at 511), with the nearest batch that lets the most in."""
    shut_out = planner.replicas_shut_out(model, gpus, hw, batch)
    if not shut_out:
        return "the default: --global-batch to change it"
    degrees = ", ".join(map(str, shut_out))
    return (f"the default, which does not split over dp {degrees}: --global-batch "
            f"{planner.nearest_multiple(batch, shut_out[-1])} lets dp {shut_out[-1]} in")


def _degrees(p: ParallelSpec) -> dict:
    keys = ("dp", "tp", "pp", "ep", "virtual_stages", "schedule", "microbatches", "micro_batch",
            "global_batch", "zero", "sequence_parallel", "recompute", "cp", "cp_mode", "cp_split",
            "stage_layers", "fp32_grads", "fp32_shards", "fsdp_root", "expert_imbalance",
            "hierarchical_dp")  # fmt: skip
    return {k: getattr(p, k) for k in keys}
