"""The bookkeeping under ZeRO (zero.py): flat parameter units and each rank's shard of them.

A *unit* is a group of parameters that is communicated as one flat fp32 buffer: the whole model for
stage 1, a gradient bucket for stage 2, one part of the model (embed, a block, the head) for stage 3.
Each unit is padded with zeros to a multiple of Nd elements, so rank i owns the i-th contiguous
slice of every unit: a reduce-scatter of the unit's gradient hands each rank exactly its slice, and
an all-gather of the slices rebuilds the unit. With one unit (stage 1) this is the plain picture of
one flat buffer cut into Nd shards.

The module's parameters become views into the unit's flat buffer, so the model code (GPT) runs
unchanged, and each rank's shard is an ``nn.Parameter`` that the optimizer updates element by element
exactly as single-device training would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from paralab.comm import all_gather_into_tensor


@dataclass
class Unit:
    """Parameters gathered and reduced together. ``full`` is the unit's flat buffer (padded to a
    multiple of Nd); ``shard`` this rank's slice of it, the tensor the optimizer owns."""

    name: str
    names: list[str]
    params: list[nn.Parameter] = field(default_factory=list)
    numel: int = 0
    padded: int = 0
    full: torch.Tensor | None = None
    shard: nn.Parameter | None = None

    @property
    def nbytes(self) -> int:
        return self.padded * self.full.element_size()


def _replace_parameter(model: nn.Module, name: str, value: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, leaf, value)


class ShardedModel:
    """The model's parameters laid out as flat units and sharded over ``world`` data-parallel ranks.

    ``resident_full``: stages 1 and 2 keep every unit's full buffer (one flat buffer for the model)
    and the rank's shard is a view into it; stage 3 keeps only the shards (one flat buffer of this
    rank's slices) and each unit's full buffer has its storage freed until it is gathered for use.
    """

    def __init__(self, model: nn.Module, groups: list[tuple[str, list[str]]], rank: int, world: int,
                 resident_full: bool, group=None):
        self.rank, self.group = rank, group
        named = dict(model.named_parameters())
        self.units = [Unit(name, names, [named[n] for n in names]) for name, names in groups]
        for u in self.units:
            u.numel = sum(p.numel() for p in u.params)
            u.padded = -(-u.numel // world) * world
        first = next(model.parameters())
        device, dtype = first.device, first.dtype
        shard_total = sum(u.padded // world for u in self.units)
        # stages 1-2: the whole model, padded; stage 3: only this rank's slices of every unit
        self.flat = torch.zeros(sum(u.padded for u in self.units) if resident_full else shard_total,
                                device=device, dtype=dtype)
        offset = shard_offset = 0
        for u in self.units:
            s = u.padded // world
            if resident_full:
                u.full = self.flat[offset : offset + u.padded]
                shard_view = u.full[rank * s : (rank + 1) * s]
            else:
                u.full = torch.zeros(u.padded, device=device, dtype=dtype)
                shard_view = self.flat[shard_offset : shard_offset + s]
            self._adopt(model, u)
            if not resident_full:
                shard_view.copy_(u.full[rank * s : (rank + 1) * s])
                self.free(u)
            u.shard = nn.Parameter(shard_view)
            offset += u.padded
            shard_offset += s

    @staticmethod
    @torch.no_grad()
    def _adopt(model: nn.Module, u: Unit) -> None:
        """Copy the unit's parameters into its flat buffer and make the module's parameters views of it
        (keeping the attributes other layers tag them with, such as tensor parallel's ``tp_split``)."""
        offset, views = 0, []
        for name, p in zip(u.names, u.params):
            view = u.full[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            new = nn.Parameter(view, requires_grad=p.requires_grad)
            new.__dict__.update(p.__dict__)
            _replace_parameter(model, name, new)
            views.append(new)
            offset += p.numel()
        u.params = views

    # ------------------------------------------------------------------ stage 3: gather / free
    @staticmethod
    def free(u: Unit) -> None:
        """Release the unit's full buffer (the module's parameter views keep pointing at its storage,
        which is refilled by the next gather)."""
        u.full.untyped_storage().resize_(0)

    @staticmethod
    def allocate(u: Unit) -> None:
        u.full.untyped_storage().resize_(u.nbytes)

    # ------------------------------------------------------------------ whole-model views (untraced)
    def full_state(self) -> dict | None:
        """Every parameter and its averaged gradient under the model's global names, gathered with plain
        torch.distributed outside the traced steps; shard rank 0 gets them, the other ranks None."""
        params, grads = {}, {}
        for u in self.units:
            shard_grad = getattr(u.shard, "main_grad", None)  # wider than the 16-bit shard (precision.py)
            shard_grad = u.shard.grad if shard_grad is None else shard_grad
            shard_grad = torch.zeros_like(u.shard) if shard_grad is None else shard_grad
            for out, piece in ((params, u.shard.detach()), (grads, shard_grad)):
                full = torch.empty(u.padded, device=piece.device, dtype=piece.dtype)
                all_gather_into_tensor(full, piece.contiguous(), group=self.group)  # untraced
                offset = 0
                for name, p in zip(u.names, u.params):
                    out[name] = full[offset : offset + p.numel()].view(p.shape).cpu().clone()
                    offset += p.numel()
        return {"params": params, "grads": grads} if self.rank == 0 else None
