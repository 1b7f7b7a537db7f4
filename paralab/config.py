"""One validated description of a run.

Every face of paralab (``paralab.run`` in Python, ``paralab run`` in the shell, ``torchrun -m paralab
run`` on a cluster) builds a :class:`RunConfig` and calls :meth:`RunConfig.validate` before any
process starts, so a configuration that cannot work is refused with a message that says which numbers
conflict and what would fit. Strategy-specific checks live with each strategy (``validate`` in its
module) and are called from here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A configuration that cannot work. Raised before any process starts (CLI exit code 2)."""


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

    def __post_init__(self):
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def validate(self) -> None:
        for name in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            divisors = [h for h in range(1, self.hidden + 1) if self.hidden % h == 0 and h <= 64]
            raise ConfigError(
                f"model hidden size {self.hidden} is not divisible by heads {self.heads}; "
                f"head counts that fit: {divisors}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    def param_count(self) -> int:
        """Exact number of parameters of paralab.models.gpt.GPT (untied embeddings, biases, LayerNorms)."""
        h, f, v, s, layer_count = self.hidden, self.ffn, self.vocab, self.seq_len, self.layers
        per_block = (
            2 * 2 * h  # two LayerNorms (weight + bias)
            + 3 * h * h + 3 * h  # fused QKV
            + h * h + h  # attention output projection
            + h * f + f  # MLP up
            + f * h + h  # MLP down
        )
        return v * h + s * h + layer_count * per_block + 2 * h + h * v + v


MODEL_PRESETS: dict[str, ModelConfig] = {
    # CPU tests, Binder and laptops: 4 layers and 4 heads, so it splits 2 and 4 ways.
    "tiny": ModelConfig(layers=4, hidden=64, heads=4, vocab=128, seq_len=32),
    # A workstation CPU or one GPU: big enough for compute to dominate per-call overheads.
    "small": ModelConfig(layers=8, hidden=256, heads=8, vocab=512, seq_len=128),
    # GPUs: communication and compute both matter.
    "medium": ModelConfig(layers=16, hidden=1024, heads=16, vocab=8192, seq_len=512),
}

STRATEGIES = ("single", "dp", "ddp", "mp", "pp", "tp", "zero1", "zero2", "zero3", "hybrid")
REFERENCE_STRATEGIES = ("torch_ddp", "torch_pp", "torch_tp", "torch_fsdp", "torch_hybrid")  # torch's own, for tests and benchmarks
NON_DATA_PARALLEL = ("single", "mp", "pp", "tp", "torch_pp", "torch_tp")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class RunConfig:
    """Everything a run needs. Plain data: it travels to every rank as a dict."""

    strategy: str = "ddp"
    world_size: int = 1
    steps: int = 5
    model: ModelConfig = field(default_factory=lambda: MODEL_PRESETS["tiny"])
    model_name: str = "tiny"
    global_batch: int = 8
    seed: int = 0
    device: str = "auto"
    lr: float = 3e-3
    optimizer: str = "adam"
    # data parallel
    bucket_mb: float = 25.0  # DDP bucket cap, torch's default
    hierarchical: bool = False  # ddp: reduce-scatter in the node, all-reduce across nodes, all-gather
    nodes: int = 1  # local launches: ranks split into this many emulated nodes (torchrun: real nodes)
    # pipeline / tensor / hybrid degrees (later strategies fill these in)
    dp: int = 0
    tp: int = 1
    pp: int = 1
    schedule: str = ""
    microbatches: int = 1
    virtual_stages: int = 1
    sequence_parallel: bool = False
    stage_layers: list[int] | None = None
    zero: int = 0  # hybrid: ZeRO stage over the dp dimension (0: ddp-style all-reduce)
    # run control
    trace: bool = True
    timeout_s: float = 300.0  # a collective hung longer than this ends the run with an error
    threads_per_rank: int = 0  # 0: share the cores fairly
    fault: dict | None = None  # test hook: {"rank": r, "step": k} makes that rank raise
    collect_state: bool = False  # return final parameters and gradients (parity tests)
    profile_dir: str | None = None  # each rank writes a torch.profiler trace here (paralab.profiling)

    # ------------------------------------------------------------------ helpers
    @classmethod
    def build(cls, model: str | ModelConfig | dict = "tiny", **kwargs) -> RunConfig:
        """Make a config from a preset name (or a ModelConfig / dict of its fields) and options."""
        if isinstance(model, str):
            if model not in MODEL_PRESETS:
                raise ConfigError(f"unknown model preset {model!r}; choose one of {sorted(MODEL_PRESETS)}")
            model_cfg, name = MODEL_PRESETS[model], model
        elif isinstance(model, dict):
            model_cfg, name = ModelConfig(**model), "custom"
        else:
            model_cfg, name = model, "custom"
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown run option(s): {sorted(unknown)}")
        return cls(model=model_cfg, model_name=name, **kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        data = dict(data)
        data["model"] = ModelConfig(**data["model"])
        return cls(**data)

    @property
    def data_parallel_size(self) -> int:
        """How many ranks take different slices of each global batch."""
        if self.strategy in NON_DATA_PARALLEL:
            return 1
        if self.strategy in ("hybrid", "torch_hybrid"):
            return self.dp
        return self.world_size

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if cuda_device_count() >= self.world_size else "cpu"

    # ------------------------------------------------------------------ checks
    def validate(self) -> RunConfig:
        if self.strategy not in STRATEGIES + REFERENCE_STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ConfigError(f"world size must be an integer >= 1, got {self.world_size!r}")
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if self.global_batch < 1:
            raise ConfigError(f"global batch must be >= 1, got {self.global_batch}")
        if self.lr <= 0:
            raise ConfigError(f"learning rate must be > 0, got {self.lr}")
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.bucket_mb <= 0:
            raise ConfigError(f"bucket size must be > 0 MB, got {self.bucket_mb}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout must be > 0 s, got {self.timeout_s}")
        self.model.validate()
        check_device(self.device, self.world_size)
        if self.strategy == "single" and self.world_size != 1:
            raise ConfigError(f"strategy 'single' runs on one rank, got world size {self.world_size}")
        dp = self.data_parallel_size
        if dp >= 1 and self.global_batch % dp:
            fits = [b for b in range(dp, 4 * dp + 1, dp)]
            raise ConfigError(
                f"global batch {self.global_batch} is not divisible by the {dp} data-parallel ranks; "
                f"global batches that fit: {fits}"
            )
        if self.nodes < 1 or self.world_size % self.nodes:
            raise ConfigError(f"{self.nodes} node(s) cannot split world size {self.world_size} evenly")
        if self.hierarchical and self.strategy != "ddp":
            raise ConfigError(f"hierarchical all-reduce is a ddp option, not {self.strategy!r}")
        if self.zero and self.strategy != "hybrid":
            raise ConfigError(f"zero={self.zero} is a hybrid option; for ZeRO over all ranks use strategy "
                              f"'zero{self.zero}' instead of {self.strategy!r}")
        if self.fault is not None and not 0 <= int(self.fault.get("rank", -1)) < self.world_size:
            raise ConfigError(f"fault rank must be in [0, {self.world_size}), got {self.fault}")
        from paralab.strategies import strategy_module

        check = getattr(strategy_module(self.strategy), "validate", None)  # ConfigError if not built
        if check is not None:
            check(self)
        return self


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
