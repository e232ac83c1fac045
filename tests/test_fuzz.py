"""Property fuzzing of every op on every available backend.

Hypothesis draws the cases: sizes 0, 1, small primes and odd sizes; every dtype the backend takes;
contiguous, transposed, strided (every other element) and sliced (an offset window of a larger
tensor) views; scalars including 0 and negative ones; NaN and +-inf in the inputs of the ops whose
answer on them is defined elementwise (level 1 BLAS, activations, softmax, cross_entropy's
forward) and in the product's operands of gemv, geru and gemm when alpha = 0 (the BLAS rule: they
are not read); batches of 0 in gemm; in-place targets that are strided views of a larger buffer filled with a sentinel.
Each case is checked

  - against the python reference (``backend="python"``), forward and gradients, NaN where it has NaN;
  - against torch in float64, rounded once to the dtype (for the python reference itself too);
  - for an in-place op: the target holds the out-of-place result and nothing outside it changed;

with the dtype's tolerance of ``_util.TOL``, its atol grown as sqrt(k) for sums of k terms (as
every test file does). Gradients are checked for finite inputs only, first derivatives only.

Budget: a few examples per (op, backend) in the normal suite (deterministic: ``derandomize``; the
triton cases tiny, as they run through the interpreter on a CPU); set ``KCOURSE_FUZZ_EXAMPLES=n``
for n random examples per (op, backend) and larger sizes (e.g. 1000 on a GPU), and
``KCOURSE_FUZZ_PROGRESS=path`` to append one line per example that passed (``op[backend]``), so
that a run stopped by a time limit still says how many it checked (and separate runs add up: with
a large budget the examples are random, not derandomized).

Not fuzzed here: second derivatives (the BLAS ops' are checked by gradgradcheck in their test files,
the transformer primitives refuse them: tests/test_library.py).
"""
import math
import os
import random

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from kcourse.backend import OPS, has_kernel
from kcourse.blas import _host
from _util import DEVICE, TOL, require_backend

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz suite needs hypothesis (pip install hypothesis)")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

LARGE = int(os.environ.get("KCOURSE_FUZZ_EXAMPLES", "0"))
PROGRESS = os.environ.get("KCOURSE_FUZZ_PROGRESS")
BACKENDS = ["python", "pytorch", "triton", "cute"]
HALF = (torch.float16, torch.bfloat16)
FLOAT = (torch.float32, *HALF)
SCALARS = [0.0, 1.0, -1.0, 0.5, -2.5, 3.0]
MAX_NUMEL = 1 << 20


def budget(backend: str) -> int:
    if LARGE:
        return LARGE
    return 2 if backend == "triton" and DEVICE == "cpu" else 5


def random_autotune_configs(monkeypatch) -> None:
    """Each autotuned triton kernel runs one of its (pruned) configs, drawn at random for each new key,
    instead of timing all of them: a large budget on a GPU meets hundreds of shapes, each a new key
    (seconds of benchmarking), and every config, not only the fastest, gets fuzzed."""
    from triton.runtime.autotuner import Autotuner
    prune, rng = Autotuner.prune_configs, random.Random(0)
    monkeypatch.setattr(Autotuner, "prune_configs", lambda self, kwargs: [rng.choice(prune(self, kwargs))])


def fuzz(test):
    """``test(name, data)`` run for each backend with that backend's example budget (skipped on a
    backend without a kernel for the op the test is named after)."""
    op = test.__name__.removeprefix("test_")

    def run(name, monkeypatch):
        require_backend(name)
        if op in OPS and not has_kernel(name, op):
            pytest.skip(f"{name} backend: no kernel yet for {op}")
        if LARGE and name == "triton" and DEVICE == "cuda":
            random_autotune_configs(monkeypatch)
        settings_ = settings(max_examples=budget(name), deadline=None, derandomize=not LARGE, database=None,
                             suppress_health_check=list(HealthCheck))
        settings_(given(data=st.data())(lambda data: checked(name, data)))()

    def checked(name, data):
        test(name, data)
        if PROGRESS:  # a passed example (hypothesis reruns a failing one while it shrinks it: not counted)
            with open(PROGRESS, "a") as f:
                f.write(f"{op}[{name}]\n")
    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return pytest.mark.filterwarnings("ignore::RuntimeWarning")(pytest.mark.parametrize("name", BACKENDS)(run))


# ----------------------------------------------------------------------------- strategies

def size(data, name, small=False):
    """A dimension's size: 0, 1, primes, odd sizes; tiny for triton through the interpreter."""
    if name == "triton" and DEVICE == "cpu" or small:
        choices = [0, 1, 2, 3, 5, 7]
    else:
        choices = [0, 1, 2, 3, 5, 7, 13, 31] + ([64, 127, 257, 1031] if LARGE else [])
    return data.draw(st.sampled_from(choices))


def sizes(data, name, max_dims):
    """1 to ``max_dims`` sizes (``size``) of at most about MAX_NUMEL elements in all: a size that would
    pass it is drawn again from the small ones (16 workers share one GPU; the references are float64)."""
    out = []
    for _ in range(data.draw(st.integers(1, max_dims))):
        s = size(data, name)
        out.append(s if math.prod(out) * s <= MAX_NUMEL else size(data, name, small=True))
    return out


def dtype(data, name):
    return data.draw(st.sampled_from(FLOAT if name in ("triton", "cute") else (torch.float64, *FLOAT)))


def scalar(data):
    return data.draw(st.sampled_from(SCALARS))


def tensor(data, shape, dt, scale=1.0, nonfinite=False, layout=None):
    """N(0, scale^2) values of ``shape`` in a drawn layout; with ``nonfinite`` a few NaN / +-inf."""
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    layout = layout or data.draw(st.sampled_from(["contiguous", "strided", "sliced"]
                                                 + (["transposed"] if len(shape) >= 2 else [])))
    shape = tuple(shape)
    # the view is taken last, of a buffer already in its dtype and on its device: an elementwise op
    # or a copy of a non-dense view gives a contiguous tensor, not the layout drawn
    if layout == "transposed":
        full, view = (*shape[:-2], shape[-1], shape[-2]), lambda t: t.mT
    elif layout == "strided":
        full, view = (*shape[:-1], 2 * shape[-1]), lambda t: t[..., ::2]
    elif layout == "sliced":
        full, view = tuple(s + 2 for s in shape), lambda t: t[tuple(slice(1, 1 + s) for s in shape)]
    else:
        full, view = shape, lambda t: t
    t = view((scale * torch.randn(full, generator=gen, dtype=torch.float64)).to(dt).to(DEVICE))
    assert t.shape == shape
    if nonfinite and t.numel() and data.draw(st.booleans()):  # a few NaN / +-inf, written through the view
        flat = torch.randint(0, t.numel(), (min(3, t.numel()),), generator=gen)
        values = torch.tensor([math.nan, math.inf, -math.inf], dtype=dt)
        picked = values[torch.randint(0, 3, (len(flat),), generator=gen)]
        t[torch.unravel_index(flat, t.shape)] = picked.to(t.device)
    return t


def close(actual, expected, k=1, scale=1.0):
    """``actual`` matches ``expected`` within the dtype's tolerance, NaN where it is NaN. The absolute
    part grows as sqrt(k) for sums of k terms and with ``scale``, the largest factor the terms were
    multiplied by (|alpha|, |beta| of the BLAS ops): a rounding error in a term scales with it."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    rtol, atol = TOL[actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * math.sqrt(max(k, 1)) * scale,
                               equal_nan=True)


def finite(*tensors) -> bool:
    return all(t is None or not t.is_floating_point() or bool(t.isfinite().all()) for t in tensors)


def forward_backward(f, inputs, dout_seed=0):
    """``f(*inputs)`` and the gradients of its floating inputs for a fixed random seed of the backward."""
    leaves = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in inputs]
    out = f(*leaves)
    wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    gen = torch.Generator().manual_seed(dout_seed)
    dout = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype).to(out.device)
    grads = torch.autograd.grad(out, wanted, dout, allow_unused=True) if out.requires_grad else [None] * len(wanted)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wanted)]
    return out.detach(), grads


def check(name, op, torch_op, inputs, k=1, grad_k=None, grads=True, scale=1.0):
    """``op(*inputs, backend=name)`` against the python reference (other backends) and against
    ``torch_op`` on the inputs in float64 rounded to the dtype, forward and (finite inputs) gradients;
    ``grad_k``: the gradients' k (default ``k``), or a list of one per differentiable input."""
    grads = grads and finite(*inputs)
    ours = lambda *t: op(*t, backend=name)
    if grads:
        out, g = forward_backward(ours, inputs)
    else:
        out, g = ours(*inputs), []
    up = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    if grads:
        out64, g64 = forward_backward(torch_op, up)
    else:
        out64, g64 = torch_op(*up), []
    dt = out.dtype
    ks = grad_k if isinstance(grad_k, (list, tuple)) else [grad_k or k] * len(g)
    if name != "python":
        if grads:
            ref, g_ref = forward_backward(lambda *t: op(*t, backend="python"), inputs)
        else:
            ref, g_ref = op(*inputs, backend="python"), []
        close(out, ref, k, scale)
        for a, e, k_ in zip(g, g_ref, ks):
            close(a, e, k_, scale)
    close(out, out64.to(dt), k, scale)
    for a, e, k_ in zip(g, g64, ks):
        close(a, e.to(a.dtype), k_, scale)
    return out


def sentinel_target(data, shape, dt):
    """``(view, buffer, outside)``: a target of ``shape``, every other element of the last dim of a
    larger buffer filled with a sentinel elsewhere, and a mask of the elements outside the view."""
    shape = tuple(shape)
    buf = torch.full((*shape[:-1], 2 * shape[-1] + 1), 1234.0, dtype=dt, device=DEVICE)
    view = buf[..., 1::2][..., :shape[-1]]
    mask = torch.ones(buf.shape, dtype=torch.bool, device=DEVICE)
    mask[..., 1::2][..., :shape[-1]] = False
    view.copy_(tensor(data, shape, dt, layout="contiguous"))
    return view, buf, mask


def check_inplace(name, op_, inputs, target_index, expected, data, k=1, scale=1.0):
    """``op_`` writing the input at ``target_index`` through a strided view of a sentinel buffer:
    the target then holds ``expected`` (the out-of-place result) and nothing else changed."""
    target = inputs[target_index]
    view, buf, mask = sentinel_target(data, target.shape, target.dtype)
    view.copy_(target)
    before = buf.clone()
    args = list(inputs)
    args[target_index] = view
    with torch.no_grad():
        op_(*args, backend=name)
    close(view, expected, k, scale)
    assert torch.equal(buf[mask], before[mask]), "an in-place op wrote outside its target"


# ----------------------------------------------------------------------------- level 1

@fuzz
def test_copy(name, data):
    dt = dtype(data, name)
    x = tensor(data, sizes(data, name, 3), dt, nonfinite=True)
    check(name, blas.copy, lambda t: t.clone(), [x])
    if x.dim() and x.shape[-1]:
        check_inplace(name, lambda x, y, backend: blas.copy_(x, y, backend=backend), [x, x.clone()], 1, x, data)


@fuzz
def test_swap(name, data):
    dt = dtype(data, name)
    shape = sizes(data, name, 2)
    x, y = tensor(data, shape, dt, nonfinite=True), tensor(data, shape, dt, nonfinite=True)
    xs, ys = blas.swap(x, y, backend=name)
    close(xs, y), close(ys, x)
    if shape[-1]:
        vx, bx, mx = sentinel_target(data, shape, dt)
        vy, by, my = sentinel_target(data, shape, dt)
        vx.copy_(x), vy.copy_(y)
        before = (bx.clone(), by.clone())
        blas.swap_(vx, vy, backend=name)
        close(vx, y), close(vy, x)
        assert torch.equal(bx[mx], before[0][mx]) and torch.equal(by[my], before[1][my])


@fuzz
def test_scal(name, data):
    dt, alpha = dtype(data, name), scalar(data)
    x = tensor(data, sizes(data, name, 3), dt, nonfinite=True)
    out = check(name, lambda x, backend: blas.scal(x, alpha, backend=backend), lambda x: alpha * x, [x])
    if x.dim() and x.shape[-1]:
        check_inplace(name, lambda x, backend: blas.scal_(x, alpha, backend=backend), [x], 0, out, data)


@fuzz
def test_axpby(name, data):
    dt, alpha, beta = dtype(data, name), scalar(data), scalar(data)
    shape = sizes(data, name, 2)
    x, y = tensor(data, shape, dt, nonfinite=True), tensor(data, shape, dt, nonfinite=True)
    # beta == 0: y is not read (BLAS), so NaN there does not reach the result
    out = check(name, lambda x, y, backend: blas.axpby(x, y, alpha, beta, backend=backend),
                lambda x, y: alpha * x + (beta * y if beta else 0), [x, y], scale=max(1, abs(alpha), abs(beta)))
    if shape[-1]:
        check_inplace(name, lambda x, y, backend: blas.axpby_(x, y, alpha, beta, backend=backend), [x, y], 1, out,
                      data, scale=max(1, abs(alpha), abs(beta)))


@fuzz
def test_dot(name, data):
    dt, n = dtype(data, name), size(data, name)
    x, y = tensor(data, [n], dt), tensor(data, [n], dt)
    check(name, blas.dot, lambda x, y: (x * y).sum(), [x, y], k=n)


# ----------------------------------------------------------------------------- level 2 and 3
# The product's operands hold NaN / +-inf only when alpha = 0, where the BLAS rule says they are not
# read (the reference follows it); otherwise finite.

@fuzz
def test_gemv(name, data):
    dt, alpha, beta = dtype(data, name), scalar(data), scalar(data)
    m, n = size(data, name), size(data, name)
    if LARGE and data.draw(st.booleans()):  # few long rows: the triton gemv splits the columns (n >= 2048)
        m, n = size(data, name, small=True), 4099
    A, x = tensor(data, [m, n], dt, nonfinite=alpha == 0), tensor(data, [n], dt, nonfinite=alpha == 0)
    y = tensor(data, [m], dt) if data.draw(st.booleans()) else None
    f = lambda A, x, y, backend: blas.gemv(A, x, y, alpha, beta, backend=backend)
    ref = lambda A, x, y: (alpha * (A * x).sum(-1) if alpha else A.new_zeros(A.shape[:1])) \
        + (beta * y if y is not None and beta else 0)
    scale = max(1, abs(alpha), abs(beta))
    out = check(name, f, ref, [A, x, y], k=n, grad_k=max(m, n), scale=scale)  # dx sums m terms
    if y is not None and m:
        check_inplace(name, lambda A, x, y, backend: blas.gemv_(A, x, y, alpha, beta, backend=backend), [A, x, y], 2,
                      out, data, k=n, scale=scale)


@fuzz
def test_geru(name, data):
    dt, alpha = dtype(data, name), scalar(data)
    m, n = size(data, name), size(data, name)
    A = tensor(data, [m, n], dt)
    x, y = tensor(data, [m], dt, nonfinite=alpha == 0), tensor(data, [n], dt, nonfinite=alpha == 0)
    out = check(name, lambda A, x, y, backend: blas.geru(A, x, y, alpha, backend=backend),
                lambda A, x, y: A + alpha * x[:, None] * y[None, :] if alpha else A + 0, [A, x, y], grad_k=max(m, n),
                scale=max(1, abs(alpha)))
    if n:
        check_inplace(name, lambda A, x, y, backend: blas.geru_(A, x, y, alpha, backend=backend), [A, x, y], 0, out,
                      data, scale=max(1, abs(alpha)))


@fuzz
def test_gemm(name, data):
    dt, alpha, beta = dtype(data, name), scalar(data), scalar(data)
    m, k, n = size(data, name), size(data, name), size(data, name)
    # batched: a batch of 0, 1 or 3, either operand 2-D (shared by the batch)
    batch = data.draw(st.sampled_from([(), (0,), (1,), (3,)]))
    a_batch = batch if not batch or data.draw(st.booleans()) else ()
    b_batch = batch if not batch or not a_batch or data.draw(st.booleans()) else ()
    A, B = tensor(data, [*a_batch, m, k], dt, nonfinite=alpha == 0), tensor(data, [*b_batch, k, n], dt, nonfinite=alpha == 0)
    out_shape = torch.broadcast_shapes(tuple(a_batch), tuple(b_batch)) + (m, n)
    c_shape = data.draw(st.sampled_from([None, (n,), out_shape]))
    C = None if c_shape is None else tensor(data, c_shape, dt)
    f = lambda A, B, C, backend: blas.gemm(A, B, C, alpha, beta, backend=backend)
    ref = lambda A, B, C: (alpha * torch.matmul(A, B) if alpha else torch.zeros(out_shape, dtype=A.dtype, device=A.device)) \
        + (beta * C if C is not None and beta else 0)
    grad_k = max(k, m * (batch[0] if batch else 1), n * (batch[0] if batch else 1))
    scale = max(1, abs(alpha), abs(beta))
    out = check(name, f, ref, [A, B, C], k=k, grad_k=grad_k, scale=scale)
    if C is not None and tuple(C.shape) == tuple(out_shape) and math.prod(out_shape):
        check_inplace(name, lambda A, B, C, backend: blas.gemm_(A, B, C, alpha, beta, backend=backend), [A, B, C], 2,
                      out, data, k=k, scale=scale)


# ----------------------------------------------------------------------------- transformer primitives

@fuzz
def test_softmax(name, data):
    _rows(name, data, "softmax")


@fuzz
def test_log_softmax(name, data):
    _rows(name, data, "log_softmax")


def _rows(name, data, op):
    dt = dtype(data, name)
    shape = sizes(data, name, 3)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = tensor(data, shape, dt, scale=data.draw(st.sampled_from([1.0, 3.0])), nonfinite=True)
    check(name, lambda x, backend: getattr(blas, op)(x, dim, backend=backend), lambda x: getattr(F, op)(x, dim), [x],
          k=shape[dim])


@fuzz
def test_cross_entropy(name, data):
    dt = dtype(data, name)
    N, V = size(data, name), max(size(data, name), 1)
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]))
    ignore_index = data.draw(st.sampled_from([-100, -1, 0]))
    logits = tensor(data, [N, V], dt, scale=3.0, nonfinite=True)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    target = torch.randint(0, V, (N,), generator=gen)
    target[torch.rand(N, generator=gen) < 0.3] = ignore_index
    target = target.to(data.draw(st.sampled_from([torch.int64, torch.int32]))).to(DEVICE)
    f = lambda x, backend: blas.cross_entropy(x, target, ignore_index, reduction, backend=backend)
    if finite(logits):
        ref = lambda x: F.cross_entropy(x, target.long(), ignore_index=ignore_index, reduction=reduction)
    else:  # the rule for non-finite logits: logsumexp(x) - x[target] (F.cross_entropy gives NaN for a +inf)
        ref = lambda x: _cross_entropy_by_formula(x, target.long(), ignore_index, reduction)
    check(name, f, ref, [logits], k=N if reduction == "sum" else 1)


@fuzz
def test_linear_cross_entropy(name, data):
    """Against F.linear (rounded to the dtype) then the loss in float64; the rows in chunks of a drawn size."""
    dt = dtype(data, name)
    N, K, V = size(data, name), size(data, name), max(size(data, name), 1)
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]))
    x, weight = tensor(data, [N, K], dt, nonfinite=True), tensor(data, [V, K], dt)
    bias = tensor(data, [V], dt) if data.draw(st.booleans()) else None
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    target = torch.randint(0, V, (N,), generator=gen)
    target[torch.rand(N, generator=gen) < 0.3] = -100
    target = target.to(DEVICE)
    f = lambda x, w, b, backend: blas.linear_cross_entropy(x, w, target, b, reduction=reduction, backend=backend)
    # the logits rounded to the dtype, as the op (and a Linear layer) writes them
    ref = lambda x, w, b: _cross_entropy_by_formula(F.linear(x, w, b).to(dt).double(), target, -100, reduction)
    saved = _host.CHUNKS, _host.MIN_CHUNK_LOGITS
    _host.CHUNKS, _host.MIN_CHUNK_LOGITS = data.draw(st.integers(1, min(max(N, 1), saved[0]))), 1  # as many as in use
    chunks = -(-N // _host.chunk_rows(N, V)) if N and name != "python" else 1
    try:  # the loss sums K products per logit and V logits per row (N rows for a sum); dx and dweight
        # max(N, V) + K terms; dweight and dbias are rounded to their dtype once per chunk (noise ~ sqrt(chunks))
        g = max(N, V) + K
        check(name, f, ref, [x, weight, bias], k=(K + V) * (N if reduction == "sum" else 1),
              grad_k=[g, g * chunks, g * chunks])
    finally:
        _host.CHUNKS, _host.MIN_CHUNK_LOGITS = saved


@fuzz
def test_linear(name, data):
    """act(F.linear) in float64, finite inputs (the activations' non-finite rules: test_activations)."""
    dt = dtype(data, name)
    lead = sizes(data, name, 2)[:data.draw(st.integers(0, 1))]  # x (K,), (M, K) or (B, M, K)
    K, N = size(data, name), size(data, name)
    activation = data.draw(st.sampled_from([None, "gelu", "gelu_tanh", "relu", "silu"]))
    x, weight = tensor(data, [*lead, K], dt), tensor(data, [N, K], dt)
    bias = tensor(data, [N], dt) if data.draw(st.booleans()) else None
    act = {None: lambda z: z, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
           "relu": F.relu, "silu": F.silu}[activation]
    f = lambda x, w, b, backend: blas.linear(x, w, b, activation, backend=backend)
    # the gradients sum N (dx) or M (dweight, dbias) terms of dz = dy act'(z), which is rounded once
    # (as torch's unfused backward rounds it) and carries z's error (a sum of K terms) through act'
    rows = math.prod(lead)
    check(name, f, lambda x, w, b: act(F.linear(x, w, b)), [x, weight, bias], k=K,
          grad_k=[4 * (N + K), 4 * (rows + K), 4 * (rows + K)])


@fuzz
def test_linear_swiglu(name, data):
    """silu(F.linear(x, W_g, b_g)) * F.linear(x, W_u, b_u) in float64, finite inputs."""
    dt = dtype(data, name)
    lead = sizes(data, name, 2)[:data.draw(st.integers(0, 1))]
    K, F_ = size(data, name), size(data, name)
    # weights of scale K^-1/2 (as a layer's initialization): g and u of unit scale, so that y = silu(g) u,
    # a product of two sums, has the error of one
    w = 1 / math.sqrt(max(K, 1))
    x, w_gate, w_up = tensor(data, [*lead, K], dt), tensor(data, [F_, K], dt, w), tensor(data, [F_, K], dt, w)
    biases = [tensor(data, [F_], dt), tensor(data, [F_], dt)] if data.draw(st.booleans()) else [None, None]
    f = lambda x, wg, wu, bg, bu, backend: blas.linear_swiglu(x, wg, wu, bg, bu, backend=backend)
    ref = lambda x, wg, wu, bg, bu: F.silu(F.linear(x, wg, bg)) * F.linear(x, wu, bu)
    # as test_linear: sums of F or M terms of dg and du, each rounded and carrying g's and u's error; the
    # rounding of g (of u) is multiplied by u (by silu(g)) in y, dg and du: up to ~3 at unit scale
    rows = math.prod(lead)
    check(name, f, ref, [x, w_gate, w_up, *biases], k=2 * K, grad_k=[8 * (F_ + K), *[4 * (rows + K)] * 4], scale=3.0)


def _cross_entropy_by_formula(x, target, ignore_index, reduction):
    valid = target != ignore_index
    picked = x.gather(1, torch.where(valid, target, 0)[:, None])[:, 0]
    loss = torch.where(valid, torch.logsumexp(x, 1) - picked, 0)
    if reduction == "none":
        return loss
    return loss.sum() / valid.sum() if reduction == "mean" else loss.sum()


@fuzz
def test_layer_norm(name, data):
    _norm(name, data, "layer_norm")


@fuzz
def test_rms_norm(name, data):
    _norm(name, data, "rms_norm")


@fuzz
def test_add_layer_norm(name, data):
    _norm(name, data, "layer_norm", add=True)


@fuzz
def test_add_rms_norm(name, data):
    _norm(name, data, "rms_norm", add=True)


def _norm(name, data, op, add=False):
    """``op`` (``add``: ``add_<op>``, its ``(y, h)`` checked as one tensor, both outputs' gradients)."""
    dt = dtype(data, name)
    shape = sizes(data, name, 3)
    D = shape[-1]
    eps = data.draw(st.sampled_from([1e-5, 1e-6, 0.1]))
    x = tensor(data, shape, dt, scale=data.draw(st.sampled_from([1.0, 10.0])))
    residual = tensor(data, shape, dt) if add else None
    weight = tensor(data, [D], dt) if data.draw(st.booleans()) else None
    bias = tensor(data, [D], dt) if op == "layer_norm" and data.draw(st.booleans()) else None
    rows = x.numel() // max(D, 1)
    # y and dx are rounding errors of terms of x's size times the row's 1/sigma (rstd): a row of
    # nearly equal values amplifies them, as it amplifies any change of x; layer_norm's x - mean
    # loses the digits of the mean, an error of |mean| * eps that its rstd amplifies again (a row
    # of two values near -12.2, 0.14 apart: |mean| * rstd = 168)
    h64 = x.double() if residual is None else (x + residual).double()
    var = h64.var(-1, unbiased=False) if op == "layer_norm" else h64.square().mean(-1)
    rstd = (var + eps).rsqrt()
    scale = max(1.0, float(rstd.max())) if rows and D else 1.0
    if op == "layer_norm" and rows and D:
        scale *= max(1.0, float((h64.mean(-1).abs() * rstd).max()))
    cpu = lambda t: None if t is None else t.cpu()  # the float64 torch reference on the CPU: CUDA's
    # native_layer_norm_backward gives weight and bias gradients of shape (0,) for 0 rows
    if op == "layer_norm":
        norm = lambda h, w, b: F.layer_norm(h.cpu(), (D,), cpu(w), cpu(b), eps).to(h.device)
    else:
        norm = lambda h, w, b: F.rms_norm(h.cpu(), (D,), cpu(w), eps).to(h.device)
    if not add:
        f = lambda x, w, b, backend: getattr(blas, op)(x, w, *([b] if op == "layer_norm" else []), eps,
                                                       backend=backend)
        check(name, f, norm, [x, weight, bias], k=1, grad_k=max(rows, D), scale=scale)
        return
    both = lambda y, h: torch.cat([y.reshape(-1), h.reshape(-1)])
    # y normalizes h as the op stores it, rounded to the dtype (D = 2 rows amplify that rounding ~1/sqrt(eps))
    ref = lambda x, r, w, b: both(norm((x + r).to(dt).to(x.dtype), w, b), x + r)
    f = lambda x, r, w, b, backend: both(*getattr(blas, "add_" + op)(
        x, r, w, *([b] if op == "layer_norm" else []), eps, backend=backend))
    check(name, f, ref, [x, residual, weight, bias], k=2, grad_k=max(rows, D), scale=scale)


@fuzz
def test_activations(name, data):
    dt = dtype(data, name)
    shape = sizes(data, name, 3)
    x = tensor(data, shape, dt, scale=3.0, nonfinite=True)
    which = data.draw(st.sampled_from(["gelu", "gelu_tanh", "silu", "relu", "swiglu"]))
    if which == "swiglu":
        up = tensor(data, shape, dt, nonfinite=True)
        check(name, blas.swiglu, lambda g, u: F.silu(g) * u, [x, up])
    elif which == "gelu_tanh":
        check(name, lambda x, backend: blas.gelu(x, "tanh", backend=backend), lambda x: F.gelu(x, approximate="tanh"),
              [x])
    else:
        check(name, getattr(blas, which), getattr(F, which), [x])


@fuzz
def test_embedding(name, data):
    dt = dtype(data, name)
    V, D = max(size(data, name), 1), size(data, name)
    shape = [size(data, name, small=True) for _ in range(data.draw(st.integers(1, 2)))]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    idx = torch.randint(0, V, shape, generator=gen).to(data.draw(st.sampled_from([torch.int64, torch.int32])))
    idx = idx.to(DEVICE)
    weight = tensor(data, [V, D], dt)
    repeats = int(torch.bincount(idx.flatten().long().cpu()).max()) if idx.numel() else 1
    # the float64 torch reference on the CPU: CUDA's embedding_dense_backward reads out of bounds at D = 0
    reference = lambda w: F.embedding(idx.long().cpu(), w.cpu()).to(w.device)
    check(name, lambda w, backend: blas.embedding(idx, w, backend=backend), reference,
          [weight], grad_k=repeats)


@fuzz
def test_rope(name, data):
    dt = dtype(data, name)
    T, half = size(data, name), size(data, name, small=True)
    lead = [size(data, name, small=True) for _ in range(data.draw(st.integers(0, 2)))]
    x = tensor(data, [*lead, T, 2 * half], dt)
    base = data.draw(st.sampled_from([10000.0, 500.0]))
    positions = None
    if data.draw(st.booleans()):
        gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        positions = torch.randint(0, 4096, (T,), generator=gen).to(DEVICE)
    check(name, lambda x, backend: blas.rope(x, base, positions, backend=backend),
          lambda x: _rope64(x, base, positions), [x], k=1, grad_k=2)


def _rope64(x, base, positions):
    T, D = x.shape[-2:]
    pos = torch.arange(T, device=x.device) if positions is None else positions
    inv_freq = base ** (-torch.arange(0, D // 2, dtype=torch.float64, device=x.device) * 2 / D)
    angle = pos.double()[:, None] * inv_freq  # (T, D/2)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], dim=-1)


@fuzz
def test_attention(name, data):
    dt = dtype(data, name)
    B, Hkv = max(size(data, name, small=True), 1), max(size(data, name, small=True), 1)
    H = Hkv * data.draw(st.sampled_from([1, 2]))
    Tq, Tk = size(data, name, small=not LARGE), size(data, name, small=not LARGE)  # the python reference is slow
    D = max(size(data, name, small=True), 1) * data.draw(st.sampled_from([1, 8]))
    causal = data.draw(st.booleans())
    scale = data.draw(st.sampled_from([None, 0.0, -0.3, 0.125]))
    layout = data.draw(st.sampled_from(["contiguous", "sliced", "strided"]))
    q = tensor(data, [B, H, Tq, D], dt, layout=layout)
    k, v = tensor(data, [B, Hkv, Tk, D], dt, layout=layout), tensor(data, [B, Hkv, Tk, D], dt, layout=layout)
    s = D ** -0.5 if scale is None else scale

    def sdpa(q, k, v):  # the causal mask as a boolean mask: SDPA's is_causal gives NaN at scale 0 (0 * -inf)
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril() if causal else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s, enable_gqa=True)

    f = lambda q, k, v, backend: blas.attention(q, k, v, causal, scale, backend=backend)
    if name == "cute" and D * q.element_size() % 4:  # a documented limit: refused before anything runs
        with pytest.raises(ValueError, match=r"attention: the cute kernels need D \* itemsize"):
            f(q, k, v, name)
        return
    check(name, f, sdpa, [q, k, v], k=max(Tk, 1), grad_k=16 * max(Tq, Tk, 1))


@fuzz
def test_attention_kv_len(name, data):
    """attention over each batch row's first kv_len[b] keys (a static KV cache), forward only: lengths
    from below 0 to above Tk, int32 or int64, and the hidden positions optionally NaN (never read)."""
    dt = dtype(data, name)
    B, Hkv = max(size(data, name, small=True), 1), max(size(data, name, small=True), 1)
    H = Hkv * data.draw(st.sampled_from([1, 2]))
    Tq, Tk = size(data, name, small=not LARGE), size(data, name, small=not LARGE)
    D = max(size(data, name, small=True), 1) * data.draw(st.sampled_from([1, 8]))
    causal = data.draw(st.booleans())
    scale = data.draw(st.sampled_from([None, 0.125, -0.3]))
    layout = data.draw(st.sampled_from(["contiguous", "sliced", "strided"]))
    q = tensor(data, [B, H, Tq, D], dt, layout=layout)
    k, v = tensor(data, [B, Hkv, Tk, D], dt, layout=layout), tensor(data, [B, Hkv, Tk, D], dt, layout=layout)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    kv_len = torch.randint(-2, Tk + 3, (B,), generator=gen).to(DEVICE, data.draw(st.sampled_from([torch.int32,
                                                                                                   torch.int64])))
    keys = torch.arange(Tk, device=DEVICE) < kv_len[:, None]  # (B, Tk)
    if data.draw(st.booleans()):
        k.masked_fill_(~keys[:, None, :, None], float("nan"))
        v.masked_fill_(~keys[:, None, :, None], float("nan"))
    s = D ** -0.5 if scale is None else scale

    def sdpa(q, k, v):  # the visible keys as a boolean mask, the hidden ones zeroed; rows of no key 0
        mask = keys[:, None, None, :]
        if causal:
            mask = mask & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        hidden = ~keys[:, None, :, None]
        out = F.scaled_dot_product_attention(q, k.masked_fill(hidden, 0), v.masked_fill(hidden, 0),
                                             attn_mask=mask, scale=s, enable_gqa=True)
        return out.masked_fill(~mask.any(dim=-1, keepdim=True), 0)

    f = lambda q, k, v, backend: blas.attention(q, k, v, causal, scale, kv_len=kv_len, backend=backend)
    if name == "cute" and D * q.element_size() % 4:
        with pytest.raises(ValueError, match=r"attention: the cute kernels need D \* itemsize"):
            f(q, k, v, name)
        return
    with torch.no_grad():
        check(name, f, sdpa, [q, k, v], k=max(Tk, 1), grads=False)
