"""Microbenchmarks behind the ``local`` hardware: what a small model on CPU ranks actually pays.

A small GPT on a CPU is not a GPU in miniature. Each part of its step is measured here with the
thread count a rank will get, by as many processes at once as the run has ranks (they share the
cores, caches and memory bus):

1. **Matmul throughput at the model's shapes.** (tokens x hidden) @ (hidden x 3 hidden) and the like,
   a few hundred wide: far from a large GEMM's rate. We time a handful of such shapes and fit the cost
   model's shape law ``rate x prod d / (d + d_half)`` (one rate, one ``d_half``) in log space.
   bf16 and fp16 get rates of their own on that law, from a linear's three matmuls at the smaller
   shapes: on a CPU without 16-bit units they run at a tenth to a hundredth of fp32's rate.
2. **Host time per module call.** Every op runs synchronously after its dispatch, autograd records
   a node per op, and the lab's memory meter sees every saved tensor. We time paralab's own
   embedding, one transformer block and the head with loss, forward and backward, at a shape so small
   that their FLOPs are negligible: what is left is the fixed cost of calling them. Likewise Adam
   (``foreach=False``, as the strategies use it) per parameter tensor, and the training loop's own
   time per step and per token loaded (:func:`loop_overheads`).
3. **Everything in a block that is not a GEMM.** LayerNorm, GELU, CPU flash attention and the
   residual adds are far slower than a memory copy on one core. We time paralab's block forward and
   backward at the lab models' shapes, among others as a model runs them (a chain of CHAIN_BLOCKS
   distinct blocks: a lone block timed over and over finds its weights and buffers still in cache
   and ran 10-20% faster than the same block inside a stage), take away the GEMM law's share and
   the host time, and fit
   the bytes per second at which the rest gets through the activations it moves
   (:func:`fit_elementwise_bandwidths`). Adam on four million parameters in tensors the size of the
   small preset's MLP matrices gives the optimizer's rate (a million, which stays in cache, ran
   twice as fast as the lab models' Adam does).
4. **How long a synchronisation waits.** Ranks leave the same compute apart: on a shared machine
   the spread grows like the square root of the duration (independent preemptions add up), and
   every synchronisation waits for the slowest rank. With gloo, a 4-byte all-reduce is timed after
   1, 3 and 10 ms of compute against one after a barrier (:func:`fit_wait_jitter`): that is what a
   run's collectives pay, three to five times what one rank's own spread over repeated block timings
   says (:func:`fit_sync_jitter`, used when the calibration runs without gloo), as a rank blocked
   in gloo is also woken late.
5. **gloo between two processes**: all-reduce, all-gather, reduce-scatter and one-way send/recv on
   a ladder of sizes (4 B to 32 MiB), mean times. On shared cores a call often waits for its I/O
   thread to be scheduled, so the cost is far from ``latency + bytes / bandwidth``, and gloo's
   reduce-scatter is an all-reduce of the whole tensor: the cost model reads each op's own curve.

Medians, not minima: the runs the model predicts report median step times on the same shared machine.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paralab.runtime.processes import wait_together

# (tokens, out, in) of the linears of the tiny (h 64) and small (h 256) presets with 128-1024 tokens
MODEL_SHAPES = ((128, 192, 64), (128, 64, 256), (512, 768, 256), (512, 256, 1024), (1024, 1024, 256),
                (256, 512, 512))


def median_time(fn, repeats: int = 7, min_seconds: float = 2e-3) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` batches of enough calls to last ``min_seconds``."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    inner = max(1, int(min_seconds / once))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def matmul_rows(shapes=MODEL_SHAPES) -> list[tuple[int, int, int, float]]:
    """(m, n, k, median seconds) of an (m x k) @ (k x n) matmul for each shape."""
    import torch

    rows = []
    for m, n, k in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        rows.append((m, n, k, median_time(lambda a=a, b=b: torch.mm(a, b), repeats=5)))
    return rows


# The model shapes a 16-bit dtype is timed at: those of MODEL_SHAPES up to 2^27 FLOPs (the tiny preset's
# two at 128 tokens, and 256 x 512 x 512), as a CPU without 16-bit units runs some of a linear's matmuls
# at about 1 GFLOP/s: the small preset's 512-token linears would take a second each
LOW_PRECISION_SHAPES = tuple(s for s in MODEL_SHAPES if 2 * s[0] * s[1] * s[2] <= 2**27)


def low_precision_rows(shapes=LOW_PRECISION_SHAPES) -> dict[str, list]:
    """{dtype: linear rows} for each 16-bit dtype this CPU trains in (``paralab.precision``). Neither
    is fp32's rate: a CPU without bf16 units runs bf16 at a tenth to a hundredth of it, one with them
    (AMX) faster."""
    from paralab.config import DTYPES
    from paralab.precision import dtype_supported

    return {dtype: linear_rows(shapes, dtype) for dtype in DTYPES
            if dtype != "fp32" and dtype_supported(dtype, "cpu")}


def linear_rows(shapes, dtype: str) -> list[tuple[int, int, int, float]]:
    """(m, n, k, median seconds per matmul) of a linear layer's three matmuls in ``dtype`` (forward
    x @ W^T, backward dY @ W and dY^T @ x, each 2mnk FLOPs), as the cost model prices a layer: a
    16-bit rate depends on the operands' layout where fp32's does not (bf16 on a 2-core EPYC: 7, 1
    and 18 GFLOP/s for the three at 512 x 768 x 256, fp32 91 for each)."""
    import torch

    from paralab.precision import torch_dtype

    rows = []
    for m, n, k in shapes:
        x, w, dy = (torch.randn(*shape).to(torch_dtype(dtype)) for shape in ((m, k), (n, k), (m, n)))
        seconds = median_time(lambda x=x, w=w, dy=dy: (x @ w.T, dy @ w, dy.T @ x), repeats=3)
        rows.append((m, n, k, seconds / 3))
    return rows


MAX_HALF_DIM = 1024  # the largest d_half the fit tries
# A fitted d_half this large says the lab's 64-256-wide matmuls ran at under a thirtieth of a large
# one's rate: no CPU does that; their calls were waiting for cores other work held (a busy machine)
DISTURBED_HALF_DIM = 256
# The share of the usable cores' time that other processes may take while a calibration measures: as
# much again would slow what it times by about that much, and the model aims at 10-20% (a calibration
# taken under a load of 5 on two cores had read a layer's host time 60 times too long and passed)
OTHERS_CPU_LIMIT = 0.1


def others_cpu() -> tuple[float, dict[tuple[int, float], float]]:
    """(now, CPU seconds of each process this one sees that is neither it nor its descendant, keyed by
    pid and start time): two readings, around a calibration, give :func:`others_cpu_share`. Processes,
    not the machine's CPU counters: in a container those count the whole host, whose other tenants do
    not hold this container's cores."""
    import psutil

    me = psutil.Process()
    ours = {me.pid, *(child.pid for child in me.children(recursive=True))}
    seconds = {}
    for proc in psutil.process_iter(["pid", "create_time", "cpu_times"]):
        info = proc.info
        if info["pid"] not in ours and info["cpu_times"] is not None:  # None: not ours to read
            seconds[info["pid"], info["create_time"]] = info["cpu_times"].user + info["cpu_times"].system
    return time.monotonic(), seconds


def others_cpu_share(before, after, cores: int) -> float:
    """The share of ``cores``' time between two :func:`others_cpu` readings that other processes used
    (those that started in between from their start; those that ended in between are not seen)."""
    (start, was), (end, now) = before, after
    used = sum(max(cpu - was.get(key, 0.0), 0.0) for key, cpu in now.items())
    return used / max((end - start) * cores, 1e-9)


def matmul_law(shapes=MODEL_SHAPES, rows=None) -> tuple[float, float, list]:
    """Fit ``seconds = 2mnk / (rate x prod d/(d + d_half))`` to timed matmuls; returns (rate, d_half,
    rows)."""
    rows = rows if rows is not None else matmul_rows(shapes)
    best = None
    for step in range(4 * int(math.log2(MAX_HALF_DIM)) + 1):
        half = 2 ** (step / 4)  # 1 .. MAX_HALF_DIM, four steps an octave
        logs = _log_rates(rows, half)
        mean = sum(logs) / len(logs)
        error = sum((x - mean) ** 2 for x in logs)
        if best is None or error < best[0]:
            best = (error, math.exp(mean), half)
    return best[1], best[2], rows


def rate_at_half(rows, half: float) -> float:
    """The law's rate fitted to ``rows`` with ``d_half`` held at ``half``: a 16-bit dtype's, timed at a
    few shapes, on fp32's shape law (its rate at the timed shapes, not a law of its own)."""
    logs = _log_rates(rows, half)
    return math.exp(sum(logs) / len(logs))


def _log_rates(rows, half: float) -> list[float]:
    """Each row's log rate once the law's shape efficiency at ``half`` is taken out."""
    return [math.log(2 * m * n * k / (t * (m / (m + half)) * (n / (n + half)) * (k / (k + half))))
            for m, n, k, t in rows]


def copy_bandwidth(nbytes: int = 16 * 2**20) -> float:
    """Bytes per second moved by a large copy (read plus write)."""
    import torch

    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_time(lambda: dst.copy_(src), repeats=5)


# (micro-batch, hidden, heads, seq) of blocks as the lab presets run them: tiny at b 8, small at b 2 and 4
BLOCK_SHAPES = ((8, 64, 4, 32), (2, 256, 8, 128), (4, 256, 8, 128))
# Adam's rate is timed on this many parameters in this many tensors (and fitted with the same numbers):
# tensors of 2^18, as the small preset's MLP matrices, and a working set past the caches, as its Adam
ADAM_PARAMS, ADAM_TENSORS = 2**22, 16
# blocks are timed in a chain of this many (half the small preset's 8 layers: one stage of pp 2), each
# call following other blocks' weights and activations through the caches, as in a model's step
CHAIN_BLOCKS = 4


def block_config(hidden: int, heads: int, seq: int):
    """A one-block lab model of this width: what the block timings run and the fit prices."""
    from paralab.config import ModelConfig

    return ModelConfig(layers=1, hidden=int(hidden), heads=int(heads), vocab=16, seq_len=int(seq))


def _part_times(meter, part, call, repeats: int, skip: int) -> tuple[float, float, float, float]:
    """Median forward and backward seconds of ``call(part)`` under the memory meter, and the standard
    deviation of each (:func:`spread`)."""
    import torch

    forward, backward = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        with meter.saving(0):
            y = call(part)
        mid = time.perf_counter()
        y.backward(torch.ones_like(y))
        end = time.perf_counter()
        meter.release(0)
        forward.append(mid - start)
        backward.append(end - mid)
    kept = forward[skip:], backward[skip:]
    return (*map(statistics.median, kept), *map(spread, kept))


def spread(samples: list[float]) -> float:
    """A standard deviation that one long stall cannot inflate much: Gini's mean difference (the mean
    |x - y| over pairs) x sqrt(pi) / 2, which is sigma for normal samples."""
    n = len(samples)
    pairs = sum(abs(x - y) for i, x in enumerate(samples) for y in samples[i + 1:])
    return pairs / (n * (n - 1) / 2) * math.sqrt(math.pi) / 2 if n > 1 else 0.0


def host_overheads() -> dict[str, float]:
    """Seconds per call of paralab's embedding, block and head + loss (forward, backward) at a shape
    whose FLOPs are negligible, under the memory meter the strategies wrap forwards in; and Adam's
    seconds per parameter tensor."""
    import torch

    from paralab.config import ModelConfig
    from paralab.memory import MemoryMeter
    from paralab.models.gpt import build_part, lm_loss

    cfg = ModelConfig(layers=1, hidden=8, heads=2, ffn=32, vocab=16, seq_len=4)
    meter = MemoryMeter(torch.device("cpu"))
    idx = torch.randint(0, cfg.vocab, (1, cfg.seq_len))
    x0 = torch.randn(1, cfg.seq_len, cfg.hidden)
    parts = {
        "embed": (build_part(cfg, 0, 0), lambda part: part(idx)),
        "layer": (build_part(cfg, 1, 0), lambda part: part(x0.clone().requires_grad_())),
        "head": (build_part(cfg, 2, 0), lambda part: lm_loss(part(x0.clone().requires_grad_()), idx)),
    }
    out: dict[str, float] = {}
    for name, (part, call) in parts.items():
        out[f"{name}_forward"], out[f"{name}_backward"], *_ = _part_times(meter, part, call, 60, 10)
    out["tensor_update"] = adam_seconds(24 * 8, 24, repeats=7) / 24  # 24 tiny tensors: per-tensor cost
    return out


def loop_overheads(steps: int = 12) -> dict[str, float]:
    """The training loop's own seconds per step, outside forward, backward and the optimizer: a fixed
    part ("step": recorder, memory meter, clearing gradients, the gradient-sync calls) and a part per
    token of the rank's batch ("data_token": the synthetic corpus draws each token in Python).

    Runs the real loop (``train_model``) of a one-rank model with negligible FLOPs at two sequence
    lengths and reads its own trace: per step, the step span minus the spans inside it."""
    import torch

    from paralab.config import ModelConfig, RunConfig
    from paralab.layout import resolve_layout
    from paralab.memory import MemoryMeter
    from paralab.models.gpt import GPT
    from paralab.precision import LossScaler
    from paralab.runtime.context import RaiseOrHang, RankContext
    from paralab.runtime.recorder import Recorder
    from paralab.strategies.common import GradSync, train_model
    from paralab.trace import COMPUTE

    cpu, batch, points = torch.device("cpu"), 4, []
    for seq in (8, 128):
        model_cfg = ModelConfig(layers=1, hidden=8, heads=2, ffn=32, vocab=16, seq_len=seq)
        cfg = RunConfig.build(model_cfg, strategy="single", world_size=1, steps=steps, global_batch=batch)
        ctx = RankContext(cfg, resolve_layout(cfg), 0, 1, 0, 0, cpu, Recorder(0), MemoryMeter(cpu),
                          RaiseOrHang(cfg, 0), LossScaler(cfg.dtype))
        train_model(ctx, GPT(model_cfg, 0), GradSync())
        trace = ctx.recorder.trace()
        outside = [hi - lo - trace.busy_time(0, COMPUTE, (lo, hi))
                   for k, (lo, hi) in trace.step_windows().items() if k >= 2]
        points.append((batch * seq, statistics.median(outside)))
    (n0, t0), (n1, t1) = points
    per_token = max(t1 - t0, 0.0) / (n1 - n0)
    return {"step": max(t0 - n0 * per_token, 0.0), "data_token": per_token}


def block_times(shapes=BLOCK_SHAPES, chain: int = CHAIN_BLOCKS) -> list[list[float]]:
    """[micro-batch, hidden, heads, seq, forward s, backward s, forward sigma, backward sigma] of one
    paralab block per shape, timed in a chain of ``chain`` distinct blocks (per block: the chain's
    medians / chain, its spreads / sqrt(chain), as independent delays add in quadrature)."""
    import torch

    from paralab.memory import MemoryMeter
    from paralab.models.gpt import build_part

    meter = MemoryMeter(torch.device("cpu"))
    rows = []
    for b, h, heads, s in shapes:
        cfg = block_config(h, heads, s)
        x0 = torch.randn(b, s, h)
        blocks = torch.nn.Sequential(*(build_part(cfg, 1, seed) for seed in range(chain)))
        f, bw, f_sigma, b_sigma = _part_times(
            meter, blocks, lambda part, x0=x0: part(x0.clone().requires_grad_()), 10, 3)
        root = math.sqrt(chain)
        rows.append([b, h, heads, s, f / chain, bw / chain, f_sigma / root, b_sigma / root])
    return rows


def adam_seconds(params: int = ADAM_PARAMS, tensors: int = ADAM_TENSORS, repeats: int = 5) -> float:
    """Median seconds of one Adam step (``foreach=False``) over ``params`` parameters in ``tensors``
    tensors."""
    import torch

    weights = [torch.nn.Parameter(torch.randn(params // tensors)) for _ in range(tensors)]
    for w in weights:
        w.grad = torch.randn_like(w)
    return median_time(torch.optim.Adam(weights, lr=1e-3, foreach=False).step, repeats=repeats)


def compute_figures(shapes=MODEL_SHAPES, sync=lambda: None, rounds: int = 3) -> dict:
    """The compute microbenchmarks of one process: matmul rows, copy bandwidth, host overheads,
    block timings, Adam's step time on ADAM_PARAMS parameters (kept as "adam_1m", its first size) and
    each 16-bit dtype's linear rows (``low_precision_rows``).

    The block fit subtracts the matmul law from block times, so the two must see the same machine:
    they alternate for ``rounds`` rounds and each figure is the median over rounds. ``sync`` (a
    barrier when several ranks calibrate together) keeps the ranks on the same benchmark."""
    matmuls, blocks = [], []
    for _ in range(rounds):
        sync()
        matmuls.append(matmul_rows(shapes))
        sync()
        blocks.append(block_times())
    figures = {"matmul_rows": _merge(matmuls, 3, statistics.median),
               "blocks": _merge(blocks, 4, statistics.median)}
    sync()
    figures["copy_bw"] = copy_bandwidth()
    sync()
    figures["host"] = {**host_overheads(), **loop_overheads()}
    sync()
    figures["adam_1m"] = adam_seconds()
    sync()
    figures["low_precision_rows"] = low_precision_rows()
    return figures


def fit_elementwise_bandwidths(hw, blocks: list[list[float]]) -> tuple[float, float]:
    """Bytes/s of a block's non-GEMM work in its forward and in its backward, fitted to timed blocks
    against the cost model itself.

    For each timed block the cost model's GEMM time (forward: linear + core; backward twice the
    linear and the core's backward) and the calibrated host time are taken away; what is left is
    fitted, through the origin, to the activation bytes the model says those kernels move (forward
    once, backward twice), each pass on its own: on a CPU these kernels are not simply memory-bound
    (GELU's erf, softmax's exp), and one rate for both had read the lab's blocks' forward 6-11% low
    and their backward 2-5% high. A rate is 0 when nothing is left: a disturbed calibration, measured
    again (hardware.local); the cost model would read a 0 as "no such rate" (the forward's then stands
    for the backward's, the memory bandwidth for the forward's).
    """
    from paralab.sim.cost import layer_work
    from paralab.sim.presets import lab_model
    from paralab.sim.specs import ParallelSpec

    host = hw.host_overhead_s
    forward_fit, backward_fit = [], []
    for b, h, heads, s, forward, backward, *_ in blocks:
        model = lab_model(block_config(h, heads, s))
        work = layer_work(model, ParallelSpec(micro_batch=int(b), microbatches=1).resolved(), hw)
        forward_fit.append((forward - host.get("layer_forward", 0.0) - work.linear - work.core,
                            work.elementwise_bytes))
        backward_gemms = 2 * work.linear + work.core_backward
        backward_fit.append((backward - host.get("layer_backward", 0.0) - backward_gemms,
                             2 * work.elementwise_bytes))
    return _rate_through_origin(forward_fit), _rate_through_origin(backward_fit)


def _rate_through_origin(points: list[tuple[float, float]]) -> float:
    """B in seconds = bytes / B, least squares through the origin over (seconds, bytes); 0 when the
    seconds are not positive overall."""
    num = sum(seconds * moved for seconds, moved in points)
    return sum(moved * moved for _, moved in points) / num if num > 0 else 0.0


def fit_sync_jitter(blocks: list[list[float]]) -> float:
    """c (seconds^0.5) in sigma = c sqrt(T): the spread of a rank's compute over T seconds, fitted
    through the origin to the timed blocks' spreads (forward and backward) against their durations.
    Independent preemptions on a shared machine add their delays like a random walk, so the spread
    grows with the square root of the time, not in proportion to it."""
    points = [(t, sigma) for *_, forward, backward, f_sigma, b_sigma in blocks
              for t, sigma in ((forward, f_sigma), (backward, b_sigma))]
    return sum(sigma * math.sqrt(t) for t, sigma in points) / sum(t for t, _ in points)


def optimizer_bandwidth(adam_1m: float, tensor_update: float, params: int = ADAM_PARAMS,
                        tensors: int = ADAM_TENSORS) -> float:
    """Optimizer bytes/s in the cost model's accounting (OPTIMIZER_BYTES_TOUCHED per parameter)."""
    from paralab.sim.cost import OPTIMIZER_BYTES_TOUCHED

    return OPTIMIZER_BYTES_TOUCHED * params / max(adam_1m - tensors * tensor_update, 1e-9)


def concurrent_figures(threads: int, ranks: int = 2, shapes=MODEL_SHAPES,
                       timeout: float = 90.0) -> tuple[dict, dict]:
    """Compute figures measured by ``ranks`` processes at once (as the ranks of a run share the
    machine: its cores, caches, memory bus and whatever else is running), averaged over them, and
    the gloo curves between the first two."""
    spec = {"threads": threads, "ranks": ranks, "shapes": shapes}
    results = _run_workers(spec, ranks, timeout)
    compute = {
        "matmul_rows": _merge([res["matmul_rows"] for res in results], 3, statistics.mean),
        "copy_bw": statistics.mean(res["copy_bw"] for res in results),
        "host": {k: statistics.mean(res["host"][k] for res in results) for k in results[0]["host"]},
        "blocks": _merge([res["blocks"] for res in results], 4, statistics.mean),
        "adam_1m": statistics.mean(res["adam_1m"] for res in results),
        "low_precision_rows": {dtype: _merge([res["low_precision_rows"][dtype] for res in results], 3,
                                             statistics.mean) for dtype in results[0]["low_precision_rows"]},
    }
    return compute, results[0]["gloo"]


def _merge(tables: list[list], keys: int, aggregate) -> list[list]:
    """Tables of the same shapes (rounds, or ranks) as one: each row's first ``keys`` columns, then
    every other column aggregated over the tables."""
    return [[*rows[0][:keys], *(aggregate(r[j] for r in rows) for j in range(keys, len(rows[0])))]
            for rows in zip(*tables)]


def gloo_curves(timeout: float = 40.0) -> dict[str, list]:
    """gloo's all-reduce, all-gather, reduce-scatter and one-way send/recv curves between two fresh local
    processes (1 thread each), and the waits of a synchronisation after compute (``sync``).

    The workers are fresh interpreters (``python -m paralab.sim.calibration``), so calibrating works
    from a notebook or a script without a ``__main__`` guard."""
    spec = {"threads": 1, "ranks": 2, "compute": False}
    return _run_workers(spec, 2, timeout)[0]["gloo"]


def link_summary(curves: dict[str, list]) -> dict[str, float]:
    """Alpha-beta of the all-reduce curve for the fields every preset has: per ring step latency (a
    2-rank all-reduce is two steps) and bandwidth between its smallest and largest points (a 2-rank
    ring puts the whole tensor on the wire)."""
    (small, t_small), (large, t_large) = curves["allreduce"][0], curves["allreduce"][-1]
    return {"latency": t_small / 2, "bw": (large - small) / max(t_large - t_small, 1e-9)}


def _run_workers(spec: dict, ranks: int, timeout: float) -> list[dict]:
    """Run ``python -m paralab.sim.calibration SPEC RANK`` for each rank, all under one deadline (a
    rank's collectives give up in half of it, so a rank that waits for a lost peer says so itself; it
    dies with this process); their JSON outputs, by rank. RuntimeError naming the first rank that
    failed, with its last words, or the deadline.

    The ranks meet through a file store in their scratch directory, as a local run's do: no port is
    picked ahead for another process to take, and nothing listens beyond loopback."""
    with tempfile.TemporaryDirectory(prefix="paralab-calibration-") as scratch:
        spec = json.dumps({**spec, "parent": os.getpid(), "timeout": timeout / 2,
                           "store": f"file://{Path(scratch) / 'store'}"})
        outs, logs = ([Path(scratch) / f"rank{r}.{kind}" for r in range(ranks)] for kind in ("out", "err"))
        procs = []
        for r in range(ranks):
            with outs[r].open("w") as out, logs[r].open("w") as err:
                procs.append(subprocess.Popen([sys.executable, "-m", "paralab.sim.calibration", spec, str(r)],
                                              stdout=out, stderr=err))
        waited = None
        try:
            waited = wait_together(procs, timeout)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        if failed := [r for r, p in enumerate(procs) if p.returncode]:
            first = ((waited and waited.first_failed) or failed)[0]  # not one its failure took down
            last_words = logs[first].read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"calibration rank {first} failed (exit {procs[first].returncode}"
                               + (f"): {' / '.join(last_words)}" if last_words else ", nothing on stderr)")
                               + (f"; {timeout:.0f} s passed" if waited and waited.timed_out else ""))
        return [json.loads(out.read_text()) for out in outs]


def _worker(spec: dict, rank: int) -> None:
    """One calibration rank: compute figures in step with the others, then (first two) gloo curves."""
    import gc
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from paralab.runtime.loopback import transport_env
    from paralab.runtime.worker import die_with_parent

    die_with_parent(spec["parent"])
    torch.set_num_threads(spec["threads"])
    os.environ.update(transport_env())  # gloo's own sockets on loopback too
    dist.init_process_group("gloo", init_method=spec["store"], rank=rank,
                            world_size=spec["ranks"], timeout=timedelta(seconds=spec["timeout"]))
    try:
        out = {}
        if spec.get("compute", True):
            out = compute_figures([tuple(s) for s in spec["shapes"]], sync=dist.barrier)
        dist.barrier()
        torch.set_num_threads(1)
        pair = dist.new_group([0, 1])
        if rank < 2:
            out["gloo"] = {**_gloo_curves(rank, pair), "sync": _sync_waits(pair)}
        print(json.dumps(out))
    finally:
        gc.collect()  # seen with gloo: without it a rank may abort at exit after destroy
        dist.destroy_process_group()


# bytes: two floats (the least an all-gather of halves takes), then 4 KiB to 32 MiB (a DDP bucket is 25 MiB)
LADDER = (8, *(2**k for k in range(12, 26)))


def _gloo_curves(rank: int, group, rounds: int = 8, calls: int = 3) -> dict[str, list]:
    """{"allreduce" | "allgather" | "reducescatter" | "p2p": [[bytes, s]...]}: each collective with
    that many bytes in its whole tensor (the all-gather's output, the reduce-scatter's input), as
    the strategies call them (``paralab.comm``); p2p one way (a ping-pong, halved).

    On a few shared cores a gloo call is bimodal: it finishes at once, or waits a millisecond or
    more for its I/O thread to be scheduled, and which one varies from call to call more than with
    the size. A run's step pays the sum of its calls, so each point is a mean, over ``rounds``
    passes up the ladder (spreading any burst of load over every size), made non-decreasing in the
    size (:func:`monotone`).
    """
    import torch
    import torch.distributed as dist

    peer = 1 - rank

    def ping_pong(t):
        if rank == 0:
            dist.send(t, peer, group=group)
            dist.recv(t, peer, group=group)
        else:
            dist.recv(t, peer, group=group)
            dist.send(t, peer, group=group)

    from paralab.comm import all_gather_into_tensor, reduce_scatter_tensor

    # each size: the whole tensor, this rank's half of it (an all-gather's input), a half to receive into
    buffers = [(t, t[: len(t) // 2].clone(), torch.empty(len(t) // 2))
               for t in (torch.ones(n // 4) for n in LADDER)]
    calls_of = {
        "allreduce": lambda whole, mine, out: dist.all_reduce(whole, group=group),
        "allgather": lambda whole, mine, out: all_gather_into_tensor(whole, mine, group=group),
        "reducescatter": lambda whole, mine, out: reduce_scatter_tensor(out, whole, group=group),
        "p2p": lambda whole, mine, out: ping_pong(whole),
    }
    samples = {name: [[] for _ in LADDER] for name in calls_of}
    for _ in range(rounds):
        for i, tensors in enumerate(buffers):
            for name, call in calls_of.items():
                dist.barrier(group=group)
                samples[name][i] += [_timed(lambda call=call, b=tensors: call(*b)) for _ in range(calls)]
    scale = {"p2p": 0.5}
    return {name: [[n, y] for n, y in zip(LADDER, monotone([scale.get(name, 1.0) * statistics.mean(x)
                                                            for x in rows]))]
            for name, rows in samples.items()}


# seconds of compute before a timed collective: about a tensor-parallel pass or a ZeRO layer of the lab
SYNC_COMPUTE_S = (0.001, 0.003, 0.01)


def _sync_waits(group, rounds: int = 60) -> list[list[float]]:
    """[[T, seconds]]: what a 4-byte all-reduce issued after T seconds of compute costs beyond one
    issued straight after a barrier, as rank 0 sees it (the ranks start the compute together).

    In a run every collective follows compute, and the ranks come out of it apart: one waits for the
    other, and a rank blocked in gloo is woken when its peer arrives. Timed back to back (the curves
    above) a collective pays neither; here it pays both, as a run's do.
    """
    import torch
    import torch.distributed as dist

    a = torch.randn(256, 256)
    start = time.perf_counter()
    for _ in range(20):
        a @ a
    per_matmul = torch.tensor([(time.perf_counter() - start) / 20])
    dist.all_reduce(per_matmul, op=dist.ReduceOp.MAX, group=group)  # both ranks do the same work
    one = torch.ones(1)

    def after(seconds: float) -> float:
        times = []
        for _ in range(rounds):
            dist.barrier(group=group)
            for _ in range(round(seconds / per_matmul.item())):
                a @ a
            times.append(_timed(lambda: dist.all_reduce(one, group=group)))
        return statistics.mean(times[2:])

    hot = after(0.0)
    return [[t, max(after(t) - hot, 0.0)] for t in SYNC_COMPUTE_S]


def fit_wait_jitter(waits: list[list[float]]) -> float:
    """c (seconds^0.5) in :func:`paralab.sim.cost.sync_wait`, from :func:`_sync_waits`: a 2-rank
    synchronisation after T seconds waits c sqrt(T) E[max of 2] (least squares through the origin)."""
    from paralab.sim.cost import expected_max

    k = sum(w * math.sqrt(t) for t, w in waits) / sum(t for t, _ in waits)
    return k / expected_max(2)


def monotone(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, c1), (m2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(c)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]), int(sys.argv[2]))
