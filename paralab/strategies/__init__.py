"""One readable file per strategy. Each module has ``train(ctx) -> dict`` (runs on every rank) and may
have ``validate(cfg)`` (runs before any process starts and raises ConfigError).

Modules are imported by name only when a run needs them, so ``import paralab`` stays light.
"""

from __future__ import annotations

import importlib

MODULES = {
    "single": "paralab.strategies.single",
    "dp": "paralab.strategies.dp",
    "ddp": "paralab.strategies.ddp",
    "mp": "paralab.strategies.pipeline",
    "pp": "paralab.strategies.pipeline",
    "tp": "paralab.strategies.tensor",
    "zero1": "paralab.strategies.zero",
    "zero2": "paralab.strategies.zero",
    "zero3": "paralab.strategies.zero",
    "hybrid": "paralab.strategies.hybrid",
    # torch's own implementations, the references that tests and benchmarks compare against
    "torch_ddp": "paralab.strategies.reference_ddp",
    "torch_pp": "paralab.strategies.reference_pipeline",
    "torch_tp": "paralab.strategies.reference_tensor",
    "torch_fsdp": "paralab.strategies.reference_fsdp",
    "torch_hybrid": "paralab.strategies.reference_hybrid",
}


def strategy_module(name: str):
    """The module of strategy ``name``; ConfigError if the name is unknown or not built yet."""
    from paralab.config import ConfigError

    if name not in MODULES:
        raise ConfigError(f"unknown strategy {name!r}; available: {', '.join(sorted(MODULES))}")
    try:
        return importlib.import_module(MODULES[name])
    except ModuleNotFoundError as exc:
        if exc.name != MODULES[name]:
            raise
        raise ConfigError(f"strategy {name!r} is not implemented in this version of paralab") from None
