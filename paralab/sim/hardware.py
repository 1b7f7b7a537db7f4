"""Hardware presets: datasheet GPUs in their usual nodes, and ``local`` (this machine, measured).

GPU figures are dense (no 2:4 sparsity) datasheet peaks; link bandwidths are the per-GPU,
per-direction bus bandwidths NCCL reaches (about 3/4 of the NVLink datasheet figure), and the
inter-node bandwidth is one NIC per GPU as in DGX nodes. Sources: NVIDIA A100 datasheet (312 TFLOP/s
bf16, 2.0 TB/s HBM2e, NVLink 3 at 600 GB/s both ways), DGX A100 user guide (8 x 200 Gb/s HDR
InfiniBand for compute), NVIDIA H100 / H200 datasheets (989 TFLOP/s bf16 dense, 3.35 / 4.8 TB/s,
NVLink 4 at 900 GB/s both ways), DGX H100 (8 x 400 Gb/s NDR).

``local`` is calibrated by microbenchmarks so the same cost model predicts the CPU runs of this lab:
torch matmul throughput, memory copy bandwidth, and a gloo all-reduce between two local processes
(latency from a tiny tensor, bandwidth from a larger one). The result is cached as JSON in
``$PARALAB_CACHE`` (default ``~/.cache/paralab``); torch is imported only here, only when calibrating.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from paralab.sim.specs import HardwareSpec, SpecError

GiB = 1024**3

PRESETS: dict[str, HardwareSpec] = {
    "a100": HardwareSpec(
        name="a100",
        peak_flops={"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
        memory_bytes=80 * GiB,
        memory_bandwidth=2.039e12,
        gpus_per_node=8,
        intra_bw=230e9,
        intra_latency=5e-6,
        inter_bw=23e9,
        inter_latency=10e-6,
        matmul_max_efficiency=0.8,
        notes="A100 80GB SXM in DGX A100 nodes: NVLink 3 / NVSwitch inside, 8 x HDR 200 Gb/s between",
    ),
    "h100": HardwareSpec(
        name="h100",
        peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
        memory_bytes=80 * GiB,
        memory_bandwidth=3.35e12,
        gpus_per_node=8,
        intra_bw=360e9,
        intra_latency=5e-6,
        inter_bw=45e9,
        inter_latency=10e-6,
        matmul_max_efficiency=0.7,
        notes="H100 SXM in DGX H100 nodes: NVLink 4 / NVSwitch inside, 8 x NDR 400 Gb/s between",
    ),
    "h200": HardwareSpec(
        name="h200",
        peak_flops={"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
        memory_bytes=141e9,
        memory_bandwidth=4.8e12,
        gpus_per_node=8,
        intra_bw=360e9,
        intra_latency=5e-6,
        inter_bw=45e9,
        inter_latency=10e-6,
        matmul_max_efficiency=0.7,
        notes="H200 SXM (H100 compute, 141 GB HBM3e) in 8-GPU HGX nodes, 8 x NDR 400 Gb/s between",
    ),
}
ALIASES = {"a100-80gb": "a100", "a100-sxm": "a100", "h100-sxm": "h100", "h200-sxm": "h200"}
NAMES = (*PRESETS, "local")


def get_hardware(name: str, recalibrate: bool = False) -> HardwareSpec:
    """A preset by name (case-insensitive); ``local`` loads the cached calibration or measures it."""
    key = ALIASES.get(name.lower(), name.lower())
    if key == "local":
        return local(recalibrate=recalibrate)
    if key not in PRESETS:
        raise SpecError(f"unknown hardware {name!r}; choose from {', '.join(NAMES)}")
    return PRESETS[key]


def cache_dir() -> Path:
    return Path(os.environ.get("PARALAB_CACHE") or Path.home() / ".cache" / "paralab")


def local(recalibrate: bool = False, matmul_size: int = 1024, gloo: bool = True) -> HardwareSpec:
    """This machine as seen by CPU ranks, from the cache when present, else measured (< 30 s) and cached."""
    path = cache_dir() / "local_hardware.json"
    if path.exists() and not recalibrate:
        return HardwareSpec.from_dict(json.loads(path.read_text()))
    spec = calibrate(matmul_size=matmul_size, gloo=gloo)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_dict(), indent=1))
    return spec


def calibrate(matmul_size: int = 1024, gloo: bool = True, allreduce_bytes: int = 4 * 2**20) -> HardwareSpec:
    """Measure this machine: fp32 matmul FLOP/s, copy bandwidth, and (optionally) gloo all-reduce alpha-beta.

    The matmul rate is the best of a few repeats with every thread, so it is the whole machine's rate;
    CPU ranks share it (``shared_compute``), which is how the lab runs them. Without ``gloo`` the link
    figures are a loopback guess (20 us, 1 GB/s) so tests can calibrate in well under a second.
    """
    import torch

    n = matmul_size
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(5))
    flops = 2 * n**3 / best
    src = torch.empty(16 * 2**20 // 4)
    dst = torch.empty_like(src)
    copy = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    latency, bandwidth = _gloo_alpha_beta(allreduce_bytes) if gloo else (20e-6, 1e9)
    cores = os.cpu_count() or 1
    return HardwareSpec(
        name="local",
        peak_flops={"fp32": flops, "bf16": flops, "fp16": flops},
        memory_bytes=_total_memory(),
        memory_bandwidth=2 * src.numel() * 4 / copy,
        gpus_per_node=max(cores, 2),
        intra_bw=bandwidth,
        intra_latency=latency,
        inter_bw=bandwidth,
        inter_latency=latency,
        # the cost model's shape factor (n / (n + 32))^3 gives exactly the measured rate at size n
        matmul_max_efficiency=((n + 32.0) / n) ** 3,
        matmul_half_dim=32.0,
        kernel_overhead_s=10e-6,
        shared_compute=True,
        notes=f"this machine ({cores} cores), torch {torch.__version__}, calibrated {time.strftime('%Y-%m-%d %H:%M')}",
        calibration={"matmul_size": n, "matmul_s": best, "gloo": gloo, "allreduce_bytes": allreduce_bytes},
    )


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _total_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16.0 * GiB


def _gloo_alpha_beta(nbytes: int, timeout: float = 25.0) -> tuple[float, float]:
    """All-reduce a tiny and a large tensor between two local gloo processes; fit t = alpha + wire/beta.

    Ring accounting: a 2-rank all-reduce puts 2(n-1)/n = 1 x the tensor on the wire per rank. The
    workers are fresh interpreters (``python -m paralab.sim.hardware``), so calibrating works from a
    notebook or a script without a ``__main__`` guard.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "paralab.sim.hardware", str(port), str(nbytes)]
    procs = [subprocess.Popen([*cmd, str(r)], stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"gloo calibration failed (exit codes {[p.returncode for p in procs]})")
    small, large = json.loads(outputs[0])
    return small, nbytes / max(large - small, 1e-9)


def _gloo_worker(port: int, nbytes: int, rank: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        times = []
        for numel in (1, nbytes // 4):
            t = torch.ones(numel)
            for _ in range(3):
                dist.all_reduce(t)
            dist.barrier()
            times.append(min(_timed(lambda t=t: dist.all_reduce(t)) for _ in range(10)))
        print(json.dumps(times))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _gloo_worker(*(int(a) for a in sys.argv[1:4]))
