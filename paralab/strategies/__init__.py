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
    # torch's own implementations, the references that tests and benchmarks compare against
    "torch_ddp": "paralab.strategies.reference",
}


def strategy_module(name: str):
    try:
        return importlib.import_module(MODULES[name])
    except KeyError:
        raise KeyError(f"strategy {name!r} is not implemented yet; available: {sorted(MODULES)}") from None
