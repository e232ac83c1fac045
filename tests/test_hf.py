"""GPT.from_hf and GPT.to_hf against transformers' GPT-2 and Llama built from small configs: logits
equal in float32 on python and pytorch (and the tiniest model through triton), tied and untied
heads, grouped-query heads, a head_dim of its own, biases; the base models; the round trip; every
unsupported model, config field or weight shape an error that names it."""
import pytest
import torch

from kcourse.modules import GPT, GPTConfig
from _util import DEVICE

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pip install -e '.[dev]')")

NO_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
CONFIGS = {  # name -> (transformers class, config)
    "gpt2": ("GPT2LMHeadModel", lambda: transformers.GPT2Config(
        vocab_size=61, n_positions=24, n_embd=32, n_layer=2, n_head=4, **NO_TOKENS)),
    "gpt2_untied_exact_gelu": ("GPT2LMHeadModel", lambda: transformers.GPT2Config(
        vocab_size=61, n_positions=24, n_embd=32, n_layer=1, n_head=2, n_inner=40, activation_function="gelu",
        layer_norm_epsilon=1e-3, tie_word_embeddings=False, **NO_TOKENS)),
    "llama_gqa": ("LlamaForCausalLM", lambda: transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=24, rope_theta=500000.0, rms_norm_eps=1e-5, **NO_TOKENS)),
    "llama_tied_head_dim_bias": ("LlamaForCausalLM", lambda: transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, max_position_embeddings=24, attention_bias=True, mlp_bias=True,
        tie_word_embeddings=True, **NO_TOKENS)),
}


def hf_model(name, **changes):
    cls, make = CONFIGS[name]
    config = make()
    for field, value in changes.items():
        setattr(config, field, value)
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config).to(DEVICE).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(std=0.1)
    return model


def tokens(B=2, T=11):
    return torch.randint(0, 61, (B, T), generator=torch.Generator().manual_seed(1)).to(DEVICE)


def assert_logits(ours, theirs, rtol=1e-5):
    err = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    assert err < rtol, f"max |ours - transformers| / max |transformers| = {err:.2e}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_from_hf_logits_equal_transformers_and_to_hf_round_trips(name):
    hf = hf_model(name)
    idx = tokens()
    with torch.no_grad():
        expected = hf(idx).logits
        for backend in ("python", "pytorch"):
            gpt = GPT.from_hf(hf, backend=backend)
            assert_logits(gpt(idx)[0], expected)
        back = gpt.to_hf().eval()
        assert type(back) is type(hf)
        assert torch.equal(back(idx).logits, expected)
    assert gpt.config.tie_weights == hf.config.tie_word_embeddings
    assert (gpt.lm_head.weight is gpt.wte.weight) == gpt.config.tie_weights
    ours, theirs = GPT.from_hf(back).state_dict(), gpt.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_from_hf_on_triton():
    hf = hf_model("gpt2_untied_exact_gelu")
    idx = tokens(B=1, T=7)
    with torch.no_grad():
        assert_logits(GPT.from_hf(hf, backend="triton")(idx)[0], hf(idx).logits, rtol=1e-4)


def test_config_fields_reach_the_model():
    gpt = GPT.from_hf(hf_model("llama_tied_head_dim_bias"))
    attn = gpt.h[0].attn
    assert (attn.head_dim, attn.c_attn.weight.shape, attn.c_proj.weight.shape) == (16, (3 * 64, 32), (32, 64))
    assert attn.c_attn.bias is not None and gpt.h[0].mlp.w_up.bias is not None and gpt.h[0].ln_1.eps == 1e-6
    gpt = GPT.from_hf(hf_model("llama_gqa"))
    assert (gpt.config.rope_theta, gpt.h[0].attn.rope_base, gpt.h[0].ln_2.eps) == (500000.0, 500000.0, 1e-5)
    assert GPT.from_hf(hf_model("gpt2")).h[0].mlp.activation == "gelu_tanh"  # GPT-2's gelu_new


def test_base_models():
    """GPT2Model and a tied LlamaModel: the same final hidden states; an untied LlamaModel has no head."""
    idx = tokens()
    for name, cls in (("gpt2", "GPT2Model"), ("llama_tied_head_dim_bias", "LlamaModel")):
        base = getattr(transformers, cls)(hf_model(name).config).to(DEVICE).eval()
        gpt = GPT.from_hf(base, backend="pytorch")
        with torch.no_grad():
            assert_logits(gpt.hidden_states(idx), base(idx).last_hidden_state)
    untied = transformers.LlamaModel(hf_model("llama_gqa").config)
    with pytest.raises(ValueError, match="LlamaModel has no LM head.*tie_word_embeddings=False"):
        GPT.from_hf(untied)


def test_to_hf_from_a_kcourse_config():
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=4, n_kv_head=2, n_embd=32, activation="swiglu",
                       norm="rmsnorm", pos="rope", bias=False, tie_weights=False, rope_theta=5000.0, norm_eps=1e-5)
    gpt = GPT(config, backend="pytorch").to(DEVICE)
    hf = gpt.to_hf().eval()
    assert (hf.config.num_key_value_heads, hf.config.rms_norm_eps, hf.config.max_position_embeddings) == (2, 1e-5, 16)
    idx = tokens(T=9) % 40
    with torch.no_grad():
        assert_logits(gpt(idx)[0], hf(idx).logits)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("model, error, match", [
    (torch.nn.Linear(2, 2), TypeError, "Linear is not supported; it converts GPT2LMHeadModel"),
    ({"transformer.wte.weight": torch.zeros(2, 2)}, TypeError, "dict is not supported.*not a state dict"),
])
def test_unsupported_models(model, error, match):
    with pytest.raises(error, match=match):
        GPT.from_hf(model)


@pytest.mark.parametrize("name, changes, match", [
    ("llama_gqa", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters=.*'linear'"),
    ("llama_gqa", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("gpt2", {"activation_function": "quick_gelu"}, "activation_function='quick_gelu'"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ("gpt2", {"n_inner": 40}, r"mlp.c_fc.weight \(32, 128\), Conv1D .* makes h.0.mlp.c_fc.weight \(40, 32\)"),
    ("llama_gqa", {"num_key_value_heads": 4}, r"self_attn.k_proj.weight \(16, 32\).* makes h.0.attn.c_attn.weight"),
    ("llama_gqa", {"model_type": "mistral"}, "model_type 'mistral' is not supported"),
])
def test_unsupported_config_fields_and_mismatched_weights(name, changes, match):
    """Config fields changed after the model was built: an unmodelled feature, or weights of other shapes."""
    hf = hf_model(name)
    for field, value in changes.items():
        setattr(hf.config, field, value)
    with pytest.raises(ValueError, match=match):
        GPT.from_hf(hf)


@pytest.mark.parametrize("changes, match", [
    (dict(pos="rope"), "no transformers class matches pos='rope', norm='layernorm'"),
    (dict(bias=False), "GPT-2 has biases everywhere .* bias=False"),
    (dict(n_kv_head=2), "n_kv_head=2"),
])
def test_to_hf_refuses_what_no_transformers_class_holds(changes, match):
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=4, n_embd=32, **changes)
    with pytest.raises(ValueError, match=match):
        GPT(config).to_hf()


def test_example_script_loads_a_checkpoint_checks_and_generates(tmp_path):
    from test_training import example

    script = example("hf_generate")
    script.build("llama").save_pretrained(tmp_path)
    result = script.main(["--checkpoint", str(tmp_path), "--max-new-tokens", "4", "--device", DEVICE])
    assert result["logit_error"] < result["rtol"] and result["greedy_identical"] and result["text"]
