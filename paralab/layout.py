"""A run's parallel shape, resolved once: the :class:`Layout`.

``resolve_layout(cfg)`` is the only place where a strategy name and the options a user gave become
degrees on each axis of the device mesh, a pipeline schedule and a batch split. It is a pure
function of the :class:`~paralab.config.RunConfig` (it writes nothing back and asks nothing of the
machine) and it refuses, with the numbers that conflict and what would fit, every shape that
cannot run. Everything downstream — the strategies on every rank, the run summary, the trace's
metadata, the simulator bridge, the widgets — reads the Layout instead of deriving it again.

The mesh. Ranks sit on a grid with one dimension per axis, outermost first (``AXES``)::

    global rank = ((pp_index x dp + dp_index) x cp + cp_index) x tp + tp_index

Tensor parallelism talks in every layer, forward and backward, so its ranks are neighbours (the
same node, the fastest links); context parallelism talks in every layer too (K/V blocks round a ring,
or four all-to-alls), but each message overlaps a block's attention or is a fraction of the layer's
activations, so it sits next to tp, just outside it (torchtitan's order: dp, cp, tp); data
parallelism talks once per step (the gradient reduction, over dp and cp together); pipeline
parallelism sends one activation per microbatch to the next stage, the least traffic, so it is
outermost and its stages are the ranks farthest apart. It is the order of torch's
``init_device_mesh(device, layout.shape, mesh_dim_names=AXES)``, which builds the run's process
groups from this grid. A single-axis strategy is the same grid with every other degree 1.

Expert parallel (ep) is carved out of the data-parallel ranks, as Megatron and DeepSpeed-MoE do, so
it is no dimension of its own and the grid keeps its shape: each dp group is cut into groups of ``ep``
consecutive dp ranks (neighbours, so a token's all-to-all stays close), and each such *expert group*
holds every expert once, E / ep on each rank. A mixture-of-experts model has two kinds of
parameters: attention, norms, embeddings and the router are replicated on every dp rank and their
gradients are reduced over the whole dp group; an expert lives on the dp ranks at the same place of
every expert group (the *expert-data-parallel* group, dp / ep of them), and only they reduce it::

    dp index = expert-data-parallel index x ep + ep index

Adding an axis is local: a field, its place in ``AXES``, and the rule that sets its degree.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

from paralab.config import CORPUS_SAMPLES, CP_MODES, CP_SPLITS, ConfigError, RunConfig
from paralab.schedules import DEFAULT_SCHEDULE, chunks_per_rank, shape_problems
from paralab.strategies.registry import (
    CONTEXT_OPTIONS,
    OPTION_DEFAULTS,
    TUNING_OPTIONS,
    Strategy,
    bucket_cap_applies,
    check_replicas_reduce,
    get_strategy,
)
from paralab.text import count_text

AXES = ("pp", "dp", "cp", "tp")  # mesh dimensions, outermost first


@dataclass(frozen=True)
class Layout:
    """The resolved parallel shape of one run (see the module docstring)."""

    strategy: str
    world_size: int
    global_batch: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    cp_mode: str = ""  # context parallel: "ring" or "alltoall"; "" when the strategy has no cp axis
    cp_split: str = ""  # how the sequence is cut over cp ranks: "zigzag" or "contiguous"
    ep: int = 1  # expert parallel, inside dp (see the module docstring): experts sharded over ep dp ranks
    schedule: str = ""  # the pipeline schedule; "" when the run has no pipeline
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved: v; zbv: 2)
    # per data-parallel replica and step: gradient accumulation (a pipeline's microbatches)
    microbatches: int = 1
    zero: int = 0  # ZeRO stage over the dp axis
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] | None = None  # blocks per pipeline stage, when not even
    nodes: int = 1
    unused_options: tuple[str, ...] = ()  # tuning knobs given that this strategy has no use for

    # ------------------------------------------------------------------ batch split
    @property
    def batch_per_replica(self) -> int:
        """Sequences each data-parallel replica trains on per step."""
        return self.global_batch // self.dp

    @property
    def micro_batch(self) -> int:
        """Sequences in one forward and backward pass of a replica."""
        return self.batch_per_replica // self.microbatches

    @property
    def pipelined(self) -> bool:
        return bool(self.schedule)

    @property
    def num_stages(self) -> int:
        """Pipeline stages S = pp x virtual stages (model chunks), each on one rank."""
        return self.pp * self.virtual_stages

    # ------------------------------------------------------------------ the mesh
    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.degree(axis) for axis in AXES)

    @cached_property
    def coords(self) -> dict[int, tuple[int, ...]]:
        """Every global rank's coordinate on the mesh, in AXES order."""
        out = {}
        for rank in range(self.world_size):
            coord, rest = [], rank
            for size in reversed(self.shape):  # innermost axis varies fastest
                rest, index = divmod(rest, size)
                coord.append(index)
            out[rank] = tuple(reversed(coord))
        return out

    def coord(self, rank: int) -> dict[str, int]:
        """``rank``'s index on each axis."""
        return dict(zip(AXES, self.coords[rank]))

    def rank_of(self, **coord: int) -> int:
        """The global rank at a coordinate (axes left out are 0)."""
        rank = 0
        for axis, size in zip(AXES, self.shape):
            rank = rank * size + coord.get(axis, 0)
        return rank

    def groups(self, *axes: str) -> list[list[int]]:
        """The ranks that vary only along ``axes`` (every other coordinate fixed), each list in rank
        order: the tp groups, the dp groups, the pipelines (pp), or with two axes the ranks that
        reduce gradients together (``groups("dp", "cp")``)."""
        fixed = [i for i, axis in enumerate(AXES) if axis not in axes]
        lines: dict[tuple, list[int]] = {}
        for rank, coord in self.coords.items():  # rank order, so each line is in the axes' order
            lines.setdefault(tuple(coord[i] for i in fixed), []).append(rank)
        return list(lines.values())

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The ``axis`` group that ``rank`` belongs to."""
        return next(group for group in self.groups(axis) if rank in group)

    def expert_groups(self) -> list[list[int]]:
        """The expert-parallel groups: ``ep`` consecutive ranks of each dp group, which between them
        hold every expert once (their all-to-all carries the tokens)."""
        return [dp[i:i + self.ep] for dp in self.groups("dp") for i in range(0, self.dp, self.ep)]

    def expert_data_groups(self) -> list[list[int]]:
        """The expert-data-parallel groups: the ranks of a dp group that hold the same experts (every
        ep-th one), over which those experts' gradients are reduced."""
        return [dp[i::self.ep] for dp in self.groups("dp") for i in range(self.ep)]

    def text(self) -> str:
        """The grid as a table: one row per (pp, dp), one column per tp rank (per (cp, tp) pair with
        context parallelism), the global rank in each cell."""
        rank = f"(pp * {self.dp} + dp) * {self.tp} + tp"
        if self.cp > 1:
            rank = f"((pp * {self.dp} + dp) * {self.cp} + cp) * {self.tp} + tp"
        cp = f" x cp={self.cp}" if self.cp > 1 else ""
        head = (f"dp={self.dp}{cp} x tp={self.tp} x pp={self.pp} = {self.world_size} ranks "
                f"(global rank = {rank})")
        columns = [(c, t) for c in range(self.cp) for t in range(self.tp)]
        names = [f"tp{t}" if self.cp == 1 else f"cp{c}tp{t}" for c, t in columns]
        width = max(len(str(self.world_size - 1)), *map(len, names))
        rows = [head, " " * 9 + " ".join(name.rjust(width) for name in names)]
        for p in range(self.pp):
            for d in range(self.dp):
                label = (f"pp{p}" if d == 0 else "").ljust(5) + f"dp{d}".ljust(4)
                rows.append(label + " ".join(str(self.rank_of(pp=p, dp=d, cp=c, tp=t)).rjust(width)
                                             for c, t in columns))
        if self.ep > 1:
            rows.append(f"expert groups (ep={self.ep}, every expert once): {self.expert_groups()}")
            rows.append(f"expert-data-parallel groups (same experts): {self.expert_data_groups()}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.text()

    # ------------------------------------------------------------------ plain data
    def to_dict(self) -> dict:
        """JSON data for a trace's meta, a rank's arguments or a figure: the fields, and the mesh."""
        out = dataclasses.asdict(self)
        out["mesh"] = {"dims": list(AXES), "shape": list(self.shape),
                       "coords": {str(rank): list(coord) for rank, coord in self.coords.items()}}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        for name in ("stage_layers", "unused_options"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)


def mesh_layout(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1) -> Layout:
    """The grid of a dp x cp x tp x pp mesh alone, with ep carved from dp (for figures and lessons;
    ``print`` it for the table)."""
    if min(dp, tp, pp, cp, ep) < 1 or dp % ep:
        raise ValueError(f"every degree must be >= 1 and ep must divide dp, got dp={dp}, cp={cp}, tp={tp}, "
                         f"pp={pp}, ep={ep}")
    return Layout("hybrid", dp * cp * tp * pp, global_batch=dp, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)


# ---------------------------------------------------------------------------------------- resolving
def resolve_layout(cfg: RunConfig) -> Layout:
    """The Layout of ``cfg``, or ConfigError naming what conflicts and what would fit.

    Order of the checks: the config's own fields, options the strategy does not use, the degree of
    every axis, the replicas' share of the batch, the pipeline's shape, the batch split into
    microbatches, a reduction dtype where one replica reduces nothing, then the strategy's own rules
    (its ``check``).
    """
    if not isinstance(cfg, RunConfig):  # None or a dict had been an AttributeError from inside
        raise ConfigError(f"resolve_layout takes a RunConfig (RunConfig.build(model, strategy=..., ...)), "
                          f"got {cfg!r}"[:200])
    cfg.validate()
    strategy = get_strategy(cfg.strategy)
    unused = _unused_options(cfg, strategy)
    degrees = _degrees(cfg, strategy)
    degrees["ep"] = _expert_degree(cfg, strategy, degrees)
    if cfg.global_batch % degrees["dp"]:  # the replicas' share first: a schedule counts its offers from it
        _check_batch_split(cfg.global_batch, degrees["dp"], 1)
    schedule, virtual_stages, microbatches = _pipeline_shape(cfg, strategy, degrees["pp"], degrees["dp"])
    _check_batch_split(cfg.global_batch, degrees["dp"], microbatches,
                       runs=lambda m: not schedule or not shape_problems(schedule, degrees["pp"], m,
                                                                          cfg.virtual_stages))
    if cfg.world_size % cfg.nodes:
        fit = _divisors(cfg.world_size)
        raise ConfigError(f"{count_text(cfg.nodes, 'node')} cannot split world size "
                          f"{cfg.world_size} evenly: nodes that do are {', '.join(map(str, fit))}")
    context = "cp" in strategy.axes
    if context and degrees["cp"] == 1:  # as sequence parallel with tp = 1: refused, not ignored
        for option in CONTEXT_OPTIONS:
            if getattr(cfg, option) != OPTION_DEFAULTS[option]:
                raise ConfigError(f"{option}={getattr(cfg, option)} applies to context parallelism, and this "
                                  f"run has cp=1: set cp > 1 or leave {option} out")
    layout = Layout(
        strategy=cfg.strategy, world_size=cfg.world_size, global_batch=cfg.global_batch, **degrees,
        cp_mode=(cfg.cp_mode or CP_MODES[0]) if context else "",
        cp_split=(cfg.cp_split or CP_SPLITS[0]) if context else "", schedule=schedule,
        virtual_stages=virtual_stages, microbatches=microbatches,
        zero=strategy.zero or cfg.zero, sequence_parallel=cfg.sequence_parallel,
        stage_layers=tuple(cfg.stage_layers) if cfg.stage_layers else None, nodes=cfg.nodes,
        unused_options=unused,
    )
    given = cfg.bucket_mb not in (OPTION_DEFAULTS["bucket_mb"], None)
    if given and "bucket_mb" not in unused and not bucket_cap_applies(cfg.strategy, layout):
        # taken by the strategy, but its layout keeps no buckets (one replica; ZeRO-1's one unit):
        # paralab.run had dropped it in silence, where the CLI refuses it
        layout = dataclasses.replace(layout, unused_options=(*unused, "bucket_mb"))
    check_replicas_reduce(cfg, strategy, layout)
    if strategy.check is not None:
        strategy.check(cfg, layout)
    return layout


def _unused_options(cfg: RunConfig, strategy: Strategy) -> tuple[str, ...]:
    """An option the strategy does not use is refused, never silently ignored and echoed back as if
    applied; a tuning knob is returned as unused (the summary reports it)."""
    unused = []
    for option, default in OPTION_DEFAULTS.items():
        value = getattr(cfg, option)
        if value in (default, None) or option in strategy.options:
            continue
        name = strategy.name
        if option in TUNING_OPTIONS:
            unused.append(option)
            continue
        if option in AXES:
            axes = " x ".join(strategy.axes) or "no axis (one rank)"
            raise ConfigError(f"{name} splits over {axes} only; it does not take {option}={value}. Use "
                              f"strategy 'hybrid' to combine data, context, tensor and pipeline parallelism.")
        if option in ("cp_mode", "cp_split"):
            raise ConfigError(f"{option}={value} is a context-parallel option; {name} has no cp axis (use "
                              f"strategy 'cp', or 'hybrid' with cp > 1)")
        if option == "zero":
            instead = (f"strategy {name!r} is ZeRO-{name[-1]} already: leave zero out"
                       if name.startswith("zero")
                       else f"for ZeRO over all ranks use strategy 'zero{value}' instead of {name!r}")
            raise ConfigError(f"zero={value} is a hybrid option; {instead}")
        if option == "hierarchical":
            raise ConfigError(f"hierarchical all-reduce is a ddp option, not {name!r}")
        if option == "reduce_dtype":
            raise ConfigError(f"reduce_dtype={value} sets the dtype gradients are reduced in across ranks; "
                              f"{name} has no reduction it applies to: leave it out")
        if option == "zero_prefetch":
            raise ConfigError(f"zero_prefetch gathers ZeRO-3's next part ahead: a zero3 option, not {name!r}")
        if option == "ep":
            raise ConfigError(f"ep={value} shards the experts of a mixture-of-experts model over "
                              f"data-parallel ranks; {name} has no expert parallel: "
                              "use strategy 'ep' or 'hybrid'")
        if option == "sequence_parallel":
            raise ConfigError(f"sequence_parallel splits the sequence over tensor-parallel ranks; {name} has "
                              f"no tp axis")
        raise ConfigError(f"{name} has no pipeline: {option}={value} needs strategy 'pp' or 'hybrid' "
                          "with pp > 1")
    return tuple(unused)


def _degrees(cfg: RunConfig, strategy: Strategy) -> dict[str, int]:
    """The degree of every axis. A single-axis strategy's degree is the world size (given or not); a
    multi-axis one fills dp from the others (world / product); every unused axis is 1."""
    world = cfg.world_size
    given = {axis: getattr(cfg, axis) for axis in AXES}
    for axis, value in given.items():
        if value < 0:
            raise ConfigError(f"{axis} must be >= 1 (or 0: from the world size), got {value}")
    if not strategy.axes:
        if world != 1:
            raise ConfigError(f"strategy {strategy.name!r} runs on one rank, got world size {world}")
        return dict.fromkeys(AXES, 1)
    if len(strategy.axes) == 1:
        (axis,) = strategy.axes
        if given[axis] not in (0, world):
            raise ConfigError(f"{strategy.name} puts all ranks on its {axis} axis: {axis}={given[axis]} but "
                              f"world size {world}; use {axis}={world} (or leave it out), world size "
                              f"{given[axis]}, or strategy 'hybrid' to combine {axis} with other axes")
        return {a: world if a == axis else 1 for a in AXES}
    degrees = {a: (given[a] or 1) if a in strategy.axes else 1 for a in AXES}
    others = math.prod(d for a, d in degrees.items() if a != "dp")
    degrees["dp"] = given["dp"] or max(world // others, 1)
    if math.prod(degrees.values()) != world:
        names = [a for a in ("dp", "cp", "tp", "pp")
                 if a in strategy.axes and (a != "cp" or degrees["cp"] > 1)]  # cp named when used
        shown = " x ".join(str(degrees[a]) for a in names)
        fits = ["x".join(str(d) for d in combo) for combo in _factorisations(world, len(names))]
        raise ConfigError(f"{strategy.name} needs {' x '.join(names)} = world size: {shown} = "
                          f"{math.prod(degrees.values())}, but world size is {world}; use world size "
                          f"{math.prod(degrees.values())}, or {' x '.join(names)} that fit {world} ranks: "
                          f"{', '.join(fits)}")
    return degrees


def _expert_degree(cfg: RunConfig, strategy: Strategy, degrees: dict[str, int]) -> int:
    """ep: given, or for the ep strategy the whole dp axis; it must divide dp (it is carved out of it)
    and the experts (each rank holds E / ep of them), and it needs experts to shard."""
    dp, experts = degrees["dp"], cfg.model.experts
    if experts and degrees["tp"] > 1:
        raise ConfigError(f"not supported: a mixture-of-experts model ({experts} experts) "
                          f"with tp={degrees['tp']}: paralab's tensor-parallel blocks split a dense MLP; "
                          "use dp, pp and ep for it")
    if experts and degrees["cp"] > 1:
        raise ConfigError(f"not supported: a mixture-of-experts model ({experts} experts) "
                          f"with cp={degrees['cp']}: each rank would route its slice of every sequence, so "
                          "capacity, dropped tokens and the balancing loss would be per slice, not per "
                          "sequence as on one device; use dp, pp and ep for it")
    if "ep" not in strategy.options:
        return 1
    ep = cfg.ep or (dp if strategy.name == "ep" else 1)
    if ep > 1 and not experts:  # "ep=2" alone had read as a flag the user never gave
        who = f"ep={ep}" if cfg.ep else f"strategy {strategy.name} (ep = its {dp} data-parallel ranks)"
        raise ConfigError(f"{who} shards experts, but model {cfg.model_name!r} is dense (experts=0); use a "
                          f"mixture-of-experts model such as 'tiny-moe'")
    if dp % ep:
        fits = [d for d in range(1, dp + 1) if dp % d == 0 and (not experts or experts % d == 0)]
        raise ConfigError(f"ep={ep} must divide the {dp} data-parallel ranks it is carved from; ep that fit: "
                          f"{fits}")
    if experts % ep:
        fits = [d for d in range(1, dp + 1) if dp % d == 0 and experts % d == 0]
        raise ConfigError(f"{experts} experts are not divisible by ep={ep}: "
                          "every rank of an expert group holds the same number of experts; ep that fit: "
                          f"{fits}")
    return ep


def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to write ``n`` as an ordered product of ``parts`` degrees."""
    if parts == 1:
        return [(n,)]
    return [(d, *rest) for d in _divisors(n) for rest in _factorisations(n // d, parts - 1)]


def _divisors(n: int) -> list[int]:
    """``n``'s divisors in order, found up to its square root (a walk to ``n`` had kept a refusal of
    10**9 + 7 ranks busy for minutes)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _pipeline_shape(cfg: RunConfig, strategy: Strategy, pp: int, dp: int) -> tuple[str, int, int]:
    """(schedule, virtual stages, microbatches). A pipeline exists when the strategy pipelines (its
    schedule rules come from paralab.schedules); otherwise microbatches accumulate gradients."""
    pipelines = "pp" in strategy.axes and (pp > 1 or len(strategy.axes) == 1)
    if not pipelines:
        if cfg.schedule or cfg.virtual_stages != 1 or cfg.stage_layers:
            raise ConfigError("a pipeline schedule, virtual_stages or stage_layers needs pp > 1; with pp=1 "
                              "the microbatches simply accumulate gradients")
        return "", 1, cfg.microbatches
    schedule = cfg.schedule or strategy.schedule or DEFAULT_SCHEDULE
    if strategy.schedules and schedule not in strategy.schedules:
        raise ConfigError(f"unknown pipeline schedule {schedule!r} for {strategy.name}; choose one of: "
                          f"{', '.join(strategy.schedules)}")
    # the virtual stages asked for are checked before a V's two chunks replace them: a zbv run given 3
    # had run with 2 and said nothing
    problems = shape_problems(schedule, pp, cfg.microbatches, cfg.virtual_stages,
                              sequences=cfg.global_batch // dp)  # dp divides it (resolve_layout)
    if problems:
        raise ConfigError(f"pipeline schedule {schedule!r} (pp={pp}, microbatches={cfg.microbatches}, "
                          f"virtual_stages={cfg.virtual_stages}) cannot run: {problems[0]}")
    return schedule, chunks_per_rank(schedule, cfg.virtual_stages), cfg.microbatches


def _check_batch_split(batch: int, dp: int, microbatches: int, runs=lambda m: True) -> None:
    """The global batch splits over the dp replicas and their microbatches; a refusal offers the counts
    the pipeline's schedule ``runs`` too (interleaved's were offered, then refused by it)."""
    if microbatches < 1:
        raise ConfigError(f"microbatches must be >= 1, got {microbatches}")
    if batch % (dp * microbatches) == 0:
        return
    if dp == 1:
        fits = [d for d in _divisors(batch) if runs(d)]
        raise ConfigError(f"global batch {batch} is not divisible by {microbatches} microbatches; "
                          f"microbatch counts that fit: {fits}")
    split = (f"is not divisible by the {dp} data-parallel ranks" if microbatches == 1
             else f"does not split into dp={dp} replicas x {microbatches} microbatches")
    step = dp * microbatches
    if step > CORPUS_SAMPLES:  # the batches that fit would be refused in turn
        raise ConfigError(f"global batch {batch} {split}: that needs a batch of at least {step:,} sequences, "
                          f"more than the corpus holds ({CORPUS_SAMPLES:,}); use fewer ranks")
    fits = [b for b in range(step, 4 * step + 1, step) if b <= CORPUS_SAMPLES]
    raise ConfigError(f"global batch {batch} {split}; global batches that fit: {fits}")
