"""Microbenchmarks behind the ``local`` hardware: what a tiny fp32 model on CPU ranks actually pays.

A small GPT on a CPU is not a GPU in miniature. Its step time has three parts of similar size, and
each is measured here with the thread count a rank will get (ranks share the cores):

1. **Matmul throughput at the model's shapes.** (tokens x hidden) @ (hidden x 3 hidden) and the like,
   a few hundred wide: far from a large GEMM's rate. We time a handful of such shapes and fit the cost
   model's shape law ``rate x prod d / (d + d_half)`` (one rate, one ``d_half``) in log space.
2. **Host time per module call.** Every op runs synchronously after its dispatch, autograd records
   a node per op, and the lab's memory meter sees every saved tensor. We time paralab's own
   embedding, one transformer block and the head with loss, forward and backward, at a shape so small
   that their FLOPs are negligible: what is left is the fixed cost of calling them. Likewise Adam
   (``foreach=False``, as the strategies use it) per parameter tensor.
3. **gloo between two processes**: all-reduce and send/recv, each at a tiny and a large size, giving
   latency (alpha) and bandwidth (beta) by difference.

Medians, not minima: the runs the model predicts report median step times on the same shared machine.
"""

from __future__ import annotations

import json
import math
import socket
import statistics
import subprocess
import sys
import time

# (tokens, out, in) of the linears of the tiny (h 64) and small (h 256) presets with 128-1024 tokens
MODEL_SHAPES = ((128, 192, 64), (128, 64, 256), (512, 768, 256), (512, 256, 1024), (1024, 1024, 256), (256, 512, 512))


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


def matmul_law(shapes=MODEL_SHAPES, rows=None) -> tuple[float, float, list]:
    """Fit ``seconds = 2mnk / (rate x prod d/(d + d_half))`` to timed matmuls; returns (rate, d_half, rows)."""
    rows = rows if rows is not None else matmul_rows(shapes)
    best = None
    for step in range(0, 41):
        half = 2 ** (step / 4)  # 1 .. 1024
        logs = [math.log(2 * m * n * k / (t * (m / (m + half)) * (n / (n + half)) * (k / (k + half))))
                for m, n, k, t in rows]
        mean = sum(logs) / len(logs)
        error = sum((x - mean) ** 2 for x in logs)
        if best is None or error < best[0]:
            best = (error, math.exp(mean), half)
    return best[1], best[2], rows


def copy_bandwidth(nbytes: int = 16 * 2**20) -> float:
    """Bytes per second moved by a large copy (read plus write)."""
    import torch

    src = torch.empty(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_time(lambda: dst.copy_(src), repeats=5)


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
        forward, backward = [], []
        for _ in range(60):
            start = time.perf_counter()
            with meter.saving(0):
                y = call(part)
            mid = time.perf_counter()
            y.backward(torch.ones_like(y))
            end = time.perf_counter()
            meter.release(0)
            forward.append(mid - start)
            backward.append(end - mid)
        out[f"{name}_forward"] = statistics.median(forward[10:])
        out[f"{name}_backward"] = statistics.median(backward[10:])
    params = [torch.nn.Parameter(torch.randn(8)) for _ in range(24)]
    for p in params:
        p.grad = torch.randn(8)
    adam = torch.optim.Adam(params, lr=1e-3, foreach=False)
    out["tensor_update"] = median_time(adam.step, repeats=7) / len(params)
    return out


def compute_figures(shapes=MODEL_SHAPES) -> dict:
    """The compute microbenchmarks of one process: matmul rows, copy bandwidth, host overheads."""
    return {"matmul_rows": matmul_rows(shapes), "copy_bw": copy_bandwidth(), "host": host_overheads()}


def concurrent_figures(threads: int, ranks: int = 2, nbytes: int = 4 * 2**20, shapes=MODEL_SHAPES,
                       timeout: float = 60.0) -> tuple[dict, dict]:
    """Compute figures measured by ``ranks`` processes at once (as the ranks of a run share the
    machine: its cores, caches, memory bus and whatever else is running), averaged over them, and
    the gloo link figures between the first two."""
    spec = json.dumps({"port": _free_port(), "nbytes": nbytes, "threads": threads, "ranks": ranks,
                       "shapes": shapes})
    results = _run_workers([spec], ranks, timeout)
    rows = [(*r[:3], statistics.mean(res["matmul_rows"][i][3] for res in results))
            for i, r in enumerate(results[0]["matmul_rows"])]
    compute = {
        "matmul_rows": rows,
        "copy_bw": statistics.mean(res["copy_bw"] for res in results),
        "host": {k: statistics.mean(res["host"][k] for res in results) for k in results[0]["host"]},
    }
    return compute, _links(results[0]["gloo"], nbytes)


def gloo_alpha_beta(nbytes: int = 4 * 2**20, timeout: float = 25.0) -> dict[str, float]:
    """All-reduce and send/recv a tiny and a large tensor between two fresh local gloo processes.

    Ring accounting: a 2-rank all-reduce puts 2(n-1)/n = 1 x the tensor on the wire per rank, so
    both fits are ``t = alpha + bytes / beta``. Send/recv is timed as a ping-pong, halved. The workers
    are fresh interpreters (``python -m paralab.sim.calibration``), so calibrating works from a
    notebook or a script without a ``__main__`` guard.
    """
    return _links(_run_workers([str(_free_port()), str(nbytes)], 2, timeout)[0], nbytes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_workers(args: list[str], ranks: int, timeout: float) -> list[dict]:
    """Run ``python -m paralab.sim.calibration ARGS RANK`` for each rank; their JSON outputs, by rank."""
    procs = [subprocess.Popen([sys.executable, "-m", "paralab.sim.calibration", *args, str(r)],
                              stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"calibration workers failed (exit codes {[p.returncode for p in procs]})")
    return [json.loads(o) for o in outputs]


def _links(times: list[float], nbytes: int) -> dict[str, float]:
    small, large, p2p_small, p2p_large = times
    allreduce_bw = nbytes / max(large - small, 1e-9)
    # a loaded machine's wake-up latency can swamp the transfer itself: when the large send/recv is
    # not clearly slower than the tiny one, its bandwidth is unresolved and the all-reduce's stands in
    resolved = p2p_large - p2p_small > 0.1 * p2p_large
    return {
        "allreduce_latency": small, "allreduce_bw": allreduce_bw,
        "p2p_latency": p2p_small, "p2p_bw": nbytes / (p2p_large - p2p_small) if resolved else allreduce_bw,
    }


def _concurrent_worker(spec: dict, rank: int) -> None:
    """One calibration rank: compute figures in step with the others, then (first two) gloo figures."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank,
                            world_size=spec["ranks"])
    try:
        dist.barrier()
        out = compute_figures([tuple(s) for s in spec["shapes"]])
        dist.barrier()
        torch.set_num_threads(1)
        pair = dist.new_group([0, 1])
        if rank < 2:
            out["gloo"] = _gloo_times(spec["nbytes"], rank, pair)
        print(json.dumps(out))
    finally:
        dist.destroy_process_group()


def _gloo_worker(port: int, nbytes: int, rank: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        print(json.dumps(_gloo_times(nbytes, rank, None)))
    finally:
        dist.destroy_process_group()


def _gloo_times(nbytes: int, rank: int, group) -> list[float]:
    """[all-reduce tiny, all-reduce large, one-way send/recv tiny, large] seconds, medians."""
    import torch
    import torch.distributed as dist

    if True:
        times = []
        tensors = [torch.ones(1), torch.ones(nbytes // 4)]
        for t in tensors:
            for _ in range(3):
                dist.all_reduce(t, group=group)
            dist.barrier(group=group)
            times.append(statistics.median(_timed(lambda t=t: dist.all_reduce(t, group=group)) for _ in range(15)))

        def ping_pong(t):
            peer = 1 - rank
            if rank == 0:
                dist.send(t, peer, group=group)
                dist.recv(t, peer, group=group)
            else:
                dist.recv(t, peer, group=group)
                dist.send(t, peer, group=group)

        for t in tensors:
            ping_pong(t)
            dist.barrier(group=group)
            times.append(statistics.median(_timed(lambda t=t: ping_pong(t)) for _ in range(15)) / 2)
    return times


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    if sys.argv[1].startswith("{"):
        _concurrent_worker(json.loads(sys.argv[1]), int(sys.argv[2]))
    else:
        _gloo_worker(*(int(a) for a in sys.argv[1:4]))
