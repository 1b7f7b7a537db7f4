"""A plain torch DDP job that profiles itself: what an engineer runs under torchrun, paralab nowhere.

    torchrun --nproc-per-node 2 tests/ddp_profiled_job.py OUT_DIR

Two gloo ranks train a small MLP with torch's DistributedDataParallel (bucket cap 0.05 MB, so a step
all-reduces its gradients in several buckets) and Adam for 5 iterations under torch.profiler
(wait 1, warm up 1, record 3: ProfilerStep#2..4), with shapes and memory recorded; each rank writes
OUT_DIR/rank{r}.json.gz. tests/test_trace_import.py imports them.
"""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule

HIDDEN, WIDTH, BATCH, ITERATIONS = 64, 256, 32, 5


def model() -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(nn.Linear(HIDDEN, WIDTH), nn.GELU(), nn.Linear(WIDTH, HIDDEN))


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(model(), bucket_cap_mb=0.05)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 record_shapes=True, profile_memory=True,
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out_dir}/rank{rank}.json.gz")) as prof:
        for _ in range(ITERATIONS):
            x, y = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
