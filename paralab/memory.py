"""Per-rank memory, accounted by kind from the tensors a rank actually holds.

Why not the process RSS: on CPU it mixes the allocator, Python and torch's own caches, and it cannot
say which bytes are parameters and which are activations. The ZeRO and sequence-parallel lessons are
about exactly that split, so paralab counts it:

- parameters, gradients and optimizer states: the bytes of the tensors the strategy holds;
- activations: the bytes autograd saves for backward (via saved-tensor hooks), excluding parameters,
  added when a microbatch's forward saves them and removed as autograd frees them in its backward.

The peak is sampled after every forward and every backward, where the high-water marks lie, and
after each recomputation of a checkpointed region, whose rematerialised activations it counts too.
On CUDA ``torch.cuda.max_memory_allocated`` is reported beside it as the allocator's view, from the end
of set-up (the strategy's ``watch`` or ``count_held``) on.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from functools import partial

import torch

KINDS = ("params", "grads", "optimizer", "activations")


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank holds: a DTensor's local shard, else the tensor itself."""
    return getattr(t, "_local_tensor", t)


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    return sum(local(t).numel() * local(t).element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    if optimizer is None:
        return 0
    return sum(
        tensor_bytes(v for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
        for state in optimizer.state.values()
    )


class MemoryMeter:
    """One rank's memory by kind, its peak, and (with a recorder) ``memory.*`` counters in the trace.

    Model states come from what the strategy says it holds: by default the parameters given to
    :meth:`watch` and their gradients; a strategy that manages its own flat buffers (ZeRO) hands
    :meth:`count_held` a function listing every tensor it keeps, and those are counted by distinct
    storage (a view and the buffer it aliases once, a freed buffer not at all). Transient buffers,
    such as DDP's flat buckets while their all-reduce is in flight, are announced with :meth:`hold`.
    """

    def __init__(self, device: torch.device, recorder=None):
        self.device = device
        self.recorder = recorder
        self.params: list[torch.Tensor] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self._param_ptrs: set[int] = set()
        self._held = None
        self._extra = {"params": 0, "grads": 0, "optimizer": 0}
        self._live: dict = {}  # activations by key (microbatch), in bytes
        self._holders: dict[int, list] = {}  # storage (_storage) -> [key, bytes, holders autograd keeps]
        # weak references to those holders, whose ends take the bytes off, by identity (a reference to a
        # live tensor compares as the tensor does)
        self._refs: dict[int, weakref.ref] = {}
        self._fixed: set = set()  # keys whose bytes shrink() set: what they hold is no longer tracked
        self._rematerialised: set = set()  # keys of recomputations, dropped once all they counted is freed
        self._rerunning: set = set()  # keys of recomputations still running (kept even while empty)
        self.peak_total = 0
        self.peak_by_kind = dict.fromkeys(KINDS, 0)  # the breakdown at the moment of the total's peak
        self.max_by_kind = dict.fromkeys(KINDS, 0)  # each kind's own high-water mark

    def watch(self, params: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer | None = None) -> None:
        """The tensors whose bytes count as this rank's model states, and the optimizer whose states do."""
        self.params = list(params)
        self.optimizer = optimizer
        self._param_ptrs = {local(p).untyped_storage().data_ptr() for p in self.params}
        self._allocator_peak_from_here()

    def count_held(self, held: Callable[[], dict]) -> None:
        """Count model states from ``held()`` = {"params": [...], "grads": [...]}, every tensor alive on
        the rank, by distinct storage."""
        self._held = held
        self._allocator_peak_from_here()

    def _allocator_peak_from_here(self) -> None:
        """The CUDA allocator's peak counted from the end of set-up, where the strategy hands over what
        it keeps: a model built whole and then sharded (ZeRO-3) had peaked at the whole model's bytes
        before training began, and read as a training peak."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def hold(self, kind: str, nbytes: int) -> None:
        """``nbytes`` more (or, negative, fewer) bytes of ``kind`` held outside the watched tensors."""
        self._extra[kind] += nbytes

    def model_states(self) -> dict[str, int]:
        if self._held is not None:
            held = self._held()
            params = _storages(held["params"])
            grads = {k: v for k, v in _storages(held["grads"]).items() if k not in params}
            states = {"params": sum(params.values()), "grads": sum(grads.values())}
        else:
            states = {"params": tensor_bytes(self.params), "grads": tensor_bytes(p.grad for p in self.params)}
        states["optimizer"] = optimizer_state_bytes(self.optimizer)
        return {kind: n + self._extra[kind] for kind, n in states.items()}

    def param_storages(self) -> set[int]:
        """Storage addresses of the parameters: a saved parameter is not an activation. Asked at every
        save, since a strategy may gather parameters inside the forward (ZeRO-3)."""
        if self._held is not None:
            return set(_storages(self._held()["params"]))
        return self._param_ptrs

    @contextmanager
    def saving(self, key):
        """Count what autograd saves for backward inside this block as activations of ``key``, for as
        long as autograd holds it: each saved tensor travels in a holder whose end (autograd frees a
        node's saved tensors once the node has run) takes its bytes off."""

        def pack(t: torch.Tensor):
            storage = self._storage(t)
            if storage is None:  # a parameter's
                return t
            entry = self._holders.setdefault(storage._cdata, [key, storage.nbytes(), 0])
            if entry[0] != key:  # another key's
                return t
            if entry[2] == 0:
                self._live[key] += entry[1]
            entry[2] += 1
            holder = _Saved(t)
            self._watch(holder, storage)
            return holder

        def unpack(saved):
            return saved.tensor if isinstance(saved, _Saved) else saved

        self._live.setdefault(key, 0)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        self.sample()

    @contextmanager
    def recomputing(self):
        """Count what a checkpointed region saves when it runs again inside backward, for as long as it
        lives.

        Its first run kept only its inputs (checkpoint's own saved-tensor hooks, innermost there, keep
        nothing else); its second run rematerialises the region's activations for the backward that
        follows. Checkpoint keeps each such tensor until the backward node that saved it takes it, and
        frees it once that node has run; these hooks count each one (not the inputs, counted already),
        hand it on, and take its bytes off when it goes. The sample is taken at the end of the run (or
        where checkpoint stops it early, once it has every tensor it needs). Two kinds go uncounted
        after that sample: the tensor checkpoint stops at, which it keeps out of these hooks' sight,
        and a tensor that needs no gradient, which checkpoint keeps as it is, not as a copy of its own,
        so its end says nothing of the backward (a mask cached across steps would never end)."""
        top = _innermost_saved_tensor_hooks()
        if top is None:  # not inside a recomputation (or a torch that does not say): nothing counted
            yield
            return
        keep, unpack = top
        key, made = object(), []  # made: the storages this rerun counted first
        self._live[key] = 0
        self._rematerialised.add(key)
        self._rerunning.add(key)

        def pack(t: torch.Tensor):
            storage = self._storage(t)
            entry = None if storage is None else self._holders.get(storage._cdata)
            if storage is not None and entry is None:  # not an input the forward kept
                entry = self._holders[storage._cdata] = [key, storage.nbytes(), 0]
                self._live[key] += entry[1]
                made.append(storage._cdata)
            kept = keep(t)  # after counting: checkpoint stops the run early right after its last tensor
            if entry is not None and entry[0] is key and t.requires_grad:  # kept is checkpoint's own copy
                entry[2] += 1
                self._watch(kept, storage)
            return kept

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                yield
        finally:
            self.sample()
            self._rerunning.discard(key)
            for storage in made:  # those no holder watches go now
                if storage in self._holders and not self._holders[storage][2]:
                    self._live[key] -= self._holders.pop(storage)[1]
            self._forget_if_empty(key)

    def _storage(self, t: torch.Tensor) -> torch.UntypedStorage | None:
        """``t``'s storage, or None for a parameter's or a tensor without one. Storages are told apart
        by their identity (``_cdata``), not their address: a storage resized to nothing (FSDP2 frees the
        weights it gathered so) gives its address back to the allocator while autograd holds it."""
        try:
            storage = local(t).untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass with no storage of its own
            return None
        return None if storage.data_ptr() in self.param_storages() else storage

    def _watch(self, holder, storage: torch.UntypedStorage) -> None:
        """Take ``storage``'s share off when ``holder`` (what autograd or checkpoint keeps) is gone."""
        ref = weakref.ref(holder, partial(self._dropped, storage._cdata))
        self._refs[id(ref)] = ref

    def _dropped(self, storage: int, ref) -> None:
        """A holder autograd kept is gone; the storage's bytes go once its last holder has."""
        self._refs.pop(id(ref), None)
        entry = self._holders.get(storage)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] == 0:
            key, nbytes, _ = self._holders.pop(storage)
            if key in self._live and key not in self._fixed:
                self._live[key] -= nbytes
                self._forget_if_empty(key)

    def _forget_if_empty(self, key) -> None:
        """A recomputation whose tensors are all gone leaves no key behind (one per block a step), once
        it has ended: a tensor it made can die while it runs."""
        if key in self._rematerialised and key not in self._rerunning and not self._live[key]:
            self._rematerialised.discard(key)
            del self._live[key]

    def shrink(self, key, nbytes: int) -> None:
        """Part of ``key``'s activations is gone: what it still holds is ``nbytes`` (a zero-bubble
        Bi frees the graph and keeps only what W needs, partly outside autograd's saved tensors)."""
        self.sample()
        self._live[key] = nbytes
        self._fixed.add(key)

    def release(self, key) -> None:
        """The backward of ``key`` has run: its saved activations are gone. A holder that outlives it (a
        retained graph) no longer counts, nor takes bytes off a later step's key of the same name."""
        self.sample()
        self._live.pop(key, None)
        self._fixed.discard(key)
        for storage in [s for s, (owner, _, _) in self._holders.items() if owner == key]:
            del self._holders[storage]

    def activations(self) -> int:
        """Activation bytes held now."""
        return sum(self._live.values())

    def sample(self) -> None:
        now = {**self.model_states(), "activations": self.activations()}
        total = sum(now.values())
        if total > self.peak_total:
            self.peak_total, self.peak_by_kind = total, now
        self.max_by_kind = {kind: max(self.max_by_kind[kind], now[kind]) for kind in KINDS}
        if self.recorder is not None and self.recorder.enabled:
            for kind, value in now.items():
                self.recorder.counter(f"memory.{kind}", value)

    def report(self) -> dict:
        out = {"peak_bytes": self.peak_total, "peak_by_kind": dict(self.peak_by_kind),
               "max_by_kind": dict(self.max_by_kind), "final": self.model_states()}
        if self.device.type == "cuda":
            out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out


def _innermost_saved_tensor_hooks():
    """The (pack, unpack) hooks autograd applies now, or None: torch's private accessor, absent from
    some of the torch 2 releases paralab supports."""
    try:
        return torch._C._autograd._top_saved_tensors_default_hooks(False)
    except (AttributeError, TypeError):
        return None


class _Saved:
    """A tensor autograd saved, in a holder of its own so that the holder's end says autograd let go."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _storages(tensors) -> dict[int, int]:
    """Address -> bytes of each distinct, allocated storage behind ``tensors``."""
    out = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.nbytes():
            out[storage.data_ptr()] = storage.nbytes()
    return out
