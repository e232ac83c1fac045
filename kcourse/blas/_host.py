"""Host code the triton and cute backends share: the Python around their kernels, written once.

Each function here does what the two backends do alike (allocating outputs and workspaces, early
returns, which gradients to compute, how a cache is laid out) and leaves the launches to callables
the backend passes in. An op's public functions (the dispatcher looks ``<op>`` and ``<op>_backward``
up by name in ``kcourse.blas.<backend>.<op>``) are made by an ``<op>_ops`` factory here and bound
there in one line, e.g. ``rope, rope_backward = _host.rope_ops(rotate=_rotate)``, so both backends take
the same launch helpers with the same signatures:

- ``sm_count(device, off_gpu)``: the SM count of a CUDA device (cached), ``off_gpu`` elsewhere.
- ``cross_entropy_ops``: row allocations, the reduction through the backend's
  ``valid_sum(loss, target, ignore_index, reduction, out)`` with ``reduction`` "mean", "sum" or
  "count" (n_valid; ``loss`` None), and ``g``'s stride (0 for a reduced loss).
- ``weight_partials`` / ``column_sums`` / ``norm_gradients``: the norm backward's (S, P, D) float32
  partials of dweight and dbias and their column sums.
- ``layer_norm_ops`` / ``rms_norm_ops``: what each norm's cache holds.
- ``add_norm_ops`` / ``add_norm_backward``: the fused add + norms (h = x + residual, y = norm(h)), the
  gradient of h computed once for x and residual; ``composed_add_norm_ops``: the same of a backend's
  add and norm kernels (pytorch, cute).
- ``rope_ops``: the backward is the rotation by ``-theta``.
- ``embedding_ops``: the gather's output and the float32 scatter-add accumulator.
- ``linear_ops`` / ``linear_swiglu_ops``: a linear layer with its activation, and SwiGLU's gate and
  up projections with the gated unit, over a backend's gemm, gemv and activation kernels, in the
  gemm's epilogue where the backend's gemm takes one (every backend's).
- ``linear_cross_entropy_ops``: the LM head and its loss a chunk of rows at a time, over a backend's
  gemm, gemv and cross_entropy kernels (every backend's, the python reference's included).
"""
from __future__ import annotations

import functools

import torch

from . import _cache
from ._layout import rows_of
from ._rope import turns


# ----------------------------------------------------------------------------- SM counts

def sm_count(device: torch.device, off_gpu: int) -> int:
    """The streaming multiprocessors of ``device`` when it is a CUDA device, else ``off_gpu`` (the
    count a backend sizes its grids by where there is no GPU)."""
    return device_sm_count(device.index) if device.type == "cuda" else off_gpu


@functools.cache  # asked on every launch: the device properties query costs microseconds
def device_sm_count(index: int | None) -> int:
    """The streaming multiprocessors of CUDA device ``index`` (None: the current device)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


# ----------------------------------------------------------------------------- cross_entropy

def cross_entropy_ops(*, forward, backward, valid_sum):
    """``(cross_entropy, cross_entropy_backward)`` of a backend, from its launches:

    - ``forward(logits, target, lse, loss, ignore_index)`` fills lse and loss (N > 0 rows only);
    - ``backward(logits, target, lse, dout, n_valid, dlogits, ignore_index, dout_stride)`` fills
      dlogits: n_valid a 0-d float32 count (reduction "mean") or None, dout_stride 0 for a 0-d dout;
    - ``valid_sum(loss, target, ignore_index, reduction, out)``: out (0-d) <- the "mean" or "sum" of
      loss over the rows whose target is not ignore_index, or (reduction "count", loss None) their count.
    """

    def cross_entropy(logits, target, ignore_index, reduction):
        """``(loss, (logits, target, lse))``: the losses (reduction "none") or their mean or sum."""
        N, V = logits.shape
        lse = torch.empty(N, dtype=torch.float32, device=logits.device)
        loss = torch.empty(N, dtype=logits.dtype if reduction == "none" else torch.float32, device=logits.device)
        if N:
            forward(logits, target, lse, loss, ignore_index)
        if reduction != "none":
            loss = valid_sum(loss, target, ignore_index, reduction,
                             torch.empty((), dtype=logits.dtype, device=logits.device))
        return loss, (logits, target, lse)

    def cross_entropy_backward(dout, cache, needs, ignore_index, reduction, out=None):
        """``(dlogits, None)``: ``(softmax(logits) - onehot(target)) * g`` row by row, 0 on ignored rows,
        written into ``out`` when given (it may be the logits themselves: each element is read
        before it is written, by the thread that writes it)."""
        logits, target, lse = cache
        if not needs[0] or logits.numel() == 0:
            return (torch.zeros_like(logits) if needs[0] else None), None
        n_valid = None
        if reduction == "mean":
            n_valid = valid_sum(None, target, ignore_index, "count",
                                torch.empty((), dtype=torch.float32, device=logits.device))
        dlogits = torch.empty_like(logits) if out is None else out
        backward(logits, target, lse, dout, n_valid, dlogits, ignore_index,
                 0 if reduction != "none" else dout.stride(0))
        return dlogits, None

    return cross_entropy, cross_entropy_backward


# ----------------------------------------------------------------------------- layer_norm, rms_norm

def weight_partials(needs, programs: int, d: int, device: torch.device):
    """``(partials, dw, db)``: one (S, programs, d) float32 buffer, dweight's partials then dbias's
    (S = needs[1] + needs[2]; None when 0), and those two sets (None where not needed)."""
    sets = int(needs[1]) + int(needs[2])  # one buffer, one column-sum launch
    partials = torch.empty(sets, programs, d, dtype=torch.float32, device=device) if sets else None
    return partials, (partials[0] if needs[1] else None), (partials[sets - 1] if needs[2] else None)


def column_sums(partials, dtype, *, launch) -> list:
    """The (D,) column sums, in ``dtype``, of each set of the (S, P, D) float32 ``partials``
    (S = 0, 1, 2; None for 0); ``launch(partials, out0, out1)`` writes them (out1 None unless S = 2)."""
    if partials is None:
        return []
    s, _, d = partials.shape
    outs = [torch.empty(d, dtype=dtype, device=partials.device) for _ in range(s)]
    if d:
        launch(partials, outs[0], outs[1] if s == 2 else None)
    return outs


def norm_gradients(dx, partials, needs, dtype, *, launch):
    """``(dx, dweight, dbias)`` from the ``weight_partials`` buffer: its column sums (``column_sums``)."""
    sums = column_sums(partials, dtype, launch=launch)
    return dx, sums[0] if needs[1] else None, sums[len(sums) - 1] if needs[2] else None


def layer_norm_ops(norm_forward, norm_backward):
    """``(layer_norm, layer_norm_backward)`` of a backend over its ``_norm.norm_forward`` and
    ``norm_backward``; the cache holds x, weight and the float32 mean and rstd (N,)."""

    def layer_norm(x, weight, bias, eps):
        y, _, mean, rstd = norm_forward(x, weight, bias, eps, center=True)
        return y, (x, weight, mean, rstd)

    def layer_norm_backward(dout, cache, needs, eps):
        x, weight, mean, rstd = cache
        return norm_backward(dout, rows_of(x), weight, mean, rstd, needs)

    return layer_norm, layer_norm_backward


def rms_norm_ops(norm_forward, norm_backward):
    """``(rms_norm, rms_norm_backward)`` of a backend over its ``_norm.norm_forward`` and
    ``norm_backward``; the cache holds x, weight and the float32 rstd (N,)."""

    def rms_norm(x, weight, eps):
        y, _, _, rstd = norm_forward(x, weight, None, eps, center=False)
        return y, (x, weight, rstd)

    def rms_norm_backward(dout, cache, needs, eps):
        x, weight, rstd = cache
        return norm_backward(dout, rows_of(x), weight, None, rstd, (*needs, False))[:2]

    return rms_norm, rms_norm_backward


def add_norm_backward(norm_backward):
    """The backward of a fused add + norm (``h = x + residual``, ``y = norm(h)``) from its norm's pullback
    ``norm_backward(dy, cache, needs, eps, dh) -> (dh_total, *parameter grads)``, which adds dh (h's own
    gradient, None for 0) to the gradient of h: ``(dx, dresidual, *parameter grads)``, dx = dresidual =
    dh_total, computed once (``needs`` over x, residual, then the parameters)."""

    def backward(dout, cache, needs, eps):
        dy, dh = dout
        dx, *rest = norm_backward(dy, cache, (needs[0] or needs[1], *needs[2:]), eps, dh)
        return (dx if needs[0] else None, dx if needs[1] else None, *rest)

    return backward


def composed_add_norm_ops(*, norm, norm_backward, add):
    """``(add_<norm>, add_<norm>_backward)`` of a backend without a fused kernel, composed of its own
    ``add(a, b) -> a + b`` (rounded once, contiguous) and the norm's kernels: h = add(x, residual),
    (y, cache) = norm(h, ...); backward, the norm's, then dx = dresidual = add(its dx, dh). Caches as
    the norm's, of h."""

    def forward(x, residual, *params, **eps):  # the norm's weight[, bias] and eps
        h = add(x, residual)
        y, cache = norm(h, *params, **eps)
        return (y, h), cache

    def backward(dy, cache, needs, eps, dh):
        dx, *rest = norm_backward(dy, cache, needs, eps)
        return (dx if dx is None or dh is None else add(dx, dh), *rest)

    return forward, add_norm_backward(backward)


def add_norm_ops(norm_forward, norm_backward):
    """``(add_layer_norm, add_layer_norm_backward, add_rms_norm, add_rms_norm_backward)`` of a backend whose
    ``_norm.norm_forward`` fuses the add (``residual=``; it returns h's rows in x2's place) and whose
    ``norm_backward`` adds h's own gradient (``dresidual=``); caches as the norms' (``layer_norm_ops``), of h."""

    def add_layer_norm(x, residual, weight, bias, eps):
        y, h, mean, rstd = norm_forward(x, weight, bias, eps, center=True, residual=residual)
        h = h.view(x.shape)
        return (y, h), (h, weight, mean, rstd)

    def add_rms_norm(x, residual, weight, eps):
        y, h, _, rstd = norm_forward(x, weight, None, eps, center=False, residual=residual)
        h = h.view(x.shape)
        return (y, h), (h, weight, rstd)

    def layer(dy, cache, needs, eps, dh):
        h, weight, mean, rstd = cache
        return norm_backward(dy, rows_of(h), weight, mean, rstd, needs, dresidual=dh)

    def rms(dy, cache, needs, eps, dh):
        h, weight, rstd = cache
        return norm_backward(dy, rows_of(h), weight, None, rstd, (*needs, False), dresidual=dh)[:2]

    return add_layer_norm, add_norm_backward(layer), add_rms_norm, add_norm_backward(rms)


# ----------------------------------------------------------------------------- rope

def rope_ops(*, rotate):
    """``(rope, rope_backward)`` of a backend from its ``rotate(x, out, positions, table, sign)``:
    out <- x (not empty) rotated by ``sign * theta``, table the (D/2,) float64 frequencies in full
    turns per position (``_rope.turns``). The backward is the rotation by ``-theta``."""

    def rotated(x, positions, base, sign):
        out = torch.empty_like(x)  # laid out as x when x is dense
        if x.numel():
            rotate(x, out, positions, turns(x.shape[-1], base, x.device), sign)
        return out

    def rope(x, positions, base):
        return rotated(x, positions, base, 1.0), (positions,)

    def rope_backward(dout, cache, needs, base):
        (positions,) = cache
        return (rotated(dout, positions, base, -1.0) if needs[0] else None), None

    return rope, rope_backward


# ----------------------------------------------------------------------------- embedding

def embedding_ops(*, gather, scatter_add):
    """``(embedding, embedding_backward)`` of a backend from its launches (N, D > 0 only):

    - ``gather(idx, weight, out)`` copies rows ``idx`` (N,) of ``weight`` (V, D) into ``out`` (N, D);
    - ``scatter_add(idx, dout, acc)`` adds row n of ``dout`` (N, D) into row idx[n] of the float32
      ``acc`` (V, D), for the in-range indices.
    """

    def embedding(indices, weight):
        D = weight.shape[1]
        idx = indices.reshape(-1)  # (N,): a view unless indices cannot be flattened
        out = torch.empty((idx.numel(), D), dtype=weight.dtype, device=weight.device)
        if out.numel():
            gather(idx, weight, out)
        return out.reshape(*indices.shape, D), (indices, weight)

    def embedding_backward(dout, cache, needs):
        indices, weight = cache
        if not needs[1]:
            return None, None
        idx = indices.reshape(-1)
        acc = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # dweight in float32
        if idx.numel() and weight.shape[1]:
            scatter_add(idx, dout, acc)
        return None, acc.to(weight.dtype)

    return embedding, embedding_backward


# ----------------------------------------------------------------------------- linear_cross_entropy

CHUNKS = 8  # the rows in about this many chunks: each chunk's logits an eighth of the whole (N, V)
MIN_CHUNK_LOGITS = 1 << 24  # and at least this many logits per chunk (few, large gemms for small N V)


def _projection(gemm, rows, weight, bias, **epilogue):
    """rows W^T + b (M, N) by one gemm (the bias as C, beta = 1) into a new tensor, with the gemm's
    ``epilogue`` arguments (activation, z, ...) where given; nothing launched for no output."""
    M, N = rows.shape[0], weight.shape[0]
    C, beta = (None, 0.0) if bias is None else (bias.expand(M, N), 1.0)
    out = rows.new_empty(M, N)
    if out.numel():
        gemm(rows, weight.mT, C, 1.0, beta, out, **epilogue)  # (M, K) @ (K, N)
    return out


def _projection_grads(gemm, gemv, dzs, rows, weights, needs, x_shape):
    """dx = sum_i dz_i W_i, and dW_i = dz_i^T x, db_i = dz_i^T 1 for each projection i (M, N_i) of the
    same rows (M, K): ``needs`` over x, the weights, then the biases. dx sums in place (beta = 1)."""
    M, K = rows.shape
    dx = None
    if needs[0]:
        dx = rows.new_empty(M, K)
        for i, (dz, weight) in enumerate(zip(dzs, weights)):
            if dx.numel():
                gemm(dz, weight, None if i == 0 else dx, 1.0, 0.0 if i == 0 else 1.0, dx)  # (M, N) @ (N, K)
        dx = dx.reshape(x_shape)
    n = len(weights)
    dweights, dbiases = [], []
    for dz, weight, need_w, need_b in zip(dzs, weights, needs[1:1 + n], needs[1 + n:]):
        N = weight.shape[0]
        dweight = dbias = None
        if need_w:
            dweight = weight.new_zeros(N, K) if M == 0 else weight.new_empty(N, K)
            if M and dweight.numel():
                gemm(dz.mT, rows, None, 1.0, 0.0, dweight)  # (N, M) @ (M, K)
        if need_b:
            dbias = weight.new_zeros(N) if M == 0 else weight.new_empty(N)
            if M and N:
                gemv(dz.mT, _cache.ones(M, dz), None, 1.0, 0.0, dbias)  # (N, M) @ (M,)
        dweights.append(dweight)
        dbiases.append(dbias)
    return (dx, *dweights, *dbiases)


def linear_ops(*, gemm, gemv, activations, epilogue=False):
    """``(linear, linear_backward)`` of a backend from its own kernels (as ``kcourse.blas.<backend>``
    exports them): ``gemm``, ``gemv`` and ``activations``, {"gelu": (gelu, gelu_backward), "relu": ...,
    "silu": ...}. x (..., K) is taken as rows (M, K), weight is (N, K):

        z = x W^T + b         one gemm (the bias as C, beta = 1), accumulated in float32, rounded once
        y = act(z)            the activation kernel on z; ``epilogue``: the backend's gemm applies it to
                              the float32 z itself (``gemm(..., activation=, z=)``, storing z rounded too)

    The cache is (x, weight), and z where an activation's backward reads it. Backward, dy as rows (M, N):

        dz = dy act'(z)       the activation's backward kernel (dz = dy without an activation)
        dx = dz W,   dW = dz^T x,   db = dz^T 1      (gemm, gemm, gemv), each rounded once

    Eagerly (``in_place``) dz is written over z, which only this op holds: the backward then needs
    no (M, N) tensor beyond those the forward made (a second backward through the graph is refused
    by autograd: z's version changed).
    """

    def act(name):
        """The activation's forward and backward kernels and their parameters."""
        forward, backward = activations[name.removesuffix("_tanh")]
        params = {"approximate": "tanh" if name == "gelu_tanh" else "none"} if name.startswith("gelu") else {}
        return forward, backward, params

    def linear(x, weight, bias, activation):
        rows, N = rows_of(x), weight.shape[0]
        if activation == "none":
            return _projection(gemm, rows, weight, bias).reshape(*x.shape[:-1], N), (x, weight)
        if epilogue:
            z = rows.new_empty(rows.shape[0], N)
            y = _projection(gemm, rows, weight, bias, activation=activation, z=z)
        else:
            z = _projection(gemm, rows, weight, bias)
            forward, _, params = act(activation)
            y = forward(z, **params)[0]
        return y.reshape(*x.shape[:-1], N), (x, weight, z)

    def linear_backward(dout, cache, needs, activation, in_place=False):
        x, weight, *z = cache
        dz = rows_of(dout)  # (M, N)
        if activation != "none" and dz.numel():
            _, backward, params = act(activation)
            out = {"out": z[0]} if in_place else {}  # dz over z: no second (M, N) tensor
            dz = backward(dz, (z[0],), (True,), **params, **out)[0]
            if in_place:  # a kernel's raw writes leave z's version as it was: autograd must see the change
                torch.autograd.graph.increment_version(z[0])
        return _projection_grads(gemm, gemv, [dz], rows_of(x), [weight], needs, x.shape)

    return linear, linear_backward


def linear_swiglu_ops(*, gemm, gemv, swiglu, swiglu_backward, epilogue=False):
    """``(linear_swiglu, linear_swiglu_backward)`` of a backend from its own kernels: the gate and up
    projections of a SwiGLU feed-forward and the gated unit, x (..., K) as rows (M, K), W_g and W_u (F, K):

        g = x W_g^T + b_g,   u = x W_u^T + b_u      two gemms; ``epilogue``: one pass of the backend's gemm
                                                   over x with two accumulators (``gemm(..., B2=)``)
        y = silu(g) * u                            the swiglu kernel; ``epilogue``: in that gemm's epilogue

    The cache is (x, W_g, W_u, g, u). Backward, dy as rows (M, F):

        dg, du = swiglu's backward                 dg = dy u silu'(g),  du = dy silu(g)
        dx = dg W_g + du W_u,  dW_g = dg^T x,  dW_u = du^T x,  db_g = dg^T 1,  db_u = du^T 1

    Eagerly (``in_place``) dg and du are written over g and u, as linear's dz over z.
    """

    def linear_swiglu(x, w_gate, w_up, b_gate, b_up):
        rows, F = rows_of(x), w_gate.shape[0]
        if epilogue:
            g, u = rows.new_empty(rows.shape[0], F), rows.new_empty(rows.shape[0], F)
            C2 = None if b_up is None else b_up.expand(rows.shape[0], F)
            y = _projection(gemm, rows, w_gate, b_gate, activation="silu", z=g, B2=w_up.mT, C2=C2, z2=u)
        else:
            g, u = _projection(gemm, rows, w_gate, b_gate), _projection(gemm, rows, w_up, b_up)
            y = swiglu(g, u)[0]
        return y.reshape(*x.shape[:-1], F), (x, w_gate, w_up, g, u)

    def linear_swiglu_backward(dout, cache, needs, in_place=False):
        x, w_gate, w_up, g, u = cache
        dy = rows_of(dout)  # (M, F)
        out = {"out": (g, u)} if in_place else {}  # dg, du over g, u: no second pair of (M, F) tensors
        dg, du = swiglu_backward(dy, (g, u), (True, True), **out) if dy.numel() else (dy, dy)
        if in_place and dy.numel():  # (as linear's z)
            torch.autograd.graph.increment_version(g)
            torch.autograd.graph.increment_version(u)
        return _projection_grads(gemm, gemv, [dg, du], rows_of(x), [w_gate, w_up], needs, x.shape)

    return linear_swiglu, linear_swiglu_backward


def chunk_rows(N: int, V: int) -> int:
    """Rows per chunk of linear_cross_entropy: ceil(N / CHUNKS), at least MIN_CHUNK_LOGITS / V, at
    most N. Larger chunks mean fewer, better-shaped gemms and fewer roundings of a half-precision
    dweight; smaller ones less memory (the chunk's logits are the op's one large temporary)."""
    return max(1, min(N, max(-(-N // CHUNKS), -(-MIN_CHUNK_LOGITS // max(V, 1)))))


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The accumulation dtype of ``t``: float64 for float64, else float32 (also the custom ops' fakes')."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def linear_cross_entropy_ops(*, gemm, gemv, cross_entropy, cross_entropy_backward, chunked=True,
                             dlogits_in_place=False, weights_on_operands=False, cross_entropy_grad=None,
                             scal=None):
    """``(linear_cross_entropy, linear_cross_entropy_backward)`` of a backend from its own kernels
    (``gemm``, ``gemv``, ``cross_entropy`` and its backward, as ``kcourse.blas.<backend>`` exports them):
    ``cross_entropy(x @ weight.T + bias, target)`` for x (N, K), weight (V, K), ``chunk_rows`` rows
    at a time, each chunk's (rows, V) logits in one reused buffer (``chunked=False``: all N rows at
    once). ``dlogits_in_place``: the backend's cross_entropy backward may write dlogits over the
    logits it reads (``out=``), so the chunk needs no second buffer. ``weights_on_operands``: the
    backward's ``row_weighted=False`` gives dlogits without each row's weight g (dout, 0 on ignored
    rows), which is applied to the (n, K) operands instead (dx = g * (dlogits W), dW += dlogits^T (g
    x), dbias += dlogits^T g): a pass over n x K elements rather than n x V, where the backward's
    scaling is a pass of its own (the pytorch backend's ATen ops; a kernel fuses it).
    ``cross_entropy_grad(logits, target, ignore_index) -> (loss, dlogits, valid)``: a chunk's forward
    and its unweighted backward in one call (with ``weights_on_operands``), for the pass that computes
    both; ``valid`` (rows,) marks the rows whose target is not ignore_index. ``scal(g, alpha, out)``:
    the backend's kernel for ``out <- alpha * g`` with alpha a 0-d float32 tensor it reads on the
    device (the backward's scale), where torch's own product of a half tensor and a float32 0-d
    tensor takes its unvectorized casting path (a quarter of copy bandwidth; None: that product).

    With ``grads`` (some input wants a gradient) and a "mean" or "sum", the forward also computes the
    gradients, in the same pass over the chunk: dlogits = softmax - onehot (the sum's backward for
    dout = 1), dx = dlogits W for the chunk's rows, dW += dlogits^T x, dbias += dlogits^T 1. Its
    cache holds them and n_valid; the backward scales them by dout / n_valid (mean) or dout (sum),
    in float32, rounded once (``in_place``: over the cache itself, no second copy). Otherwise the
    cache holds each row's lse and the backward sweeps the chunks again, recomputing the logits
    ("none": dlogits scaled by each row's dout).

    dW and dbias are in the weight's dtype and added up by the gemm and gemv themselves (beta = 1,
    in place): each chunk's product is accumulated in float32 and added to the running sum in the
    epilogue, rounded once per chunk (at most CHUNKS roundings for a half-precision weight)."""
    if cross_entropy_grad is not None and not weights_on_operands:  # (its dlogits carry no row weights)
        raise ValueError("linear_cross_entropy_ops: cross_entropy_grad needs weights_on_operands=True")

    def accumulate(dlogits, x, weight, dx, sums, first, ones, g=None):
        """dx <- dlogits weight; (dW, dbias) <- (dlogits^T x, dlogits^T 1) for the ``first`` chunk,
        else += them, in place; with the rows' weights ``g`` (n,), dlogits's rows scaled by them."""
        beta = 0.0 if first else 1.0
        if dx is not None and dx.numel():
            gemm(dlogits, weight, None, 1.0, 0.0, dx)  # (n, V) @ (V, K)
            if g is not None:
                dx.mul_(g[:, None])
        dweight, dbias = sums
        if dweight is not None and dweight.numel():
            x = x if g is None else x * g[:, None]
            gemm(dlogits.mT, x, None if first else dweight, 1.0, beta, dweight)  # (V, n) @ (n, K)
        if dbias is not None:
            g = ones[: x.shape[0]] if g is None else g
            gemv(dlogits.mT, g, None if first else dbias, 1.0, beta, dbias)  # (V, n) @ (n,)

    def sweep(x, weight, target, bias, ignore_index, lse, *, losses=None, grads=None, dout=None):
        """One pass over the rows, a chunk at a time: the chunk's logits (n, V), then
          - with ``losses`` (N,): the cross_entropy forward, each row's loss into ``losses`` and its
            lse into ``lse`` (None: not kept); without, the chunk's rows of ``lse`` are read;
          - with ``grads = (dx, dweight, dbias)`` (from ``new_grads``; None where not wanted):
            dlogits from the cross_entropy backward, for the rows' own ``dout`` ("none"), or unscaled
            (``dout`` None: a sum's, for dout = 1), and from them the gradients (``accumulate``)."""
        N, K = x.shape
        V = weight.shape[0]
        step = chunk_rows(N, V) if chunked else max(N, 1)
        buffer = x.new_empty(min(step, N), V)  # one chunk's logits (and, in place, its dlogits)
        one = _cache.ones(1, x)[0]  # (0-d: a sum's dout of 1)
        if grads is not None:
            dx, *sums = grads
            ones = _cache.ones(step, x) if sums[1] is not None else None
            if N == 0:  # no chunk runs: the sums are zeros
                for g in sums:
                    g is None or g.zero_()
        for start in range(0, N, step):
            rows = slice(start, min(start + step, N))
            x_rows, t = x[rows], target[rows]
            logits = buffer[: rows.stop - start]
            if K:
                gemm(x_rows, weight.mT, None if bias is None else bias.expand(logits.shape), 1.0,
                     0.0 if bias is None else 1.0, logits)  # (n, K) @ (K, V) + bias
            else:  # no features: the logits are the bias
                logits.copy_(bias.expand(logits.shape)) if bias is not None else logits.zero_()
            if grads is not None and dout is None and losses is not None and cross_entropy_grad is not None:
                loss, dlogits, valid = cross_entropy_grad(logits, t, ignore_index)  # (the sum's, for dout = 1)
                losses[rows] = loss
                accumulate(dlogits, x_rows, weight, None if dx is None else dx[rows], sums, start == 0, ones,
                           valid.to(x.dtype))
                continue
            if losses is not None:
                loss, cache = cross_entropy(logits, t, ignore_index, "none")  # (logits, t, lse_rows[, ...])
                lse_rows = cache[2]
                losses[rows] = loss
                if lse is not None:
                    lse[rows] = lse_rows
            else:
                lse_rows = lse[rows]
                cache = (logits, t, lse_rows)
            if grads is not None:
                d, how = (one, "sum") if dout is None else (dout[rows], "none")
                more = {"out": logits} if dlogits_in_place else {"row_weighted": False} if weights_on_operands else {}
                dlogits, _ = cross_entropy_backward(d, cache, (True, False), ignore_index, how, **more)
                g = torch.where(t != ignore_index, d, 0).to(x.dtype) if weights_on_operands else None  # (n,)
                accumulate(dlogits, x_rows, weight, None if dx is None else dx[rows], sums, start == 0, ones, g)

    def new_grads(x, weight, bias, wanted):
        """(dx, dweight, dbias) for ``sweep``, uninitialised (the first chunk writes them)."""
        return (x.new_empty(x.shape) if wanted[0] else None, weight.new_empty(weight.shape) if wanted[1] else None,
                bias.new_empty(bias.shape) if wanted[2] and bias is not None else None)

    def linear_cross_entropy(x, weight, target, bias, ignore_index, reduction, grads, float32_loss):
        """``(loss, (x, weight, target, bias, *extras))``: extras ``(dx, dweight, [dbias,] n_valid)`` when
        the gradients are computed here (for dout = 1 and the sum), else ``(lse,)``. The loss has x's
        dtype, or float32 with ``float32_loss`` (under autocast: a mean or sum is then never rounded
        to x's dtype; the rows of "none" are, by the cross_entropy kernel)."""
        ahead = grads and reduction != "none"  # the gradients in this pass
        acc = acc_dtype(x)
        losses = x.new_empty(x.shape[0])  # (N,) each row's loss, 0 on ignored rows
        lse = None if ahead else torch.empty(x.shape[0], dtype=acc, device=x.device)
        g = new_grads(x, weight, bias, (True, True, True)) if ahead else None
        sweep(x, weight, target, bias, ignore_index, lse, losses=losses, grads=g)
        needed = ahead or reduction == "mean"  # n_valid, counted on the device: no host sync
        n_valid = (target != ignore_index).sum(dtype=acc) if needed else None
        if reduction == "none":
            loss = losses
        else:  # the rows' losses added in float32, divided by n_valid (0/0 = NaN when all are ignored)
            total = losses.sum(dtype=acc)
            loss = total / n_valid if reduction == "mean" else total
        loss = loss.to(torch.float32 if float32_loss and x.dtype != torch.float64 else x.dtype)
        extras = [g[0], g[1], *([g[2]] if bias is not None else []), n_valid] if ahead else [lse]
        return loss, (x, weight, target, bias, *extras)

    def linear_cross_entropy_backward(dout, cache, needs, ignore_index, reduction, grads, float32_loss,
                                      in_place=False):
        """``(dx, dweight, None, dbias)`` (None where not in ``needs``). ``in_place``: gradients the
        forward computed are scaled over the cache itself and returned (eager autograd only: the
        cache is then spent, and a second backward through it fails autograd's version check)."""
        x, weight, target, bias, *extras = cache
        wanted = (needs[0], needs[1], needs[3] and bias is not None)
        if not (grads and reduction != "none"):  # recomputed, for the rows' own dout or the sum's
            computed = new_grads(x, weight, bias, wanted)
            sweep(x, weight, target, bias, ignore_index, extras[0], grads=computed,
                  dout=None if reduction != "none" else dout.to(x.dtype))
            if reduction == "none":
                return computed[0], computed[1], None, computed[2]
            computed, n_valid = list(computed), (target != ignore_index).sum(dtype=acc_dtype(x))
        else:  # computed by the forward for dout = 1
            computed, n_valid = [extras[0], extras[1], extras[2] if bias is not None else None], extras[-1]
        # dout (sum) or dout / n_valid (mean), in float32; n_valid = 0: every dlogits row is 0, so is the gradient.
        # A half tensor times a 0-d float32 tensor is computed in float32 and rounded once.
        scale = dout.to(acc_dtype(x))
        scale = scale / n_valid.clamp(min=1) if reduction == "mean" else scale

        def scaled(g):
            if scal is None:
                return g.mul_(scale) if in_place else g * scale
            out = g if in_place else torch.empty_like(g)
            if g.numel():
                scal(g, scale, out)
            if in_place:  # a kernel's raw writes leave g's version as it was: autograd must see the change
                torch.autograd.graph.increment_version(g)
            return out

        dx, dweight, dbias = (scaled(g) if want else None for g, want in zip(computed, wanted))
        return dx, dweight, None, dbias

    return linear_cross_entropy, linear_cross_entropy_backward
