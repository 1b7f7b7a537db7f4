"""``make gpu-check`` / ``python -m paralab.gpu_check``: every strategy on the visible GPUs, in one go.

For whoever has a GPU machine: each strategy runs a few steps on CUDA with NCCL at the visible GPU
count (world size 1 on one GPU), in bf16 (fp16 where the GPU has no bf16) with activation
recomputation on, and its losses are checked against the same run on one GPU; then the CUDA tests
(tests/test_cuda.py) run. A table says what passed, how fast and how much memory it took. Without
CUDA it says so and exits 0: nothing here can fail a CPU-only machine. It is sized to finish in
well under five minutes on one node.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

STEPS = 4
TOLERANCE = 2e-2  # 16-bit runs of one strategy against one GPU: reductions in another order round otherwise


def shapes(gpus: int, model: str) -> dict[str, dict]:
    """Each strategy's options at ``gpus`` ranks (the hybrids need at least 2 and 4), with the model it
    trains: the preset, or for expert parallel the preset with a mixture of experts in every block
    (dropless, no balancing loss, so that it matches its own single-GPU run step for step)."""
    from paralab import MODEL_PRESETS

    pipeline = dict(microbatches=max(2, gpus))
    out = {name: {} for name in ("dp", "ddp", "tp", "zero1", "zero2", "zero3", "cp", "torch_ddp",
                                 "torch_fsdp", "torch_tp")}
    out.update(mp={}, pp=pipeline, torch_pp=pipeline)
    moe = {**MODEL_PRESETS[model].__dict__, "experts": max(8, gpus), "top_k": 2, "aux_loss": 0.0}
    out["ep"] = dict(model=moe)
    if gpus >= 2:
        out["torch_hybrid"] = dict(tp=2)
        out["hybrid"] = dict(tp=2, pp=2 if gpus >= 4 else 1, **pipeline)
    return {name: {"model": model, **options} for name, options in out.items()}


def run_all(gpus: int, model: str, dtype: str, device: str = "cuda") -> list[dict]:
    """Every strategy at ``gpus`` ranks against its model on one rank; a row per strategy.
    (``device="cpu"`` runs the same check on CPU ranks: the test suite exercises it so, without a GPU.)"""
    import paralab

    rows, references = [], {}
    # a hung strategy (NCCL's sends and receives in issue order, say) is reported after two minutes, and
    # the check goes on with the next, not after the run's default five
    common = dict(steps=STEPS, device=device, dtype=dtype, global_batch=8 * gpus, timeout_s=120.0)
    for name, options in shapes(gpus, model).items():
        recompute = "selective" if name in ("pp", "torch_pp") else "full"
        started = time.perf_counter()
        try:
            key = repr(options["model"])
            if key not in references:
                references[key] = paralab.run("single", 1, model=options["model"], **common).losses
            result = paralab.run(name, gpus, recompute=recompute, **common, **options)
            worst = max(abs(a - b) / abs(b) for a, b in zip(result.losses, references[key]))
            s = result.summary
            rows.append(dict(strategy=name, ok=worst <= TOLERANCE, note=f"max rel. loss diff {worst:.1e}",
                             step_ms=s["step_time_s"] * 1e3, tokens_per_s=s["tokens_per_s"],
                             peak_gib=max(s["peak_memory_bytes"]) / 2**30))
        except Exception as exc:  # report, and go on with the next strategy
            rows.append(dict(strategy=name, ok=False, note=f"{type(exc).__name__}: {str(exc)[:120]}",
                             step_ms=0.0, tokens_per_s=0.0, peak_gib=0.0))
        rows[-1]["wall_s"] = time.perf_counter() - started
    return rows


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible; nothing to check "
              "(CPU-only machines pass make test alone)")
        return 0
    gpus = torch.cuda.device_count()
    dtype = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"  # V100, T4: fp16
    model = "medium"
    print(f"gpu-check: {gpus} x {torch.cuda.get_device_name(0)}, model {model}, {dtype}, "
          f"{STEPS} steps per run")
    rows = run_all(gpus, model, dtype)
    print(f"\n{'strategy':<14}{'result':<8}{'step ms':>9}{'tokens/s':>11}{'peak GiB':>10}{'wall s':>8}  note")
    for r in rows:
        print(f"{r['strategy']:<14}{'pass' if r['ok'] else 'FAIL':<8}"
              f"{r['step_ms']:>9.1f}{r['tokens_per_s']:>11.0f}{r['peak_gib']:>10.2f}{r['wall_s']:>8.1f}"
              f"  {r['note']}")
    tests = Path(__file__).resolve().parents[1] / "tests" / "test_cuda.py"
    code = 0
    if tests.exists():
        print("\ngpu-check: the CUDA tests")
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                                str(tests)])
    failed = [r["strategy"] for r in rows if not r["ok"]]
    print(f"\ngpu-check: {len(rows) - len(failed)} of {len(rows)} strategies passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + ("; CUDA tests failed" if code else ""))
    return 1 if failed or code else 0


if __name__ == "__main__":
    raise SystemExit(main())
