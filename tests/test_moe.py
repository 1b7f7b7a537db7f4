"""The mixture-of-experts model on one process: routing, capacity and dropping, the auxiliary losses
against their closed forms, the layer against a token-by-token reference, expert weights that do not
depend on the expert-parallel split, and the configurations refused before any process starts."""

from __future__ import annotations

import math

import pytest
import torch

import paralab
from paralab import cli
from paralab.config import MODEL_PRESETS, ConfigError, ModelConfig, RunConfig
from paralab.layout import resolve_layout
from paralab.models.gpt import GPT, MLP, build_part
from paralab.models.moe import (
    ExpertGroup,
    MoELayer,
    capacity,
    combine,
    load_balancing_loss,
    route,
    router_z_loss,
    set_aux_loss_scale,
)
from paralab.runtime import launch as launch_module

MOE = dict(layers=2, hidden=16, heads=2, vocab=32, seq_len=8, experts=4, top_k=2)


def logits_choosing(choices: list[list[int]], experts: int) -> torch.Tensor:
    """Router logits whose top-k are ``choices`` in that order (first choice highest)."""
    logits = torch.zeros(len(choices), experts)
    for t, chosen in enumerate(choices):
        for rank, e in enumerate(chosen):
            logits[t, e] = 10.0 - rank
    return logits


# ------------------------------------------------------------------------------------------ routing
def test_top_k_gates_switch_for_one_expert_and_renormalised_for_several():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = logits.softmax(-1)
    one = route(logits, 1, seq_len=1, capacity_factor=None)
    assert one.experts.tolist() == [[0]] and one.gates[0, 0] == pytest.approx(probs[0, 0].item())
    two = route(logits, 2, seq_len=1, capacity_factor=None)
    assert two.experts.tolist() == [[0, 1]]
    assert two.gates[0].tolist() == pytest.approx((probs[0, :2] / probs[0, :2].sum()).tolist())


def test_capacity_drops_the_assignments_past_it_first_choices_first():
    """Two sequences of 4 tokens, 2 experts, top-2, factor 0.5: each expert takes ceil(0.5 x 4 x 2 / 2)
    = 2 per sequence. Every first choice queues before any second choice, then by position."""
    assert capacity(4, 2, 2, 0.5) == 2 and capacity(4, 2, 2, None) is None
    choices = [[0, 1], [0, 1], [1, 0], [0, 1],   # sequence 0: expert 0 is everyone's first or second
               [1, 0], [1, 0], [1, 0], [0, 1]]   # sequence 1: expert 1 is the popular first choice
    routing = route(logits_choosing(choices, 2), 2, seq_len=4, capacity_factor=0.5)
    # sequence 0, expert 0 queue: firsts of t0, t1, t3 then the second of t2 -> t0, t1 kept
    # sequence 0, expert 1 queue: first of t2, then seconds of t0, t1, t3 -> t2's first and t0's second
    # sequence 1, expert 1 queue: firsts of t4, t5, t6 -> t4, t5; expert 0: first of t7, second of t4
    assert routing.kept.tolist() == [[True, True], [True, False], [True, False], [False, False],
                                     [True, True], [True, False], [False, False], [True, False]]
    assert route(logits_choosing(choices, 2), 2, seq_len=4, capacity_factor=None).kept.all()


def test_dropping_is_per_sequence_so_any_batch_split_drops_the_same_tokens():
    torch.manual_seed(0)
    logits = torch.randn(6 * 8, 4)
    whole = route(logits, 2, seq_len=8, capacity_factor=1.0).kept
    halves = [route(part, 2, seq_len=8, capacity_factor=1.0).kept for part in logits.split(3 * 8)]
    assert (~whole).any(), "the case must drop something"
    assert torch.equal(whole, torch.cat(halves))


# ------------------------------------------------------------------------------------------ losses
def test_load_balancing_loss_equals_its_closed_form_on_a_constructed_routing():
    """E x sum_e f_e P_e per sequence, averaged over sequences (Switch / GShard)."""
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.6, 0.2, 0.1, 0.1],     # sequence 0
                          [0.25, 0.25, 0.25, 0.25], [0.1, 0.1, 0.1, 0.7]])  # sequence 1
    experts = torch.tensor([[0, 1], [0, 1], [2, 0], [3, 0]])
    # sequence 0: f = (2, 2, 0, 0) / 4, P = (0.65, 0.15, 0.1, 0.1) -> 4 x (0.5 x 0.65 + 0.5 x 0.15) = 1.6
    # sequence 1: f = (2, 0, 1, 1) / 4, P = (0.175, 0.175, 0.175, 0.475)
    #   -> 4 x (0.0875 + 0.04375 + 0.11875) = 1.0
    assert load_balancing_loss(probs, experts, seq_len=2).item() == pytest.approx((1.6 + 1.0) / 2)
    uniform = torch.full((8, 4), 0.25)
    assert load_balancing_loss(uniform, torch.tensor([[0, 1], [2, 3]] * 4), 8).item() == pytest.approx(1.0)
    collapsed = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 8)
    assert load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long), 8).item() == pytest.approx(4.0)


def test_router_z_loss_is_the_mean_squared_logsumexp():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    assert router_z_loss(logits).item() == pytest.approx((math.log(2) ** 2 + math.log(4) ** 2) / 2)


def test_the_layer_trains_its_router_on_the_auxiliary_losses_scaled_as_the_loss_is():
    """Backward through a layer whose output gradient is zero leaves only the auxiliary losses: the
    router's gradient equals that of aux_loss x balancing + z_loss x z, times the loss scale."""
    cfg = ModelConfig(**MOE, aux_loss=0.1, z_loss=0.01)
    layer = MoELayer(cfg, MLP)
    layer.aux_loss_scale = 0.5
    x = torch.randn(3, cfg.seq_len, cfg.hidden)
    layer(x).backward(torch.zeros(3, cfg.seq_len, cfg.hidden))
    logits = x.reshape(-1, cfg.hidden) @ layer.router.weight.t()
    routing = route(logits, cfg.top_k, cfg.seq_len, None)
    expected_loss = 0.5 * (0.1 * load_balancing_loss(routing.probs, routing.experts, cfg.seq_len)
                           + 0.01 * router_z_loss(logits))
    (expected,) = torch.autograd.grad(expected_loss, layer.router.weight)
    assert torch.allclose(layer.router.weight.grad, expected, rtol=1e-5, atol=1e-8)


def test_under_fp16_the_auxiliary_gradient_is_loss_scaled_as_the_training_loss_is():
    """The master weights divide every gradient by the fp16 loss scale; the router's auxiliary
    gradient must have been multiplied by it too, or load balancing fades by 1/65536."""
    from paralab.precision import LossScaler

    cfg = ModelConfig(**MOE, aux_loss=0.1, z_loss=0.01)
    x = torch.randn(3, cfg.seq_len, cfg.hidden)
    grads = {}
    for dtype in ("fp32", "fp16"):
        torch.manual_seed(0)  # the same router both times
        layer = MoELayer(cfg, MLP)
        scaler = LossScaler(dtype, initial=1024.0)
        set_aux_loss_scale([layer], 0.5, scaler)
        layer(x).backward(torch.zeros(3, cfg.seq_len, cfg.hidden))
        grads[dtype] = layer.router.weight.grad
    assert torch.allclose(grads["fp16"], 1024.0 * grads["fp32"], rtol=1e-6)


# ------------------------------------------------------------------------------------------ the layer
@pytest.mark.parametrize("options", [dict(), dict(top_k=1, capacity_factor=1.0, shared_expert=True)])
def test_the_layer_equals_a_token_by_token_reference(options):
    cfg = ModelConfig(**{**MOE, **options})
    layer = MoELayer(cfg, MLP)
    torch.nn.init.normal_(layer.router.weight, std=1.0)  # a decisive router, so capacity bites
    x = torch.randn(4, cfg.seq_len, cfg.hidden)
    tokens = x.reshape(-1, cfg.hidden)
    routing = route(layer.router(tokens), cfg.top_k, cfg.seq_len, cfg.capacity_factor)
    expected = torch.stack([
        sum((routing.gates[t, j] * layer.experts[str(int(routing.experts[t, j]))](tokens[t])
             for j in range(cfg.top_k) if routing.kept[t, j]), torch.zeros(cfg.hidden))
        + (layer.shared(tokens[t]) if layer.shared is not None else 0)
        for t in range(len(tokens))
    ])
    if cfg.capacity_factor is not None:
        assert (~routing.kept).any(), "the capacity case must drop tokens"
    assert torch.allclose(layer(x).reshape(-1, cfg.hidden), expected, atol=1e-6)


def test_combining_sums_each_tokens_weighted_outputs_and_keeps_no_copy_of_them():
    """Each token's output is the sum of its kept assignments' weighted rows (a dropped one adds
    nothing), as index_add over the tokens gives, with the same gradients; but the combine keeps
    only integer slots for its backward, where index_add kept every row it added (k per token,
    hidden wide: the lab's tiny-moe had measured 6% more activations than counted)."""
    torch.manual_seed(0)
    tokens, top_k, hidden = 5, 2, 3
    slot_of = torch.tensor([9, 0, 3, 4, 1, 6, 2])  # token 3's second choice (slot 7) and 4's first dropped
    weighted = torch.randn(len(slot_of), hidden, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = combine(weighted, slot_of, tokens, top_k)
    assert all(not t.is_floating_point() for t in saved)
    reference = torch.zeros(tokens, hidden).index_add(0, slot_of // top_k, weighted)
    torch.testing.assert_close(out, reference)
    grad = torch.randn(tokens, hidden)
    (by_slots,) = torch.autograd.grad(out, weighted, grad)
    (by_index_add,) = torch.autograd.grad(reference, weighted, grad)
    torch.testing.assert_close(by_slots, by_index_add)


def test_every_expert_gets_a_gradient_even_without_tokens():
    cfg = ModelConfig(**{**MOE, "top_k": 1})
    layer = MoELayer(cfg, MLP)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[2] = 1.0  # every token with positive sum goes to expert 2
    x = torch.rand(2, cfg.seq_len, cfg.hidden)
    layer(x).sum().backward()
    for j, expert in layer.experts.items():
        for p in expert.parameters():
            assert p.grad is not None and (p.grad.abs().sum() > 0) == (j == "2")


def test_an_expert_has_the_same_weights_whatever_rank_builds_it():
    cfg = ModelConfig(**MOE)
    whole = build_part(cfg, 1, seed=3)
    second_half = build_part(cfg, 1, seed=3, ep=ExpertGroup(group=None, rank=1, size=2))
    assert list(second_half.mlp.experts) == ["2", "3"]
    for name, param in second_half.named_parameters():
        assert torch.equal(param, dict(whole.named_parameters())[name]), name


def test_presets_and_parameter_count():
    for name in ("tiny-moe", "small-moe"):
        cfg = MODEL_PRESETS[name]
        assert cfg.experts > 1 and cfg.param_count() == sum(p.numel() for p in GPT(cfg).parameters())
    assert MODEL_PRESETS["tiny-moe"].top_k == 2 and MODEL_PRESETS["small-moe"].top_k == 1
    assert MODEL_PRESETS["small-moe"].capacity_factor == 1.25 and MODEL_PRESETS["small-moe"].shared_expert


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("strategy, world, model, options, message", [
    ("ep", 4, dict(MOE, experts=6), dict(ep=4),
     r"6 experts are not divisible by ep=4.* ep that fit: \[1, 2\]"),
    ("hybrid", 4, dict(MOE, experts=6), dict(ep=4), r"6 experts are not divisible by ep=4"),
    ("ep", 2, dict(MOE, top_k=5), {}, r"top_k 5 is above the number of experts 4"),
    ("ep", 2, dict(MOE, capacity_factor=0.0), {}, r"capacity factor .* must be > 0, got 0"),
    ("ep", 2, dict(MOE, capacity_factor=-1.5), {}, r"capacity factor .* must be > 0, got -1.5"),
    ("ep", 4, MOE, dict(ep=3), r"ep=3 must divide the 4 data-parallel ranks"),
    ("cp", 2, MOE, {}, r"with cp=2: each rank would route its slice"),
    ("hybrid", 4, MOE, dict(dp=2, cp=2), r"with cp=2: each rank would route its slice"),
    ("torch_pp", 2, MOE, dict(pp=2, microbatches=2), r"torch_pp is the reference for dense models"),
])
def test_bad_mixture_of_experts_shapes_are_refused_before_any_process(monkeypatch, strategy, world, model,
                                                                      options, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=message):
        paralab.run(strategy, world, model=model, global_batch=8, **options)


@pytest.mark.parametrize("flags, message", [
    (["--ep", "4"], "6 experts are not divisible by --ep 4"),
    (["--top-k", "7"], "--top-k 7 is above the number of experts 6"),
    (["--capacity-factor", "0"], "capacity factor"),
])
def test_the_cli_refuses_them_with_exit_code_2(capsys, monkeypatch, flags, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    code = cli.main(["run", "--strategy", "ep", "--world-size", "4", "--model", "tiny-moe", "--experts", "6",
                     "--ep", "2", *flags])
    assert code == 2 and message in capsys.readouterr().err


def test_a_preset_given_experts_by_the_cli_is_named_custom():
    """`--model tiny --experts 4` had trained a mixture of experts and reported "model tiny"."""
    def named(*flags):
        args = cli.build_parser().parse_args(["run", "--strategy", "ep", *flags])
        return cli.config_from_args(args).model_name

    assert named("--model", "tiny", "--experts", "4") == "custom (from tiny)"
    assert named("--model", "tiny-moe", "--experts", "0") == "custom (from tiny-moe)"
    assert named("--model", "tiny-moe", "--experts", "4") == "tiny-moe"  # the preset's own: unchanged
    assert named("--model", "tiny-moe", "--attention", "math") == "tiny-moe"  # the summary says attention


@pytest.mark.parametrize("preset", ["tiny-moe", "small-moe"])
def test_a_preset_whose_experts_the_cli_takes_away_is_a_dense_model(preset):
    """`--experts 0` takes the preset's routing with its experts (tiny-moe's top-2, small-moe's capacity
    and shared expert): left on the dense model, they would each be refused as having no effect."""
    args = cli.build_parser().parse_args(["run", "--strategy", "ddp", "--model", preset, "--experts", "0"])
    model = cli.config_from_args(args).validate().model
    assert (model.experts, model.top_k, model.capacity_factor, model.shared_expert) == (0, 1, None, False)


def test_cli_flags_override_the_preset():
    args = cli.build_parser().parse_args(["run", "--strategy", "ep", "--world-size", "2",
                                          "--model", "tiny-moe", "--top-k", "1", "--capacity-factor", "1.25",
                                          "--ep", "2"])
    cfg = cli.config_from_args(args)
    assert (cfg.model.experts, cfg.model.top_k, cfg.model.capacity_factor) == (4, 1, 1.25)
    assert resolve_layout(cfg).ep == 2
    assert RunConfig.from_dict(cfg.to_dict()).model == cfg.model
