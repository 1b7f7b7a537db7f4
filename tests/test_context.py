"""Context parallel (cp): ring attention and all-to-all (Ulysses) against single-device training,
torch's own context parallel, the analytic communication volume, memory, causal balance, and the
refusals before launch.

Each launch is shared by several checks (the ``runs`` cache). The parity model is small (the
per-rank slice is 4 tokens at cp 4); the memory and balance models have long sequences, where
attention and activations dominate.
"""

from __future__ import annotations

import json

import pytest
import torch

import paralab
from paralab import cli
from paralab.config import ConfigError
from paralab.layout import mesh_layout
from paralab.runtime import launch as launch_module
from paralab.sim import context as sim_context
from paralab.sim.bridge import specs_from_run
from paralab.strategies.sequence_split import attention_pairs, imbalance, rank_chunks, rank_positions
from tests.conftest import assert_close_rel, assert_replicas_agree, assert_same_params

STEPS, BATCH, LR = 3, 4, 0.05
MODEL = dict(layers=2, hidden=32, heads=4, vocab=64, seq_len=16)
MODES = [(n, mode, split) for n in (2, 4) for mode in ("ring", "alltoall")
         for split in ("zigzag", "contiguous")]


@pytest.fixture(scope="module")
def runs():
    """runs(strategy, world, **options) -> RunResult (SGD, parity model), each launched once per module."""
    cache = {}

    def get(strategy, world, **options):
        key = (strategy, world, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = paralab.run(strategy, world, steps=STEPS, model=MODEL, global_batch=BATCH,
                                     optimizer="sgd", lr=LR, collect_state=True, **options)
        return cache[key]

    return get


# ------------------------------------------------------------------------------------- the split
def test_zigzag_pairs_a_front_chunk_with_its_mirror_and_every_token_is_held_once():
    assert [rank_chunks(r, 4, "zigzag") for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [rank_chunks(r, 2, "contiguous") for r in range(2)] == [(0, 1), (2, 3)]
    for split in ("zigzag", "contiguous"):
        held = [p for r in range(4) for p in rank_positions(32, r, 4, split)]
        assert sorted(held) == list(range(32))
    assert rank_positions(16, 1, 2, "zigzag") == [4, 5, 6, 7, 8, 9, 10, 11]


def test_the_pairs_a_rank_computes_counted_by_hand():
    """Two ranks. Chunks of 2 tokens (diagonal tiles of one row each): exactly the causal pairs, 36 of
    8 tokens; contiguous, rank 0's queries 0-3 see 1+2+3+4 keys and rank 1's 4-7 see 5+6+7+8; zig-zag,
    0,1,6,7 and 2,3,4,5 see 18 each. Chunks of 8 (4 tiles of 2 rows): a diagonal chunk computes
    2 x (2 + 4 + 6 + 8) = 40 pairs of its 64 (5/8), a chunk met whole 64."""
    assert [attention_pairs(r, 2, "contiguous", 8) for r in range(2)] == [10, 26]
    assert [attention_pairs(r, 2, "zigzag", 8) for r in range(2)] == [18, 18]
    diagonal, whole = 40, 64
    assert [attention_pairs(r, 2, "contiguous", 32) for r in range(2)] == [
        diagonal + (whole + diagonal), (2 * whole + diagonal) + (3 * whole + diagonal)]
    assert [attention_pairs(r, 2, "zigzag", 32) for r in range(2)] == [
        diagonal + (3 * whole + diagonal), (whole + diagonal) + (2 * whole + diagonal)]


def test_the_work_model_zigzag_balanced_contiguous_close_to_2n_minus_1():
    """Query-key pairs per rank: zig-zag gives every rank the same; a contiguous split gives the last
    rank about 2N-1 times the first's (exactly 2N-1 if a diagonal cost half its square; the staircase
    of 4 tiles computes 5/8 of it)."""
    for n in (2, 4, 8):
        assert imbalance(n, "zigzag", 64 * n) == 1.0
        assert 0.85 * (2 * n - 1) <= imbalance(n, "contiguous", 64 * n) < 2 * n - 1


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_ring_attention_computes_in_fp32_whatever_travels(dtype, tolerance):
    """One rank's ring (no hops): its tiles, merge and backward against torch's attention in fp32;
    16-bit inputs keep their dtype outside (output and gradients) and lose only their own rounding."""
    from paralab.strategies.ring_attention import ContextParallelGroup, ring_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 32, 8) for _ in range(3))
    reference = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*reference, is_causal=True)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    ours = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*ours, ContextParallelGroup(None, (0,), 0), "L0")
    out.backward(grad.to(dtype))
    assert out.dtype == dtype and all(t.grad.dtype == dtype for t in ours)
    for got, want in [(out, expected)] + [(t.grad, r.grad) for t, r in zip(ours, reference)]:
        assert (got.float() - want).abs().max() <= tolerance * want.abs().max()


def test_cp_sits_between_dp_and_tp_on_the_mesh():
    layout = mesh_layout(dp=2, cp=2, tp=2)
    assert layout.coord(3) == {"pp": 0, "dp": 0, "cp": 1, "tp": 1}
    assert layout.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("dp", "cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]  # the ranks that average gradients
    assert layout.text().splitlines()[1].split() == ["cp0tp0", "cp0tp1", "cp1tp0", "cp1tp1"]


# ------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize("n, mode, split", MODES)
def test_same_losses_parameters_and_gradients_as_single_device(runs, n, mode, split, no_leftover_ranks):
    ours, single = runs("cp", n, cp_mode=mode, cp_split=split), runs("single", 1)
    assert (ours.layout.cp, ours.summary["cp"], ours.summary["cp_mode"]) == (n, n, mode)
    assert_close_rel(ours.losses, single.losses, what=f"cp={n} {mode} {split} losses")
    assert_same_params(ours.params, single.params)
    assert_same_params(ours.grads, single.grads, atol=1e-7)
    assert all(r["losses"] is not None for r in ours.rank_results), "every cp rank reports its slice's loss"
    assert_replicas_agree(ours)  # every cp rank holds the whole model


@pytest.mark.parametrize("options", [
    dict(cp=2, dp=2, tp=2, cp_mode="ring", cp_split="zigzag"),
    dict(cp=2, pp=2, microbatches=2, cp_mode="alltoall", cp_split="contiguous"),
], ids=["cp2 x dp2 x tp2 ring", "cp2 x pp2 alltoall"])
def test_hybrid_with_cp_matches_single_device(runs, options, no_leftover_ranks):
    world = options["cp"] * options.get("dp", 1) * options.get("tp", 1) * options.get("pp", 1)
    ours, single = runs("hybrid", world, **options), runs("single", 1)
    assert_close_rel(ours.losses, single.losses, what=f"hybrid {options} losses")
    assert_same_params(ours.params, single.params)
    assert_same_params(ours.grads, single.grads, atol=1e-7)
    layout = ours.layout
    buckets = [s for s in ours.trace.select(kind="all_reduce") if s.name.startswith("bucket")]
    reducing = [sorted(s.group_ranks or range(world)) for s in buckets]
    assert reducing and all(g in layout.groups("dp", "cp") for g in reducing), "gradients: over dp x cp"
    for s in ours.trace.select(lane="comm"):
        if s.kind in ("send", "recv", "all_to_all") and s.name.startswith("L"):  # the cp traffic
            peers = [s.peer] if s.peer is not None else s.group_ranks
            assert set(peers) <= set(layout.group_of("cp", s.rank)), f"{s.name} left its cp group"


@pytest.mark.parametrize("options", [
    dict(cp=2, tp=2, sequence_parallel=True, cp_mode="ring", cp_split="zigzag"),
    dict(cp=2, dp=2, zero=1, cp_mode="alltoall", cp_split="zigzag"),
], ids=["cp2 x tp2 + sequence parallel", "cp2 x dp2 ZeRO-1"])
def test_cp_beside_sequence_parallel_or_zero_matches_single_device(runs, options, no_leftover_ranks):
    world = options["cp"] * options.get("dp", 1) * options.get("tp", 1)
    ours, single = runs("hybrid", world, **options), runs("single", 1)
    assert_close_rel(ours.losses, single.losses, what=f"hybrid {options} losses")
    assert_same_params(ours.params, single.params)
    assert_same_params(ours.grads, single.grads, atol=1e-7)


def _torch_context_parallel_rank(rank: int, out_dir: str) -> None:
    """One of two gloo ranks: torch's context_parallel on causal SDPA, and paralab's ring attention on
    the same zig-zag slices, each gathered and compared with single-device SDPA."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from paralab.strategies.ring_attention import ContextParallelGroup, ring_attention

    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=2)
    report = {}
    try:
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        held = torch.tensor(rank_positions(16, rank, 2, "zigzag"))
        ours = ring_attention(q[:, :, held], k[:, :, held], v[:, :, held],
                              ContextParallelGroup(None, (0, 1), rank, "zigzag"), "probe")
        report["ours"] = (ours - full[:, :, held]).abs().max().item()
        try:
            from torch.distributed.tensor.experimental import context_parallel
            from torch.distributed.tensor.experimental._attention import context_parallel_unshard

            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
            buffers = [t.clone() for t in (q, k, v)]
            with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
                local = F.scaled_dot_product_attention(*buffers, is_causal=True)
                (gathered,) = context_parallel_unshard(mesh, [local], [2])
            report["torch"] = (gathered - full).abs().max().item()
        except (NotImplementedError, RuntimeError) as exc:
            report["torch_refused"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        (__import__("pathlib").Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()


def test_against_torchs_own_context_parallel(tmp_path, no_leftover_ranks):
    """torch.distributed.tensor.experimental.context_parallel on two gloo ranks. Where it runs, its
    attention and paralab's ring attention both equal single-device attention; where torch refuses
    (on CPU its ring handles only the CUDA attention kernels), the test says why and skips, and the
    parity with single-device training above stands."""
    import torch.multiprocessing as mp

    mp.start_processes(_torch_context_parallel_rank, args=(str(tmp_path),),
                       nprocs=2, start_method="spawn")
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["ours"] < 1e-5 for r in reports), reports
    if "torch_refused" in reports[0]:
        pytest.skip(f"torch's context_parallel does not run here (CPU, gloo): {reports[0]['torch_refused']}")
    assert all(r["torch"] < 1e-5 for r in reports), reports


# ------------------------------------------------------------------------------------- traffic
def expected_cp_bytes(n: int, mode: str) -> dict[str, tuple[int, int]]:
    """op -> (payload, wire) bytes per step summed over ranks, from the config alone (fp32).

    A rank's slice of a layer's activation is b x S/N x h. Ring: each hop carries K and V (twice the
    slice); per layer and rank, N-1 hops forward, N-1 K/V hops and N dK/dV hops backward; a send puts
    its tensor on the wire, a receive nothing. All-to-all: q, k, v and the output forward, their
    gradients backward, each the slice, (N-1)/N of it on the wire."""
    m = MODEL
    piece = BATCH * m["seq_len"] // n * m["hidden"] * 4
    per_rank = n * m["layers"]
    if mode == "ring":
        sends = per_rank * (3 * n - 2) * 2 * piece
        return {"send": (sends, sends), "recv": (sends, 0)}
    return {"all_to_all": (per_rank * 8 * piece, per_rank * 8 * piece * (n - 1) // n)}


@pytest.mark.parametrize("n, mode, split", [m for m in MODES if m[2] == "zigzag"])
def test_traced_wire_bytes_equal_the_analytic_count(runs, n, mode, split, no_leftover_ranks):
    run = runs("cp", n, cp_mode=mode, cp_split=split)
    params = 4 * paralab.ModelConfig(**MODEL).param_count()
    expected = expected_cp_bytes(n, mode)
    expected["all_reduce"] = (n * params, n * 2 * (n - 1) * params // n)  # the gradients, one bucket
    assert run.summary["comm_payload_bytes"] == {op: payload for op, (payload, _) in expected.items()}
    assert run.summary["comm_bytes"] == {op: wire for op, (_, wire) in expected.items()}

    layers = MODEL["layers"]
    for rank in range(n):
        for step in range(STEPS):
            spans = [s for s in run.trace.select(lane="comm", rank=rank) if s.step == step]
            names = [s.name for s in spans if s.kind in ("send", "all_to_all")]
            for layer in range(layers):
                if mode == "ring":
                    assert names.count(f"L{layer} kv") == 2 * (n - 1) and names.count(f"L{layer} dkv") == n
                else:
                    forward = [f"L{layer} {x}" for x in ("q", "k", "v", "out")]
                    assert all(names.count(x) == 1 and names.count(f"{x} grad") == 1 for x in forward), names
    # the simulator counts the same bytes: per GPU, from the run's config alone
    model, spec = specs_from_run(run.config)
    counted = sim_context.comm_bytes_per_gpu(model, spec)
    (split,) = (v for k, v in counted.items() if k.startswith("cp_"))
    assert n * split == sum(wire for op, (_, wire) in expected.items() if op != "all_reduce")
    # every rank all-reduces the whole position table, though its slice reads only its rows
    assert n * counted["dp_all_reduce"] == expected["all_reduce"][1]
    if mode == "ring":  # the ring posts each K/V hop, then computes a block of attention as it travels
        for rank in range(n):
            order = sorted((s for s in run.trace.select(rank=rank)
                            if s.kind == "attention" or (s.kind == "send" and s.name.endswith(" kv"))),
                           key=lambda s: s.start)
            assert all(after.kind == "attention" for before, after in zip(order, order[1:])
                       if before.kind == "send"), [s.kind for s in order]


@pytest.mark.parametrize("mode, recompute, again", [("ring", "full", 1), ("alltoall", "full", 4),
                                                    ("ring", "selective", 1), ("alltoall", "selective", 3)])
def test_recompute_sends_the_forwards_hops_again_and_the_simulator_counts_them(runs, mode, recompute, again,
                                                                              no_leftover_ranks):
    """Full recompute reruns each layer's forward in backward, attention across the split included:
    the ring's N-1 K/V hops (4N-3 a layer, not 3N-2), the all-to-all's q, k, v and output (12 slices,
    not 8). Selective recompute reruns the attention core: the same hops, the q, k, v all-to-alls (11).
    The simulator had counted only the first forward's."""
    run = runs("cp", 2, cp_mode=mode, cp_split="zigzag", recompute=recompute)
    plain = expected_cp_bytes(2, mode)
    op = "send" if mode == "ring" else "all_to_all"
    per_layer = {"ring": 3 * 2 - 2, "alltoall": 8}[mode]
    assert run.summary["comm_bytes"][op] == plain[op][1] * (per_layer + again) // per_layer
    model, spec = specs_from_run(run.config)
    (counted,) = (v for k, v in sim_context.comm_bytes_per_gpu(model, spec).items() if k.startswith("cp_"))
    assert 2 * counted == run.summary["comm_bytes"][op]


# ------------------------------------------------------------------------------------- memory and balance
LONG = dict(layers=2, hidden=32, heads=4, vocab=64, seq_len=512)


@pytest.mark.parametrize("mode", ["ring", "alltoall"])
def test_activation_memory_per_rank_falls_as_one_over_n(mode, no_leftover_ranks):
    def activations(strategy, world, **options):
        run = paralab.run(strategy, world, steps=1, model=LONG, global_batch=2, **options)
        return [r["memory"]["peak_by_kind"]["activations"] for r in run.rank_results]

    (single,) = activations("single", 1)
    for n in (2, 4):
        for rank, held in enumerate(activations("cp", n, cp_mode=mode)):
            assert abs(held * n / single - 1) <= 0.15, f"cp {n} rank {rank}: {held} bytes, single {single}"


BALANCE = dict(layers=1, hidden=64, heads=2, vocab=64, seq_len=2048)


@pytest.mark.parametrize("n", [2, 4])
def test_zigzag_balances_causal_attention_and_contiguous_does_not(n, no_leftover_ranks):
    """The query-key pairs each rank's ring tiles computed in a real run, per step: one layer's
    forward and backward each compute the rank's share (sequence_split.attention_pairs) for every
    sequence and head. Zig-zag: every rank the same. Contiguous: every rank later in the sequence
    more, the last about 2N-1 times the first. The CPU seconds the same tiles take are shown by
    notebook 10 and timed by benchmarks/bench_context.py --balance (they are a timing, not held here)."""
    batch = 2

    def per_rank(split):
        run = paralab.run("cp", n, steps=2, model=BALANCE, global_batch=batch, cp_split=split)
        per_step = [r["attention_pairs"] for r in run.rank_results]
        assert all(len(set(steps.values())) == 1 for steps in per_step), per_step
        return [steps["0"] for steps in per_step]

    zigzag, contiguous = per_rank("zigzag"), per_rank("contiguous")
    shares = {split: [attention_pairs(r, n, split, BALANCE["seq_len"]) for r in range(n)]
              for split in ("zigzag", "contiguous")}
    per_share = 2 * BALANCE["layers"] * batch * BALANCE["heads"]  # forward, backward; every sequence, head
    for measured, split in ((zigzag, "zigzag"), (contiguous, "contiguous")):
        assert measured == [per_share * share for share in shares[split]]
    assert len(set(zigzag)) == 1
    assert contiguous == sorted(contiguous) and len(set(contiguous)) == n
    assert max(contiguous) / min(contiguous) == pytest.approx(imbalance(n, "contiguous", BALANCE["seq_len"]))
    assert 0.85 * (2 * n - 1) <= imbalance(n, "contiguous", BALANCE["seq_len"]) < 2 * n - 1
    assert sum(zigzag) == sum(contiguous)  # the same work, shared out differently


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("strategy, world, options, message", [
    ("cp", 4, dict(model=dict(MODEL, seq_len=20)), r"divisible by 8, got 20: zig-zag cuts it into 2 x cp"),
    ("cp", 2, dict(model=dict(MODEL, seq_len=18), cp_split="contiguous"), r"ring attention cuts each rank's"),
    # the degrees that fit come first: the command line sets no sequence length; the all-to-all's fit
    # its heads too (cp 8 and 16 had been offered, then refused for 4 heads)
    ("cp", 3, dict(cp_mode="alltoall", cp_split="contiguous"),
     r"divisible by 3, got 16: .*; cp degrees \(2 to 16\) that fit its 16 tokens and heads: 2, 4 \(or, "
     r"from Python"),
    ("cp", 3, dict(model=dict(MODEL, seq_len=20)),
     r"by 6, got 20: .*cp degrees \(2 to 16\) that fit its 20 tokens: 2, 5, 10 "),
    ("cp", 4, dict(cp_mode="alltoall", model=dict(MODEL, heads=2)),
     r"2 heads do not divide by 4; cp degrees \(2 to 16\) that fit its heads and tokens: 2, or "
     r"cp_mode 'ring'"),
    ("hybrid", 4, dict(cp=2, tp=2, cp_mode="alltoall", model=dict(MODEL, heads=2)),
     r"1 heads per tensor-parallel rank \(heads 2 / tp 2\) do not divide by 2"),
    # and with sequence parallel, the degrees whose slices tp splits (cp 4's 6 tokens over tp 4 do not)
    ("hybrid", 20, dict(cp=5, tp=4, sequence_parallel=True, model=dict(MODEL, seq_len=24, heads=8)),
     r"divisible by 10, got 24: .*cp degrees \(2 to 16\) that fit its 24 tokens: 2, 3, 6 \(or"),
    ("hybrid", 8, dict(cp=2, tp=4, sequence_parallel=True, model=dict(MODEL, seq_len=20)),
     r"splits each cp rank's 10 tokens .* over tp 4 ranks"),
    ("cp", 2, dict(model=dict(MODEL, dropout=0.1)), r"does not run attention dropout"),
    ("cp", 2, dict(cp=4), r"cp=4 but world size 2"),
    ("cp", 2, dict(cp_mode="ulysses"), r"cp_mode must be one of \('ring', 'alltoall'\)"),
    ("ddp", 2, dict(cp_split="contiguous"), r"cp_split=contiguous is a context-parallel option; ddp has no"),
    ("tp", 2, dict(cp=2), r"tp splits over tp only; it does not take cp=2"),
    ("hybrid", 2, dict(dp=2, cp_mode="alltoall"), r"cp_mode=alltoall applies to context parallelism.*cp=1"),
    ("hybrid", 2, dict(tp=2, cp_split="contiguous"), r"cp_split=contiguous applies .* cp=1"),
    # a default's own name, given where it changes nothing, as the other choice is (it had passed)
    ("hybrid", 2, dict(dp=2, cp_mode="ring"), r"cp_mode=ring applies to context parallelism.*cp=1"),
    ("hybrid", 2, dict(tp=2, cp_split="zigzag"), r"cp_split=zigzag applies .* cp=1"),
    ("ddp", 2, dict(cp_mode="ring"), r"cp_mode=ring is a context-parallel option; ddp has no"),
    ("cp", 2, dict(model=dict(MODEL, attention="math")), r"attention='math' writes out the s x s scores"),
])
def test_bad_input_is_refused_before_any_process(monkeypatch, strategy, world, options, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    options = {"model": MODEL, **options}
    with pytest.raises(ConfigError, match=message):
        paralab.run(strategy, world, **options)


@pytest.mark.parametrize("flag", [["--cp-mode", "ring"], ["--cp-split", "zigzag"]])
def test_the_cli_refuses_a_cp_flag_at_cp_1_whichever_its_value(capsys, monkeypatch, flag):
    """--cp-mode ring had passed at cp 1 where --cp-mode alltoall was refused: the CLI could not tell
    the default typed from the default left out."""
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    code = cli.main(["run", "--strategy", "hybrid", "--world-size", "2", "--dp", "2", *flag, "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"{flag[0]} {flag[1]} applies" in err


def test_the_cli_refuses_with_exit_2_and_one_line(capsys, monkeypatch):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    code = cli.main(["run", "--strategy", "cp", "--world-size", "8", "--cp-mode", "alltoall", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "4 heads do not divide by 8" in err


def _attention_run(split, seconds, pairs):
    """A cp run as viz.attention_per_rank reads it: its split, one cp group, two steps per rank (the
    first left out as warm-up)."""
    from types import SimpleNamespace

    ranks = [{"attention_cpu_s": {"0": 9.0, "1": s}, "attention_pairs": {"0": n, "1": n}}
             for s, n in zip(seconds, pairs)]
    return SimpleNamespace(layout=SimpleNamespace(cp=len(seconds), cp_split=split), rank_results=ranks)


def test_the_attention_figure_says_which_chunks_a_rank_holds_under_each_split():
    """A zig-zag rank is not a place in the sequence (rank 0 holds the first chunk and the last): the
    x axis names the chunks per split, and each measured bar's hover the chunks of its rank."""
    from paralab import viz

    both = viz.attention_per_rank({"zigzag": _attention_run("zigzag", [0.01, 0.01, 0.01, 0.01], [5] * 4),
                                   "contiguous": _attention_run("contiguous", [0.01, 0.02, 0.03, 0.04],
                                                                [1, 2, 3, 4])})
    axis = both.layout.xaxis.title.text
    assert "zig-zag: chunks r and 2N−1−r" in axis and "contiguous: chunks 2r and 2r+1, first to last" in axis
    zigzag, contiguous = (t for t in both.data if t.name.endswith("measured"))
    assert list(zigzag.customdata) == [" (chunks 0 and 7)", " (chunks 1 and 6)", " (chunks 2 and 5)",
                                       " (chunks 3 and 4)"]
    assert list(contiguous.customdata)[3] == " (chunks 6 and 7)"
    alone = viz.attention_per_rank({"contiguous": _attention_run("contiguous", [0.01, 0.02], [1, 3])})
    assert "zig-zag" not in alone.layout.xaxis.title.text
    # a run whose ranks are not one cp group (or not a cp run) is not labelled with chunks
    other = _attention_run("zigzag", [0.01, 0.02], [1, 3])
    other.layout.cp = 1
    assert viz.attention_per_rank({"dp": other}).layout.xaxis.title.text == "rank"


@pytest.mark.parametrize("seq, recompute, close", [(32768, "full", ["cp 2", "cp 4", "cp 8"]),
                                                   (2048, "full", ["cp 2"])])
def test_cp_modes_shows_both_step_lines_and_says_where_they_overlap(seq, recompute, close):
    """Step times within 2% draw as one line: the ring's is wider, under the dashed all-to-all, and a
    note on the step-time panel says where they lie that close."""
    from paralab import viz
    from paralab.sim.hardware import get_hardware
    from paralab.sim.presets import get_model
    from paralab.viz.context import CLOSE_STEPS

    model = get_model("llama3-8b").replace(seq=seq)
    fig = viz.cp_modes(model, get_hardware("h100"), [2, 4, 8], global_batch=1, recompute=recompute)
    meta = fig.layout.meta
    rel = meta["step_rel_diff"]
    for i, (ring, a2a) in enumerate(zip(meta["step_s"]["ring"], meta["step_s"]["alltoall"])):
        assert rel[i] == pytest.approx(abs(ring - a2a) / min(ring, a2a))
    assert [f"cp {cp}" for cp, r in zip(meta["cps"], rel) if r <= CLOSE_STEPS] == close
    ring, a2a = (t for t in fig.data if t.type == "scatter")
    assert ring.name == "ring" and ring.line.width > a2a.line.width and a2a.line.dash == "dash"
    notes = [a.text for a in fig.layout.annotations if "overlap" in a.text]
    assert len(notes) == 1 and fig.layout.annotations[-1].xref == "x2 domain"
    where = "at every degree" if len(close) == 3 else "at " + ", ".join(close)
    assert where in notes[0] and f"{max(r for r in rel if r <= CLOSE_STEPS):.1%}" in notes[0]


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_a_ring_hop_meets_each_send_with_its_receive_in_issue_order(monkeypatch, size):
    """NCCL runs a group's sends and receives one after another in the order each rank issued them, and
    a send of a block beyond its buffer waits for the peer's receive. Every rank had sent first, so each
    send waited for a receive queued behind its peer's own send, round the ring. Played here as NCCL
    would run the ranks' queues (no GPU on CI; gloo matches each message apart), the ring finishes."""
    from paralab.strategies import ring_attention

    queues = {}
    for index in range(size):
        issued = queues[index] = []
        monkeypatch.setattr(ring_attention.comm, "isend",
                            lambda tensor, dst, group, name, issued=issued: issued.append(("send", dst)))
        monkeypatch.setattr(ring_attention.comm, "irecv",
                            lambda tensor, src, group, name, issued=issued: issued.append(("recv", src)))
        ring = ring_attention.ContextParallelGroup(None, tuple(range(size)), index)
        ring.pass_on(torch.zeros(2), "kv")
    moved = True
    while moved:  # a send leaves when the head of its peer's queue is the receive of it
        moved = False
        for rank, queue in queues.items():
            if queue and queue[0][0] == "send" and queues[queue[0][1]][:1] == [("recv", rank)]:
                queues[queue.pop(0)[1]].pop(0)
                moved = True
    assert all(not queue for queue in queues.values()), f"stuck: {queues}"
