"""One validated description of a run.

Every face of paralab (``paralab.run`` in Python, ``paralab run`` in the shell, ``torchrun -m paralab
run`` on a cluster) builds a :class:`RunConfig`; before any process starts its fields are checked here
(:meth:`RunConfig.validate`) and what they mean together for a strategy is resolved into a Layout by
paralab.layout, so a configuration that cannot work is refused with a message that says which numbers
conflict and what would fit.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field

from paralab.stage_split import not_a_split


class ConfigError(ValueError):
    """A configuration that cannot work. Raised before any process starts (CLI exit code 2)."""


CORPUS_SAMPLES = 65536  # sequences in the synthetic corpus (paralab.data), which a global batch draws from
MAX_RANKS = 2**24  # beyond any cluster: a run's world size, the ranks a trace names (figures are per rank)
# the type of a field that names a file or a directory (None: not asked for); check_field_kinds reads it
PathOption = str | os.PathLike | None


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the GPT-style decoder (see paralab.models.gpt)."""

    layers: int = 4
    hidden: int = 64
    heads: int = 4
    ffn: int = 0  # 0 means 4 x hidden, the usual GPT ratio
    vocab: int = 128
    seq_len: int = 32
    dropout: float = 0.0
    # the attention core: "sdpa" is torch's fused scaled_dot_product_attention (flash attention on
    # CPU and GPU: it keeps the output and one log-sum-exp per row, never the s x s scores); "math"
    # writes softmax(QK^T / sqrt(d)) V out and keeps the s x s probabilities for backward
    attention: str = "sdpa"
    # mixture of experts (paralab.models.moe): every block's MLP becomes ``experts`` FFNs of width ffn,
    # each token routed to ``top_k`` of them; 0 experts is the dense GPT
    experts: int = 0
    top_k: int = 1
    capacity_factor: float | None = None  # None: dropless; else ceil(factor x seq x k / experts) per sequence
    aux_loss: float = 0.01  # load-balancing loss coefficient (Switch / GShard form)
    z_loss: float = 0.0  # router z-loss coefficient (ST-MoE)
    shared_expert: bool = False  # one FFN every token also goes through (DeepSeek style)

    def __post_init__(self):
        if self.ffn == 0 and type(self.hidden) is int:  # any other hidden is refused by validate()
            object.__setattr__(self, "ffn", 4 * self.hidden)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def validate(self) -> None:
        check_field_kinds(self)
        for name in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len"):
            check_int(f"model {name}", getattr(self, name), low=1)
        check_int("model experts", self.experts, low=0)  # None had trained a dense model
        if self.hidden % self.heads:
            divisors = [h for h in range(1, self.hidden + 1) if self.hidden % h == 0 and h <= 64]
            raise ConfigError(
                f"model hidden size {self.hidden} is not divisible by heads {self.heads}; "
                f"head counts that fit: {divisors}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise ConfigError(f"attention must be one of {ATTENTION_KERNELS}, got {self.attention!r}")
        if self.experts:
            self._validate_experts()
        elif routing := [f"{name}={getattr(self, name)!r}" for name, unset in DENSE_ROUTING.items()
                         if getattr(self, name) != unset]:
            raise ConfigError(routing_without_experts(routing[0], "the model"))

    def _validate_experts(self) -> None:
        check_int("model top_k", self.top_k, low=1)
        if self.top_k > self.experts:
            raise ConfigError(f"top_k {self.top_k} is above the number of experts {self.experts}: "
                              "a token cannot go to more experts than there are; "
                              f"use top_k <= {self.experts}")
        if self.capacity_factor is not None:
            check_positive("capacity factor (--capacity-factor; left out, every token is kept)",
                           self.capacity_factor)
        for name in ("aux_loss", "z_loss"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigError(f"model {name} coefficient must be a finite number >= 0, got {value!r}")

    def param_count(self) -> int:
        """Exact number of parameters of paralab.models.gpt.GPT (untied embeddings, biases, LayerNorms;
        a mixture of experts: the router, every expert and the shared expert)."""
        h, f, v, s, layer_count = self.hidden, self.ffn, self.vocab, self.seq_len, self.layers
        ffn = h * f + f + f * h + h  # MLP up and down
        mlp = ffn if not self.experts else h * self.experts + (self.experts + self.shared_expert) * ffn
        per_block = (
            2 * 2 * h  # two LayerNorms (weight + bias)
            + 3 * h * h + 3 * h  # fused QKV
            + h * h + h  # attention output projection
            + mlp
        )
        return v * h + s * h + layer_count * per_block + 2 * h + h * v + v


# a mixture of experts' routing fields as a dense model leaves them: set otherwise on a dense model,
# one changes nothing, and whoever set it believes it changed something
DENSE_ROUTING = {"top_k": 1, "capacity_factor": None, "shared_expert": False}


def routing_without_experts(what: str, dense: str) -> str:
    """Why ``what`` (a routing option, as given) is refused on the ``dense`` model."""
    moe = ", ".join(name for name, m in MODEL_PRESETS.items() if m.experts)
    return (f"{what} has no effect: {dense} is dense, with no experts to route tokens to; it applies to a "
            f"mixture of experts: model {moe}, or one given experts")


MODEL_PRESETS: dict[str, ModelConfig] = {
    # CPU tests, Binder and laptops: 4 layers and 4 heads, so it splits 2 and 4 ways.
    "tiny": ModelConfig(layers=4, hidden=64, heads=4, vocab=128, seq_len=32),
    # A workstation CPU or one GPU: big enough for compute to dominate per-call overheads.
    "small": ModelConfig(layers=8, hidden=256, heads=8, vocab=512, seq_len=128),
    # A GPU workstation (about 220 M parameters, trained in bf16): communication and compute both
    # matter. Notebooks pick it when GPUs are present.
    "medium": ModelConfig(layers=16, hidden=1024, heads=16, vocab=8192, seq_len=512),
    # mixture of experts (notebook 11): tiny's shape, 4 experts, top-2, dropless
    "tiny-moe": ModelConfig(layers=4, hidden=64, heads=4, vocab=128, seq_len=32, experts=4, top_k=2),
    # small's shape with 8 experts, top-1 (Switch), a capacity of 1.25 and a shared expert
    "small-moe": ModelConfig(layers=8, hidden=256, heads=8, vocab=512, seq_len=128, experts=8, top_k=1,
                             capacity_factor=1.25, shared_expert=True),
}

DEVICES = ("auto", "cpu", "cuda")
CP_MODES = ("ring", "alltoall")  # context parallel: K/V round a ring, or all-to-all to heads (Ulysses)
CP_SPLITS = ("zigzag", "contiguous")  # how the sequence is cut over context-parallel ranks
# cp_mode and cp_split left "" (not asked for) take the first of these where cp > 1 (paralab.layout)
OPTIMIZERS = ("adam", "sgd")
DTYPES = ("fp32", "bf16", "fp16")
LOSS_SCALED_DTYPES = ("fp16",)  # whose loss precision.LossScaler scales
CUSTOM_MODEL = "custom"  # the model name of a run given its model's fields, not a preset's name
RECOMPUTE = ("none", "selective", "full")
ATTENTION_KERNELS = ("sdpa", "math")
# the same kernels as the simulator names them (paralab.sim.specs.ATTENTION): either name is taken by
# run, simulate and plan alike, so an --attention moves between the commands as it is
ATTENTION_AS_SIMULATED = {"sdpa": "fused", "math": "standard"}


def custom_from(preset: str) -> str:
    """The name of a preset's model with its shape changed: "custom (from tiny)", not the preset's own
    name, which would claim the preset's shape."""
    return f"{CUSTOM_MODEL} (from {preset})"


def preset_named(model: ModelConfig) -> str:
    """The name of the preset ``model`` is, its attention kernel aside (a kernel, not a shape: the CLI's
    ``--model tiny --attention math`` is model tiny), else "custom". A preset's fields handed over from
    Python had been named "custom", where the same run from the shell was named by its preset."""
    for name, preset in MODEL_PRESETS.items():
        if dataclasses.replace(model, attention=preset.attention) == preset:
            return name
    return CUSTOM_MODEL


@dataclass
class TrainingConfig:
    """What every training run has, whatever splits it: the model, the data, the optimizer, the
    device and the limits. RunConfig (``paralab run``) and ElasticConfig (``paralab elastic``) both
    extend it, so these fields, their checks and their command-line flags are written once."""

    model: ModelConfig = field(default_factory=lambda: MODEL_PRESETS["tiny"])
    model_name: str = "tiny"
    steps: int = 5
    global_batch: int = 8
    seed: int = 0
    device: str = "auto"
    lr: float = 3e-3
    optimizer: str = "adam"
    timeout_s: float = 300.0  # a collective hung longer than this ends the run with an error
    threads_per_rank: int = 0  # 0: share the cores fairly
    # whether ranks record compute and communication spans (False: step spans only); not a file: a path
    # given here is refused, pointing to paralab.run's trace_path (check_field_kinds)
    trace: bool = field(default=True, metadata={"path_goes_to": "trace_path"})
    fault: dict | None = None  # testing: {"rank": r, "step": k, ...} makes rank r fail at step k
    # start more local ranks than the machine holds (runtime.worker.check_capacity)
    oversubscribe: bool = False
    # mixed precision (paralab.precision): parameters and activations in ``dtype`` for compute, fp32
    # master weights and optimizer states, gradients reduced in ``reduce_dtype``; fp16 scales the loss
    dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    loss_scale: float | None = None  # fp16: where the dynamic loss scale starts (None: FP16_LOSS_SCALE)
    # activation recomputation: "selective" recomputes each attention core in backward, "full" each
    # block (Korthikanti et al. 2022); paralab.recompute
    recompute: str = "none"

    FAULT_OPTIONS = {"kind": ("raise", "hang")}  # what a fault may say besides rank and step

    def __post_init__(self):
        """A path given as a PathLike (a pathlib.Path) is kept as its str: the config travels to the
        ranks and into the trace's meta as JSON, which holds no Path."""
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), os.PathLike):
                setattr(self, f.name, os.fspath(getattr(self, f.name)))

    @property
    def initial_loss_scale(self) -> float:
        """Where fp16's dynamic loss scale starts: the one asked for, else FP16_LOSS_SCALE."""
        return FP16_LOSS_SCALE if self.loss_scale is None else self.loss_scale

    @classmethod
    def build(cls, model: str | ModelConfig | dict = "tiny", **kwargs):
        """Make a config from a preset name (or a ModelConfig / dict of its fields) and options."""
        if isinstance(model, str):
            if model not in MODEL_PRESETS:
                raise ConfigError(f"unknown model preset {model!r}; choose one of {sorted(MODEL_PRESETS)}")
            model_cfg, name = MODEL_PRESETS[model], model
        elif isinstance(model, dict):
            try:
                model_cfg = ModelConfig(**model)
            except TypeError as exc:
                raise ConfigError(f"model: {exc}") from None
            name = preset_named(model_cfg)
        elif isinstance(model, ModelConfig):
            model_cfg, name = model, preset_named(model)
        else:  # None or a number had gone on to an AttributeError inside validate()
            raise ConfigError(f"model must be a preset's name, a ModelConfig or a dict of its fields, got "
                              f"{model!r}")
        fields = [f.name for f in dataclasses.fields(cls)]
        if unknown := sorted(set(kwargs) - set(fields)):
            raise ConfigError(f"unknown run option(s): {unknown}" + _what_was_meant(unknown, fields))
        if "model_name" in kwargs:  # had raised TypeError: given twice
            raise ConfigError(f"model_name is model's to say: a preset's name, or {CUSTOM_MODEL!r} for a "
                              f"ModelConfig or a dict, whose shape no preset's name may claim; got "
                              f"{kwargs['model_name']!r}")
        return cls(model=model_cfg, model_name=name, **kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        data = dict(data)
        data["model"] = ModelConfig(**data["model"])
        return cls(**data)

    def validate(self):
        """Check every field on its own (types and ranges), and the loss scale against the dtype;
        returns self. What the fields mean together for a strategy is checked by
        paralab.layout.resolve_layout."""
        check_field_kinds(self)
        # the upper bounds are far beyond any run here; past them a number fails only inside the ranks
        # (a thread count torch cannot hold) or never ends
        check_int("steps", self.steps, low=1, high=10**9)
        check_int("global_batch", self.global_batch, low=1)
        if self.global_batch > CORPUS_SAMPLES:  # a step draws each of its samples once
            raise ConfigError(f"global batch {self.global_batch:,} is larger than the corpus "
                              f"({CORPUS_SAMPLES:,} samples)")
        check_int("seed", self.seed, low=0, high=2**63 - 1)
        check_int("threads per rank (--threads; threads_per_rank from Python)", self.threads_per_rank,
                  low=0, high=4096)
        check_positive("learning rate", self.lr)
        check_positive("timeout", self.timeout_s, low=1.0, unit=" s", high=MAX_TIMEOUT_S)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        for name, choices in (("device", DEVICES), ("dtype", DTYPES), ("reduce_dtype", DTYPES),
                              ("recompute", RECOMPUTE)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        self._validate_loss_scale()
        if not isinstance(self.model, ModelConfig):  # RunConfig(model="tiny"): build() takes a name
            raise ConfigError(f"model must be a ModelConfig, got {self.model!r}: RunConfig.build(model, ...) "
                              "takes a preset's name or a dict")
        self.model.validate()
        self._validate_fault()
        return self

    def _validate_loss_scale(self) -> None:
        """A loss scale is where fp16's dynamic scale starts; at a dtype whose loss is not scaled it
        would change nothing, and whoever gives one believes it changed something."""
        if self.loss_scale is None:
            return
        if self.dtype not in LOSS_SCALED_DTYPES:
            scaled = " or ".join(LOSS_SCALED_DTYPES)
            raise ConfigError(f"loss_scale has no effect at dtype {self.dtype}, whose loss is not scaled: it "
                              f"is where {scaled}'s dynamic loss scale starts; give dtype={scaled} or leave "
                              "it out")
        check_positive("loss scale", self.loss_scale)

    def _validate_fault(self) -> None:
        if self.fault is None:
            return
        if not isinstance(self.fault, dict):
            raise ConfigError(f"fault must be a dict like {{'rank': 1, 'step': 3}}, got {self.fault!r}")
        unknown = set(self.fault) - {"rank", "step", *self.FAULT_OPTIONS}
        if unknown:
            raise ConfigError(f"fault takes rank, step and {', '.join(self.FAULT_OPTIONS)}; unknown: "
                              f"{sorted(unknown)}")
        missing = [key for key in ("rank", "step") if key not in self.fault]
        if missing:  # had been said as "fault step must be a whole number, got None"
            raise ConfigError(f"fault needs a rank and a step, like {{'rank': 1, 'step': 3}}: "
                              f"{missing[0]!r} is missing")
        for key in ("rank", "step"):
            check_int(f"fault {key}", self.fault.get(key), low=0)
        for key, choices in self.FAULT_OPTIONS.items():
            if key in self.fault and self.fault[key] not in choices:
                raise ConfigError(f"fault {key} must be one of {choices}, got {self.fault[key]!r}")


# Reduce-scatters paralab's ZeRO-2 and ZeRO-3 keep on the wire beside backward, each holding its unit's
# full gradient buffer and the reduced shard it lands in (the simulator's memory model counts them too)
ZERO_REDUCE_SCATTERS_IN_FLIGHT = 2


@dataclass
class RunConfig(TrainingConfig):
    """Everything ``paralab.run`` / ``paralab run`` needs. Plain data: it travels to every rank as a dict.

    The parallel options say what the user asked for; 0 (or the default) means "not asked for".
    paralab.layout.resolve_layout turns them, with the strategy, into the run's Layout."""

    strategy: str = "ddp"
    world_size: int = 1
    # data parallel
    bucket_mb: float = 25.0  # DDP bucket cap, torch's default
    hierarchical: bool = False  # ddp: reduce-scatter in the node, all-reduce across nodes, all-gather
    nodes: int = 1  # local launches: ranks split into this many emulated nodes (torchrun: real nodes)
    # degrees (0: from the strategy and the world size) and the pipeline's shape
    dp: int = 0
    tp: int = 0
    pp: int = 0
    ep: int = 0  # expert parallel: experts sharded over ep of the data-parallel ranks (paralab.layout)
    schedule: str = ""
    microbatches: int = 1
    virtual_stages: int = 1
    sequence_parallel: bool = False
    stage_layers: list[int] | None = None
    zero: int = 0  # hybrid: ZeRO stage over the dp dimension (0: ddp-style all-reduce)
    zero_prefetch: bool = False  # zero3: gather the next part while this one computes (strategies/zero.py)
    cp: int = 0  # context-parallel degree (0: from the strategy and the world size)
    cp_mode: str = ""  # "": not asked for (ring where cp > 1); given at cp = 1, it is refused
    cp_split: str = ""  # "": not asked for (zigzag where cp > 1)
    # run control
    collect_state: bool = False  # return final parameters and gradients (parity tests)
    profile_dir: PathOption = None  # each rank writes a torch.profiler trace here (paralab.profiling)

    def validate(self) -> RunConfig:
        super().validate()
        if not isinstance(self.strategy, str):
            raise ConfigError(f"strategy must be a name, got {self.strategy!r}")
        check_int("world size", self.world_size, low=1, high=MAX_RANKS)
        for name in ("dp", "tp", "pp", "cp", "ep", "zero"):
            check_int(name, getattr(self, name), low=0)  # 0: not asked for
        for name in ("microbatches", "virtual_stages", "nodes"):
            check_int(name, getattr(self, name), low=1)
        if why := not_a_split(self.stage_layers):
            raise ConfigError(why)
        check_positive("bucket size", self.bucket_mb, unit=" MiB")
        for name, choices in (("cp_mode", CP_MODES), ("cp_split", CP_SPLITS)):
            if getattr(self, name) not in ("", *choices):
                raise ConfigError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if self.fault is not None and self.fault["rank"] >= self.world_size:
            raise ConfigError(f"fault rank must be in [0, {self.world_size}), got {self.fault['rank']}")
        if self.fault is not None and self.fault["step"] >= self.steps:
            raise ConfigError(f"fault step {self.fault['step']} is beyond the run: "
                              f"steps are 0..{self.steps - 1}")
        return self


# What each rank of a launch may set for itself: how it uses its own machine (threads, whether it may
# start more ranks than cores, how long it waits for a peer, where its profile goes) and what it reads
# from its own node's environment (nodes: torchrun's agents, when this node's ranks times them is the
# world). Every other setting shapes the training all ranks do together.
RANK_OWN_SETTINGS = frozenset({"threads_per_rank", "oversubscribe", "timeout_s", "profile_dir", "nodes"})


def shared_settings(settings: dict) -> dict:
    """A run's settings (``RunConfig.to_dict()``, or a trace's ``meta["config"]``) that every rank of
    it holds alike: without :data:`RANK_OWN_SETTINGS`."""
    return {key: value for key, value in settings.items() if key not in RANK_OWN_SETTINGS}


def first_difference(named: list[tuple[str, dict]]) -> tuple[str, str] | None:
    """(name, how its settings differ) of the first of ``named`` (name, a run's settings) whose
    :func:`shared_settings` differ from the first one's, or None where all agree: the ranks of one
    launch as they meet, the files of one trace folder as they merge."""
    if not named:
        return None
    (first_name, first), *others = [(name, shared_settings(settings)) for name, settings in named]
    for name, theirs in others:
        if said := settings_differ(first, theirs, f"{first_name}'s"):
            return name, said
    return None


# the layout's settings whose empty value (0, "") says "not asked for": the strategy and the world
# size decide them (paralab.layout.resolve_layout). Of the options whose "not asked for" value
# paralab.strategies.registry.OPTION_DEFAULTS keeps, those where it is a placeholder, no value of its
# own (zero's 0 is a stage, virtual_stages' 1 a layout): a test holds the two alike.
LEFT_TO_THE_STRATEGY = frozenset({"dp", "tp", "pp", "ep", "cp", "schedule", "cp_mode", "cp_split"})


def settings_differ(first: dict, other: dict, whose: str) -> str:
    """How ``other``'s settings differ from ``first``'s (``whose``), at most three named ("seed 1
    against rank 0's 0"; a nested setting by its path, model.hidden, not the whole of its dict); ''
    where they agree. A layout setting not asked for is said so ("pp 2 against rank 0's 0 (not asked
    for: left to the strategy)"): its 0 is no layout's."""
    mine, theirs = dict(_flat(first)), dict(_flat(other))
    keys = sorted(key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
    said = ", ".join(f"{key} {_value_text(key, theirs.get(key))} against {whose} "
                     f"{_value_text(key, mine.get(key))}" for key in keys[:3])
    return said + (f" (and {len(keys) - 3} more)" if len(keys) > 3 else "")


def _value_text(key: str, value) -> str:
    unasked = key in LEFT_TO_THE_STRATEGY and value in (0, "")
    return f"{value!r} (not asked for: left to the strategy)" if unasked else repr(value)


def _flat(settings: dict, prefix: str = ""):
    for key, value in settings.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


MAX_TIMEOUT_S = 10**7  # about four months: what a time-out may be before deadlines overflow the clocks
FP16_LOSS_SCALE = 2.0**16  # where fp16's dynamic loss scale starts unless told (torch.amp.GradScaler's)


def _what_was_meant(unknown: list[str], fields: list[str]) -> str:
    """The options ``unknown`` names were likely meant as: a model's field (``hidden=``) goes in
    ``model``, and a command-line flag's name (``fail``, ``timeout``, ``threads``) is close to its
    field's (``fault``, ``timeout_s``, ``threads_per_rank``); "" when none is near."""
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    meant = []
    for name in unknown:
        if name in model_fields:
            meant.append(f"{name} is a model field: model={{'{name}': ...}} or a ModelConfig")
        elif close := difflib.get_close_matches(name, fields, n=1, cutoff=0.6):
            meant.append(f"{name}: did you mean {close[0]}?")
    return f" ({'; '.join(meant)})" if meant else ""


def check_field_kinds(config) -> None:
    """ConfigError for a yes/no field (annotated bool) that is not True or False, or a path field
    (PathOption) that is not a str, a PathLike or None: a truthy string had passed (``"no"`` turned
    sequence parallelism on) and ``trace="run.json"`` had run and written nothing. Read from the
    dataclass's annotations, so a field is checked as it is declared."""
    kinds = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, kind = getattr(config, f.name), kinds[f.name]
        if kind is bool and type(value) is not bool:
            goes_to = f.metadata.get("path_goes_to")
            hint = f" (a file to write it to is {goes_to})" if goes_to else ""
            raise ConfigError(f"{f.name} must be True or False, got {value!r}{hint}")
        if kind == PathOption and not isinstance(value, PathOption):
            raise ConfigError(f"{f.name} must be a path (str or os.PathLike) or None, got {value!r}")


def check_int(name: str, value, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be <= {high:,}, got {value:,}")


def finite_number(value) -> bool:
    """A real number a float can hold: not a bool, inf or nan, nor an integer too large for a float
    (JSON allows 400 digits; they overflow on first use)."""
    if type(value) is int:
        return abs(value) < 2**1000
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def nulls_for_non_finite(value):
    """``value`` with every non-finite float (nan, inf) inside it replaced by None: JSON has no NaN,
    and ``json.dumps`` writes a bare ``NaN`` that browsers, Perfetto and jq refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: nulls_for_non_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [nulls_for_non_finite(v) for v in value]
    return value


def check_positive(name: str, value, low: float = 0.0, unit: str = "", high: float | None = None) -> None:
    """A finite number above ``low`` (nan and inf are refused: they would only fail later), and at most
    ``high`` when given."""
    if not finite_number(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if value <= 0 or value < low:
        raise ConfigError(f"{name} must be {'> 0' if not low else f'>= {low:g}'}{unit}, got {value:g}{unit}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be <= {high:g}{unit}, got {value:g}{unit}")


def resolve_device(device: str, local_ranks: int) -> str:
    """The device the ranks on this machine run on: 'auto' is CUDA when each of the ``local_ranks``
    has a GPU of its own, else the CPU. ConfigError when 'cuda' cannot be honoured."""
    check_device(device, local_ranks)
    if device != "auto":
        return device
    return "cuda" if cuda_device_count() >= local_ranks else "cpu"


def check_device(device: str, ranks: int, choices: tuple[str, ...] = DEVICES) -> None:
    """ConfigError unless ``device`` is one of ``choices`` and, for 'cuda', each of the ``ranks``
    local ranks has a GPU of its own."""
    if device not in choices:
        raise ConfigError(f"device must be one of {choices}, got {device!r}")
    if device == "cuda":
        gpus = cuda_device_count()
        if gpus < ranks:
            raise ConfigError(
                f"device='cuda' needs one GPU per rank: world size {ranks} but "
                f"{gpus} CUDA device(s) visible; use device='cpu' or world size <= {gpus}"
                if gpus
                else "device='cuda' asked for, but no CUDA device is visible; use device='cpu'"
            )


def cuda_device_count() -> int:
    """GPUs visible to this process, without initialising CUDA in a parent that will fork ranks."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return 0
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
