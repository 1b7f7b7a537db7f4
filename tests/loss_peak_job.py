"""What torch's cross-entropy holds at its peak, per logit: the simulator's ``loss_bytes_per_logit``.

    python tests/loss_peak_job.py   # prints {"torch": bytes per logit, "loss_parallel": ...}

The loss's transients never reach autograd's saved tensors, where paralab's memory meter looks, so
this counts every CPU storage an op creates, from its birth to the moment it is freed, and takes the
high-water mark over a training step's loss as torchtitan runs it: 16-bit logits upcast to fp32, the
logits dropped before backward. Loss parallel runs on a one-rank mesh: its all-reduces span the
vocabulary shards, but what one rank holds per local logit does not depend on how many there are. A
process of its own, since it starts a process group.
"""

import gc
import json
import weakref
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss as torch_loss_parallel
from torch.distributed.tensor.parallel import loss_parallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

TOKENS, VOCAB, HIDDEN = 2048, 4000, 64
LOSS_PARALLEL_HANDLERS = ("_log_softmax", "_nll_loss_and_log_softmax_backward")


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under it that are still alive, and their high-water mark."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.counted: set[int] = set()

    def count(self, tensor) -> None:
        tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor's own shard
        if type(tensor) is not torch.Tensor:
            return
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.counted:
            return
        self.counted.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.freed, key, size)

    def freed(self, key: int, size: int) -> None:
        self.live -= size
        self.counted.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self.count(tensor)
        return out

    @contextmanager
    def inside(self, module, names: tuple[str, ...]):
        """``module``'s functions ``names`` counted too: DTensor's loss handlers compute on local
        shards below the dispatch level a mode sees, so each enters the counter again."""
        originals = {name: getattr(module, name) for name in names}

        def counted(fn):
            def run(*args, **kwargs):
                with self:
                    return fn(*args, **kwargs)
            return run

        for name, fn in originals.items():
            setattr(module, name, counted(fn))
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(module, name, fn)


def peak_per_logit(vocab_parallel: bool) -> float:
    """The high-water mark of what the logits and the loss hold, forward and backward, per logit."""
    torch.manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, VOCAB, (TOKENS,))
    meter = LiveBytes()
    with meter, meter.inside(torch_loss_parallel, LOSS_PARALLEL_HANDLERS):
        logits = hidden @ weight.t()
        if vocab_parallel:
            logits = DTensor.from_local(logits, init_device_mesh("cpu", (1,)), [Shard(1)])
        with loss_parallel() if vocab_parallel else nullcontext():
            loss = F.cross_entropy(logits.float(), targets)
            del logits  # as torchtitan's step does before backward
            loss.backward()
    return meter.peak / (TOKENS * VOCAB)  # the weight's gradient adds 0.06


def main() -> None:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    print(json.dumps({"torch": peak_per_logit(vocab_parallel=False),
                      "loss_parallel": peak_per_logit(vocab_parallel=True)}))
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
