"""Mixture of experts in the simulator: parameters and FLOPs, memory, the all-to-all and its cost.

A MoE layer (Lepikhin et al. 2020; Fedus et al. 2021; DeepSeek-AI 2024) keeps the attention of a
dense layer and replaces its MLP by a router (h x E), E routed experts of width ``expert_ffn`` and
``shared_experts`` that every token goes through; each token visits ``top_k`` routed experts.
``dense_layers`` leading layers keep a dense MLP (DeepSeek-V3: 3).

- **Parameters** count every expert; **active parameters** per token count the router, top_k routed
  experts and the shared ones. Model FLOPs follow the active ones: a token's MLP forward costs
  2 x active MLP parameters (plus the router), whatever E is (Fedus et al. 2021, sec. 2), less the
  routed copies a capacity below 1 drops (:func:`kept_share`).
- **Memory**: expert parallel spreads a layer's experts over ``ep`` ranks (E / ep on each), carved
  out of the data-parallel ranks; their gradients and optimizer states are reduced and sharded over
  the expert-data-parallel group (dp / ep ranks: DeepSpeed-MoE, Rajbhandari et al. 2022), the rest
  over dp. Activations: each token is stored k times at the experts (its copy and its FFN inner
  tensors), plus the shared experts'.
- **Communication**: per MoE layer and microbatch, a dispatch and a combine all-to-all in the
  forward and both again in the backward, each carrying tokens x k x h x bytes, of which a rank
  sends (ep - 1)/ep away (its time: paralab.sim.cost.all_to_all_time).
- **Load imbalance**: ``ParallelSpec.expert_imbalance``, the busiest expert's tokens over the mean
  (1.0: perfect; measured runs give it, paralab.moe_load), slows the expert GEMMs and the all-to-all
  of the layer (everyone waits for the rank with the hot expert), capped by the capacity factor when
  the model drops tokens.
"""

from __future__ import annotations

from paralab.sim.specs import ModelSpec, ParallelSpec


def ffn_params(model: ModelSpec, width: int) -> int:
    """One feed-forward block of ``width``: up (gate and up when gated) and down, with biases if any."""
    h, bias = model.hidden, 1 if model.biases else 0
    mlp_in = 2 * width if model.gated_mlp else width
    return h * mlp_in + bias * mlp_in + width * h + bias * h


def moe_layers(model: ModelSpec) -> int:
    """Layers whose MLP is a mixture of experts (0 for a dense model)."""
    return model.layers - model.dense_layers if model.experts else 0


def moe_mlp_params(model: ModelSpec) -> dict[str, int]:
    """One MoE layer's MLP: the router, every routed expert, the shared experts."""
    expert = ffn_params(model, model.expert_ffn)
    return {"router": model.hidden * model.experts, "experts": model.experts * expert,
            "shared": model.shared_experts * expert}


def extra_layer_params(model: ModelSpec, active: bool = False) -> int:
    """What the MoE layers hold beyond the dense MLPs the counter gives every layer (``active``: per
    token, top_k routed experts instead of all of them)."""
    if not model.experts:
        return 0
    mlp = moe_mlp_params(model)
    routed = model.top_k * ffn_params(model, model.expert_ffn) if active else mlp["experts"]
    return moe_layers(model) * (mlp["router"] + routed + mlp["shared"] - ffn_params(model, model.ffn))


def kept_share(model: ModelSpec) -> float:
    """The share of routed token copies the experts compute: a capacity below 1 drops tokens from
    every expert, even under a balanced router (each takes capacity x its even share), and the FLOPs
    count only what is computed, as the step's time does (:func:`imbalance`); at or above 1 only an
    uneven router drops, by an amount one imbalance figure does not give, and every copy counts."""
    return min(model.capacity_factor, 1.0) if model.capacity_factor else 1.0


def extra_forward_flops(model: ModelSpec, sequences: float) -> float:
    """Forward matmul FLOPs the MoE layers add over dense MLPs of width ``ffn``: each token through the
    router, top_k routed experts (those of its copies the capacity keeps: :func:`kept_share`) and the
    shared experts (2 FLOPs per weight it meets)."""
    if not model.experts:
        return 0.0
    tokens = sequences * model.seq
    matrices = 3 if model.gated_mlp else 2
    routed = model.top_k * kept_share(model)
    per_token = (model.hidden * model.experts
                 + matrices * model.hidden * ((routed + model.shared_experts) * model.expert_ffn - model.ffn))
    return 2 * tokens * moe_layers(model) * per_token


def expert_params_per_gpu(model: ModelSpec, parallel: ParallelSpec, moe_layers_here: float) -> float:
    """Routed-expert parameters one GPU holds for ``moe_layers_here`` MoE layers: E / ep experts each."""
    return moe_layers_here * moe_mlp_params(model)["experts"] / parallel.ep


def imbalance(model: ModelSpec, parallel: ParallelSpec) -> float:
    """The slowdown of a MoE layer's expert work from uneven routing, capped by the capacity factor
    (an expert never takes more than capacity x the mean)."""
    factor = max(parallel.expert_imbalance, 1.0)
    return min(factor, model.capacity_factor) if model.capacity_factor else factor


def extra_activation_bytes(model: ModelSpec, micro_batch: int, tp: int = 1,
                           sequence_parallel: bool = False) -> float:
    """Bytes a MoE layer stores for backward beyond the dense MLP of Korthikanti et al.'s Table 2:
    k copies of each token a rank routes (:func:`routed_tokens`) at the experts (dispatched input and
    combined output, k routed expert inner tensors of ``expert_ffn``) and the router's logits (fp32);
    the shared experts' inner tensors (split over tp, as the dense MLP's) in place of the dense MLP's
    ``ffn``."""
    if not model.experts:
        return 0.0
    e, per_token = model.dtype_bytes, (3 if model.gated_mlp else 2) * model.dtype_bytes
    split = model.seq * micro_batch / tp  # what a tensor-parallel MLP's inner tensors hold per rank
    routed = routed_tokens(model, micro_batch, tp, sequence_parallel)
    copies = model.top_k * routed * (2 * e * model.hidden + per_token * model.expert_ffn)
    shared = model.shared_experts * split * per_token * model.expert_ffn
    return copies + shared + 4 * routed * model.experts - split * per_token * model.ffn


def routed_tokens(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """Tokens of a microbatch one rank routes through a MoE layer: all of them, or with sequence
    parallelism its tp rank's slice. Its all-to-alls, expert GEMMs, router and kept activations all
    follow them."""
    return micro_batch * model.seq / (tp if sequence_parallel else 1)


def all_to_all_payload(model: ModelSpec, parallel: ParallelSpec) -> float:
    """Bytes one rank hands one all-to-all of a MoE layer: the tokens it routes, k times."""
    tokens = routed_tokens(model, parallel.micro_batch, parallel.tp, parallel.sequence_parallel)
    return tokens * model.top_k * model.hidden * model.dtype_bytes
