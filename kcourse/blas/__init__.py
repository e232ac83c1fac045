"""kcourse.blas: the public functional API.

Every op resolves its backend (``kcourse.backend.backend_for``), casts its inputs as an active
``torch.autocast`` would (``autocast_inputs``: torch's policy for the op it stands for), validates its arguments
(``_check``, before anything is written) and runs the custom op ``torch.ops.kcourse.<op>``
(``_library.call``: eagerly without the dispatcher's overhead), passing the backend by name. The kernel has one calling convention on every
backend: inputs first, then scalars, then ``out``, the tensor it writes. An out-of-place op writes
a fresh ``out`` and is differentiable; the in-place variant ``op_`` writes its target (``out`` is
then one of the inputs, element for element, which every kernel supports) and returns it.

BLAS conventions, on every backend: with ``beta == 0`` ``y``/``C`` is not read, so NaN or Inf there
never reaches the result; with ``alpha == 0`` the product's operands are not read.
"""
from __future__ import annotations

import torch

from ..backend import backend_for
from . import _check
from ._library import _autocasting, autocast_inputs, call

__all__ = ["copy", "copy_", "swap", "swap_", "scal", "scal_", "axpby", "axpby_", "dot",
           "gemv", "gemv_", "geru", "geru_", "gemm", "gemm_",
           "softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm", "gelu", "silu", "relu",
           "swiglu", "embedding", "rope", "attention", "add_layer_norm", "add_rms_norm",
           "linear", "linear_swiglu", "linear_cross_entropy"]


_VALID: dict = {}  # (check, the arguments' signature) -> what the check returned
_SCALARS = (int, float, str, bool, type(None))


def _validated(check, backend: str, *args):
    """``check(backend, *args)``, run once per signature: the tensors' shapes, strides, dtypes and
    devices and the other arguments' values (every check reads only those). Under torch.compile
    the check runs as written, traced like the rest of the call."""
    if torch.compiler.is_compiling():
        return check(backend, *args)
    key = [check, backend]
    for a in args:
        if isinstance(a, torch.Tensor):
            key += (a.shape, a.stride(), a.dtype, a.device)
        elif type(a) in _SCALARS:
            key.append(a)
        else:  # a 0-d tensor as a scalar, say: not a signature to keep
            return check(backend, *args)
    key = tuple(key)
    result = _VALID.get(key, _VALID)
    if result is _VALID:
        result = check(backend, *args)
        if len(_VALID) > 4096:
            _VALID.clear()
        _VALID[key] = result
    return result


def _check_gelu(backend, x, approximate):
    return _check.check_activation(backend, "gelu", x, approximate=approximate)


def _check_log_softmax(backend, x, dim):
    return _check.check_softmax(backend, x, dim, op="log_softmax")


def _inplace(op: str, *tensors) -> None:
    # An in-place op overwrites its target: autograd could not differentiate through it.
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(f"{op}: in-place ops are not differentiable; use the out-of-place form, "
                           "or call it under torch.no_grad()")


# ----------------------------------------------------------------------------- level 1

def copy(x, backend=None):
    """``y = x``: a new tensor with the values of ``x``."""
    name = backend_for("copy", backend)
    _validated(_check.check_copy, name, x)
    return call("copy", x, name)


def copy_(x, y, backend=None):
    """``y <- x``; returns ``y``."""
    name = backend_for("copy", backend)
    _check.check_copy(name, x, y, inplace=True)
    _inplace("copy_", x, y)
    call("copy_", x, y, name)
    return y


def swap(x, y, backend=None):
    """``(x', y') = (y, x)``: new tensors holding the values of ``y`` and of ``x``."""
    name = backend_for("swap", backend)
    x, y = autocast_inputs("swap", x, y)
    _validated(_check.check_swap, name, x, y)
    return call("swap", x, y, name)


def swap_(x, y, backend=None):
    """``x <-> y`` in place; returns ``(x, y)``."""
    name = backend_for("swap", backend)
    _check.check_swap(name, x, y, inplace=True)
    _inplace("swap_", x, y)
    call("swap_", x, y, name)
    return x, y


def scal(x, alpha, backend=None):
    """``alpha * x``."""
    name = backend_for("scal", backend)
    _validated(_check.check_scal, name, x, alpha)
    return call("scal", x, float(alpha), name)


def scal_(x, alpha, backend=None):
    """``x <- alpha * x``; returns ``x``."""
    name = backend_for("scal", backend)
    _check.check_scal(name, x, alpha, inplace=True)
    _inplace("scal_", x)
    call("scal_", x, float(alpha), name)
    return x


def axpby(x, y, alpha=1.0, beta=1.0, backend=None):
    """``alpha * x + beta * y`` (``y`` is not read when ``beta == 0``)."""
    name = backend_for("axpby", backend)
    x, y = autocast_inputs("axpby", x, y)
    _validated(_check.check_axpby, name, x, y, alpha, beta)
    return call("axpby", x, y, float(alpha), float(beta), name)


def axpby_(x, y, alpha=1.0, beta=1.0, backend=None):
    """``y <- alpha * x + beta * y``; returns ``y``."""
    name = backend_for("axpby", backend)
    _check.check_axpby(name, x, y, alpha, beta, inplace=True)
    _inplace("axpby_", x, y)
    call("axpby_", x, y, float(alpha), float(beta), name)
    return y


def dot(x, y, backend=None):
    """``x^T y`` as a 0-d tensor of the inputs' dtype, accumulated in float32 (float64 for float64)."""
    name = backend_for("dot", backend)
    x, y = autocast_inputs("dot", x, y)
    _validated(_check.check_dot, name, x, y)
    return call("dot", x, y, name)


# ----------------------------------------------------------------------------- level 2

def gemv(A, x, y=None, alpha=1.0, beta=0.0, backend=None):
    """``alpha * A x + beta * y`` for ``A (m, n)``, ``x (n,)``, ``y (m,)`` (not read when ``beta == 0``)."""
    name = backend_for("gemv", backend)
    A, x, y = autocast_inputs("gemv", A, x, y)
    _validated(_check.check_gemv, name, A, x, y, alpha, beta)
    return call("gemv", A, x, y, float(alpha), float(beta), name)


def gemv_(A, x, y, alpha=1.0, beta=0.0, backend=None):
    """``y <- alpha * A x + beta * y``; returns ``y``."""
    name = backend_for("gemv", backend)
    _check.check_gemv(name, A, x, y, alpha, beta, inplace=True)
    _inplace("gemv_", A, x, y)
    call("gemv_", A, x, y, float(alpha), float(beta), name)
    return y


def geru(A, x, y, alpha=1.0, backend=None):
    """``A + alpha * x y^T`` for ``A (m, n)``, ``x (m,)``, ``y (n,)``."""
    name = backend_for("geru", backend)
    A, x, y = autocast_inputs("geru", A, x, y)
    _validated(_check.check_geru, name, A, x, y, alpha)
    return call("geru", A, x, y, float(alpha), name)


def geru_(A, x, y, alpha=1.0, backend=None):
    """``A <- A + alpha * x y^T``; returns ``A``."""
    name = backend_for("geru", backend)
    _check.check_geru(name, A, x, y, alpha, inplace=True)
    _inplace("geru_", A, x, y)
    call("geru_", A, x, y, float(alpha), name)
    return A


# ----------------------------------------------------------------------------- level 3

def gemm(A, B, C=None, alpha=1.0, beta=0.0, backend=None):
    """``alpha * A B + beta * C`` for ``A (m, k)`` or ``(b, m, k)`` and ``B (k, n)`` or ``(b, k, n)``.

    The batch dims broadcast (a 2-D operand is shared by the batch). ``C`` broadcasts to the
    output ``(m, n)`` or ``(b, m, n)`` (a bias row ``(n,)`` works) and is not read when
    ``beta == 0``. Accumulates in float32; float32 operands use IEEE float32 products unless
    ``torch.backends.cuda.matmul.allow_tf32`` is on.
    """
    name = backend_for("gemm", backend)
    A, B, C = autocast_inputs("gemm", A, B, C)
    _validated(_check.check_gemm, name, A, B, C, alpha, beta)
    return call("gemm", A, B, C, float(alpha), float(beta), name)


def gemm_(A, B, C, alpha=1.0, beta=0.0, backend=None):
    """``C <- alpha * A B + beta * C``; returns ``C``."""
    name = backend_for("gemm", backend)
    _check.check_gemm(name, A, B, C, alpha, beta, inplace=True)
    _inplace("gemm_", A, B, C)
    call("gemm_", A, B, C, float(alpha), float(beta), name)
    return C


# ----------------------------------------------------------------------------- transformer primitives
# Each returns the first output of ``torch.ops.kcourse.<op>`` (the others are what its backward reads).

def softmax(x, dim=-1, backend=None):
    """``y_i = exp(x_i - max x) / sum_j exp(x_j - max x)`` along ``dim``."""
    name = backend_for("softmax", backend)
    x, = autocast_inputs("softmax", x)
    return call("softmax", x, _validated(_check.check_softmax, name, x, dim)["dim"], name)[0]


def log_softmax(x, dim=-1, backend=None):
    """``y_i = x_i - max x - log sum_j exp(x_j - max x)`` along ``dim``."""
    name = backend_for("log_softmax", backend)
    x, = autocast_inputs("log_softmax", x)
    return call("log_softmax", x, _validated(_check_log_softmax, name, x, dim)["dim"], name)[0]


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", backend=None):
    """``loss_i = logsumexp(logits_i) - logits_i[target_i]`` for logits ``(N, V)``, target ``(N,)``.

    Rows whose target is ``ignore_index`` contribute nothing; ``"mean"`` averages over the other
    rows, ``"sum"`` adds them, ``"none"`` returns the ``(N,)`` losses (0 for ignored rows).
    """
    name = backend_for("cross_entropy", backend)
    logits, = autocast_inputs("cross_entropy", logits)
    p = _check.check_cross_entropy(name, logits, target, ignore_index, reduction)
    return call("cross_entropy", logits, target, p["ignore_index"], p["reduction"], name)[0]


def layer_norm(x, weight=None, bias=None, eps=1e-5, backend=None):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension (biased variance)."""
    name = backend_for("layer_norm", backend)
    x, weight, bias = autocast_inputs("layer_norm", x, weight, bias)
    p = _validated(_check.check_layer_norm, name, x, weight, bias, eps)
    return call("layer_norm", x, weight, bias, p["eps"], name)[0]


def rms_norm(x, weight=None, eps=1e-6, backend=None):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""
    name = backend_for("rms_norm", backend)
    x, weight = autocast_inputs("rms_norm", x, weight)
    return call("rms_norm", x, weight, _validated(_check.check_rms_norm, name, x, weight, eps)["eps"], name)[0]


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, backend=None):
    """``(y, h)``: ``h = x + residual`` (x's dtype, rounded once) and ``y = layer_norm(h, weight, bias, eps)``,
    in one pass; gradients flow from both outputs (x and residual receive the same one)."""
    name = backend_for("add_layer_norm", backend)
    x, residual, weight, bias = autocast_inputs("add_layer_norm", x, residual, weight, bias)
    p = _validated(_check.check_add_layer_norm, name, x, residual, weight, bias, eps)
    return tuple(call("add_layer_norm", x, residual, weight, bias, p["eps"], name)[:2])


def add_rms_norm(x, residual, weight=None, eps=1e-6, backend=None):
    """``(y, h)``: ``h = x + residual`` (x's dtype, rounded once) and ``y = rms_norm(h, weight, eps)``, in one
    pass; gradients flow from both outputs (x and residual receive the same one)."""
    name = backend_for("add_rms_norm", backend)
    x, residual, weight = autocast_inputs("add_rms_norm", x, residual, weight)
    p = _validated(_check.check_add_rms_norm, name, x, residual, weight, eps)
    return tuple(call("add_rms_norm", x, residual, weight, p["eps"], name)[:2])


def linear(x, weight, bias=None, activation=None, backend=None):
    """``act(x @ weight.T + bias)`` for x ``(..., K)`` and weight ``(N, K)`` (torch.nn.Linear's layout), bias
    ``(N,)`` or None; ``activation`` None, "gelu", "gelu_tanh", "relu" or "silu", applied to the float32
    product (the triton kernels do it in the gemm's epilogue). Output ``(..., N)`` in x's dtype."""
    name = backend_for("linear", backend)
    x, weight, bias = autocast_inputs("linear", x, weight, bias)
    activation = "none" if activation is None else activation
    p = _validated(_check.check_linear, name, x, weight, bias, activation)
    return call("linear", x, weight, bias, p["activation"], name)[0]


def linear_swiglu(x, w_gate, w_up, b_gate=None, b_up=None, backend=None):
    """``silu(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)`` for x ``(..., K)``, w_gate and w_up ``(F, K)``:
    a SwiGLU feed-forward's gate and up projections and its gated unit (the triton kernel computes both
    products from one pass over x, the unit in the epilogue). Output ``(..., F)`` in x's dtype."""
    name = backend_for("linear_swiglu", backend)
    x, w_gate, w_up, b_gate, b_up = autocast_inputs("linear_swiglu", x, w_gate, w_up, b_gate, b_up)
    _validated(_check.check_linear_swiglu, name, x, w_gate, w_up, b_gate, b_up)
    return call("linear_swiglu", x, w_gate, w_up, b_gate, b_up, name)[0]


def linear_cross_entropy(x, weight, target, bias=None, ignore_index=-100, reduction="mean", backend=None):
    """``cross_entropy(x @ weight.T + bias, target)`` for x ``(N, K)``, weight ``(V, K)`` (torch.nn.Linear's
    layout), target ``(N,)``: an LM head and its loss without the ``(N, V)`` logits, a chunk of rows at
    a time; when a gradient is wanted (and reduction is "mean" or "sum") the forward computes it in the
    same pass. Under autocast the product runs in the autocast dtype and the loss is float32, as
    ``F.cross_entropy(F.linear(x, weight, bias), target)`` gives there."""
    name = backend_for("linear_cross_entropy", backend)
    autocast = _autocasting((x,)) is not None  # then the loss is float32 (float64 stays)
    cast = autocast_inputs("linear_cross_entropy", x, weight, bias)
    p = _check.check_linear_cross_entropy(name, *cast[:2], target, cast[2], ignore_index, reduction)
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in cast)
    return call("linear_cross_entropy", *cast[:2], target, cast[2], p["ignore_index"], p["reduction"], grads,
                autocast, name)[0]


def gelu(x, approximate="none", backend=None):
    """``x * Phi(x)`` (``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``)."""
    name = backend_for("gelu", backend)
    p = _validated(_check_gelu, name, x, approximate)
    return call("gelu", x, p["approximate"], name)[0]


def silu(x, backend=None):
    """``x * sigmoid(x)``."""
    name = backend_for("silu", backend)
    _validated(_check.check_activation, name, "silu", x)
    return call("silu", x, name)[0]


def relu(x, backend=None):
    """``max(x, 0)``."""
    name = backend_for("relu", backend)
    _validated(_check.check_activation, name, "relu", x)
    return call("relu", x, name)[0]


def swiglu(gate, up, backend=None):
    """``silu(gate) * up``."""
    name = backend_for("swiglu", backend)
    gate, up = autocast_inputs("swiglu", gate, up)
    _validated(_check.check_swiglu, name, gate, up)
    return call("swiglu", gate, up, name)[0]


def embedding(indices, weight, backend=None):
    """``weight[indices]``: rows of ``weight (V, D)``, shape ``(*indices.shape, D)``; the backward
    adds the gradients of repeated indices."""
    name = backend_for("embedding", backend)
    _check.check_embedding(name, indices, weight)
    return call("embedding", indices, weight, name)[0]


def rope(x, base=10000.0, positions=None, backend=None):
    """Rotary embedding of ``x (..., T, D)``, rotate-half convention: with ``x1, x2`` the two halves
    of the last dim and angle ``p * base^(-2i/D)`` at position ``p`` (default ``0..T-1``),
    ``y = [x1 cos - x2 sin, x2 cos + x1 sin]``."""
    name = backend_for("rope", backend)
    p = _validated(_check.check_rope, name, x, base, positions)
    return call("rope", x, positions, p["base"], name)[0]


def attention(q, k, v, causal=False, scale=None, kv_len=None, backend=None):
    """``softmax(q k^T * scale [+ mask]) v`` for q ``(B, H, Tq, D)``, k and v ``(B, Hkv, Tk, D)``.

    Grouped-query when ``H`` is a multiple of ``Hkv`` (query head ``h`` reads kv head
    ``h // (H / Hkv)``); ``scale`` defaults to ``D^-1/2``; ``causal`` lets query ``i`` see keys
    ``j <= i`` (top-left aligned, as ``scaled_dot_product_attention(is_causal=True)``).

    ``kv_len`` (int32 or int64, ``(B,)``, on q's device) hides the keys ``j >= kv_len[b]`` of batch
    row ``b`` as well (a value above Tk shows all Tk keys, one of 0 or below none): a static KV
    cache of Tk positions of which the first ``kv_len[b]`` are written. The lengths are read on the
    device, never by the host, so a CUDA graph can replay the call as the cache grows. A query that
    sees no key gets 0. Inference only: with ``kv_len`` no input may need a gradient.
    """
    name = backend_for("attention", backend)
    q, k, v = autocast_inputs("attention", q, k, v)
    p = _validated(_check.check_attention, name, q, k, v, kv_len, causal, scale)
    if kv_len is not None:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ValueError(f"attention: kv_len is for inference (a KV cache) and has no backward, but q {tuple(q.shape)}, "
                             f"k or v {tuple(k.shape)} requires a gradient; call it under torch.no_grad() or "
                             "without kv_len")
        if kv_len.dtype != torch.int32 or not kv_len.is_contiguous():
            kv_len = kv_len.to(torch.int32).contiguous()
    return call("attention", q, k, v, kv_len, p["causal"], p["scale"], name)[0]
