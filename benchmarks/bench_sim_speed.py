"""How fast the simulator answers: GPT-3 175B on 1,024 A100s, and ``paralab plan`` for 1,024 GPUs.

    python benchmarks/bench_sim_speed.py

Goals (issues 7 and 17): one prediction of the 1,024-GPU configuration (tp 8, pp 16, dp 8, 64+
microbatches) in under 100 ms end to end, and planning 1,024 GPUs in under 5 s, also where context
parallelism (a long sequence) or expert parallelism (a mixture of experts) joins the search. "Cold"
is the first request of a schedule shape in this process (it builds and proves the schedule); "warm"
repeats it (the proof is cached per shape). Medians of a few repeats; a shared machine inflates every
figure. Also timed, beyond the goals: Llama 3 405B as it ran on 16,384 GPUs (128 chunks of one layer)
and planning it there (uneven splits and ZeRO beside pipelines widen the search).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from paralab.bench import benchmark_parser


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    from paralab.schedules import validated_schedule
    from paralab.sim import ParallelSpec, get_hardware, get_model, plan, predict
    from paralab.sim.events import builtin_plan
    from paralab.stage_split import ends_split

    model, hw = get_model("gpt3-175b"), get_hardware("a100")
    rows = ["| what | cold (ms) | warm median (ms) |", "|---|---|---|"]
    for schedule, v, m in (("1f1b", 1, 64), ("interleaved", 2, 64), ("1f1b", 1, 128), ("zbv", 2, 64)):
        spec = ParallelSpec(dp=8, tp=8, pp=16, virtual_stages=v, schedule=schedule, microbatches=m,
                            sequence_parallel=True, recompute="selective")
        validated_schedule.cache_clear()
        builtin_plan.cache_clear()
        cold = _timed(lambda spec=spec: predict(model, spec, hw))
        warm = statistics.median(_timed(lambda spec=spec: predict(model, spec, hw)) for _ in range(5))
        rows.append(f"| predict 175B, 1,024 GPUs, {schedule} v={v}, m={m} "
                    f"| {cold * 1e3:.1f} | {warm * 1e3:.1f} |")
    planned = _timed(lambda: plan(model, 1024, hw))
    rows.append(f"| plan 175B on 1,024 GPUs (in process) | {planned * 1e3:.0f} | |")
    big, h100 = get_model("llama3-405b"), get_hardware("h100")
    spec = ParallelSpec(dp=128, tp=8, pp=16, virtual_stages=8, schedule="interleaved", micro_batch=1,
                        global_batch=2048, sequence_parallel=True, zero=1,
                        stage_layers=ends_split(126, 16 * 8, 0, 0))
    cold = _timed(lambda: predict(big, spec, h100))
    warm = statistics.median(_timed(lambda: predict(big, spec, h100)) for _ in range(5))
    rows.append(f"| predict Llama 3 405B, 16,384 GPUs, interleaved v=8, m=16 | {cold * 1e3:.1f} | "
                f"{warm * 1e3:.1f} |")
    planned = _timed(lambda: plan(big, 16384, h100, 2048))
    rows.append(f"| plan 405B on 16,384 GPUs (in process) | {planned * 1e3:.0f} | |")
    long = get_model("llama3-8b").replace(seq=131072)
    planned = _timed(lambda: plan(long, 1024, h100, 1024))  # a sequence a GPU: more layouts than the default
    rows.append("| plan Llama 3 8B at 131,072 tokens, 1,024 sequences, on 1,024 GPUs (cp in the search; "
                f"in process) | {planned * 1e3:.0f} | |")
    moe = get_model("mixtral-8x7b")
    planned = _timed(lambda: plan(moe, 1024, h100))
    rows.append(f"| plan Mixtral 8x7B on 1,024 GPUs (ep in the search; in process) | {planned * 1e3:.0f} | |")
    cli = [sys.executable, "-m", "paralab", "plan", "--model", "gpt3-175b", "--gpus", "1024",
           "--hardware", "a100"]
    whole = _timed(lambda: subprocess.run(cli, check=True, capture_output=True))
    rows.append("| `paralab plan` 175B on 1,024 GPUs (whole command, interpreter start included) "
                f"| {whole * 1e3:.0f} | |")
    print("\n".join(rows))


if __name__ == "__main__":
    benchmark_parser(__doc__).parse_args()  # --help, and no stray flags
    main()
