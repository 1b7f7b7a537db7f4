"""torch's own DistributedDataParallel, run through paralab's loop: the reference that tests compare
paralab's ddp gradients with, and that benchmarks time paralab's ddp against.

Its all-reduces happen inside torch (C++), so they do not appear in paralab's trace; the step spans
and compute spans do.
"""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from paralab.strategies.common import GradSync, full_model, train_model
from paralab.strategies.registry import Strategy


class _Wrapped(DistributedDataParallel):
    """Keep the unwrapped parameter names (no ``module.`` prefix) so states compare by name."""

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)


def train(ctx):
    model = full_model(ctx)
    ddp = _Wrapped(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=ctx.cfg.bucket_mb,
    )
    return train_model(ctx, ddp, GradSync())


STRATEGIES = [Strategy("torch_ddp", "torch's DistributedDataParallel", axes=("dp",), options=("bucket_mb",),
                       train=train, reference_for="ddp")]
