"""The strategy registry: what each ``--strategy`` name means, declared in the strategy's own file.

Each strategy module ends with ``STRATEGIES = [Strategy(...)]``: its name, a one-line summary, the
mesh axes it splits the ranks over, the options it honours and its ``train(ctx)``. The registry
reads those declarations; the layout resolver (paralab.layout), the CLI's ``paralab strategies``
table, error messages and the docs table all come from them, so a strategy's meaning is written
once. Modules are imported when the registry is first asked, so ``import paralab`` and the
simulator's commands stay free of torch.distributed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from paralab.config import ConfigError

# The files that declare strategies, in the order the docs table lists them.
MODULES = ("single", "dp", "ddp", "pipeline", "tensor", "zero", "context", "expert", "hybrid",
           "reference_ddp", "reference_pipeline", "reference_tensor", "reference_fsdp", "reference_hybrid")

# Options a strategy may or may not use, with the value that means "not asked for". Everything else
# in RunConfig (model, batch, steps, optimizer, device, precision, recomputation, microbatches:
# gradient accumulation, tracing, ...) applies to every strategy. A strategy that does not use an
# option refuses it; a tuning knob it has no use for (TUNING_OPTIONS: a benchmark may pass one to
# several strategies) is reported as unused instead.
OPTION_DEFAULTS = {"dp": 0, "tp": 0, "pp": 0, "ep": 0, "schedule": "", "virtual_stages": 1,
                   "stage_layers": None, "sequence_parallel": False, "zero": 0, "bucket_mb": 25.0,
                   "hierarchical": False, "reduce_dtype": "fp32",
                   "cp": 0, "cp_mode": "", "cp_split": "", "zero_prefetch": False}
TUNING_OPTIONS = ("bucket_mb",)
PIPELINE_OPTIONS = ("schedule", "virtual_stages", "stage_layers")
CONTEXT_OPTIONS = ("cp_mode", "cp_split")


def check_reduce_dtype_applies(cfg, reduces: bool, why_not: str) -> None:
    """Refuse a ``reduce_dtype`` in a layout of a strategy that takes it but reduces nothing in this
    layout (``why_not`` says why), rather than ignore it."""
    if cfg.reduce_dtype != OPTION_DEFAULTS["reduce_dtype"] and not reduces:
        raise ConfigError(f"reduce_dtype={cfg.reduce_dtype} would change nothing: {why_not}; leave it out")


def check_replicas_reduce(cfg, strategy: Strategy, layout) -> None:
    """Refuse a ``reduce_dtype`` given to a strategy that averages gradients over its replicas alone (its
    axes among dp and cp) in a layout with one replica of each (dp x cp = 1), where nothing is reduced.
    Such a run had been accepted, its summary saying "gradients reduced in bf16": ddp's then kept no
    buckets and changed nothing, while dp, ZeRO and torch's references still cast an fp32 model's
    gradients to bf16 and back, a rounding but no reduction. The strategies with a tp axis keep their
    own rules (tensor's ``check_tp``, hybrid's and torch_hybrid's ``check``)."""
    if set(strategy.axes) <= {"dp", "cp"} and cfg.reduce_dtype != OPTION_DEFAULTS["reduce_dtype"]:
        if layout.dp * layout.cp == 1:
            raise ConfigError(f"reduce_dtype={cfg.reduce_dtype} has no reduction to apply to: "
                              f"{strategy.name} averages each gradient over its dp x cp ranks, and this run "
                              f"has one replica of each (dp {layout.dp} x cp {layout.cp}); leave it out, or "
                              "give dp >= 2")


def traces_its_collectives(strategy: str) -> bool:
    """Whether paralab's recorder sees a strategy's collectives: not a torch reference's, which runs them
    inside DDP's hooks, FSDP2, DTensor or the pipelining schedule."""
    return not get_strategy(strategy).reference_for


def bucket_cap_applies(strategy: str, layout) -> bool:
    """Whether a run's ``bucket_mb`` changes what it does: a strategy that reduces in buckets, on more
    than one replica of each gradient (dp x cp >= 2; paralab's bucketed reduction keeps none for one,
    ``ddp.bucketed_sync``), or ZeRO-2, which cuts its units by the cap on one replica too; torch's own
    (a reference) keeps its buckets whatever the layout. ZeRO-1 reduces the whole model as one unit
    (``zero.unit_groups``): hybrid's ``--zero 1`` had taken a cap and reported it, changing nothing."""
    s = get_strategy(strategy)
    if "bucket_mb" not in s.options or layout.zero == 1:
        return False
    return bool(s.reference_for) or layout.dp * layout.cp > 1 or layout.zero == 2


@dataclass(frozen=True)
class Strategy:
    """One ``--strategy``. ``axes``: the mesh axes its ranks spread over (a single axis takes the whole
    world; none means one rank). ``options``: the OPTION_DEFAULTS it honours (its axes always).
    ``check(cfg, layout)``: its own refusals, after the layout is resolved. ``schedule``: the only
    schedule it runs (mp: naive); ``schedules``: those it can run (empty: every one). ``zero``: the
    ZeRO stage it is. ``title``: its name in the docs, in English and, once, in Chinese.
    ``reference_for``: the paralab strategy this torch implementation is the reference of."""

    name: str
    summary: str
    axes: tuple[str, ...]
    train: Callable
    options: tuple[str, ...] = ()
    check: Callable | None = None
    schedule: str = ""
    schedules: tuple[str, ...] = ()
    zero: int = 0
    title: str = ""
    reference_for: str = ""

    def __post_init__(self):
        object.__setattr__(self, "options", tuple(dict.fromkeys(self.axes + self.options)))


@dataclass
class _Registry:
    """Modules are imported in MODULES order, and only as far as a lookup needs: paralab's own
    strategies come first, so a rank that runs one never imports torch's references (pipelining,
    DTensor and FSDP2 bring sympy and the compiler's modules: about 80 MB more in every process that
    starts afresh, as torchrun's workers do)."""

    entries: dict[str, Strategy] = field(default_factory=dict)
    loaded: int = 0  # how many of MODULES are imported

    def load(self, until: str | None = None) -> dict[str, Strategy]:
        """Import modules until ``until`` is declared (all of them when it is None or unknown)."""
        while self.loaded < len(MODULES) and (until is None or until not in self.entries):
            for entry in importlib.import_module(f"paralab.strategies.{MODULES[self.loaded]}").STRATEGIES:
                self.entries[entry.name] = entry
            self.loaded += 1
        return self.entries


_REGISTRY = _Registry()


def strategies() -> dict[str, Strategy]:
    """Every strategy, by name, in the docs table's order."""
    return dict(_REGISTRY.load())


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``, or ConfigError listing the names there are."""
    entries = _REGISTRY.load(until=name)
    if name not in entries:
        ours = [n for n, s in entries.items() if not s.reference_for]
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(ours)} (or torch's own: "
                          f"{', '.join(n for n, s in entries.items() if s.reference_for)})")
    return entries[name]


def strategy_table() -> str:
    """The strategies as a Markdown table (README's and ``paralab strategies``)."""
    rows = ["| strategy | `--strategy` | mesh axes | what runs | torch reference |", "|---|---|---|---|---|"]
    entries = _REGISTRY.load()
    for s in entries.values():
        if s.reference_for:
            continue
        title = s.title or s.name
        refs = ", ".join(f"`{r.name}`" for r in entries.values() if r.reference_for == s.name) or "—"
        rows.append(f"| {title} | `{s.name}` | {' x '.join(s.axes) or '—'} | {s.summary} | {refs} |")
    return "\n".join(rows)
