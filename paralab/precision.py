"""Mixed precision as practitioners train: low-precision compute, fp32 master weights and optimizer
states, gradients reduced in a chosen dtype, and dynamic loss scaling for fp16.

With ``dtype="bf16"`` (or fp16) every strategy keeps its parameters, and so its activations, in
that dtype: the forward and backward run in 16 bits, with half the bytes to hold and to send. The
optimizer does not: :class:`MasterWeights` keeps an fp32 copy of every parameter (of every shard,
under ZeRO), hands the fp32 gradients to Adam or SGD, and copies the updated masters back into the
16-bit parameters. So a parameter costs 2 + 2 + 12 bytes (16-bit weight and gradient; fp32 master,
momentum and variance), the mixed-precision accounting of the ZeRO paper. ``torch_fsdp`` is the
exception: FSDP2 keeps its shards in fp32 and casts them as it gathers, so they are their own master
weights (4 + 4 + 8 bytes).

Gradients are reduced across ranks in ``reduce_dtype`` (fp32 by default, as FSDP2's
MixedPrecisionPolicy): a reducer casts its flat buffer up before the collective and back after, and
ZeRO accumulates and reduce-scatters in an fp32 buffer that becomes the masters' gradient directly
(``main_grad``, as Megatron names it), or, under an fp16 loss scale, a copy divided by the scale.

fp16's narrow range needs loss scaling (Micikevicius et al. 2018): the loss is multiplied by a
scale before backward, the gradients divided by it before the update; when any gradient overflows
(inf or nan, on any rank: they agree by an all-reduce) the step is skipped and the scale halved,
and after ``GROWTH_INTERVAL`` good steps it doubles. bf16 has fp32's range and needs none. Where
ranks split a step's samples or tokens, each token's gradient in backward is that many times one
device's (each rank's loss is a mean over its share, as in Megatron-LM), so near the overflow point a
data-parallel run can skip a step one device takes: docs/architecture.md says why it is left so.
"""

from __future__ import annotations

import torch

from paralab import comm
from paralab.config import FP16_LOSS_SCALE, LOSS_SCALED_DTYPES, ConfigError
from paralab.trace import EVENT

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GROWTH_INTERVAL = 200  # good steps before the fp16 loss scale doubles


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def check_dtype(name: str, device: str) -> None:
    """ConfigError, before any process starts, when this torch cannot train in ``name`` on ``device``."""
    if not dtype_supported(name, device):
        raise ConfigError(f"dtype={name!r} does not train on {device} with this torch "
                          f"({torch.__version__}); use dtype='fp32'"
                          + (" or 'fp16'" if device == "cuda" else ""))


def dtype_supported(name: str, device: str) -> bool:
    """Whether a linear layer trains in ``name`` on ``device`` ('cpu' or 'cuda') with this torch."""
    if name == "fp32":
        return True
    if device == "cuda":
        return torch.cuda.is_available() and (name == "fp16" or torch.cuda.is_bf16_supported())
    try:
        x = torch.ones(2, 2, dtype=TORCH_DTYPES[name], requires_grad=True)
        torch.nn.functional.linear(x, x).sum().backward()
        return True
    except RuntimeError:
        return False


class LossScaler:
    """The fp16 loss scale (1 and inert for fp32 and bf16). ``scale(loss)`` before backward;
    :class:`MasterWeights` unscales, detects overflow and calls :meth:`update`."""

    def __init__(self, dtype: str, initial: float = FP16_LOSS_SCALE):
        self.dynamic = dtype in LOSS_SCALED_DTYPES
        self.value = initial if self.dynamic else 1.0
        self.good_steps = 0
        self.skipped: list[int] = []  # steps whose update an overflow skipped

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.value if self.dynamic else loss

    def update(self, overflow: bool, step: int) -> None:
        if overflow:
            self.skipped.append(step)
            self.value, self.good_steps = self.value / 2, 0
            return
        self.good_steps += 1
        if self.good_steps == GROWTH_INTERVAL:
            self.value, self.good_steps = self.value * 2, 0


class MasterWeights:
    """An optimizer over fp32 master copies of low-precision parameters (see the module docstring).

    ``params`` are what the model computes with; ``make_optimizer(masters)`` builds the inner fp32
    optimizer. A parameter's gradient is read from ``param.main_grad`` when a reducer keeps one in
    fp32 (ZeRO), else from ``param.grad``. ``state`` lists the masters and the inner optimizer's
    states together, so memory meters count them as optimizer bytes (12 per parameter with Adam)."""

    def __init__(self, params, make_optimizer, scaler: LossScaler, recorder=None):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().float().clone().requires_grad_() for p in self.params]
        self.inner = make_optimizer(self.masters)
        self.scaler, self.recorder = scaler, recorder
        self.steps = 0

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self) -> dict:
        return {m: {"master": m, **self.inner.state.get(m, {})} for m in self.masters}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        scale = self.scaler.value
        for p, m in zip(self.params, self.masters):
            grad = getattr(p, "main_grad", None)
            grad = p.grad if grad is None else grad
            # a new tensor when unscaling: ZeRO's fp32 main_grad is left as backward made it, loss-scaled
            # like a 16-bit .grad (dividing it in place had made the two read differently afterwards)
            m.grad = None if grad is None else grad.float() / scale if scale != 1 else grad.float()
        if self.scaler.dynamic and self._overflowed():
            self.scaler.update(True, self.steps)
            if self.recorder is not None:  # a mark on the event lane, where the timeline shows it
                with self.recorder.span("overflow", lane=EVENT,
                                        name=f"fp16 overflow: step skipped, loss scale "
                                             f"{scale:g} -> {self.scaler.value:g}"):
                    pass
        else:
            self.inner.step()
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
            self.scaler.update(False, self.steps)
        for m in self.masters:  # read only by this step: an unscaled copy is not held until the next
            m.grad = None
        self.steps += 1

    def _overflowed(self) -> bool:
        """Any non-finite gradient on any rank (each rank holds only its part of the model). Checked on
        the device, all the gradients at once, and read once: a read a gradient had waited for the
        device once per parameter tensor on a GPU."""
        # a DTensor's (torch's tensor parallel) own shard: every rank checks its own, and the MAX over
        # the ranks below covers them all
        grads = [m.grad for m in self.masters if m.grad is not None]
        finite = [torch.isfinite(g.to_local() if hasattr(g, "to_local") else g).all() for g in grads]
        device = self.masters[0].device if self.masters else "cpu"
        flag = (torch.stack(finite).all().logical_not() if finite else torch.tensor(False, device=device))
        flag = flag.to(torch.float32).reshape(1)
        comm.all_reduce(flag, op=comm.ReduceOp.MAX, name="overflow check")
        return bool(flag.item())
