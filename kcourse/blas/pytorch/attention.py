"""attention: ``out = softmax(scale q k^T [+ causal mask]) v`` with ATen's flash attention kernel,
else ``F.scaled_dot_product_attention``.

q (B, H, Tq, D), k and v (B, Hkv, Tk, D); ``enable_gqa=True`` lets query head h read kv head
h // (H / Hkv). Backward, with P the attention weights and delta_i = sum_j P_ij dP_ij:

    dV = P^T dO     dP = dO v^T     dS = P * (dP - delta)     dQ = scale dS k     dK = scale dS^T q

``attention_backward`` does not spell that out: it runs the backward kernel of the forward's.
Where the forward called ATen's flash attention kernel itself (``keeps_lse``: no kv_len, 0 < scale
< inf; on CUDA sm80+, 16-bit, D a multiple of 8 up to 256, Tq = Tk if causal; on the CPU any
dtype), the cache is q, k, v, out and that kernel's logsumexp (B, H, Tq), and the backward is
ATen's flash backward from them, as SDPA's own autograd runs it: no second forward. Elsewhere the
cache keeps an empty lse, and the backward recomputes the forward under autograd and lets
``torch.autograd.grad`` run SDPA's backward. The output and the gradients come as the flash kernels
write them, token-major for token-major q, k, v (``_layout.heads_like``, the op's layout).

``kv_len`` (the keys of batch row b past kv_len[b] hidden): on CUDA, in 16-bit, without the causal
mask and with k and v token-major (a static KV cache stores ``(B, max_len, Hkv, hd)``), flash
attention's variable-length forward reads only each row's first kv_len[b] keys (``seqused_k``).
Otherwise it becomes a boolean mask for SDPA, and
the hidden keys and values are read as zeros (a cache's unwritten positions may hold NaN, which a
masked score would still multiply); a batch row with no key gets zeros (SDPA's NaN rows
replaced). It never reaches the backward.

``scale`` NaN: every score is NaN, so by the formula every output and every gradient is NaN (the
other backends' answer); SDPA returns zeros instead, so that case does not reach it. (With
Tq = 0 or Tk = 0 there is no score: the same empty or zero results as for any scale.)
"""
import functools
import itertools
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import _cache, _layout

# SDPA's cuDNN backend is left out: on an H100 with torch 2.11 its backward returned wrong bfloat16
# gradients in our GPU tests (dq off by up to 6 at T = 2048..8192, head dim 128; see also
# pytorch/pytorch#196678). The flash, memory-efficient and math backends agree with the reference.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or on CUDA a fresh contiguous copy where SDPA's fused kernels would read it misaligned:
    they load 16 bytes at a time, and torch 2.11 checks neither the data pointer nor the strides
    (a view at an odd element offset, such as ``buf[1:, 1:]``, ends in a CUDA misaligned-address
    error). Views made by splitting heads or a fused qkv projection stay as they are."""
    size = t.element_size()
    if t.device.type != "cuda" or t.numel() == 0 or (
            t.data_ptr() % 16 == 0 and t.stride(-1) == 1
            and all(s * size % 16 == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1)):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _sdpa(q, k, v, causal, scale, keys=None):
    """SDPA over the keys ``keys`` (B, Tk) bool marks visible in each batch row (every key: None)."""
    q, k, v = (aligned(t) for t in (q, k, v))
    mask = None
    if (causal and scale <= 0) or keys is not None:  # SDPA's is_causal path scales its -inf mask: NaN at
        # scale 0 (0 * -inf), and a negative scale turns it into +inf (NaN rows on the CPU); a boolean mask does not
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril() if causal else None
        if keys is not None:  # (B, 1, 1, Tk), and (Tq, Tk) with it: (B, 1, Tq, Tk)
            mask = keys[:, None, None, :] if mask is None else keys[:, None, None, :] & mask
        causal = False
    # a scale of 0 (every score 0: the mean of the visible values) or below: SDPA's fused CUDA kernels
    # give NaN rows in float16 (torch 2.11), its math backend the formula's answer
    with sdpa_kernel(SDPA_BACKENDS if scale > 0 else [SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)


_FLASH_CUDA = (torch.ops.aten._scaled_dot_product_flash_attention,
               torch.ops.aten._scaled_dot_product_flash_attention_backward)
_FLASH_CPU = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
              torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)


@functools.cache
def _sm80(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def keeps_lse(q, k, v, kv_len, causal: bool, scale: float) -> bool:
    """Does the forward call ATen's flash attention kernel itself and keep its logsumexp for the
    backward? Without kv_len, with some score and 0 < scale < inf (a causal mask at scale <= 0 is a
    boolean mask, which the kernel does not take), on CUDA under that kernel's own conditions (sm80+,
    16-bit, D a multiple of 8 up to 256, the flash backend enabled; under the causal mask Tq = Tk,
    where its bottom-right aligned mask is ours), on the CPU in any dtype (its flash kernel is what
    SDPA runs there). Shapes, dtypes and flags only: the fake implementation asks it too."""
    if kv_len is not None or _no_scores(q, k) or not 0 < scale < math.inf:
        return False
    if q.device.type == "cpu":
        return True
    D = q.shape[-1]
    return (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and D % 8 == 0 and D <= 256
            and (not causal or q.shape[2] == k.shape[2])  # its causal mask is bottom-right aligned, ours top-left
            and torch.backends.cuda.flash_sdp_enabled() and _sm80(q.device))


def _readable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the flash kernels read it: ``aligned`` on CUDA; on the CPU a contiguous copy unless
    its rows are (the CPU kernel reads the head dim as unit-stride, whatever the strides say, and
    SDPA, which checks, would take its math backend instead)."""
    if t.device.type == "cuda":
        return aligned(t)
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _flash(q, k, v, causal: bool, scale: float):
    """``(out, lse)`` of ATen's flash attention kernel (grouped-query heads read natively)."""
    q, k, v = (_readable(t) for t in (q, k, v))
    if q.is_cuda:
        return _FLASH_CUDA[0](q, k, v, 0.0, causal, False, scale=scale)[:2]
    return _FLASH_CPU[0](q, k, v, 0.0, causal, scale=scale)


def _flash_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    """``(dq, dk, dv)`` of ATen's flash backward from the forward's out and lse."""
    q, k, v, dout = (_readable(t) for t in (q, k, v, dout))
    if not q.is_cuda:
        return _FLASH_CPU[1](dout, q, k, v, out, lse, 0.0, causal, scale=scale)
    # the RNG state (seed, offset) is read only under dropout: an uninitialized pair of the forward's kind
    rng = torch.empty(2, dtype=torch.uint64, device=q.device)
    return _FLASH_CUDA[1](dout, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, rng, rng,
                          scale=scale)


def _no_scores(q, k) -> bool:
    return q.shape[2] == 0 or k.shape[2] == 0


def _packed_tokens(t: torch.Tensor) -> bool:
    """Is ``t (B, H, T, D)`` the ``.transpose(1, 2)`` view of a contiguous ``(B, T, H, D)`` tensor
    (rows of packed tokens, as flash attention's variable-length layout reads them)?"""
    return t.transpose(1, 2).is_contiguous()


def _flash_lengths(q, k, v, causal: bool, scale: float) -> bool:
    """Can flash attention's variable-length forward take this kv_len call: CUDA (sm80+), 16-bit, D a
    multiple of 8 up to 256, no mask but the lengths (its causal mask is bottom-right aligned,
    kcourse's top-left), a positive scale, k and v token-major (a view of the packed layout)?"""
    D = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and D % 8 == 0 and D <= 256 and not causal
            and 0 < scale < math.inf and _packed_tokens(k) and _packed_tokens(v) and q.stride(-1) == 1
            and torch.backends.cuda.flash_sdp_enabled() and torch.cuda.get_device_capability(q.device) >= (8, 0))


def _flash_with_lengths(q, k, v, kv_len, scale: float) -> torch.Tensor:
    """out (B, H, Tq, D) from flash attention's variable-length forward: batch row b is a sequence of
    Tq queries and the first kv_len[b] of its Tk key slots (``seqused_k``, clamped to [0, Tk]); the
    kernel never reads the others, so what they hold does not matter. A row of no key gives 0."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    rows = q.transpose(1, 2).reshape(B * Tq, H, D)  # (B Tq, H, D): a copy only where q is not token-major
    keys, values = (t.transpose(1, 2).reshape(B * Tk, Hkv, D) for t in (k, v))  # views: token-major
    starts_q, starts_k = _cache.starts(B, Tq, q.device), _cache.starts(B, Tk, q.device)  # (B + 1,) int32
    out = torch.ops.aten._flash_attention_forward(rows, keys, values, starts_q, starts_k, Tq, Tk, 0.0, False, False,
                                                  scale=scale, seqused_k=kv_len.clamp(0, Tk))[0]
    return out.reshape(B, Tq, H, D).transpose(1, 2)


def _not_kept(q: torch.Tensor) -> torch.Tensor:
    """The cache's lse where the forward kept none: empty, so the backward recomputes."""
    return q.new_empty((0,), dtype=torch.float32)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len, causal: bool, scale: float):
    if keeps_lse(q, k, v, kv_len, causal, scale):
        out, lse = _flash(q, k, v, causal, scale)
        return out, (q, k, v, out, lse)
    if math.isnan(scale) and not _no_scores(q, k):
        out = torch.full_like(q, math.nan)  # (B, H, Tq, D)
    elif kv_len is None:
        out = _sdpa(q, k, v, causal, scale)
    elif _no_scores(q, k):
        out = q.new_zeros(q.shape)
    elif _flash_lengths(q, k, v, causal, scale):
        out = _flash_with_lengths(q, k, v, kv_len, scale).masked_fill((kv_len <= 0)[:, None, None, None], 0.0)
    else:
        # the hidden keys and values as zeros: SDPA masks scores, yet multiplies (and adds to a -inf
        # mask) whatever they hold, which in a cache's unwritten positions may be NaN
        keys = torch.arange(k.shape[2], device=k.device) < kv_len[:, None]  # (B, Tk): key j visible in row b
        hidden = ~keys[:, None, :, None]  # (B, 1, Tk, 1)
        k, v = k.masked_fill(hidden, 0.0), v.masked_fill(hidden, 0.0)
        out = _sdpa(q, k, v, causal, scale, keys)  # a batch row with no key: SDPA's rows of NaN, made 0
        out = out.masked_fill((kv_len <= 0)[:, None, None, None], 0.0)
    return out, (q, k, v, out, _not_kept(q))


def attention_backward(dout: torch.Tensor, cache, needs, causal: bool, scale: float):
    if not any(needs):
        return None, None, None
    q, k, v, out, lse = cache
    if lse.dim() == 3:  # the forward's flash kernel kept it
        return tuple(g if n else None for g, n in zip(_flash_backward(dout, q, k, v, out, lse, causal, scale), needs))
    if math.isnan(scale) and not _no_scores(q, k):
        return tuple(torch.full_like(t, math.nan) if n else None for t, n in zip((q, k, v), needs))
    # This runs inside the custom op kcourse::attention_backward, below autograd (its dispatch keys
    # excluded): let autograd record the recomputed forward again, for SDPA's own backward.
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.AutogradFunctionality, False), \
            torch.enable_grad():
        inputs = [t.detach().requires_grad_(n) for t, n in zip((q, k, v), needs)]
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(_sdpa(*inputs, causal, scale), wanted, aligned(dout)))
    return tuple(next(grads) if n else None for n in needs)


def _node_hooks(orders: tuple[bool, bool, bool]):
    """The pre- and post-hook of a flash attention node whose q, k and v have these heads orders:
    the incoming gradient ``aligned``, the gradients of q, k and v laid out as those inputs are. They
    keep the orders, not the tensors (the node would otherwise hold its inputs beyond its backward)."""
    def pre(grad_outputs):
        return (None if grad_outputs[0] is None else aligned(grad_outputs[0]), *grad_outputs[1:])

    def post(grad_inputs, grad_outputs):
        return tuple(g if g is None else _layout.in_heads_order(g, order) for g, order in zip(grad_inputs, orders))

    return pre, post


_HOOKS = {orders: _node_hooks(orders) for orders in itertools.product((False, True), repeat=3)}


def attention_autograd(q, k, v, kv_len, causal: bool, scale: float):
    """``[out]`` of ATen's flash attention kernel recorded by ATen's autograd
    (``kcourse.backend.autograd_kernel``), where the forward above calls that kernel (``keeps_lse``):
    its backward is the same flash backward from the same out and lse. Hooks on that call's node keep
    the op's layouts: the gradient reaching it ``aligned`` (CUDA), those of q, k and v laid out as
    q, k and v order heads and tokens, as the output is. Else None."""
    if not keeps_lse(q, k, v, kv_len, causal, scale):
        return None
    out = _flash(q, k, v, causal, scale)[0]
    pre, post = _HOOKS[(_layout.token_major(q), _layout.token_major(k), _layout.token_major(v))]
    if out.is_cuda:
        out.grad_fn.register_prehook(pre)
    out.grad_fn.register_hook(post)
    return [_layout.laid_out_like_heads(out, q)]
