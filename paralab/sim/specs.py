"""What the simulator is asked about: a model shape, a way to parallelise it, and the hardware.

Three frozen dataclasses, validated once, shared by the counting formulas, the cost model, the
planner and the CLI. Presets live elsewhere: model shapes in :mod:`paralab.sim.presets`, machines in
:mod:`paralab.sim.hardware`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from paralab.config import finite_number
from paralab.schedules import SCHEDULES, V_SHAPED, chunks_per_rank, shape_problems
from paralab.stage_split import split_example, split_problems, uneven_split
from paralab.trace import MAX_RANKS

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
PEAK_DTYPES = (*DTYPE_BYTES, "fp8")  # what HardwareSpec.peak_flops may list: a model's dtypes and FP8 GEMMs'
ATTENTION = ("standard", "fused")
# which kernel runs a fused attention: one written for the part ("native", at its GEMMs' efficiency) or
# FlashAttention-2 ("flash2", at its measured share of the part's peak, HardwareSpec.flash2_efficiency)
ATTENTION_KERNELS = ("native", "flash2")
KERNELS = ("fused", "eager")  # how the non-GEMM ops run: paralab.sim.kernels
RECOMPUTE = ("none", "selective", "full")
# how ranks are numbered, innermost first: Megatron-LM's tp, dp, pp; or tp, pp, dp (Llama 3, torchtitan)
RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")
OPTIMIZERS = ("adam-mixed", "adam-fp32")
DEGREES = ("dp", "tp", "pp", "cp", "ep")  # how a layout splits its GPUs (ParallelSpec's, a trace's meta)
CP_MODES = ("ring", "alltoall")  # paralab.config's, kept here so the simulator stays free of the run config
CP_SPLITS = ("zigzag", "contiguous")
# beyond any cluster (a trace's ranks stop there too), and where the event simulator's lists would
# outgrow memory
MAX_GPUS, MAX_MICROBATCHES = MAX_RANKS, 2**16
# schedules of several chunks per rank, which without a pipeline have nothing to place (the others, given
# pp 1, run the one stage as 1F1B does)
MULTI_CHUNK = (*V_SHAPED, "interleaved")


class SpecError(ValueError):
    """A specification that cannot describe a run (the CLI turns it into exit code 2)."""


def _hashed_once(spec) -> int:
    """A spec's hash, worked out on first use and kept. Specs key the simulator's caches, which planning
    a 16k-GPU run asks millions of times, and a dataclass hashes every field (a 128-chunk split among
    them) at each ask. Equal specs hash alike: the hash is the dataclass's own, of the same fields."""
    kept = spec.__dict__.get("_hash")
    if kept is None:
        kept = hash(tuple(getattr(spec, f.name) for f in dataclasses.fields(spec)))
        object.__setattr__(spec, "_hash", kept)
    return kept


def _without_hash(spec) -> dict:
    """What a copy or a pickle of a spec carries: its fields, not the hash (a string's hash differs
    from one process to the next)."""
    return {k: v for k, v in spec.__dict__.items() if k != "_hash"}


def sequence_parallel_divides(seq: int, tp: int, cp: int = 1) -> bool:
    """Whether sequence parallelism can give each of tp ranks an equal part of a sequence of ``seq``
    tokens, or of each of its cp slices (8,191 tokens over tp 2 had been priced as 4,095.5 a rank)."""
    return seq % (tp * cp) == 0


def ulysses_kv_heads(model: ModelSpec, tp: int, cp: int) -> int | None:
    """KV heads of one tp rank that an all-to-all (Ulysses) cp split sends: its own where cp divides
    them; where they divide cp (grouped-query attention with fewer KV heads than cp), each replicated
    cp / k times before the all-to-all, so that every cp rank receives the one its query heads read
    (DeepSpeed-Ulysses' and verl's scheme; the replicas' gradients sum in backward); None where
    neither divides."""
    kv = model.kv_heads // tp
    if kv % cp == 0:
        return kv
    return cp if cp % kv == 0 else None


def ulysses_splits(model: ModelSpec, tp: int, cp: int) -> bool:
    """Whether an all-to-all (Ulysses) cp split can run at this tp: each cp rank takes whole query heads
    (they divide by cp), and the KV heads divide by cp or are replicated (:func:`ulysses_kv_heads`)."""
    return (model.heads // tp) % cp == 0 and bool(ulysses_kv_heads(model, tp, cp))


def kind_problems(spec, what: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Each field of ``spec`` whose value is not of the kind its annotation names, with the value:
    numbers finite, counts whole (24.5 layers, or 3.5 GPUs a node, would place half a layer or a
    rank), booleans true or false (a string is true whatever it says), text text, records objects
    (a hardware file's ``"calibration": 5`` had been taken). ``skip``: fields
    checked with a message of their own. Run first: everything after them computes with the values."""
    fields = [(f.name, f.type, getattr(spec, f.name)) for f in dataclasses.fields(spec) if f.name not in skip]
    out = [f"{what} {n} must be a finite number, got {v!r}"
           for n, kind, v in fields if kind in ("float", "int") and not finite_number(v)]
    out += [f"{what} {n} must be a whole number, got {v!r}"
            for n, kind, v in fields if kind == "int" and finite_number(v) and not isinstance(v, int)]
    out += [f"{what} {n} must be true or false (a JSON boolean), got {v!r}"
            for n, kind, v in fields if kind == "bool" and not isinstance(v, bool)]
    out += [f"{what} {n} must be text, got {v!r}"
            for n, kind, v in fields if kind == "str" and not isinstance(v, str)]
    out += [f"{what} {n} must be an object (a JSON {{...}}), got {v!r}"
            for n, kind, v in fields if kind == "dict" and not isinstance(v, dict)]
    return out


def _replaced(spec, changes: dict):
    """``dataclasses.replace(spec, **changes)`` at a fraction of its cost (a copy of the fields, then
    ``__post_init__``): the simulator derives specs from specs hundreds of thousands of times in a
    plan, and the generic replace passes every field through ``__init__``."""
    if unknown := changes.keys() - spec.__dataclass_fields__.keys():
        raise TypeError(f"{type(spec).__name__} has no field {', '.join(sorted(unknown))}")
    new = object.__new__(type(spec))
    new.__dict__.update(_without_hash(spec), **changes)
    new.__post_init__()
    return new


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    GPT-style defaults (LayerNorm with bias, biased linears, learned positions, tied embeddings, MLP of
    4h) match the models of Narayanan et al. 2021 and Brown et al. 2020. Llama sets ``gated_mlp``
    (SwiGLU: three MLP matrices), ``kv_heads`` (grouped-query attention), ``biases=False``,
    ``norm_params=1`` (RMSNorm has a weight only), ``learned_positions=False`` (RoPE) and
    ``tied_embeddings=False`` and ``dropout=False``, so its parameters and FLOPs are counted exactly,
    not approximated.
    A mixture of experts (paralab.sim.moe) sets ``experts`` routed experts of width ``expert_ffn`` (0:
    ffn), ``top_k`` per token, ``shared_experts``, ``dense_layers`` leading layers left dense and a
    ``capacity_factor`` (0: dropless).

    ``attention``: "standard" keeps the s x s attention scores for backward (Korthikanti et al. 2022,
    Table 2); "fused" is a flash-attention kernel (Dao et al. 2022): it keeps only each row's softmax
    statistics and recomputes the scores in backward. ``attention_kernel`` says which kernel runs a
    fused attention: "native" is one written for the part, as fast as its GEMMs (FlashAttention-2 on
    Ampere; cuDNN's or FlashAttention-3 on Hopper); "flash2" is FlashAttention-2 wherever it runs, at
    the share of the part's peak it was measured at (on an H100 it keeps to Ampere's instructions and
    reaches about 30%, against 55% on an A100). ``parallel_blocks``: attention and MLP read the
    same normalised input and their outputs are summed (GPT-J, PaLM): one norm and one pair of
    tensor-parallel collectives per pass instead of two. ``fp8``: the linear layers' GEMMs run in FP8
    (Transformer Engine) at the hardware's fp8 peak, with an fp8 copy of each weight; activations and
    the attention core stay in ``dtype``, a 16-bit one (FP8 recipes keep bf16 or fp16 beside the FP8
    GEMMs). ``fused_loss``: the cross-entropy keeps only the fp32
    logits (Megatron-LM's vocabulary-parallel kernel, Korthikanti et al. 2022 sec. 4.3); False is
    PyTorch's cross-entropy on upcast logits, or its loss parallel under tensor parallelism, which
    hold more fp32 tensors at their peak (``counting.loss_bytes_per_logit``). ``mask_bytes``: bytes
    per element of a kept dropout mask, 1 on a GPU (a byte mask); torch's CPU dropout keeps a mask in
    the activations' dtype (the bridge sets it for the lab's CPU runs). ``math_sdpa``: attention runs
    torch's math SDPA (the lab's CPU runs with dropout), which scales Q and K into copies and saves V
    as a view: at a micro-batch of one, in fp32, that view keeps the whole fused QKV output alive, 2
    s h + 2 s kv_dim bytes a layer more than Q, K and V alone. ``kernels``: "fused" runs the
    non-GEMM ops in a kernel library's fused kernels (Megatron-LM, Transformer Engine, torch.compile);
    "eager" runs each as its own PyTorch kernel, which moves more bytes (paralab.sim.kernels).
    """

    __hash__ = _hashed_once
    __getstate__ = _without_hash

    layers: int
    hidden: int
    heads: int
    ffn: int = 0  # 0: 4 x hidden
    vocab: int = 51200
    seq: int = 2048
    kv_heads: int = 0  # 0: same as heads (multi-head attention)
    gated_mlp: bool = False
    biases: bool = True
    norm_params: int = 2  # per hidden unit per norm: LayerNorm weight+bias = 2, RMSNorm = 1
    learned_positions: bool = True
    position_rows: int = 0  # rows of the learned position table; 0: seq (a cp slice run keeps them all)
    tied_embeddings: bool = True
    output_bias: bool = False  # untied output layer with a bias (paralab's own GPT has one)
    dropout: bool = True
    dtype: str = "bf16"
    name: str = "custom"
    experts: int = 0
    top_k: int = 1
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float = 0.0
    source: str = ""  # where a preset's numbers come from
    attention: str = "standard"
    attention_kernel: str = "native"
    mask_bytes: int = 1
    math_sdpa: bool = False
    parallel_blocks: bool = False
    fp8: bool = False
    fused_loss: bool = True
    kernels: str = "fused"

    def __post_init__(self):
        if self.ffn == 0 and type(self.hidden) in (int, float):  # any other is refused as it was given
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.expert_ffn == 0:
            object.__setattr__(self, "expert_ffn", self.ffn)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim; equals hidden without GQA."""
        return self.kv_heads * self.head_dim

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def replace(self, **changes) -> ModelSpec:
        return _replaced(self, changes)

    def problems(self) -> list[str]:
        if out := kind_problems(self, "model"):
            return out
        out = [f"model {n} must be >= 1, got {getattr(self, n)}"
               for n in ("layers", "hidden", "heads", "vocab", "seq", "ffn", "kv_heads", "expert_ffn")
               if getattr(self, n) < 1]
        out += [f"model {n} must be >= 0, got {getattr(self, n)}"
                for n in ("experts", "shared_experts", "dense_layers", "mask_bytes", "norm_params",
                          "position_rows")
                if getattr(self, n) < 0]
        if out:
            return out
        if self.hidden % self.heads:
            out.append(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            out.append(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.dtype not in DTYPE_BYTES:
            out.append(f"unknown dtype {self.dtype!r}; choose from {sorted(DTYPE_BYTES)}")
        if self.experts and not 1 <= self.top_k <= self.experts:
            out.append(f"top_k {self.top_k} must be in 1..{self.experts} (the experts)")
        if self.experts and not 0 <= self.dense_layers < self.layers:
            out.append(f"dense_layers {self.dense_layers} must leave some of the {self.layers} layers "
                       "to experts")
        if self.capacity_factor < 0:
            out.append(f"capacity factor must be > 0 (or 0: dropless), got {self.capacity_factor}")
        if self.attention not in ATTENTION:
            out.append(f"unknown attention {self.attention!r}; choose from {', '.join(ATTENTION)}")
        if self.kernels not in KERNELS:
            out.append(f"unknown kernels {self.kernels!r}; choose from {', '.join(KERNELS)}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            out.append(f"unknown attention kernel {self.attention_kernel!r}; "
                       f"choose from {', '.join(ATTENTION_KERNELS)}")
        elif self.attention_kernel != "native" and self.attention != "fused":
            out.append(f"attention kernel {self.attention_kernel} runs a fused attention; "
                       f"this model's attention is {self.attention}")
        elif self.attention_kernel == "flash2" and self.dtype == "fp32":  # its kernels are fp16/bf16 only
            out.append("attention kernel flash2 (FlashAttention-2) runs fp16 and bf16 only: give dtype bf16 "
                       "or fp16")
        if self.fp8 and self.dtype == "fp32":  # no recipe; its MFU would divide fp8 GEMMs by the fp32 peak
            out.append("fp8 GEMMs train beside 16-bit activations and weights (Transformer Engine, torchao "
                       "float8), not fp32: give dtype bf16 or fp16")
        return out


@dataclass(frozen=True)
class ParallelSpec:
    """How one training step is split: degrees, pipeline schedule, batch split, memory savers.

    ``global_batch = dp x micro_batch x microbatches`` (sequences per step). Give any two of
    ``global_batch``, ``microbatches`` and ``micro_batch``; :meth:`resolved` fills in the third.
    ``micro_batch`` 0, the default, means "what the other two leave"; with only a global batch it is
    the whole per-replica batch at pp 1 (no accumulation unless asked) and 1 in a pipeline (many
    small microbatches shrink the bubble, Megatron-LM's default).
    """

    __hash__ = _hashed_once
    __getstate__ = _without_hash

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert parallel, carved out of dp (paralab.layout): experts sharded over ep ranks
    virtual_stages: int = 1
    schedule: str = "1f1b"
    stage_layers: tuple[int, ...] | None = None  # blocks per chunk (pp x v, model order); None: even
    expert_imbalance: float = 1.0  # the busiest expert's tokens over the mean (paralab.moe_load measures it)
    microbatches: int = 0
    micro_batch: int = 0
    global_batch: int = 0
    zero: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    # "": as the model trains (optimizer_for: fp32 Adam for fp32, mixed otherwise)
    optimizer: str = ""
    overlap_grad_reduce: bool = True  # bucketed data-parallel reduction during the last backward
    # separate gradient messages per step (each pays the link latency): 0 models one bucketed stream
    # whose last 1/8 is exposed; naive dp sends one per parameter tensor, DDP one per bucket (and keeps
    # a flat copy of every gradient in its buckets); a ZeRO-2 with buckets reduce-scatters each as
    # backward fills it (DeepSpeed's reduce buckets, paralab's zero2; 0: part by part, as FSDP does)
    grad_buckets: int = 0
    # ZeRO-2/3 reduce-scatters left on the wire beside backward, each holding its unit's full gradient
    # and the shard it lands in (paralab's ZERO_REDUCE_SCATTERS_IN_FLIGHT); 0: the unit being filled alone
    reduce_scatters_in_flight: int = 0
    # bytes per parameter the rank's gradient reduction reads and writes in memory beside its collectives
    # (flattening buckets, dividing, widening, copying back), priced at the memory bandwidth after the
    # backward; 0: reduced where autograd wrote them (Megatron-LM's contiguous buffer, its in-place
    # scaling unpriced)
    grad_copy_bytes: float = 0.0
    # ZeRO-3 gathers the next layer's parameters while this one computes (DeepSpeed, FSDP on GPUs);
    # False: each layer's gather waits just before it runs (paralab's zero3, FSDP on CPU)
    prefetch_params: bool = True
    # ZeRO-3 as PyTorch FSDP runs it when the blocks and then the whole model are wrapped (torchtitan,
    # Composer): the embedding, final norm and output layer are the root unit, gathered once before the
    # forward, kept whole through the backward (FSDP does not reshard its root after the forward) and
    # reduce-scattered when the backward ends. False: each end is a part of its own (paralab's zero3
    # and torch_fsdp, DeepSpeed's ZeRO-3)
    fsdp_root: bool = False
    # ZeRO-3 as PyTorch FSDP runs mixed precision (FSDP1's MixedPrecision, FSDP2's MixedPrecisionPolicy,
    # param_dtype bf16): the shards stay fp32 and are the optimizer's weights, gathered in the 16-bit
    # dtype; a shard's reduced gradient is cast to fp32 to match. 4 + 4 + 8 bytes a parameter over dp,
    # against a 16-bit shard beside an fp32 master copy (2 + 4 + 12 with fp32 gradients: DeepSpeed's
    # ZeRO-3, paralab's zero3). Gathers, reductions and compute are as before
    fp32_shards: bool = False
    # the step's time includes loading its batch (False: loaded before the step window opens, as
    # paralab's pipelines do so that the window, which bubbles are read from, holds the schedule alone)
    loads_batch_in_step: bool = True
    # context parallel: each sequence split over cp ranks (paralab.sim.context predicts it)
    cp: int = 1
    cp_mode: str = "ring"
    cp_split: str = "zigzag"
    # DDP's flat buckets as torch's DistributedDataParallel keeps them: in the gradients' own dtype, so a
    # communication hook that reduces 16-bit gradients in fp32 widens each bucket on the wire (g + r
    # bytes a reduced parameter, counted as if all were in flight at once) and copies it back twice.
    # False: the buckets are made in the reduce dtype (paralab's ddp and hybrids); alike when the
    # dtypes agree
    buckets_in_grad_dtype: bool = False
    # with sequence parallelism, each column-parallel layer keeps its gathered input for backward, as
    # torch's DTensor (SequenceParallel before ColwiseParallel) does. False: it keeps its sequence
    # slice and gathers it again in backward (Megatron-LM, paralab's tp: counting.sequence_regathers)
    sp_keeps_gathered_inputs: bool = False
    # the gradients are set to None between steps (torch's zero_grad default; paralab's strategies but
    # its ZeRO, which zeroes flat buffers in place) and exist from the step's first backward on, so a rank
    # whose activations peak before it (GPipe, or no forward after it) holds none at that peak; with
    # ZeRO-2/3, torch's FSDP, whose shard gradients its reduce-scatters make, part by part
    # (memory._as_fsdp_reduces). False: kept in buffers that live through the step (Megatron-LM's grad
    # buffers, paralab's ZeRO)
    grads_set_to_none: bool = False
    # gradients accumulated and reduced in fp32 whatever the model's dtype (Megatron-LM's main_grad):
    # 4 bytes per parameter; with zero=1 this is Megatron's distributed optimizer (6 + 12/d bytes)
    fp32_grads: bool = False
    rank_order: str = "tp-dp-pp"
    # with recompute "full": the layers of each model chunk (pipeline stage, virtual ones included) that
    # are recomputed (Megatron-LM's --recompute-num-layers, block method; every second layer is
    # torchtitan's layer-selective AC); 0: all of them
    recompute_layers: int = 0
    # ZB-V ordered for the stages' own pass times, as Qi et al. order it with profiled times (False:
    # for equal passes, the order paralab's own runs execute)
    zbv_for_pass_times: bool = True
    # pipeline sends run beside compute (False: each send holds its rank until it lands, as the
    # pipeline schedules of Megatron-LM before 2023 and of DeepSpeed did)
    overlap_p2p: bool = True
    # ZeRO-2 sums a step's microbatches in each unit's full-size buffer and reduce-scatters it once, as
    # the last backward fills it (paralab's hybrid): ZeRO-1's collectives, every unit's buffer held from
    # the first backward on. False: every microbatch's gradients are reduce-scattered (Rajbhandari et
    # al.; paralab's zero2)
    zero_accumulates: bool = False
    # with tp > 1 and no sequence parallelism, each of a stage's t GPUs sends 1/t of the activation and
    # the next stage's all-gather it over NVLink (Narayanan et al. 2021's scatter/gather). False: each
    # sends the whole (paralab's pipelines)
    pp_scatter_gather: bool = True
    # the gradient all-reduce in three steps over nodes of this many data-parallel ranks: reduce-scatter
    # inside the node (overlapping the backward as its buckets fill), then, after the backward, the
    # shard's all-reduce among the ranks of one local index on every node and the all-gather inside
    # the node (paralab's ddp --hierarchical). 0: one flat all-reduce, as NCCL runs it
    hierarchical_dp: int = 0

    def __post_init__(self):
        # a list (as JSON and most callers write a split) would leave the spec unhashable, and specs key
        # the simulator's caches
        if isinstance(self.stage_layers, list):
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))

    @property
    def zero_in_passes(self) -> bool:
        """Whether ZeRO-2/3's collectives run inside every microbatch's passes (not once a step)."""
        return self.zero >= 2 and self.dp > 1 and not (self.zero == 2 and self.zero_accumulates)

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def replace(self, **changes) -> ParallelSpec:
        return _replaced(self, changes)

    @property
    def chunks(self) -> int:
        """Model chunks (pipeline stages in the schedule's sense): pp x virtual stages."""
        return self.pp * self.virtual_stages

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks one rank holds: the schedule's (:func:`paralab.schedules.chunks_per_rank`), one
        without a pipeline."""
        return chunks_per_rank(self.schedule, self.virtual_stages) if self.pp > 1 else 1

    @property
    def schedule_run(self) -> str:
        """The schedule as it runs: interleaved with one chunk a rank is 1F1B."""
        return "1f1b" if self.schedule == "interleaved" and self.virtual_stages == 1 else self.schedule

    def stride(self, axis: str) -> int:
        """Ranks between two neighbours of a group along ``axis`` ("tp", "dp" or "pp"): the product of
        the degrees numbered inside it (``rank_order``)."""
        inner = self.rank_order.split("-")
        return math.prod(getattr(self, a) for a in inner[: inner.index(axis)])

    def resolved(self) -> ParallelSpec:
        """Fill ``microbatches`` from ``global_batch`` (or the reverse); default one microbatch per stage.
        The V-shaped schedules (ZB-V, DualPipeV) always run two chunks per rank, so they get two virtual
        stages unless told otherwise."""
        if self.schedule in V_SHAPED and self.pp > 1 and self.virtual_stages == 1:
            return self.replace(virtual_stages=2).resolved()
        if not self.micro_batch:
            split = self.dp * (self.microbatches or (1 if self.pp == 1 else 0))
            micro_batch = max(self.global_batch // split, 1) if self.global_batch and split else 1
            return self.replace(micro_batch=micro_batch).resolved()
        per_step = self.dp * self.micro_batch
        if self.microbatches:  # already whole: itself (the cost model resolves a spec many times)
            total = per_step * self.microbatches
            return self if self.global_batch == total else self.replace(global_batch=total)
        if self.global_batch:
            return self.replace(microbatches=max(self.global_batch // per_step, 0))
        m = self.pp * self.virtual_stages if self.pp > 1 else 1
        return self.replace(microbatches=m, global_batch=per_step * m)

    def optimizer_for(self, model: ModelSpec) -> str:
        """The optimizer this names or, when it names none, Adam as ``model`` trains: all fp32 for an
        fp32 model (the lab's CPU runs), mixed precision otherwise."""
        return self.optimizer or ("adam-fp32" if model.dtype == "fp32" else "adam-mixed")

    def problems(self, model: ModelSpec, gpus: int | None = None) -> list[str]:
        """Every reason this split cannot run ``model`` (empty when it can); each names the numbers."""
        if out := kind_problems(self, "parallel", skip=("expert_imbalance",)):
            return out
        # before resolving, which divides by the degrees (and then leaves a micro-batch of 1 at least)
        out = [f"{n} must be >= 1, got {getattr(self, n)}"
               for n in ("dp", "tp", "pp", "cp", "ep", "virtual_stages") if getattr(self, n) < 1]
        out += [f"{n} must be >= 0 (0: what the others leave), got {getattr(self, n)}"
                for n in ("micro_batch", "microbatches", "global_batch") if getattr(self, n) < 0]
        if out:
            return out
        p = self.resolved()
        if self.global_batch and self.microbatches and p.global_batch != self.global_batch:
            if self.micro_batch:
                out.append(f"global batch {self.global_batch} != dp {p.dp} x micro-batch {p.micro_batch} x "
                           f"{p.microbatches} microbatches = {p.global_batch}")
            else:  # the micro-batch is derived: name the split the user asked for, not its rounding down
                split = p.dp * p.microbatches
                out.append(f"global batch {self.global_batch} does not divide into dp {p.dp} x "
                           f"{p.microbatches} microbatches = {split} equal micro-batches "
                           f"({self.global_batch / split:.3g} sequences each)")
        if p.world_size > MAX_GPUS or p.microbatches > MAX_MICROBATCHES:
            out.append(f"the simulator models up to {MAX_GPUS:,} GPUs and {MAX_MICROBATCHES:,} microbatches "
                       f"a step, got a world size of {p.world_size:,} and {p.microbatches:,} microbatches")
            return out
        if gpus is not None and p.world_size != gpus:
            names, degrees = ("dp x tp x pp x cp", f" x {p.cp}") if p.cp > 1 else ("dp x tp x pp", "")
            out.append(f"{names} = {p.dp} x {p.tp} x {p.pp}{degrees} = {p.world_size} != {gpus} GPUs")
        if p.global_batch and p.global_batch % p.dp:  # named first: a micro-batch may be derived from it
            out.append(f"global batch {p.global_batch} is not divisible by dp {p.dp}")
        elif p.global_batch and p.global_batch % (p.dp * p.micro_batch):
            out.append(f"global batch {p.global_batch} is not divisible by dp {p.dp} x micro-batch "
                       f"{p.micro_batch} = {p.dp * p.micro_batch}")
        if p.microbatches < 1:
            out.append(f"global batch {p.global_batch} gives no microbatch per data-parallel rank")
        if model.heads % p.tp:
            out.append(f"tp {p.tp} does not divide the {model.heads} attention heads")
        elif model.kv_heads % p.tp:  # each rank computes whole key-value heads (Megatron-LM's query groups)
            out.append(f"tp {p.tp} does not divide the {model.kv_heads} key-value heads")
        if model.ffn % p.tp:
            out.append(f"tp {p.tp} does not divide the MLP width {model.ffn}")
        # the schedule's shape first: a wrong one makes its chunk count meaningless
        shape = []
        if p.schedule not in SCHEDULES:
            shape.append(f"unknown schedule {p.schedule!r}; choose from {', '.join(SCHEDULES)}")
        elif p.pp > 1:
            shape += shape_problems(p.schedule, p.pp, p.microbatches, p.virtual_stages)
        elif p.schedule in MULTI_CHUNK:
            shape.append(f"schedule {p.schedule} spreads model chunks over the ranks of a pipeline: it needs "
                         f"pp >= 2, got pp {p.pp}")
        elif p.virtual_stages > 1:
            shape.append(f"virtual stages {p.virtual_stages} need a pipeline (pp > 1)")
        chunks = p.pp * p.virtual_stages
        if shape:
            out += shape
        elif p.stage_layers is None and model.layers % chunks:
            example = uneven_split(model.layers, chunks)
            how = (f"give stage_layers, {split_example(example)}" if example
                   else "no split can hold them: every stage but the first and last needs a layer")
            # the virtual stages named only where there are some: a planner or explorer with no such
            # control had told its user of them
            cut = f"pp x virtual stages = {chunks}" if p.virtual_stages > 1 else f"pp {chunks}"
            out.append(f"{cut} does not divide {model.layers} layers; {how}")
        else:
            out += split_problems(model.layers, chunks, p.stage_layers)
        out += self._expert_problems(model)
        if p.zero not in (0, 1, 2, 3):
            out.append(f"zero stage must be 0..3, got {p.zero}")
        if p.fsdp_root:  # what is missing, as for fp32_shards below (zero 0 had been told of its 1 stage)
            unmet = [f"{needed}, got {got}" for needed, got, met in (
                ("zero 3", f"zero {p.zero}", p.zero == 3),
                ("one pipeline stage", f"pp x virtual stages = {p.chunks}", p.chunks == 1),
            ) if not met]
            if unmet:
                out.append(f"fsdp_root (FSDP's root unit: both ends of the model on one rank) needs "
                           f"{'; '.join(unmet)}")
        if p.zero_accumulates and p.zero != 2:
            out.append(f"zero_accumulates (a step's gradients summed before one reduce-scatter) is ZeRO-2's, "
                       f"got zero {p.zero}")
        if p.fp32_shards:  # what is missing, not what holds already (checked on every prediction)
            optimizer = p.optimizer_for(model)
            unmet = [f"{needed}, got {got}" for needed, got, met in (
                ("zero 3", f"zero {p.zero}", p.zero == 3),
                ("mixed-precision Adam", optimizer, optimizer == "adam-mixed"),
            ) if not met]
            if unmet:
                out.append(f"fp32_shards (FSDP's fp32 shards as the master weights) needs {'; '.join(unmet)}")
        for name in ("grad_buckets", "reduce_scatters_in_flight", "grad_copy_bytes"):
            if getattr(p, name) < 0:
                out.append(f"{name} must be >= 0, got {getattr(p, name)}")
        if p.sequence_parallel and p.tp == 1:
            out.append("sequence parallelism needs tp > 1")
        elif p.sequence_parallel and not sequence_parallel_divides(model.seq, p.tp, p.cp):
            degrees = f"tp {p.tp} x cp {p.cp} = {p.tp * p.cp}" if p.cp > 1 else f"tp {p.tp}"
            out.append(f"sequence parallelism splits each sequence{' (each cp slice)' * (p.cp > 1)} over tp: "
                       f"{degrees} does not divide its {model.seq} tokens")
        if p.recompute not in RECOMPUTE:
            out.append(f"unknown recompute {p.recompute!r}; choose from {', '.join(RECOMPUTE)}")
        if p.recompute_layers < 0 or (p.recompute_layers and p.recompute != "full"):
            out.append(f"recompute_layers {p.recompute_layers} needs recompute 'full' and must be >= 0")
        if p.rank_order not in RANK_ORDERS:
            out.append(f"unknown rank order {p.rank_order!r}; choose from {', '.join(RANK_ORDERS)}")
        elif p.cp > 1 and p.rank_order != RANK_ORDERS[0]:  # cp is priced beside dp (context.slice_run)
            out.append(f"context parallel is modelled in the {RANK_ORDERS[0]} rank order only (its gradients "
                       f"reduced over dp and cp as one group of neighbours), got cp {p.cp} with "
                       f"{p.rank_order}")
        if p.optimizer and p.optimizer not in OPTIMIZERS:
            out.append(f"unknown optimizer {p.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        return out + self._hierarchy_problems() + self._context_problems(model)

    def hierarchy_over(self, local: int) -> ParallelSpec:
        """This spec with a hierarchical gradient all-reduce over nodes of ``local`` data-parallel ranks,
        or the flat one where its steps would add up to it: every rank on one node, one rank a node, or
        nodes that do not divide dp."""
        return self.replace(hierarchical_dp=local if self._tiers(local) else 0)

    def _tiers(self, local: int) -> bool:
        """Whether nodes of ``local`` data-parallel ranks make a hierarchy: 2 or more ranks on each of 2
        or more nodes, alike."""
        return 1 < local < self.dp and self.dp % local == 0

    def _hierarchy_problems(self) -> list[str]:
        """What a hierarchical gradient all-reduce needs: 2 or more data-parallel ranks on each of 2 or
        more nodes, alike, and plain data-parallel gradients (paralab's ddp is the one that runs it)."""
        local = self.hierarchical_dp
        if not local:
            return []
        out = []
        if not self._tiers(local):
            out.append(f"a hierarchical all-reduce needs 2 or more data-parallel ranks on each of 2 or more "
                       f"nodes: hierarchical_dp {local} must divide dp {self.dp} into 2 or more nodes")
        if self.zero or self.cp > 1 or self.ep > 1:
            out.append(f"a hierarchical all-reduce reduces plain data-parallel gradients: it needs zero 0, "
                       f"cp 1 and ep 1, got zero {self.zero}, cp {self.cp}, ep {self.ep}")
        return out

    def _context_problems(self, model: ModelSpec) -> list[str]:
        """What a cp degree needs: the sequence split into its pieces, and for all-to-all the query heads
        divided by cp and the KV heads too or replicated (a real run's model has no grouped-query
        attention: paralab.strategies.context checks its heads alone)."""
        if self.cp_mode not in CP_MODES or self.cp_split not in CP_SPLITS:
            return [f"cp mode {self.cp_mode!r} / split {self.cp_split!r}: choose from {CP_MODES} / "
                    f"{CP_SPLITS}"]
        if self.cp == 1:
            return []
        pieces = self.cp if self.cp_mode == "alltoall" and self.cp_split == "contiguous" else 2 * self.cp
        out = [] if model.seq % pieces == 0 else [
            f"cp {self.cp} needs the sequence ({model.seq}) divisible by {pieces}"]
        heads, kv = model.heads // self.tp, model.kv_heads // self.tp
        if self.cp_mode == "alltoall" and not ulysses_splits(model, self.tp, self.cp):
            # only the condition that fails: "KV heads (8) divisible by 64 or dividing it" had been said
            # of 8 KV heads, which divide 64
            needs = [f"the heads per tp rank ({heads}) divisible by {self.cp}"] if heads % self.cp else []
            if not ulysses_kv_heads(model, self.tp, self.cp):
                needs.append(f"the tp rank's KV heads ({kv}) divisible by {self.cp} or dividing it (each "
                             f"then replicated for the all-to-all)")
            out.append(f"all-to-all (Ulysses) cp {self.cp} needs {', and '.join(needs)}")
        return out

    def _expert_problems(self, model: ModelSpec) -> list[str]:
        out = []
        if self.ep > 1 and not model.experts:
            out.append(f"ep {self.ep} shards experts, but {model.name} is dense")
        elif self.dp % self.ep:
            out.append(f"ep {self.ep} must divide dp {self.dp} (expert parallel is carved out of it)")
        elif model.experts % self.ep:
            out.append(f"ep {self.ep} does not divide the {model.experts} experts")
        if not self.expert_imbalance >= 1.0 or not math.isfinite(self.expert_imbalance):
            out.append("expert imbalance is the busiest expert's load over the mean: a finite number "
                       f">= 1, got {self.expert_imbalance}")
        elif self.expert_imbalance != 1.0 and not model.experts:
            out.append(f"expert imbalance {self.expert_imbalance:g} weighs experts, but {model.name} is "
                       "dense")
        elif model.experts and self.expert_imbalance > model.experts / model.top_k:
            # each token goes to top_k different experts, so the busiest takes at most every token: the
            # mean's E / k times
            out.append(f"expert imbalance {self.expert_imbalance:g} is over the most there can be: the "
                       f"busiest expert takes at most every token, {model.experts} experts / "
                       f"top-{model.top_k} = {model.experts / model.top_k:g} times the mean")
        return out


# (lowest, highest, unit) a part's figures may be (HardwareSpec._implausible): a thousand times below a
# laptop CPU's and above the largest GPUs' (192 GiB, 8 TB/s, 2.3 PFLOP/s dense fp8, 900 GB/s NVLink)
PLAUSIBLE = {
    "memory_bytes": (2**20, 2**50, "1 MiB to 1 PiB"),
    "memory_bandwidth": (1e6, 1e15, "1 MB/s to 1 PB/s"),
    "intra_bw": (1e6, 1e15, "1 MB/s to 1 PB/s"),
    "inter_bw": (1e6, 1e15, "1 MB/s to 1 PB/s"),
    "peak_flops": (1e6, 1e18, "1 MFLOP/s to 1 EFLOP/s"),
    # a hop's latency: NVLink's is microseconds, a network's tens of them; a loaded CPU's calibrated
    # loopback (the local machine) has read a second and more when a call stalled
    "intra_latency": (0.0, 10.0, "0 to 10 s"),
    "inter_latency": (0.0, 10.0, "0 to 10 s"),
}
# the most FLOP/s per byte/s of memory bandwidth (the roofline's ridge point) a part has: an H100's is about
# 300 in bf16 and 600 in fp8, a CPU's 1 to 20; each figure within its range, the two can still disagree
MOST_FLOPS_PER_BYTE = 2e4

# the most a GPU's compute speed may vary from part to part (straggler_cv, one standard deviation): several
# times the presets' spread (paralab.sim.hardware.GPU_STRAGGLER_CV, measured on 392 V100s); at 10% the
# slowest of 1,000 GPUs would run a third slower than the mean
MOST_STRAGGLER_CV = 0.1

# HardwareSpec's measured [bytes, seconds] curves (the local calibration's gloo calls)
MEASURED_CURVES = ("allreduce_curve", "allgather_curve", "reducescatter_curve", "p2p_curve")


# What ``HardwareSpec.host_overhead_s`` may time (seconds): a call of each part forward and backward, the
# optimizer's work per parameter tensor, the training loop's per step and per token loaded.
HOST_PARTS = (*(f"{part}_{phase}" for part in ("embed", "layer", "head")
                for phase in ("forward", "backward")),
              "tensor_update", "step", "data_token")


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator and the links between accelerators.

    Link bandwidths are per GPU per direction as NCCL's bus bandwidth sees them; ``inter_bw`` is what
    one GPU gets through its own NIC (DGX nodes have one NIC per GPU). ``matmul_max_efficiency`` is the
    share of peak a large GEMM reaches; ``matmul_half_dim`` is the matrix side at which a dimension
    costs half of that efficiency (small GEMMs cannot fill the machine).
    """

    name: str
    peak_flops: dict[str, float]
    memory_bytes: float
    memory_bandwidth: float
    gpus_per_node: int
    intra_bw: float
    intra_latency: float
    inter_bw: float
    inter_latency: float
    matmul_max_efficiency: float = 0.8
    matmul_half_dim: float = 64.0
    kernel_overhead_s: float = 4e-6
    shared_compute: bool = False  # True when all ranks share one processor (the local CPU machine)
    # Host time per module call that no FLOP or byte count explains: on a CPU every op runs
    # synchronously after its dispatch, so a small model pays the framework's per-op cost in full (on
    # a GPU launches are asynchronous and hide it; the presets leave this empty). Keys:
    # embed_/layer_/head_ + forward/backward (seconds per call of that part) and tensor_update
    # (optimizer seconds per parameter tensor).
    host_overhead_s: dict = field(default_factory=dict)
    # Measured on the local CPU, where the datasheet model misses (0 or empty: the model above).
    # elementwise_bw: bytes/s at which non-GEMM kernels (norms, GELU, attention core, softmax, loss)
    # get through the activations they move, elementwise_backward_bw the same for their backward (0:
    # elementwise_bw); optimizer_bw: bytes/s of the optimizer's per-parameter
    # traffic (OPTIMIZER_BYTES_TOUCHED a parameter). The curves are [bytes, seconds] points of a
    # 2-rank all-reduce, all-gather and reduce-scatter (bytes: the whole tensor, the all-gather's
    # output and the reduce-scatter's input) and of a one-way send/recv: gloo's cost is not linear in
    # the size, nor its collectives halves of one another (paralab.sim.calibration).
    elementwise_bw: float = 0.0
    elementwise_backward_bw: float = 0.0
    optimizer_bw: float = 0.0
    allreduce_curve: list = field(default_factory=list)
    allgather_curve: list = field(default_factory=list)
    reducescatter_curve: list = field(default_factory=list)
    p2p_curve: list = field(default_factory=list)
    notes: str = ""
    calibration: dict = field(default_factory=dict)
    # Memory a plan may fill: (memory_bytes - memory_reserved_bytes) x (1 - allocator_overhead).
    # memory_reserved_bytes: held outside the framework's allocator (CUDA context, NCCL buffers,
    # library workspaces); allocator_overhead: the share the caching allocator loses to fragmentation.
    memory_reserved_bytes: float = 0.0
    allocator_overhead: float = 0.1
    # A power-capped part: compute runs at (power_limit_w / tdp_w) ** (1/3) of its peak (dynamic power
    # ~ C V^2 f with V ~ f over the DVFS range, so f ~ P^(1/3)); memory bandwidth is unchanged. 0: no cap.
    power_limit_w: float = 0.0
    tdp_w: float = 0.0
    # NVLink SHARP (in-switch reduction, NVSwitch 3): bus bandwidth of an all-reduce inside a node
    # that the switch reduces (one hop whatever the group size). 0: not available.
    nvls_bw: float = 0.0
    # The network above the nodes: pod_gpus GPUs have full bisection bandwidth among them (0: the
    # whole machine does); between pods each link carries 1/oversubscription of its share.
    pod_gpus: int = 0
    oversubscription: float = 1.0
    # Coefficient of variation of one GPU's compute speed (manufacturing and power management): a
    # synchronous step waits for the slowest of its GPUs (cost.straggler_factor). 0: identical GPUs.
    straggler_cv: float = 0.0
    # Jitter of a rank's compute on a shared machine (seconds^0.5): over T seconds its standard
    # deviation is sync_jitter x sqrt(T), and each synchronisation waits for the slowest rank
    # (cost.sync_wait). Measured on the local CPU; 0 on the GPU presets (their variation is straggler_cv).
    sync_jitter: float = 0.0
    # Communication runs beside compute (GPUs: copy engines, NIC, a few SMs). False: it needs the cores
    # the compute uses (CPU ranks with one core each), so it does not hide under compute.
    overlaps_comm: bool = True
    # The share of the GPU's SMs a collective in flight holds: NCCL runs one thread block per channel,
    # and a GEMM tile cannot share an SM with one, so compute that runs beside a collective runs at
    # (1 - share) of its speed (cost.beside_comm). 0: communication takes nothing from compute.
    comm_sm_share: float = 0.0
    # [sequence length, share of the dense peak] points at which FlashAttention-2 ran a causal attention
    # of head dimension 128, forward and backward (its FLOPs counted as it counts them); between points
    # log-linear in the length, beyond them flat. Empty: this part has no such figures.
    flash2_efficiency: list = field(default_factory=list)

    def datasheet_peak(self, dtype: str) -> float:
        """The part's rated peak FLOP/s for ``dtype``: what MFU divides by (:meth:`problems_for` refuses
        a model in a dtype the part does not list; a bf16 model had been priced at the fp32 peak)."""
        return self.peak_flops[dtype]

    def peak(self, dtype: str) -> float:
        """The peak it computes at: the rated one, slowed by a power cap (:attr:`clock_scale`)."""
        return self.datasheet_peak(dtype) * self.clock_scale

    @property
    def clock_scale(self) -> float:
        """The share of its peak a power-capped part computes at (1 without a cap)."""
        if self.power_limit_w and self.tdp_w and self.power_limit_w < self.tdp_w:
            return (self.power_limit_w / self.tdp_w) ** (1 / 3)
        return 1.0

    def problems_for(self, model: ModelSpec) -> list[str]:
        """What this machine cannot run of ``model`` (its dtype, or FP8 GEMMs, without a peak for it) or
        price (FlashAttention-2 where it was not measured)."""
        out = []
        listed = ", ".join(self.peak_flops)
        if model.dtype not in self.peak_flops:
            out.append(f"a {model.dtype} model needs hardware with a {model.dtype} peak; {self.name} lists "
                       f"{listed}")
        if model.fp8 and "fp8" not in self.peak_flops:
            out.append(f"fp8 needs hardware with FP8 tensor cores; {self.name} lists {listed}")
        if model.attention_kernel == "flash2" and not self.flash2_efficiency:
            out.append(f"attention kernel flash2 is priced from FlashAttention-2's measured efficiency, "
                       f"which {self.name} does not give (flash2_efficiency)")
        return out

    def problems(self) -> list[str]:
        """Every field that cannot describe a machine, with its value (files, presets and saved specs
        alike: a unit converted past a float's range reads as infinity, and is caught here)."""
        if out := kind_problems(self, "hardware", skip=("host_overhead_s",)):  # its own message, below
            return out
        for name, what in (("peak_flops", "FLOP/s by dtype"), ("host_overhead_s", "seconds by part")):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(map(finite_number, value.values())):
                out.append(f"hardware {name} must be an object of finite numbers ({what}), got {value!r}")
        if out:
            return out
        positive = ("memory_bytes", "memory_bandwidth", "gpus_per_node", "intra_bw", "inter_bw")
        out = [f"hardware {n} must be > 0, got {getattr(self, n)}"
               for n in positive if not getattr(self, n) > 0]
        if not self.peak_flops or any(not v > 0 for v in self.peak_flops.values()):
            out.append(f"hardware peak_flops must be positive FLOP/s per dtype, got {self.peak_flops}")
        if not out:
            out += self._implausible()
        if unknown := sorted(set(self.peak_flops) - set(PEAK_DTYPES)):
            out.append(f"hardware peak_flops (a file's peak_tflops): unknown dtype(s) {', '.join(unknown)}; "
                       f"dtypes: {', '.join(PEAK_DTYPES)}")
        unknown = sorted(set(self.host_overhead_s) - set(HOST_PARTS))
        if unknown:
            out.append(f"hardware host_overhead_s: unknown part(s) {', '.join(unknown)}; "
                       f"parts: {', '.join(HOST_PARTS)}")
        if not 0 <= self.allocator_overhead < 1:
            out.append(f"allocator_overhead is a share of memory in [0, 1), got {self.allocator_overhead}")
        if not _rising_shares(self.flash2_efficiency):
            out.append("flash2_efficiency must be [sequence length, share of the peak in (0, 1]] points, "
                       f"lengths rising, got {self.flash2_efficiency!r}")
        out += [f"hardware {n} must be [bytes, seconds] points, bytes > 0 and rising, seconds > 0 and "
                f"never falling, got {getattr(self, n)!r}" for n in MEASURED_CURVES
                if not _measured_curve(getattr(self, n))]
        if self.memory_bytes > 0 and self.memory_reserved_bytes >= self.memory_bytes:  # else said above
            reserved, total = self.memory_reserved_bytes / 2**30, self.memory_bytes / 2**30
            out.append(f"hardware memory_reserved_bytes ({reserved:.4g} GiB) must be below memory_bytes "
                       f"({total:.4g} GiB): plans fill what is left")
        if not 0 <= self.straggler_cv <= MOST_STRAGGLER_CV:
            out.append(f"straggler_cv is the spread of one GPU's compute speed (standard deviation over the "
                       f"mean) in [0, {MOST_STRAGGLER_CV:g}]: the GPU presets' is what 392 V100s of one "
                       f"cluster measured; got {self.straggler_cv}")
        if not 0 <= self.comm_sm_share < 1:
            out.append(f"comm_sm_share is a share of the SMs in [0, 1), got {self.comm_sm_share}")
        if self.power_limit_w and not self.tdp_w:
            out.append(f"hardware power_limit_w ({self.power_limit_w:g} W) caps compute by its share of "
                       "tdp_w, which is 0: give the part's TDP (tdp_w)")
        elif self.tdp_w > 0 and self.power_limit_w > self.tdp_w:
            out.append(f"hardware power_limit_w ({self.power_limit_w:g} W) is above tdp_w "
                       f"({self.tdp_w:g} W): a part runs no faster than at its TDP; give a limit up to it "
                       "(0: no cap)")
        if self.pod_gpus and self.gpus_per_node and self.pod_gpus % self.gpus_per_node:
            out.append(f"hardware pod_gpus ({self.pod_gpus}) must be whole nodes of {self.gpus_per_node} "
                       "GPUs (0: the whole machine is one pod)")
        if self.oversubscription < 1:
            out.append(f"oversubscription must be >= 1 (1: non-blocking), got {self.oversubscription}")
        if not 0 < self.matmul_max_efficiency <= 1:
            out.append("matmul_max_efficiency is a share of the peak in (0, 1], "
                       f"got {self.matmul_max_efficiency}")
        negative = ("memory_reserved_bytes", "power_limit_w", "tdp_w", "nvls_bw", "pod_gpus", "sync_jitter",
                    "intra_latency", "inter_latency", "kernel_overhead_s", "matmul_half_dim",
                    "elementwise_bw", "elementwise_backward_bw", "optimizer_bw")  # rates: 0 for unmeasured
        out += [f"hardware {n} must be >= 0, got {getattr(self, n)}"
                for n in negative if getattr(self, n) < 0]
        out += [f"hardware host_overhead_s[{part!r}] must be >= 0 s, got {seconds}"
                for part, seconds in self.host_overhead_s.items() if seconds < 0]
        return out

    def _implausible(self) -> list[str]:
        """Figures outside what any part, from a laptop's CPU to a GPU generations ahead, could have
        (:data:`PLAUSIBLE`), or computing more per byte of memory than any (:data:`MOST_FLOPS_PER_BYTE`): a
        unit slip (bytes in a GiB key, TB/s in a GB/s one) had priced silently."""
        figures = [(name, getattr(self, name)) for name in PLAUSIBLE if name != "peak_flops"]
        figures += [(f"peak_flops[{dtype!r}]", rate) for dtype, rate in self.peak_flops.items()]
        out = []
        for name, value in figures:
            low, high, bounds = PLAUSIBLE[name.split("[")[0]]
            if value >= 0 and not low <= value <= high:  # a negative one is said by the rule of >= 0
                out.append(f"hardware {name} {value:.4g} (SI units) is outside any part's ({bounds}): a unit "
                           "slip? (docs/simulator.md lists each key's unit)")
        if out:
            return out
        for dtype, rate in self.peak_flops.items():
            per_byte = rate / self.memory_bandwidth
            if per_byte > MOST_FLOPS_PER_BYTE:
                out.append(f"hardware peak_flops[{dtype!r}] is {per_byte:.3g} FLOPs per byte "
                           f"of memory_bandwidth, above any part's ({MOST_FLOPS_PER_BYTE:,.0f}; an H100's is "
                           "about 300): a memory bandwidth in TB/s under a GB/s key?")
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HardwareSpec:
        return cls(**data)


def _points(points) -> bool:
    """[x, y] pairs of finite numbers, x positive and rising (empty: none measured)."""
    if not isinstance(points, list | tuple) or not all(isinstance(p, list | tuple) and len(p) == 2
                                                        for p in points):
        return False
    xs = [x for x, _ in points]
    return (all(finite_number(x) and finite_number(y) and x > 0 for x, y in points)
            and all(a < b for a, b in zip(xs, xs[1:])))


def _rising_shares(points) -> bool:
    """[length, share] pairs, lengths positive and rising, shares in (0, 1]."""
    return _points(points) and all(0 < share <= 1 for _, share in points)


def _measured_curve(points) -> bool:
    """[bytes, seconds] pairs as the calibration makes them (made non-decreasing, calibration.monotone):
    seconds positive, as cost.interpolate takes their logs, and never falling, as a larger message does
    not cost less."""
    if not _points(points):
        return False
    seconds = [t for _, t in points]
    return all(t > 0 for t in seconds) and all(a <= b for a, b in zip(seconds, seconds[1:]))
