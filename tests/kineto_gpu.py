"""A two-rank, two-step GPU profile in the Kineto format: the fixture of tests/data/kineto_gpu/.

No GPU takes part in the tests, so this writes what torch.profiler writes for a DDP step on CUDA with
NCCL, event by event, following torch's own exporter: ``torch/profiler/_chrome_trace_export.py``
(torch 2.13, the streaming Python exporter) and libkineto's ``output_json.cpp`` with the kernel and
memcpy arguments of ``CuptiActivity.cpp`` (pytorch/kineto). What it takes from them:

- top level: ``schemaVersion``, ``deviceProperties`` (one dict per GPU), ``distributedInfo``
  (backend, rank, world_size, pg_count, pg_config), ``displayTimeUnit``, ``baseTimeNanoseconds``
  (the Unix time, in ns, that ``ts`` counts from), ``traceEvents``, ``traceName``;
- metadata events (``ph: M``): ``process_name`` / ``process_labels`` / ``process_sort_index`` per
  device (the host process pid labelled "CPU", GPU i as pid i labelled "GPU i"), ``thread_name``
  per thread ("thread T") and per stream ("stream S ");
- complete events (``ph: X``, ``ts`` and ``dur`` in microseconds): ``cat`` is the activity type —
  ``cpu_op`` and ``user_annotation`` on host threads (pid = host pid, tid = thread id),
  ``cuda_runtime`` (cudaLaunchKernel, cudaMemcpyAsync) on the launching thread, ``kernel``,
  ``gpu_memcpy``, ``gpu_memset`` and ``gpu_user_annotation`` on streams (pid = device, tid = stream);
- args: a host op's ``External id`` is its correlation id; a kernel's or runtime call's ``External
  id`` is that of the host op that launched it, and they share ``correlation``; kernels add queued,
  device, context, stream, registers per thread, shared memory, blocks and warps per SM, grid, block,
  est. achieved occupancy %; memcpy and memset add bytes and memory bandwidth (GB/s); autograd ops
  carry ``Sequence number`` and ``Fwd thread id`` (0 on the forward thread; the forward thread's id
  on backward ops, which run on the autograd engine's thread ``pt_autograd_0``);
- ``record_param_comms`` (the op ProcessGroupNCCL wraps each collective in) carries the collective's
  metadata (torch/csrc/profiler/util.cpp, saveNcclMeta): Collective name, dtype (c10 ScalarType name),
  In/Out msg nelems, In/Out split size, Global rank start/stride, Group size, Process Group
  Name/Description/Ranks (a string "[0, 1]"), Rank, Seq, and Dst Rank / Src Rank for send / recv;
  the NCCL kernel it launched carries the same keys (the exporters copy them onto the kernel);
- flows: ``ac2g`` (``s`` on the runtime call, ``f`` with ``bp: e`` on the kernel, id = correlation),
  ``fwdbwd`` between a forward op and its backward;
- ``[memory]`` instant events (``ph: i``, ``cat: cpu_instant_event``) with Total Allocated, Total
  Reserved, Bytes, Addr, Device Type (1: CUDA) and Device Id;
- ``ProfilerStep#N`` as a user_annotation and its projection on the GPU as a gpu_user_annotation.

The run it describes, per step and rank (times in us from the step's start; rank 1 works 40 us
behind rank 0 and its clock reads 3 ms ahead, so an import must shift it back by 3 ms):

    host main thread   aten::to (H2D copy), DistributedDataParallel.forward > aten::linear > aten::addmm,
                       aten::mse_loss, Optimizer.zero_grad#AdamW.zero_grad, ..., Optimizer.step#AdamW.step
    autograd thread    evaluate_function: AddmmBackward0 (two GEMMs), evaluate_function: AccumulateGrad >
                       c10d::allreduce_ > record_param_comms > nccl:all_reduce (launches the all-reduce)
    stream 7           memcpy 60-80, sgemm 100-300, elementwise 305-315, memset 318-320,
                       sgemm 330-520, sgemm 530-650, multi_tensor_apply 850-950
    stream 20          ncclDevKernel_AllReduce 525-800 (1 MiB of fp32: 262144 elements)
    stream 24          ncclDevKernel_SendRecv 960-990 (rank 0 sends 4096 fp32 to rank 1)

``python tests/kineto_gpu.py`` writes tests/data/kineto_gpu/rank0.json and rank1.json.gz.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

STEP_US = 1000
STEPS = (5, 6)  # ProfilerStep numbers: the profiler counts iterations, not profiled steps
SKEW_US = 3000  # rank 1's clock reads this far ahead
LAG_US = 40  # rank 1 works this far behind rank 0
BASE_NS = 1_790_857_026_000_000_000
ALLREDUCE_ELEMENTS, SEND_ELEMENTS = 262144, 4096
NCCL_ARGS = "(ncclDevComm*, unsigned long, ncclWork*)"


class _Writer:
    """Collects one rank's events; times are us from the start of profiling, in the rank's own work."""

    def __init__(self, rank: int, paralab_ranges: bool):
        self.rank, self.paralab_ranges = rank, paralab_ranges
        self.host = 4000 + rank  # the host process id, and the main thread's
        self.main, self.autograd = 4000 + rank, 4100 + rank
        self.lag = LAG_US if rank == 1 else 0
        self.events: list[dict] = []
        self.next_id = 1

    def clock(self, t: float) -> float:
        """The ts the rank's profiler writes for time t of its work."""
        return 5_000_000.0 + t + self.lag + (SKEW_US if self.rank == 1 else 0)

    def op(self, name: str, cat: str, start: float, end: float, tid=None, **args) -> int:
        """A host op or range; returns its External id (correlation id)."""
        ext = self.next_id
        self.next_id += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.host, "tid": tid or self.main,
                            "ts": self.clock(start), "dur": end - start,
                            "args": {"External id": ext, "Record function id": 0, **args}})
        return ext

    def device(self, name: str, cat: str, span: tuple, stream: int, ext: int, launch_at: float, tid=None,
               runtime: str = "cudaLaunchKernel", **args) -> None:
        """A kernel, memcpy or memset on a stream, its runtime call on the launching thread, the ac2g flow."""
        corr = 100000 + self.next_id
        self.next_id += 1
        tid = tid or self.main
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": self.host, "tid": tid,
                            "ts": self.clock(launch_at), "dur": 5.0,
                            "args": {"External id": ext, "cbid": 211, "correlation": corr}})
        self.events.append({"ph": "s", "id": corr, "pid": self.host, "tid": tid, "ts": self.clock(launch_at),
                            "cat": "ac2g", "name": "ac2g"})
        gpu = {"device": self.rank, "context": 1, "stream": stream, "correlation": corr}
        if cat == "kernel":
            gpu = {"queued": 0, **gpu, "registers per thread": 128, "shared memory": 16384,
                   "blocks per SM": 1.2, "warps per SM": 9.6, "grid": [128, 1, 1], "block": [256, 1, 1],
                   "est. achieved occupancy %": 25}
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.rank, "tid": stream,
                            "ts": self.clock(span[0]), "dur": span[1] - span[0],
                            "args": {"External id": ext, **gpu, **args}})
        self.events.append({"ph": "f", "id": corr, "pid": self.rank, "tid": stream, "ts": self.clock(span[0]),
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def gpu_range(self, name: str, start: float, end: float, ext: int) -> None:
        """A host range projected on the GPU: it spans the kernels launched inside it."""
        self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": self.rank, "tid": 7,
                            "ts": self.clock(start), "dur": end - start, "args": {"External id": ext}})

    def comms(self, collective: str, elements: int, **extra) -> dict:
        """record_param_comms' metadata for a collective of fp32 ``elements`` over both ranks."""
        return {"Collective name": collective, "dtype": "Float", "In msg nelems": elements,
                "Out msg nelems": elements, "In split size": "[]", "Out split size": "[]",
                "Global rank start": 0, "Global rank stride": 1, "Group size": 2, "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Rank": self.rank,
                **extra}

    def step(self, n: int, t: float) -> None:
        self.op(f"ProfilerStep#{n}", "user_annotation", t, t + STEP_US)
        self.gpu_range(f"ProfilerStep#{n}", t + 60, t + 950, 0)
        if self.paralab_ranges:  # the recorder's clock: time since the barrier, which rank 1 left later
            clock = (t + self.lag + 1) * 1e-6
            self.op(f"paralab step:step step={n} name=step%20{n} clock={clock:.9f}", "user_annotation",
                    t + 1, t + STEP_US - 1)
            forward = self.op(f"paralab compute:forward step={n}", "user_annotation", t + 50, t + 295)
            self.gpu_range(f"paralab compute:forward step={n}", t + 100, t + 315, forward)
        copy = self.op("aten::to", "cpu_op", t + 10, t + 30)
        self.device("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", (t + 60, t + 80), 7, copy, t + 15,
                    runtime="cudaMemcpyAsync", bytes=65536, **{"memory bandwidth (GB/s)": 3.3})
        self.op("DistributedDataParallel.forward", "user_annotation", t + 50, t + 250)
        autograd = {"Sequence number": 10 + 10 * n, "Fwd thread id": 0}
        self.op("aten::linear", "cpu_op", t + 60, t + 200, **autograd)
        mm = self.op("aten::addmm", "cpu_op", t + 70, t + 190)
        self.device("ampere_sgemm_128x64_tn", "kernel", (t + 100, t + 300), 7, mm, t + 80)
        loss = self.op("aten::mse_loss", "cpu_op", t + 260, t + 290,
                       **{**autograd, "Sequence number": 11 + 10 * n})
        self.device("void at::native::elementwise_kernel<128, 2>(int, Loss)", "kernel", (t + 305, t + 315), 7,
                    loss, t + 270)
        self.op("Optimizer.zero_grad#AdamW.zero_grad", "user_annotation", t + 292, t + 300)
        zero = self.op("aten::zero_", "cpu_op", t + 293, t + 299)
        self.device("Memset (Device)", "gpu_memset", (t + 318, t + 320), 7, zero, t + 295,
                    runtime="cudaMemsetAsync", bytes=4096, **{"memory bandwidth (GB/s)": 2.0})
        self._backward(n, t)
        self.op("Optimizer.step#AdamW.step", "user_annotation", t + 820, t + 900)
        foreach = self.op("aten::_foreach_add_", "cpu_op", t + 830, t + 840)
        self.device("void multi_tensor_apply_kernel<AdamW>(...)", "kernel", (t + 850, t + 950), 7, foreach,
                    t + 835)
        self._send_or_recv(t)
        memory = {"Total Reserved": 8 << 20, "Total Allocated": (3 << 20) + self.rank * 4096, "Bytes": 65536,
                  "Addr": 139842, "Device Id": self.rank, "Device Type": 1}
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                            "pid": self.host, "tid": self.main, "ts": self.clock(t + 30), "args": memory})

    def _backward(self, n: int, t: float) -> None:
        ag = self.autograd
        self.op("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", t + 320, t + 425, tid=ag,
                **{"Sequence number": 10 + 10 * n, "Fwd thread id": 1})
        for start, end, launch in ((330, 520, 325), (530, 650, 400)):
            mm = self.op("aten::mm", "cpu_op", t + launch - 3, t + launch + 10, tid=ag)
            self.device("ampere_sgemm_64x64_nn", "kernel", (t + start, t + end), 7, mm, t + launch, tid=ag)
        self.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "cpu_op",
                t + 430, t + 480, tid=ag)
        self.op("c10d::allreduce_", "cpu_op", t + 440, t + 470, tid=ag)
        metadata = self.comms("allreduce", ALLREDUCE_ELEMENTS, Seq=n)
        rpc = self.op("record_param_comms", "cpu_op", t + 445, t + 468, tid=ag, **metadata)
        self.op("nccl:all_reduce", "user_annotation", t + 446, t + 466, tid=ag)
        # every rank leaves the all-reduce at the same instant: rank 1 came later, so it runs shorter
        self.device(f"ncclDevKernel_AllReduce_Sum_f32_RING_LL{NCCL_ARGS}", "kernel",
                    (t + 525 - self.lag, t + 800 - self.lag), 20, rpc, t + 460, tid=ag, **metadata)

    def _send_or_recv(self, t: float) -> None:
        """Rank 0 sends SEND_ELEMENTS fp32 to rank 1 (NCCL's SendRecv kernel on its p2p stream)."""
        p2p, peer = ("send", {"Dst Rank": 1}) if self.rank == 0 else ("recv", {"Src Rank": 0})
        self.op("c10d::send" if p2p == "send" else "c10d::recv_", "cpu_op", t + 905, t + 940)
        metadata = self.comms(p2p, SEND_ELEMENTS, **peer)
        rpc = self.op("record_param_comms", "cpu_op", t + 906, t + 939, **metadata)
        self.device(f"ncclDevKernel_SendRecv{NCCL_ARGS}", "kernel", (t + 960, t + 990), 24, rpc, t + 930,
                    **metadata)

    def document(self) -> dict:
        """The whole file: top-level keys, metadata events, then the events."""
        at = self.clock(0)
        meta = []
        for pid, label in ((self.host, "CPU"), (self.rank, f"GPU {self.rank}")):
            meta += [{"ph": "M", "name": "process_name", "ts": at, "pid": pid, "tid": 0,
                      "args": {"name": "python"}},
                     {"ph": "M", "name": "process_labels", "ts": at, "pid": pid, "tid": 0,
                      "args": {"labels": label}}]
        meta += [{"ph": "M", "name": "thread_name", "ts": at, "pid": self.host, "tid": tid,
                  "args": {"name": f"thread {tid}"}} for tid in (self.main, self.autograd)]
        meta += [{"ph": "M", "name": "thread_name", "ts": at, "pid": self.rank, "tid": s,
                  "args": {"name": f"stream {s} "}} for s in (7, 20, 24)]
        device = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984, "computeMajor": 9,
                  "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 132,
                  "regsPerMultiprocessor": 65536, "warpSize": 32}
        group = {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2,
                 "ranks": [0, 1]}
        window_end = {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "",
                      "ts": self.clock(len(STEPS) * STEP_US + 100)}
        return {
            "schemaVersion": 1,
            "deviceProperties": [{"id": i, **device} for i in range(2)],
            "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": 2, "pg_count": 1,
                                "pg_config": [group], "nccl_version": "2.21.5"},
            "host_name": f"gpu-node-{self.rank}",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_NS,
            "traceEvents": meta + self.events + [window_end],
            "traceName": f"rank{self.rank}.json",
        }


def gpu_profile(rank: int, paralab_ranges: bool = False) -> dict:
    """The profile of one rank; ``paralab_ranges`` adds paralab step ranges, as a profiled paralab run has."""
    writer = _Writer(rank, paralab_ranges)
    for i, n in enumerate(STEPS):
        writer.step(n, i * STEP_US)
    return writer.document()


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "rank0.json", directory / "rank1.json.gz"]
    paths[0].write_text(json.dumps(gpu_profile(0), indent=1))
    paths[1].write_bytes(gzip.compress(json.dumps(gpu_profile(1)).encode(), mtime=0))
    return paths


if __name__ == "__main__":
    print(*write(Path(__file__).parent / "data" / "kineto_gpu"))
