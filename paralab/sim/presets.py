"""Model shapes from the papers, by name (``paralab simulate --model NAME``).

- ``gpt3-*``: Brown et al. 2020, Table 2.1 (vocabulary 50257, sequence 2048). The table's XL row
  lists 24 heads of 128 for d_model 2048, which cannot both hold; we keep head size 128 (16 heads),
  and 13B's d_model 5140 is read as 5120 (40 heads of 128).
- ``megatron-*``: Narayanan et al. 2021, Table 1 (vocabulary 51200, sequence 2048), named by their
  parameter count; ``megatron-22b`` and ``megatron-175b`` are the 22B and GPT-3 175B shapes of
  Korthikanti et al. 2022, Table 3.
- ``llama2-*`` (Touvron et al. 2023, sequence 4096, vocabulary 32000) and ``llama3-*`` (Llama 3
  herd, 2024, Table 3: sequence 8192, vocabulary 128256): SwiGLU MLP, grouped-query attention (70B
  models and Llama 3 use 8 KV heads), RMSNorm, RoPE, untied embeddings, no biases, no dropout, fused
  (flash) attention as they were trained. These are modelled exactly (see
  :class:`paralab.sim.specs.ModelSpec`).
- ``bloom-176b`` (BigScience 2022: 70 layers, hidden 14336, 112 heads, vocabulary 250880, sequence
  2048): ALiBi instead of learned positions, tied embeddings, LayerNorm and biases, GELU MLP of 4h;
  the LayerNorm after its embedding (2h = 28,672 parameters, 2e-7 of the model) is not counted.

- ``mixtral-8x7b``: Jiang et al. 2024, "Mixtral of Experts", Table 1 (dim 4096, 32 layers, 32 heads,
  8 KV heads, expert width 14336, 8 experts, top-2, vocabulary 32000; Llama-style blocks). Context
  32768; modelled at sequence 4096. 46.7B parameters, 12.9B active.
- ``deepseek-v3``: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sec. 4.2 (61 layers, hidden
  7168, 128 heads, the first 3 layers dense with width 18432, then 1 shared and 256 routed experts of
  width 2048, 8 routed per token, vocabulary 129280, sequence 4096). A DeepSeek-V3-*like* shape: its
  multi-head latent attention is modelled as multi-head attention of the model's width (about 10%
  more attention parameters than MLA's low-rank projections) and the multi-token-prediction module
  is left out: about 672B parameters, 39B active (the report: 671B, 37B).
A shape override (:func:`override`) re-derives what follows from it, as the model's family does:
the MLP width from the hidden size (4h for GPT; the Llama rule, see :data:`FFN_RULES`) and the KV
heads from the heads (equal, or the preset's query-group size under grouped-query attention).
- ``tiny``, ``small``, ``medium`` and ``tiny-moe``, ``small-moe``: the lab's own GPT presets
  (:data:`paralab.config.MODEL_PRESETS`), so ``paralab simulate --model small --hardware local``
  predicts the runs the lab makes.
"""

from __future__ import annotations

from paralab.config import ATTENTION_AS_SIMULATED, MODEL_PRESETS, ModelConfig, custom_from
from paralab.sim.specs import ModelSpec, SpecError


def lab_model(m: ModelConfig, name: str = "") -> ModelSpec:
    """paralab.models.gpt.GPT with this ModelConfig: untied embeddings, a biased output layer, learned
    positions, biases, LayerNorm, GELU MLP, fp32, its attention kernel (torch's fused
    scaled_dot_product_attention keeps no scores, the written-out ``math`` core does) and its
    experts if it has some (the counted parameters equal ``m.param_count()``)."""
    return ModelSpec(attention=ATTENTION_AS_SIMULATED[m.attention],
        layers=m.layers, hidden=m.hidden, heads=m.heads, ffn=m.ffn, vocab=m.vocab, seq=m.seq_len,
        biases=True, norm_params=2, learned_positions=True, tied_embeddings=False, output_bias=True,
        dropout=m.dropout > 0, dtype="fp32", name=name, experts=m.experts, top_k=m.top_k if m.experts else 1,
        shared_experts=int(m.shared_expert) if m.experts else 0, capacity_factor=m.capacity_factor or 0.0,
    )


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=50257, seq=2048, name=name)


def _megatron(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=51200, seq=2048, name=name)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, seq: int) -> ModelSpec:
    return ModelSpec(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=llama_ffn(name, hidden),
        vocab=vocab, seq=seq, gated_mlp=True, biases=False, norm_params=1, learned_positions=False,
        tied_embeddings=False, dropout=False, attention="fused", name=name,
    )  # fmt: skip


def _moe(name: str, source: str, **shape) -> ModelSpec:
    """A Llama-style mixture of experts (SwiGLU experts, GQA, RMSNorm, RoPE, untied, no biases)."""
    return ModelSpec(gated_mlp=True, biases=False, norm_params=1, learned_positions=False,
                     tied_embeddings=False, dropout=False, attention="fused", name=name, source=source,
                     **shape)


# The Llama reference code sizes its SwiGLU MLP from the hidden size: 2/3 of 4h, times
# ffn_dim_multiplier, rounded up to a multiple of multiple_of (each model's params.json gives the two).
FFN_RULES = {  # name: (ffn_dim_multiplier, multiple_of)
    "llama2-7b": (1.0, 256), "llama2-13b": (1.0, 256), "llama2-70b": (1.3, 4096),
    "llama3-8b": (1.3, 1024), "llama3-70b": (1.3, 4096), "llama3-405b": (1.2, 4096),
}


def llama_ffn(name: str, hidden: int) -> int:
    multiplier, multiple = FFN_RULES[name]
    width = int(multiplier * int(2 * 4 * hidden / 3))
    return multiple * -(-width // multiple)


_ALL = [
    _gpt3("gpt3-125m", 12, 768, 12),
    _gpt3("gpt3-350m", 24, 1024, 16),
    _gpt3("gpt3-760m", 24, 1536, 16),
    _gpt3("gpt3-1.3b", 24, 2048, 16),
    _gpt3("gpt3-2.7b", 32, 2560, 32),
    _gpt3("gpt3-6.7b", 32, 4096, 32),
    _gpt3("gpt3-13b", 40, 5120, 40),
    _gpt3("gpt3-175b", 96, 12288, 96),
    _megatron("megatron-1.7b", 24, 2304, 24),
    _megatron("megatron-3.6b", 30, 3072, 32),
    _megatron("megatron-7.5b", 36, 4096, 32),
    _megatron("megatron-18b", 40, 6144, 48),
    _megatron("megatron-22b", 48, 6144, 64),
    _megatron("megatron-39b", 48, 8192, 64),
    _megatron("megatron-76b", 60, 10240, 80),
    _megatron("megatron-145b", 80, 12288, 96),
    _megatron("megatron-175b", 96, 12288, 96),
    _megatron("megatron-310b", 96, 16384, 128),
    _megatron("megatron-530b", 105, 20480, 128),
    _megatron("megatron-1t", 128, 25600, 160),
    _llama("llama2-7b", 32, 4096, 32, 32, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 32000, 4096),
    _llama("llama3-8b", 32, 4096, 32, 8, 128256, 8192),
    _llama("llama3-70b", 80, 8192, 64, 8, 128256, 8192),
    _llama("llama3-405b", 126, 16384, 128, 8, 128256, 8192),
    ModelSpec(layers=70, hidden=14336, heads=112, vocab=250880, seq=2048, learned_positions=False,
              name="bloom-176b"),
    _moe("mixtral-8x7b", "Jiang et al. 2024, Mixtral of Experts, Table 1", layers=32, hidden=4096, heads=32,
         kv_heads=8, ffn=14336, vocab=32000, seq=4096, experts=8, top_k=2),
    _moe("deepseek-v3", "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, sec. 4.2 (MLA as MHA)", layers=61,
         hidden=7168, heads=128, ffn=18432, vocab=129280, seq=4096, experts=256, top_k=8, expert_ffn=2048,
         shared_experts=1, dense_layers=3),
    *(lab_model(config, name) for name, config in MODEL_PRESETS.items()),
]
MODELS: dict[str, ModelSpec] = {m.name: m for m in _ALL}


SHAPE = ("layers", "hidden", "heads", "ffn", "vocab", "seq", "kv_heads", "expert_ffn")


def override(base: ModelSpec, **given) -> ModelSpec:
    """``base`` with the fields ``given`` (shape fields and any other ModelSpec field), named
    "custom (from <base>)", re-deriving what follows from an override unless that is given too:

    - the MLP width from ``hidden``: the Llama rule of :data:`FFN_RULES`, else the preset's own ratio
      (4 x hidden for GPT; 3.5 for Mixtral, whose paper gives no rule), rounded to a multiple of 256
      where it is not whole (DeepSeek-V3's 18,432 / 7,168), so that tensor parallelism can split it;
    - the experts' width from the MLP's where the preset's experts are as wide as the dense MLP they
      replace (Mixtral); narrower ones (DeepSeek-V3's 2,048 beside an 18,432-wide MLP) follow no rule,
      so they stay unless ``expert_ffn`` is given;
    - ``kv_heads`` from ``heads``: equal for multi-head attention; under grouped-query attention the
      preset's group size is kept (heads / kv_heads), and heads it does not divide raise SpecError.
    """
    if not given:
        return base
    if "expert_ffn" in given and not base.experts:
        raise SpecError(f"{base.name} has no experts: --expert-ffn sets a mixture of experts' width")
    derived = dict(given)
    if "hidden" in given and "ffn" not in given:
        hidden = given["hidden"]
        derived["ffn"] = llama_ffn(base.name, hidden) if base.name in FFN_RULES else _scaled_ffn(base, hidden)
    if base.experts and base.expert_ffn == base.ffn and "ffn" in derived and "expert_ffn" not in given:
        derived["expert_ffn"] = derived["ffn"]
    if "heads" in given and "kv_heads" not in given:
        group = base.heads // base.kv_heads
        if given["heads"] % group:
            raise SpecError(f"{base.name} uses grouped-query attention ({group} query heads per KV head): "
                            f"heads {given['heads']} is not a multiple of {group}; give --kv-heads")
        derived["kv_heads"] = given["heads"] // group
    return base.replace(**derived, name=_overridden_name(base, given))


# How a model runs, not what it is: a preset trained in FP8 or with eager kernels keeps its name
RUN_SETTINGS = ("dtype", "attention", "attention_kernel", "fp8", "kernels")


def _overridden_name(base: ModelSpec, given: dict) -> str:
    """ "custom (from <base>)" when the shape (or the architecture) changed; the preset's name with the
    settings that differ when only how it runs did (``llama3-8b (fp8)``); the name itself when nothing
    differs."""
    changed = {k: v for k, v in given.items() if getattr(base, k) != v}
    if any(k not in RUN_SETTINGS for k in changed):
        return custom_from(base.name)
    said = [("fp8" if v else "no fp8") if k == "fp8" else v if k == "dtype" else f"{k.replace('_', ' ')} {v}"
            for k, v in changed.items()]
    return f"{base.name} ({', '.join(said)})" if said else base.name


def _scaled_ffn(base: ModelSpec, hidden: int) -> int:
    width = base.ffn * hidden / base.hidden
    return int(width) if width.is_integer() else 256 * max(1, round(width / 256))


def get_model(name: str) -> ModelSpec:
    """A preset by name (case-insensitive); SpecError lists the names when it is unknown."""
    key = name.lower() if isinstance(name, str) else None  # None had been an AttributeError
    if key not in MODELS:
        raise SpecError(f"unknown model preset {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[key]
