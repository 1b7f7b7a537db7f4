"""torch's operators, kernels and communication as paralab spans (the reading half of trace_import).

Compute. On a GPU trace the kernels are the compute spans (device time, as paralab times its spans
with CUDA events); on a CPU trace, the operators of the host threads. Either way a span's kind is that
of the host operator that ran or launched it (a kernel's ``External id`` names its launching operator),
decided from the outside in:

- ``optimizer``: inside ``Optimizer.step#...`` or ``Optimizer.zero_grad#...`` (torch.optim's ranges);
- ``backward``: the autograd engine's work (``autograd::engine::evaluate_function: ...``) or any op whose
  ``Fwd thread id`` names the forward thread it differentiates;
- ``forward``: ops autograd records on the forward thread (a ``Sequence number`` with ``Fwd thread id``
  0), and ranges (``DistributedDataParallel.forward``, ``nn.Module: ...``) that hold only such ops;
- ``other``: the rest (making the batch, bookkeeping); a range holding several kinds is looked into.

Consecutive operators of one kind on one thread, in one step, less than ``HOST_GAP_S`` apart make one
span: the Python between them is that kind's work too. A longer gap is the thread blocked (DDP
waiting for its all-reduces records no operator) or not running, and stays a gap. On the GPU, kernels
of one kind on one stream closer than ``DEVICE_GAP_S`` make one span; longer gaps are the GPU idling.
GPU memory copies and sets are ``memcpy`` and ``memset`` spans whose payload is the bytes they moved.

Communication. What ran is the span: an NCCL kernel, or gloo's ``gloo:<op>`` range on its worker
thread (send and recv run inline). The call that asked for it supplies what the run asked for: the
op (gloo runs a reduce-scatter as an all-reduce), tensor sizes and dtype, group and peer. NCCL kernels
carry these from ``record_param_comms`` (``Collective name``, ``In/Out msg nelems``, ``dtype``, ``Group
size``, ``Process Group Ranks``, ``Src/Dst Rank``: a rank of the group, made a rank of the world
through the group's ranks); for gloo they come from the ``c10d::<op>`` call the execution pairs with
(the call that contains it, else the earliest open call of that op), whose shapes torch records with
``record_shapes=True``. Payload is elements x dtype size (the full tensor for
all_gather and reduce_scatter, the input for all_to_all, as paralab.comm counts); wire bytes follow
paralab.comm's ring accounting for the group size, and for an all-to-all the slices its input splits
(``In split size``, or ``c10d::alltoall_base_``'s recorded ``Concrete Inputs``) send to the other ranks.
A group size the trace does not state is 0 (read: the whole world).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

from paralab.profiling import PREFIX
from paralab.trace import COMM, COMPUTE, Span
from paralab.wire import all_to_all_wire_bytes

HOST_CATS = ("cpu_op", "user_annotation")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
FORWARD, BACKWARD, OPTIMIZER, OTHER = "forward", "backward", "optimizer", "other"
_CALL, _MIXED = "communication call", "mixed"
HOST_GAP_S, DEVICE_GAP_S = 100e-6, 2e-6
EPS_S = 1e-9

# Element sizes by the names torch writes: dtype().name() in "Input type" (record_shapes), and
# c10::toString(ScalarType) in record_param_comms' "dtype".
ELEMENT_BYTES = {
    **dict.fromkeys(("signed char", "Char", "unsigned char", "Byte", "bool", "Bool", "c10::Float8_e4m3fn",
                     "Float8_e4m3fn", "c10::Float8_e5m2", "Float8_e5m2", "c10::Float8_e4m3fnuz",
                     "Float8_e4m3fnuz", "c10::Float8_e5m2fnuz", "Float8_e5m2fnuz"), 1),
    **dict.fromkeys(("c10::Half", "Half", "c10::BFloat16", "BFloat16", "short int", "Short",
                     "short unsigned int", "UInt16"), 2),
    **dict.fromkeys(("float", "Float", "int", "Int", "unsigned int", "UInt32", "c10::complex<c10::Half>",
                     "ComplexHalf"), 4),
    **dict.fromkeys(("double", "Double", "long int", "Long", "long unsigned int", "UInt64",
                     "c10::complex<float>", "ComplexFloat"), 8),
    **dict.fromkeys(("c10::complex<double>", "ComplexDouble"), 16),
}
# paralab's op names for what torch calls them (underscores dropped, lower case); first match wins.
_OPS = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
        ("broadcast", "broadcast"), ("sendrecv", "send_recv"), ("send", "send"), ("recv", "recv"),
        ("alltoall", "all_to_all"), ("barrier", "barrier"), ("reduce", "reduce"), ("gather", "gather"),
        ("scatter", "scatter"))
_EXECUTED_AS = {"reduce_scatter": "all_reduce"}  # gloo runs these calls as that op
P2P = ("send", "recv")


@dataclass(slots=True)
class Event:
    """One timed event of a profile: seconds on the file's clock, the profiler's args."""

    name: str
    cat: str
    pid: object
    tid: object
    start: float
    end: float
    args: dict
    children: list = field(default_factory=list)
    kind: str = ""


def op_name(name: str) -> str:
    """paralab's op for a torch name: ``c10d::_allgather_base_``, ``gloo:all_reduce``, ``allreduce``,
    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` -> all_gather, all_reduce, ... ('' if none)."""
    text = name.split("(")[0]
    for prefix in ("ncclDevKernel_", "ncclKernel_"):
        if text.startswith(prefix):
            text = text[len(prefix):].split("_")[0]
    text = text.split("::")[-1].split(":")[-1].replace("_", "").lower()
    return next((op for key, op in _OPS if text.startswith(key)), "")


# Calls that ask for, run or wait for communication. DTensor's functional collectives return at once,
# and the op that first uses the result waits for it inside itself (_c10d_functional::wait_tensor), the
# thread blocked until gloo or NCCL has run it.
COMM_CALL_PREFIXES = ("c10d::", "_c10d_functional::", "_c10d_functional_autograd::", "nccl:", "gloo:")


def is_comm_call(name: str) -> bool:
    return name.startswith(COMM_CALL_PREFIXES) or name == "record_param_comms"


# ---------------------------------------------------------------------------------------------- compute
def _forest(events: list[Event]) -> list[Event]:
    """Nest one thread's events by time (a child lies within its parent); returns the roots."""
    roots: list[Event] = []
    stack: list[Event] = []
    for e in sorted(events, key=lambda e: (e.start, -e.end)):
        e.children = []
        while stack and (e.start >= stack[-1].end or e.end > stack[-1].end + EPS_S):
            stack.pop()
        (stack[-1].children if stack else roots).append(e)
        stack.append(e)
    return roots


def _kind(e: Event) -> str:
    """The kind of an operator or range (module docstring); memoised on the event."""
    if not e.kind:
        fwd_thread = e.args.get("Fwd thread id")
        if e.name.startswith("Optimizer."):
            e.kind = OPTIMIZER
        elif e.name.startswith("autograd::engine::evaluate_function") or (
                isinstance(fwd_thread, int) and fwd_thread > 0):
            e.kind = BACKWARD
        elif is_comm_call(e.name):
            e.kind = _CALL
        elif "Sequence number" in e.args and fwd_thread == 0:
            e.kind = FORWARD
        else:
            kinds = {_kind(c) for c in e.children} - {OTHER}
            e.kind = OTHER if not kinds else kinds.pop() if len(kinds) == 1 and _CALL not in kinds else _MIXED
    return e.kind


def _regions(nodes: list[Event]):
    """(event, kind) for the outermost events of a single kind, looking into mixed ranges."""
    for e in nodes:
        if _kind(e) == _MIXED:
            yield from _regions(e.children)
        else:
            yield e, e.kind


def _without_calls(e: Event, kind: str, running):
    """(start, end, kind, name, 0) pieces of a single-kind region with the communication calls inside
    it cut out as calls of their own: a DDP hook's all-reduce inside the autograd engine's
    ``AccumulateGrad`` blocks the thread on the network (gloo), which is not backward compute. After a
    call, while nothing is recorded and gloo still runs a collective (``running(t0, t1)``: until when,
    :class:`_Executions`), the thread was blocked on it and that stays a gap: a synchronous all-gather
    of FSDP2's returns its c10d op once queued and then waits 55 ms inside a backward node."""
    t = e.start
    calls = _calls_within(e) if kind != _CALL else []
    starts = sorted(c.start for c in _descendants(e)) if calls else []  # once a region, not once a call
    for call in calls:
        if call.start > t:
            yield t, call.start, kind, e.name, 0
        yield call.start, call.end, _CALL, call.name, 0
        t = max(t, call.end)
        later = bisect.bisect_left(starts, t)
        resumed = starts[later] if later < len(starts) else e.end  # the first operator after the call
        blocked_until = min(resumed, running(t, resumed))
        if blocked_until - t > HOST_GAP_S + EPS_S:
            t = blocked_until
    if e.end > t:
        yield t, e.end, kind, e.name, 0


class _Executions:
    """When gloo's collectives ran on one rank (its ``gloo:<op>`` ranges, sends and recvs aside). Called
    with (t0, t1): the latest end of those begun before t1, or t0 where none runs past it (a prefix
    maximum over their starts)."""

    def __init__(self, host_events: list[Event]):
        runs = sorted((e.start, e.end) for e in host_events if _is_gloo_collective(e))
        self.starts = [start for start, _ in runs]
        self.reach = list(itertools.accumulate((end for _, end in runs), max))

    def __call__(self, t0: float, t1: float) -> float:
        i = bisect.bisect_left(self.starts, t1)
        return max(t0, self.reach[i - 1]) if i else t0


def _is_gloo_collective(e: Event) -> bool:
    """gloo's execution of a collective, on its worker thread; a send or recv runs inline on the calling
    thread, its range open from the call to its wait, around the compute done meanwhile."""
    return e.name.startswith("gloo:") and op_name(e.name) not in P2P


def _descendants(e: Event):
    for c in e.children:
        yield c
        yield from _descendants(c)


def _calls_within(e: Event) -> list[Event]:
    """The outermost communication calls among e's descendants, in time order."""
    found = []
    for c in e.children:
        found += [c] if is_comm_call(c.name) else _calls_within(c)
    return found


def _mark(e: Event, kind: str, kinds: dict) -> None:
    kinds[e.args.get("External id")] = kind
    for c in e.children:
        _mark(c, kind, kinds)


def _host_regions(host_events: list[Event]) -> dict[object, list[tuple[Event, str]]]:
    """Per host thread, its single-kind regions in time order (ProfilerStep and paralab ranges, which
    span everything, and gloo's sends and recvs, which span the compute between the call and its wait,
    left out). gloo's executions of collectives are communication calls, with the copies and sums gloo's
    worker runs inside them (they had been read as compute: 10-14 ms a step of FSDP2's)."""
    threads: dict[object, list[Event]] = defaultdict(list)
    for e in host_events:
        sends = e.name.startswith("gloo:") and not _is_gloo_collective(e)
        if not sends and not e.name.startswith(("ProfilerStep#", PREFIX)):
            threads[e.tid].append(e)
    return {tid: sorted(_regions(_forest(events)), key=lambda r: r[0].start)
            for tid, events in threads.items()}


def compute_spans(host_events: list[Event], device_events: list[Event], rank: int, steps) -> list[Span]:
    """Compute spans of one rank: kernels on a GPU trace, host operators on a CPU trace. ``steps(t)``
    gives the step at time t: runs of one kind never cross a step boundary."""
    regions = _host_regions(host_events)
    kernels = [e for e in device_events if e.cat != "gpu_user_annotation" and not _is_nccl(e)]
    if not kernels:
        running = _Executions(host_events)
        return [span for runs in regions.values() for span in _merge(
            (piece for e, kind in runs for piece in _without_calls(e, kind, running)), rank, steps,
            gap=HOST_GAP_S)]
    kinds: dict = {}
    for runs in regions.values():
        for e, kind in runs:
            _mark(e, OTHER if kind == _CALL else kind, kinds)
    by_stream: dict[tuple, list[Event]] = defaultdict(list)
    for k in kernels:
        by_stream[(k.pid, k.tid)].append(k)
    spans = []
    for stream in by_stream.values():
        items = ((k.start, k.end, _kernel_kind(k, kinds), k.name.split("(")[0], int(k.args.get("bytes") or 0))
                 for k in sorted(stream, key=lambda k: k.start))
        spans += _merge(items, rank, steps, gap=DEVICE_GAP_S)
    return spans


def _kernel_kind(k: Event, kinds: dict) -> str:
    if k.cat in ("gpu_memcpy", "gpu_memset"):
        return k.cat[len("gpu_"):]
    return kinds.get(k.args.get("External id"), OTHER)


def _merge(items, rank: int, steps, gap: float) -> list[Span]:
    """One span per run of (start, end, kind, name, bytes) items of one kind and step, closer than
    ``gap``. ``other`` items between two of one kind belong to that run (bookkeeping inside a forward
    pass); communication calls end a run and are not compute."""
    spans: list[Span] = []
    run: list = []
    pending: list = []  # other items after the run, until we know whether the run goes on

    def emit(group: list) -> None:
        if group:
            kind = group[0][2]
            name = group[0][3] if len(group) == 1 else f"{kind} ({len(group)} ops)"
            spans.append(Span(rank, COMPUTE, kind, group[0][0], max(r[1] for r in group), name=name,
                              payload_bytes=sum(r[4] for r in group)))

    def flush() -> None:
        emit(run)
        emit(pending)
        run.clear()
        pending.clear()

    for item in items:
        start, _, kind, _, _ = item
        last = (pending or run or [None])[-1]
        if kind == _CALL or (last and (steps(start) != steps(last[0]) or start - last[1] > gap)):
            flush()
        if kind == _CALL:
            continue
        if run and kind == OTHER and run[0][2] != OTHER:
            pending.append(item)
        elif run and kind == run[0][2]:
            run.extend(pending)
            pending.clear()
            run.append(item)
        else:
            flush()
            run.append(item)
    flush()
    return spans


# ---------------------------------------------------------------------------------------------- communication
@dataclass
class _Comm:
    """One communication as the run asked for it: op, elements and dtype, group, peer."""

    op: str = ""
    elements: int = 0
    dtype: str | None = None
    group_size: int = 0
    group_ranks: list[int] | None = None
    peer: int | None = None
    shard_only: bool = False  # elements are one rank's shard of the gathered (or scattered) tensor
    splits: list[int] | None = None  # an all-to-all's input split sizes (rows of dim 0), one a group rank


def _is_nccl(e: Event) -> bool:
    return e.cat == "kernel" and "nccl" in e.name.lower()


def comm_spans(host_events: list[Event], device_events: list[Event], rank: int, world: int,
               world_only: bool = True) -> list[Span]:
    """Communication spans of one rank (module docstring). ``world_only``: the job made no process group
    smaller than the world, so every collective whose group the trace does not state is over all ranks."""
    spans = []
    for e, start, c in _communications(host_events, device_events):
        if c.op in P2P:
            c.peer = _global_peer(c, world)
            c.group_size = 2
            if world == 2 and c.peer is None:  # in a world of two the peer is the other rank
                c.peer = 1 - rank
        elif world_only and not c.group_size:
            c.group_size = world
        n = c.group_size or world
        elements = c.elements * n if c.shard_only else c.elements
        payload = 0 if c.op == "barrier" else elements * ELEMENT_BYTES.get(c.dtype, 0)
        subgroup = c.group_ranks if c.group_ranks and len(c.group_ranks) < world else None
        spans.append(Span(rank, COMM, c.op or "communication", start, e.end, name=e.name.split("(")[0],
                          bytes=_wire_bytes(c, payload, n, rank, world), payload_bytes=payload, peer=c.peer,
                          group_size=c.group_size, group_ranks=subgroup))
    return spans


def _communications(host_events: list[Event], device_events: list[Event]) -> list[tuple[Event, float, _Comm]]:
    """(what ran, when it started, what it was asked for): NCCL kernels, gloo's executions, else (no
    record of execution: another backend, or a GPU profile without CUDA events) the calls."""
    calls = sorted((e for e in host_events if e.name.startswith("c10d::")), key=lambda e: e.start)
    params = [e for e in host_events if e.name == "record_param_comms"]
    by_ext = {e.args.get("External id"): e for e in params}
    done = [(k, k.start, _from_metadata(k.args)
             or _from_metadata(by_ext.get(k.args.get("External id"), k).args) or _Comm(op_name(k.name)))
            for k in device_events if _is_nccl(k)]
    gloo = sorted((e for e in host_events if e.name.startswith("gloo:")), key=lambda e: e.start)
    paired = _pair(gloo, calls)
    for e in gloo:
        call = paired.get(id(e))
        done.append((e, _gloo_start(e, call), _from_call(call, e)))
    if done:
        return done
    by_id = {id(param): param for param in params}  # record_param_comms runs inside its call
    param_of = {id(call): by_id[param_id] for param_id, call in _pair(params, calls).items()}
    return [(c, c.start, _from_metadata(param_of.get(id(c), c).args) or _from_call(c, None)) for c in calls]


def _gloo_start(execution: Event, call: Event | None) -> float:
    """When a gloo communication started. A collective runs on gloo's worker thread: its range is the
    run. A send or recv runs in the calling thread, but its ``gloo:send`` / ``gloo:recv`` range opens
    only as ``c10d::send`` / ``c10d::recv_`` returns, after the transfer was posted: the call's start
    is the transfer's."""
    if call is not None and op_name(execution.name) in P2P:
        return min(call.start, execution.start)
    return execution.start


def _global_peer(c: _Comm, world: int) -> int | None:
    """A send's or recv's peer as a rank of the world. torch records ``Dst/Src Rank`` as the rank
    within the process group the call used (it translates the caller's global rank before the
    backend sees it), so a pipeline's sends on a group such as [1, 3] say 1 for rank 3. The group's
    ranks translate it back; a group smaller than the world whose ranks are not recorded (or cut
    short) leaves the peer unknown rather than wrong."""
    if c.peer is None:
        return None
    if c.group_ranks is not None and 0 <= c.peer < len(c.group_ranks):
        return c.group_ranks[c.peer]
    return c.peer if c.group_size in (0, world) else None


def _wire_bytes(c: _Comm, payload: int, n: int, rank: int, world: int) -> int:
    """paralab.comm's accounting: an all-to-all whose splits and own place in its group are known puts
    on the wire the slices it sends to the others; the rest the ring's for a group of n (an all-to-all
    split evenly), 0 for ops it does not price (barrier, reduce, gather, ...)."""
    from paralab.comm import wire_bytes

    me = _place_in_group(c, rank, world)
    if c.op == "all_to_all" and me is not None and sum(c.splits):
        return round(all_to_all_wire_bytes([payload * s / sum(c.splits) for s in c.splits], me))
    try:
        return wire_bytes(c.op, payload, n)
    except ValueError:
        return 0


def _place_in_group(c: _Comm, rank: int, world: int) -> int | None:
    """The rank's index among an all-to-all's splits: its place in the group's ranks, or its rank when
    the splits are as many as the world (None when neither is known, or without splits)."""
    if not c.splits:
        return None
    if c.group_ranks:
        return c.group_ranks.index(rank) if rank in c.group_ranks else None
    return rank if len(c.splits) == world else None


def _pair(executions: list[Event], calls: list[Event]) -> dict[int, Event]:
    """id(execution) -> the call that asked for it: the call that contains it on its thread (send and
    recv run inline), else the earliest open call of its op (or of an op gloo runs as it)."""
    paired: dict[int, Event] = {}
    used: set[int] = set()
    by_thread: dict[object, list[Event]] = defaultdict(list)  # calls in start order, per thread
    for c in calls:
        by_thread[c.tid].append(c)
    starts = {tid: [c.start for c in thread] for tid, thread in by_thread.items()}
    for e in executions:
        i = bisect.bisect_right(starts.get(e.tid, []), e.start) - 1  # the last call on its thread before it
        call = by_thread[e.tid][i] if i >= 0 else None
        if call is not None and e.end <= call.end + EPS_S and id(call) not in used:
            paired[id(e)] = call
            used.add(id(call))
    queues: dict[str, deque] = defaultdict(deque)
    for c in calls:
        if id(c) not in used:
            queues[op_name(c.name)].append(c)
    for e in executions:
        if id(e) in paired:
            continue
        op = op_name(e.name)
        heads = [q[0] for name, q in queues.items() if q and q[0].start <= e.start
                 and (name == op or _EXECUTED_AS.get(name) == op)]
        if heads:
            call = min(heads, key=lambda c: c.start)
            queues[op_name(call.name)].popleft()
            paired[id(e)] = call
    return paired


def _from_metadata(args: dict) -> _Comm | None:
    """What record_param_comms says (NCCL kernels carry it too), or None without it."""
    if "Collective name" not in args:
        return None
    op = op_name(str(args["Collective name"]))
    peer = args.get("Dst Rank", args.get("Src Rank"))
    sent, received = int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0)
    return _Comm(op, sent if op == "all_to_all" else max(sent, received),  # an all-to-all's payload: input
                 str(args.get("dtype")), int(args.get("Group size") or 0),
                 _int_list(args.get("Process Group Ranks")), int(peer) if peer is not None else None,
                 splits=_int_list(args.get("In split size")))


def _int_list(value) -> list[int] | None:
    """Ranks or split sizes as torch writes them, "[0, 1]" (cut short, "[0, 1, ...]", when long); None
    for an empty, cut or foreign one."""
    if isinstance(value, str):
        items = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        value = [int(v) for v in items] if all(v.isdigit() for v in items) else None
    return value if isinstance(value, list) and value and all(type(v) is int for v in value) else None


def _from_call(call: Event | None, execution: Event | None) -> _Comm:
    """A gloo execution (or a bare call) described by its c10d call's recorded shapes. The call does
    not name its process group, so group and peer stay unknown (but see comm_spans)."""
    c = _Comm(op_name((call or execution).name))
    sizes, c.dtype = _tensor_sizes(call.args) if call is not None else ([], None)
    if execution is not None:
        exec_sizes, exec_dtype = _tensor_sizes(execution.args)
        sizes, c.dtype = sizes or exec_sizes, c.dtype or exec_dtype
    # an all-to-all's payload is its input, the second of its (output, input) tensors
    c.elements = sizes[1] if c.op == "all_to_all" and len(sizes) > 1 else max(sizes, default=0)
    if call is not None and call.name.startswith("c10d::alltoall_base"):
        # (output, input, group, output splits, input splits, ...): record_shapes writes the splits as
        # text among its "Concrete Inputs"; as many splits as the group has ranks
        concrete = call.args.get("Concrete Inputs")
        c.splits = _int_list(concrete[4]) if isinstance(concrete, list) and len(concrete) > 4 else None
        c.group_size = len(c.splits or [])
    if c.op in ("all_gather", "reduce_scatter") and len(sizes) >= 2 and min(sizes) > 0:
        c.group_size = max(sizes) // min(sizes)  # full tensor / shard
    # list-form all_gather (c10d::allgather_) and reduce_scatter (c10d::reduce_scatter_): their list of
    # lists of tensors has no shapes in the profile, so only the shard is seen (and gloo's execution
    # of an all_gather is given the shard): the full tensor is group size x it, as paralab.comm counts
    c.shard_only = len(sizes) == 1 and c.op in ("all_gather", "reduce_scatter")
    return c


def _tensor_sizes(args: dict) -> tuple[list[int], str | None]:
    """Elements of each tensor argument (a tensor list counts its tensors together) and the first
    dtype, from record_shapes' ``Input type`` and ``Input Dims``."""
    types, dims = args.get("Input type") or [], args.get("Input Dims") or []
    sizes, dtype = [], None
    for kind, shape in zip(types, dims):
        if kind in ELEMENT_BYTES and _is_shape(shape):
            sizes.append(math.prod(shape))
            dtype = dtype or kind
        elif kind == "TensorList" and isinstance(shape, list) and all(map(_is_shape, shape)):
            sizes.append(sum(math.prod(s) for s in shape))
    return sizes, dtype


def _is_shape(shape) -> bool:
    """A tensor's dims as record_shapes writes them; anything else (another tool's field) is not counted."""
    return isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
