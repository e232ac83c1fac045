"""Hugging Face transformers models to and from kcourse's GPT: GPT-2 and Llama configs and weights.

    GPT2LMHeadModel, GPT2Model     <->  GPTConfig(pos="learned", norm="layernorm", biases, an MLP)
    LlamaForCausalLM, LlamaModel   <->  GPTConfig(pos="rope", norm="rmsnorm", activation="swiglu")

The weights map name to name (``LAYOUTS``): GPT-2's projections are ``Conv1D`` layers, weight
``(in, out)``, transposed to ``Linear``'s ``(out, in)``; Llama's ``q_proj, k_proj, v_proj`` are
stacked into ``c_attn``'s ``[q | k | v]`` rows. A config field kcourse does not model (rope
scaling, sliding windows, cross-attention, ...) is an error naming the field, never a silent
mismatch. transformers is imported only by ``to_hf``.
"""
from __future__ import annotations

import torch

from .gpt import GPT, GPTConfig

# GPT-2's activation_function -> GPTConfig.activation ("gelu_new", "gelu_fast" and "gelu_pytorch_tanh"
# are the same tanh approximation, written three ways)
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
CLASSES = {"GPT2LMHeadModel": "gpt2", "GPT2Model": "gpt2", "LlamaForCausalLM": "llama", "LlamaModel": "llama"}

# per architecture: kcourse module -> the transformers modules stacked along dim 0, for the whole model and
# for each layer (prefixed "h.{i}." and "{layers}.{i}."); conv1d: the layer modules whose weight is (in, out)
LAYOUTS = {
    "gpt2": {"layers": "h", "model": {"wte": ("wte",), "wpe": ("wpe",), "ln_f": ("ln_f",)},
             "layer": {"ln_1": ("ln_1",), "attn.c_attn": ("attn.c_attn",), "attn.c_proj": ("attn.c_proj",),
                       "ln_2": ("ln_2",), "mlp.c_fc": ("mlp.c_fc",), "mlp.c_proj": ("mlp.c_proj",)},
             "conv1d": {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}},
    "llama": {"layers": "layers", "model": {"wte": ("embed_tokens",), "ln_f": ("norm",)},
              "layer": {"ln_1": ("input_layernorm",),
                        "attn.c_attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                        "attn.c_proj": ("self_attn.o_proj",), "ln_2": ("post_attention_layernorm",),
                        "mlp.w_gate": ("mlp.gate_proj",), "mlp.w_up": ("mlp.up_proj",),
                        "mlp.w_down": ("mlp.down_proj",)},
              "conv1d": set()},
}


def _unsupported(arch: str, field: str, value, why: str = "kcourse does not model it"):
    return ValueError(f"GPT.from_hf: {arch} config has {field}={value!r}; {why}")


def _rope_theta(cfg) -> float:
    """Llama's rope base, from ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling`` (4)."""
    params = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    field = "rope_parameters" if getattr(cfg, "rope_parameters", None) else "rope_scaling"
    kind = params.pop("rope_type", params.pop("type", "default"))
    theta = params.pop("rope_theta", None) or getattr(cfg, "rope_theta", None) or 10000.0
    if params.pop("partial_rotary_factor", 1.0) != 1.0 or kind != "default" or params:
        raise _unsupported("llama", field, getattr(cfg, field),
                           "kcourse's rope is the default one (rope_type 'default', no scaling, the whole head)")
    return float(theta)


def config_from_hf(cfg) -> GPTConfig:
    """The ``GPTConfig`` of a transformers GPT-2 or Llama config."""
    arch = getattr(cfg, "model_type", None)
    if arch == "gpt2":
        for field, ok in (("add_cross_attention", False), ("scale_attn_weights", True),
                          ("scale_attn_by_inverse_layer_idx", False)):
            if getattr(cfg, field, ok) != ok:
                raise _unsupported(arch, field, getattr(cfg, field))
        if cfg.activation_function not in GPT2_ACTIVATIONS:
            raise _unsupported(arch, "activation_function", cfg.activation_function,
                               f"kcourse has {', '.join(GPT2_ACTIVATIONS)}")
        return GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.n_positions, n_layer=cfg.n_layer,
                         n_head=cfg.n_head, n_embd=cfg.n_embd, norm="layernorm", pos="learned", bias=True,
                         tie_weights=cfg.tie_word_embeddings, mlp_hidden=cfg.n_inner,
                         activation=GPT2_ACTIVATIONS[cfg.activation_function], norm_eps=cfg.layer_norm_epsilon)
    if arch == "llama":
        if cfg.hidden_act != "silu":
            raise _unsupported(arch, "hidden_act", cfg.hidden_act, "kcourse's gated feed-forward is SwiGLU (silu)")
        for field in ("sliding_window", "use_sliding_window", "layer_types", "attn_logit_softcapping"):
            if getattr(cfg, field, None):
                raise _unsupported(arch, field, getattr(cfg, field))
        return GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.max_position_embeddings,
                         n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                         n_kv_head=cfg.num_key_value_heads or cfg.num_attention_heads, n_embd=cfg.hidden_size,
                         norm="rmsnorm", pos="rope", bias=False, tie_weights=cfg.tie_word_embeddings,
                         mlp_hidden=cfg.intermediate_size, activation="swiglu", norm_eps=cfg.rms_norm_eps,
                         rope_theta=_rope_theta(cfg), head_dim=getattr(cfg, "head_dim", None),
                         attn_bias=cfg.attention_bias, mlp_bias=getattr(cfg, "mlp_bias", False))
    raise ValueError(f"GPT.from_hf: model_type {arch!r} is not supported; kcourse converts 'gpt2' and 'llama'")


def _pairs(arch: str, n_layer: int, ours: dict):
    """``(our key, their keys, transpose)`` for every tensor of our state dict ``ours`` but the head."""
    layout = LAYOUTS[arch]
    modules = [(o, t, False) for o, t in layout["model"].items()]
    modules += [(f"h.{i}.{o}", tuple(f"{layout['layers']}.{i}.{n}" for n in t), o in layout["conv1d"])
                for i in range(n_layer) for o, t in layout["layer"].items()]
    for module, theirs, conv1d in modules:
        for suffix in ("weight", "bias"):
            if f"{module}.{suffix}" in ours:
                yield f"{module}.{suffix}", tuple(f"{t}.{suffix}" for t in theirs), conv1d and suffix == "weight"


def _check_class(model) -> str:
    name = type(model).__name__
    if name not in CLASSES:
        raise TypeError(f"GPT.from_hf: {name} is not supported; it converts {', '.join(CLASSES)} "
                        "(a transformers model, not a state dict: build the model from its config and load it)")
    return CLASSES[name]


def from_hf(model, backend=None) -> GPT:
    arch = _check_class(model)
    config = config_from_hf(model.config)
    head = model.get_output_embeddings()  # None for the base models
    if head is None and not config.tie_weights:
        raise ValueError(f"GPT.from_hf: {type(model).__name__} has no LM head and its config does not tie "
                         "word embeddings (tie_word_embeddings=False): convert the ...ForCausalLM model")
    theirs = {n: p.detach() for n, p in model.base_model.named_parameters()}
    first = next(iter(theirs.values()))
    gpt = GPT(config, backend=backend).to(first.device, first.dtype)
    ours = gpt.state_dict()
    state, used = {}, set()
    for key, names, conv1d in _pairs(arch, config.n_layer, ours):
        missing = [n for n in names if n not in theirs]
        if missing:
            raise ValueError(f"GPT.from_hf: {type(model).__name__} has no {', '.join(missing)}, which its config makes")
        parts = [theirs[n].mT if conv1d else theirs[n] for n in names]
        state[key] = torch.cat(parts) if len(parts) > 1 else parts[0]
        used.update(names)
        if state[key].shape != ours[key].shape:
            shapes = ", ".join(f"{n} {tuple(theirs[n].shape)}" for n in names)
            raise ValueError(f"GPT.from_hf: the weights ({shapes}{', Conv1D (in, out)' if conv1d else ''}) do not "
                             f"match the config, which makes {key} {tuple(ours[key].shape)}")
    extra = sorted(set(theirs) - used)
    if extra:
        raise ValueError(f"GPT.from_hf: weights kcourse does not model: {', '.join(extra)}")
    if not config.tie_weights:
        if head.weight.shape != ours["lm_head.weight"].shape:
            raise ValueError(f"GPT.from_hf: lm_head.weight is {tuple(head.weight.shape)} but the config makes "
                             f"{tuple(ours['lm_head.weight'].shape)}")
        state["lm_head.weight"] = head.weight
    elif "lm_head.weight" in ours:
        state["lm_head.weight"] = state["wte.weight"]
    gpt.load_state_dict(state)
    return gpt.train(model.training)


def hf_config(config: GPTConfig):
    """The transformers config (GPT2Config or LlamaConfig) of a ``GPTConfig``."""
    import transformers

    c = config
    activation = c.activation or c.mlp
    attn_bias = c.bias if c.attn_bias is None else c.attn_bias
    mlp_bias = c.bias if c.mlp_bias is None else c.mlp_bias
    gpt2 = (c.pos, c.norm) == ("learned", "layernorm") and activation in ("gelu", "gelu_tanh", "relu", "silu")
    llama = (c.pos, c.norm, activation) == ("rope", "rmsnorm", "swiglu")
    if gpt2:
        fields = {"bias": (c.bias, (True,)), "attn_bias": (attn_bias, (True,)), "mlp_bias": (mlp_bias, (True,)),
                  "n_kv_head": (c.n_kv_head, (None, c.n_head)), "head_dim": (c.head_dim, (None, c.n_embd // c.n_head))}
        bad = [f"{name}={value!r}" for name, (value, ok) in fields.items() if value not in ok]
        if bad:
            raise ValueError(f"GPT.to_hf: GPT-2 has biases everywhere and one kv head per head; this config has "
                             f"{', '.join(bad)}")
        names = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
        return transformers.GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
            n_inner=c.mlp_hidden, activation_function=names[activation],
            layer_norm_epsilon=1e-5 if c.norm_eps is None else c.norm_eps, tie_word_embeddings=c.tie_weights,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    if llama:
        return transformers.LlamaConfig(
            vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.mlp_hidden or 4 * c.n_embd,
            num_hidden_layers=c.n_layer, num_attention_heads=c.n_head, num_key_value_heads=c.n_kv_head or c.n_head,
            head_dim=c.head_dim or c.n_embd // c.n_head, hidden_act="silu", max_position_embeddings=c.block_size,
            rms_norm_eps=1e-6 if c.norm_eps is None else c.norm_eps, rope_theta=c.rope_theta,
            attention_bias=attn_bias, mlp_bias=mlp_bias, tie_word_embeddings=c.tie_weights,
            bos_token_id=None, eos_token_id=None)
    raise ValueError(f"GPT.to_hf: no transformers class matches pos={c.pos!r}, norm={c.norm!r}, "
                     f"activation={activation!r}: GPT-2 is learned/layernorm/an MLP, Llama rope/rmsnorm/swiglu")


def to_hf(gpt: GPT):
    import transformers

    config = hf_config(gpt.config)
    cls = transformers.GPT2LMHeadModel if config.model_type == "gpt2" else transformers.LlamaForCausalLM
    weight = gpt.wte.weight
    model = cls(config).to(weight.device, weight.dtype)
    theirs = model.base_model.state_dict()
    ours = gpt.state_dict()
    with torch.no_grad():
        for key, names, conv1d in _pairs(config.model_type, gpt.config.n_layer, ours):
            sizes = [theirs[n].shape[-1 if conv1d else 0] for n in names]
            for name, part in zip(names, ours[key].split(sizes)):
                theirs[name].copy_(part.mT if conv1d else part)
        if not gpt.config.tie_weights:
            model.get_output_embeddings().weight.copy_(ours["lm_head.weight"])
    return model.train(gpt.training)
