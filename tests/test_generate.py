"""GPT.generate with the KV cache: greedy tokens equal to use_cache=False on every backend and to
transformers' generate; past block_size (an error with the cache, the context cropped without);
sampling; left-padded batches in generate and forward (equal to transformers with the same mask);
the cache's own errors and bad input."""
import copy
import pickle

import pytest
import torch

from kcourse.modules import GPT, GPTConfig, set_backend
from _util import DEVICE

TINY = dict(vocab_size=32, block_size=12, n_layer=1, n_head=2, n_embd=16)
ARCHS = {"gpt2": dict(activation="gelu_tanh"),
         "llama": dict(activation="swiglu", norm="rmsnorm", pos="rope", n_kv_head=1, bias=False, rope_theta=1000.0)}


def model(arch, backend=None, **changes):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY, **ARCHS[arch], **changes}), backend=backend).to(DEVICE)


def prompts(B=2, T=5, vocab=32):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(2)).to(DEVICE)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_cached_greedy_equals_uncached_and_python(backend, arch):
    gpt = model(arch, backend)
    idx = prompts(T=4)
    cached = gpt.generate(idx, 3, temperature=0)
    assert cached.shape == (2, 7) and torch.equal(cached[:, :4], idx)
    assert torch.equal(cached, gpt.generate(idx, 3, temperature=0, use_cache=False))
    assert torch.equal(cached, set_backend(gpt, "python").generate(idx, 3, temperature=0))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_cached_logits_equal_the_full_forward(arch):
    """Prefill then one token at a time through hidden_states(idx, cache): each step's hidden state
    is the full forward's at that position."""
    with torch.no_grad():
        _cached_steps(arch)


def _cached_steps(arch):
    for backend in ("python", "pytorch"):
        gpt = model(arch, backend)
        idx = prompts(T=10)
        full = gpt.hidden_states(idx)
        cache = gpt.kv_cache(10)
        steps = [gpt.hidden_states(idx[:, :6], cache)] + [gpt.hidden_states(idx[:, t:t + 1], cache) for t in range(6, 10)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
        assert cache.pos == 10


TOLERANCE = {"triton": dict(rtol=1e-4, atol=1e-4), "cute": dict(rtol=1e-4, atol=1e-4)}  # float32 on tensor cores


@pytest.mark.parametrize("arch", list(ARCHS))
def test_static_cache_steps_equal_the_full_forward(backend, arch):
    """A static cache: after the prompt, each step reads its positions from the device, writes at them
    and attends over the whole buffer with kv_len: each step's hidden state is the full forward's."""
    gpt = model(arch, backend)
    idx = prompts(T=10)
    with torch.no_grad():
        full = gpt.hidden_states(idx)
        cache = gpt.kv_cache(12, static=True)
        steps = [gpt.hidden_states(idx[:, :6], cache)]
        for buffer in cache.k + cache.v:  # unwritten positions hold anything, NaN included: never read
            buffer[:, :, 6:] = float("nan")
        for t in range(6, 10):
            assert cache.decoding and int(cache.length) == t
            steps.append(gpt.hidden_states(idx[:, t:t + 1], cache))
    assert cache.pos == 10 and int(cache.length) == 10 and cache.k[0].shape[2] == 12
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOLERANCE.get(backend, {}))


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_cuda_graph_decoding_equals_eager(backend, arch):
    gpt = model(arch, backend, block_size=40)
    idx = prompts(B=3, T=6)
    eager = gpt.generate(idx, 20, temperature=0)
    graphed = gpt.generate(idx, 20, temperature=0, cuda_graph=True)
    assert torch.equal(graphed, eager)
    kept = gpt.__dict__["_graphed_step"].step
    other = prompts(B=3, T=9)  # another prompt length: the same graph, its cache reset
    assert torch.equal(gpt.generate(other, 12, temperature=0, cuda_graph=True), gpt.generate(other, 12, temperature=0))
    assert gpt.__dict__["_graphed_step"].step is kept
    assert copy.deepcopy(gpt).__dict__.get("_graphed_step") is None  # a copy captures its own
    torch.manual_seed(3)
    sampled = gpt.generate(idx, 8, temperature=0.9, top_k=4, cuda_graph=True)
    torch.manual_seed(3)
    assert torch.equal(sampled, gpt.generate(idx, 8, temperature=0.9, top_k=4))


def test_a_kept_graph_is_not_copied():
    # deepcopy (an EMA model, say) and pickling skip the kept CUDA graph, which neither can copy
    from kcourse.modules.generate import _Kept
    gpt = model("gpt2", "pytorch")
    gpt.__dict__["_graphed_step"] = _Kept(("key",), object())
    assert copy.deepcopy(gpt).__dict__.get("_graphed_step") is None
    assert pickle.loads(pickle.dumps(gpt)).__dict__.get("_graphed_step") is None


def test_cuda_graph_needs_the_cache_and_cuda():
    gpt = model("gpt2", "pytorch")
    with pytest.raises(ValueError, match=r"cuda_graph replays decode steps on a static KV cache: it needs "
                                         r"use_cache=True \(got False\)"):
        gpt.generate(prompts(), 2, cuda_graph=True, use_cache=False)
    if not DEVICE.startswith("cuda"):
        with pytest.raises(ValueError, match=r"and a CUDA model \(idx is on cpu\)"):
            gpt.generate(prompts(), 2, cuda_graph=True)


def test_past_block_size_the_cache_refuses_and_use_cache_false_crops():
    """block_size 12: a 5-token prompt takes 7 new tokens with the cache (the last position fills it);
    8 is an error naming what is wrong; without the cache the context is cropped (nanoGPT)."""
    gpt = model("gpt2", "pytorch")
    idx = prompts()
    full = gpt.generate(idx, 7, temperature=0)
    with pytest.raises(ValueError, match=r"a prompt of 5 tokens and max_new_tokens=8 make 13 positions, more than "
                                         r"block_size \(12\).*at most 7 new tokens.*use_cache=False"):
        gpt.generate(idx, 8, temperature=0)
    cropped = gpt.generate(idx, 10, temperature=0, use_cache=False)
    assert cropped.shape == (2, 15) and torch.equal(cropped[:, :12], full)


def test_sampling_draws_the_same_tokens_with_and_without_the_cache():
    gpt = model("llama", "pytorch")
    idx = prompts()
    torch.manual_seed(5)
    a = gpt.generate(idx, 6, temperature=0.8, top_k=5)
    torch.manual_seed(5)
    assert torch.equal(a, gpt.generate(idx, 6, temperature=0.8, top_k=5, use_cache=False))


# ----------------------------------------------------------------------------- padding masks
def padded(B=3, T=7):
    idx = prompts(B, T)
    mask = torch.ones_like(idx)
    mask[0, :3] = 0
    mask[2, :1] = 0
    return idx.masked_fill(mask == 0, 0), mask


def test_left_padded_generate_equals_each_prompt_alone():
    gpt = model("gpt2", "pytorch")
    idx, mask = padded()
    out = gpt.generate(idx, 4, temperature=0, attention_mask=mask)
    assert out.shape == (3, 11) and torch.equal(out[:, :7], idx)
    for b in range(3):
        alone = idx[b:b + 1, int((mask[b] == 0).sum()):]
        assert torch.equal(out[b, 7:], gpt.generate(alone, 4, temperature=0)[0, alone.shape[1]:])


def test_padded_forward_logits_and_loss():
    """Each row's tokens as if alone (padding: logits 0, no loss); right padding too."""
    gpt = model("llama", "pytorch")
    idx, mask = padded()
    right = mask.flip(1)
    for m in (mask, right):
        logits, loss = gpt(idx, idx, attention_mask=m)
        losses, count = 0.0, 0
        for b in range(3):
            valid = m[b].bool()
            alone, alone_loss = gpt(idx[b:b + 1, valid], idx[b:b + 1, valid], return_logits=True)
            torch.testing.assert_close(logits[b, valid], alone[0], rtol=1e-5, atol=1e-5)
            assert not logits[b, ~valid].any()
            losses, count = losses + alone_loss * valid.sum(), count + valid.sum()
        torch.testing.assert_close(loss, losses / count)


transformers_cases = pytest.mark.parametrize("arch", ["GPT2LMHeadModel", "LlamaForCausalLM"])


def hf_model(cls):
    transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency")
    tokens = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2, **tokens) \
        if cls == "GPT2LMHeadModel" else transformers.LlamaConfig(
            vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=16, **tokens)
    torch.manual_seed(0)
    return getattr(transformers, cls)(config).to(DEVICE).eval()


@transformers_cases
def test_generate_equals_transformers_with_left_padding(arch):
    hf = hf_model(arch)
    gpt = GPT.from_hf(hf, backend="pytorch")
    idx, mask = padded()
    theirs = hf.generate(idx, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(gpt.generate(idx, 5, temperature=0, attention_mask=mask), theirs)
    full = torch.ones_like(idx)
    theirs = hf.generate(idx, attention_mask=full, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(gpt.generate(idx, 5, temperature=0), theirs)


@transformers_cases
def test_padded_forward_equals_transformers(arch):
    hf = hf_model(arch)
    idx, mask = padded()
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # what transformers' generate passes
    with torch.no_grad():
        theirs = hf(idx, attention_mask=mask, position_ids=positions).logits
    for backend in ("python", "pytorch"):
        ours = GPT.from_hf(hf, backend=backend)(idx, attention_mask=mask)[0]
        valid = mask.bool()
        err = (ours[valid] - theirs[valid]).abs().max() / theirs[valid].abs().max()
        assert err < 1e-5, f"{backend}: relative error {err:.2e}"


# ----------------------------------------------------------------------------- bad input
def test_cache_errors():
    gpt = model("llama", "pytorch")
    with pytest.raises(RuntimeError, match=r"KVCache: its writes are in place, not differentiable"):
        gpt.hidden_states(prompts(T=5), gpt.kv_cache(6))
    with torch.no_grad():
        _cache_errors(gpt)


def _cache_errors(gpt):
    with pytest.raises(ValueError, match=r"max_len \(13\) must be in 1..block_size \(12\)"):
        gpt.kv_cache(13)
    cache = gpt.kv_cache(6)
    gpt.hidden_states(prompts(T=5), cache)
    with pytest.raises(ValueError, match=r"2 new positions after 5 cached ones; a cached causal forward"):
        gpt.hidden_states(prompts(T=2), cache)
    gpt.hidden_states(prompts(T=1), cache)
    with pytest.raises(ValueError, match=r"KVCache: 1 new positions after 6 cached ones exceed the cache's max_len \(6\)"):
        gpt.hidden_states(prompts(T=1), cache)
    with pytest.raises(ValueError, match="sequence length 13 exceeds block_size 12"):
        gpt.hidden_states(prompts(T=13))


@pytest.mark.parametrize("mask, match", [
    ([[1, 1, 1, 1], [1, 0, 1, 1]], r"row 1: its tokens \(ones\) at \[0, 2, 3\] are not one contiguous run"),
    ([[1, 1, 1, 1], [1, 1, 1, 0]], "row 1 is not left padding"),
    ([[1, 1, 1, 1], [0, 0, 0, 0]], "row 1 is not left padding with at least one token"),
    ([[1, 1, 1, 1], [0, 2, 1, 1]], r"row 1 holds \[0, 1, 2\]; it must hold 0 \(padding\) and 1"),
    ([[1, 1, 1, 1]], r"attention_mask is \(1, 4\); it must be \(B, T\) = \(2, 4\)"),
])
def test_bad_masks(mask, match):
    gpt = model("gpt2", "pytorch")
    with pytest.raises(ValueError, match=match):
        gpt.generate(prompts(T=4), 2, attention_mask=torch.tensor(mask, device=DEVICE))


def test_bad_generate_arguments():
    gpt = model("gpt2", "pytorch")
    for kwargs in (dict(max_new_tokens=-1), dict(max_new_tokens=2, temperature=-1.0), dict(max_new_tokens=2, top_k=0)):
        with pytest.raises(ValueError, match="max_new_tokens .* must be >= 0 and top_k"):
            gpt.generate(prompts(), **kwargs)
