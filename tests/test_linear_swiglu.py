"""linear_swiglu: ``silu(x W_g^T + b_g) * (x W_u^T + b_u)`` and its gradients (x, both weights, both
biases) of every backend against the python reference and against F.linear and F.silu in float64; the
triton kernel's pair of accumulators and its epilogue; arguments that do not chain refused."""
import math

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, assert_close, raises, randn, require_dtype

SHAPES = [((7, 33), 17), ((2, 5, 40), 24), ((33,), 9), ((64, 128), 64)]  # x (..., K), F


def inputs(x_shape, F_, dtype=torch.float32, bias=True):
    """x, W_g, W_u (of scale K^-1/2, as initialized layers: g and u of unit scale), b_g, b_u, dy."""
    K = x_shape[-1]
    scale = 1 / math.sqrt(max(K, 1))
    w_gate, w_up = (randn(F_, K, dtype=dtype) * scale for _ in range(2))
    biases = [randn(F_, dtype=dtype), randn(F_, dtype=dtype)] if bias else [None, None]
    return randn(*x_shape, dtype=dtype), w_gate, w_up, *biases, randn(*x_shape[:-1], F_, dtype=dtype)


def run(fn, *args):
    """``[y, *gradients]`` of ``y = fn(x, W_g, W_u, b_g, b_u)`` pulled back from dy (None for no bias)."""
    *tensors, dy = args
    leaves = [t if t is None else t.detach().requires_grad_() for t in tensors]
    y = fn(*leaves)
    grads = iter(torch.autograd.grad(y, [t for t in leaves if t is not None], dy))
    return [y.detach()] + [None if t is None else next(grads) for t in leaves]


def kcourse_fn(backend):
    return lambda x, wg, wu, bg, bu: blas.linear_swiglu(x, wg, wu, bg, bu, backend=backend)


def torch_fn(x, wg, wu, bg, bu):
    """F.linear and F.silu in float64, rounded to x's dtype."""
    d = lambda t: None if t is None else t.double()  # noqa: E731
    return (F.silu(F.linear(d(x), d(wg), d(bg))) * F.linear(d(x), d(wu), d(bu))).to(x.dtype)


def check(backend, *args):
    """backend vs the python reference and vs float64 torch: y multiplies two sums of K terms; dx sums
    2F terms, the weights' and biases' gradients M (the rows), each of dg or du rounded once first."""
    x, wg = args[0], args[1]
    K, F_, M = x.shape[-1], wg.shape[0], x.numel() // max(x.shape[-1], 1)
    got = run(kcourse_fn(backend), *args)
    for expected in (run(kcourse_fn("python"), *args), run(torch_fn, *args)):
        for a, e, k in zip(got, expected, (2 * K, 8 * (F_ + K), *[4 * (M + K)] * 4)):
            assert (a is None) == (e is None)
            if a is not None:
                assert_close(a, e, k=3 * k)
    return got


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    args = inputs((3, 5, 33), 17, dtype)
    for a, e, k in zip(run(kcourse_fn("python"), *args), run(torch_fn, *args), (66, 400, *[200] * 4)):
        assert_close(a, e, k=k)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_linear_swiglu(backend, dtype, shape, bias):
    require_dtype(backend, dtype)
    x_shape, F_ = shape
    y = check(backend, *inputs(x_shape, F_, dtype, bias))[0]
    assert y.shape == (*x_shape[:-1], F_) and y.dtype == dtype


def test_views(backend):
    x, wg, wu, bg, bu, dy = inputs((2, 30, 17), 11)
    x = randn(2, 30, 17, layout="transposed")
    wg = randn(11, 17, layout="strided").mul_(1 / math.sqrt(17))  # W_g's strides differ from W_u's
    assert not x.is_contiguous() and not wg.is_contiguous()
    check(backend, x, wg, wu, bg, bu, dy)


@pytest.mark.parametrize("shape", [((0, 8), 5), ((4, 0), 3), ((4, 6), 0)], ids=str)
def test_empty(backend, shape):
    x_shape, F_ = shape
    y, dx, dwg, dwu, dbg, dbu = check(backend, *inputs(x_shape, F_))
    assert y.shape == (x_shape[0], F_) and dx.shape == x_shape and dwg.shape == dwu.shape == (F_, x_shape[1])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", [(136, 72, 200), (64, 2048, 64)], ids=["tiles", "long-k"])
def test_triton_tma_pair(triton_tma, case, bias):
    # both products in the Hopper kernel (two accumulators from the same x tiles), the gated unit in its
    # epilogue; a 64 x 64 output over k = 2048, which a single product would split in K, is not split
    M, K, F_ = case
    x, wg, wu, bg, bu, dy = inputs((M, K), F_, torch.float16, bias)
    y = blas.linear_swiglu(x, wg, wu, bg, bu, backend="triton")
    assert len(triton_tma) == 1, "the pair did not take the Hopper kernel"
    assert_close(y, blas.linear_swiglu(x, wg, wu, bg, bu, backend="python"), k=6 * K)


def test_backward_spends_the_cache(backend):
    """Eagerly, the backward writes dg and du over the g and u it saved: the gradients are right, and
    a second backward through the same graph is refused by autograd (g and u changed)."""
    *tensors, dy = inputs((6, 10), 4, torch.float32, bias=True)
    leaves = [t.requires_grad_() for t in tensors]
    y = blas.linear_swiglu(*leaves, backend=backend)
    got = torch.autograd.grad(y, leaves, dy, retain_graph=True)
    for g, e in zip(got, run(torch_fn, *tensors, dy)[1:]):
        assert_close(g, e, k=48)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, leaves[:1], dy)


def test_validation(backend):
    x, wg, wu = randn(3, 4), randn(5, 4), randn(5, 4)
    raises(ValueError, r"linear_swiglu: x is \(3, 6\) and w_gate is \(5, 4\); w_gate must be \(N, 6\)",
           blas.linear_swiglu, randn(3, 6), wg, wu, backend=backend)
    raises(ValueError, r"linear_swiglu: w_gate is \(5, 4\) and w_up is \(6, 4\); they must have one shape",
           blas.linear_swiglu, x, wg, randn(6, 4), backend=backend)
    raises(ValueError, r"linear_swiglu: b_gate and b_up must both be given or both be None",
           blas.linear_swiglu, x, wg, wu, randn(5), None, backend=backend)
    raises(ValueError, r"linear_swiglu: w_up is \(5, 4\) and bias is \(4,\)",
           blas.linear_swiglu, x, wg, wu, randn(5), randn(4), backend=backend)
