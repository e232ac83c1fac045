"""layer_norm: forward and gradients (x, weight, bias) of every backend against the python reference
and torch.nn.functional.layer_norm, the reference against float64 torch."""
import re

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from kcourse.backend import backward_kernel, resolve
from _util import ALL_DTYPES, DTYPES, assert_close, raises, randn, require_backend, require_dtype

# D = 64 and 1000, 1002, 33 and 4097: the cute column sums read their float32 partials 4, 2 and 1 at a time
SHAPES = [(1, 64), (7, 33), (3, 5, 1000), (5, 1002), (2, 4097)]
AFFINE = [(True, True), (True, False), (False, True), (False, False)]  # (weight given, bias given)


def inputs(shape, dtype=torch.float32, affine=(True, True), layout="contiguous"):
    """x, weight or None, bias or None, and the incoming gradient dy."""
    d = shape[-1]
    weight = randn(d, dtype=dtype) if affine[0] else None
    bias = randn(d, dtype=dtype) if affine[1] else None
    return randn(*shape, dtype=dtype, layout=layout), weight, bias, randn(*shape, dtype=dtype)


def run(fn, x, weight, bias, dy):
    """``[y, dx, dweight, dbias]`` of ``y = fn(x, weight, bias)`` pulled back from dy (None for a missing input)."""
    leaves = [t if t is None else t.detach().requires_grad_() for t in (x, weight, bias)]
    y = fn(*leaves)
    grads = iter(torch.autograd.grad(y, [t for t in leaves if t is not None], dy))
    return [y.detach()] + [None if t is None else next(grads) for t in leaves]


def kcourse_ln(backend, eps=1e-5):
    return lambda x, w, b: blas.layer_norm(x, w, b, eps, backend=backend)


def torch_ln(eps=1e-5, dtype=torch.float64):
    """F.layer_norm computed in ``dtype`` (float64: the truth) and rounded back to the inputs' dtype."""
    def fn(x, w, b):
        cast = (lambda t: t if t is None else t.to(dtype))
        return F.layer_norm(cast(x), x.shape[-1:], cast(w), cast(b), eps).to(x.dtype)
    return fn


def assert_results(actual, expected, rows):
    """y and dx elementwise, dweight and dbias as sums over ``rows`` rows."""
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), i
        if a is not None:
            assert_close(a, e, k=rows if i >= 2 else 1)


def check(backend, x, weight, bias, dy, eps=1e-5):
    """backend vs the python reference and vs F.layer_norm on the inputs upcast to float32 (float64 stays):
    torch's own CPU kernels for half types round dweight and dbias through the half type."""
    rows = x.numel() // max(x.shape[-1], 1)
    got = run(kcourse_ln(backend, eps), x, weight, bias, dy)
    assert_results(got, run(kcourse_ln("python", eps), x, weight, bias, dy), rows)
    upcast = torch.promote_types(x.dtype, torch.float32)
    assert_results(got, run(torch_ln(eps, upcast), x, weight, bias, dy), rows)
    return got


@pytest.mark.parametrize("affine", [(True, True), (False, False)])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype, affine):
    x, weight, bias, dy = inputs((5, 300), dtype, affine)
    truth = run(torch_ln(), x, weight, bias, dy)
    assert_results(run(kcourse_ln("python"), x, weight, bias, dy), truth, rows=5)
    cache = resolve("layer_norm", "python")[1](x, weight, bias, eps=1e-5)[1]  # statistics in the accumulation dtype
    assert cache[2].dtype == cache[3].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_layer_norm(backend, dtype, shape):
    require_dtype(backend, dtype)
    x, weight, bias, dy = inputs(shape, dtype)
    before = [t.clone() for t in (x, weight, bias, dy)]
    y = check(backend, x, weight, bias, dy)[0]
    assert y.dtype == dtype and y.shape == x.shape
    assert all(torch.equal(t, t0) for t, t0 in zip((x, weight, bias, dy), before))


@pytest.mark.parametrize("affine", AFFINE)
def test_weight_bias_none(backend, affine):
    check(backend, *inputs((7, 33), affine=affine))


@pytest.mark.parametrize("D, affine", [(1, (False, True))] + [(D, a) for D in (2, 33) for a in AFFINE[:3]])
def test_many_rows(backend, D, affine):
    # more than 65536 rows take CUDA's two-pass column sums, which for dbias without dweight gave a
    # dbias of shape (0,) (D = 2) or wrong values (D = 1) through ATen's backward (D = 1 has y = 0,
    # its rounding amplified by 1/sqrt(eps): the bias's case only)
    if backend == "triton" and not torch.cuda.is_available():
        pytest.skip("66k rows through the triton interpreter: minutes")
    x, weight, bias, dy = inputs((65984, D), torch.float32, affine=affine)
    x = 0.3 * x + 3 * torch.arange(D, device=x.device)  # rows far from constant (a small 1/sigma)
    got = run(kcourse_ln(backend), x, weight, bias, dy)
    if bias is not None:
        assert_close(got[3], dy.double().sum(0).float(), k=65984)
    assert_results(got, run(kcourse_ln("python"), x, weight, bias, dy), 65984)
    if weight is not None and bias is not None:  # a frozen weight: dbias alone (the same ATen path)
        cache = resolve("layer_norm", backend)[1](x, weight, bias, eps=1e-5)[1]
        dx, dweight, dbias = backward_kernel(backend, "layer_norm")(dy, cache, (True, False, True), eps=1e-5)
        assert dweight is None
        assert_close(dbias, got[3], k=65984)
        assert_close(dx, got[1])


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 100)])
@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous(backend, dtype, layout, shape):
    x, _, _, dy = inputs(shape, dtype, layout=layout)
    assert x.stride(-1) != 1
    weight, bias = randn(shape[-1], dtype=dtype, layout="strided"), randn(shape[-1], dtype=dtype)
    check(backend, x, weight, bias, dy)


@pytest.mark.parametrize("eps", [1e-6, 0.1, 10.0])
def test_eps(backend, eps):
    x, weight, bias, dy = inputs((7, 33))
    check(backend, 0.1 * x, weight, bias, dy, eps)  # var ~ 0.01: eps matters


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitude(backend, dtype):
    x, weight, bias, dy = inputs((7, 1000), dtype)
    x = (x.float() * 1e3 + 1e3).to(dtype)
    got = check(backend, x, weight, bias, dy)
    assert_results(got, run(torch_ln(), x, weight, bias, dy), rows=7)


@pytest.mark.parametrize("shape", [(7, 1000), pytest.param((3, 100000), marks=pytest.mark.gpu)])
def test_large_offset(backend, shape):
    # (3, 100000): the cute forward's rows over a cluster of CTAs, whose shares' statistics combine
    check_large_offset(backend, shape)


def check_large_offset(backend, shape):
    # mean 1e4, std 1: float32 rounds the mean to ~1e-3, so results agree with float64 to ~1e-3; a
    # one-pass variance (mean of squares minus squared mean, ~1e8 each) would be off by O(1)
    x, weight, bias, dy = inputs(shape)
    got = run(kcourse_ln(backend), x + 1e4, weight, bias, dy)
    for a, e in zip(got, run(torch_ln(), x + 1e4, weight, bias, dy)):
        torch.testing.assert_close(a, e, rtol=1e-3, atol=2e-2)


def test_one_row_and_empty(backend):
    check(backend, *inputs((100,)))  # x 1-D: one row
    x, weight, bias, dy = inputs((0, 33))
    y, dx, dweight, dbias = run(kcourse_ln(backend), x, weight, bias, dy)
    assert y.shape == dx.shape == (0, 33)
    assert torch.equal(dweight, torch.zeros_like(weight)) and torch.equal(dbias, torch.zeros_like(bias))
    x, weight, bias, dy = inputs((3, 4, 0))  # rows of no columns: empty outputs, as torch's
    y, dx, dweight, dbias = run(kcourse_ln(backend), x, weight, bias, dy)
    assert y.shape == dx.shape == (3, 4, 0) and dweight.shape == dbias.shape == (0,)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False), (False, False, True),
                                   (False, True, True)])
def test_backward_needs(backend, needs):
    # the backward kernel computes only what `needs` asks for and returns None for the rest
    x, weight, bias, dy = inputs((7, 33))
    cache = resolve("layer_norm", backend)[1](x, weight, bias, eps=1e-5)[1]
    grads = backward_kernel(backend, "layer_norm")(dy, cache, needs, eps=1e-5)
    expected = run(kcourse_ln("python"), x, weight, bias, dy)[1:]
    for need, g, e in zip(needs, grads, expected):
        if need:
            assert_close(g, e, k=7)
        else:
            assert g is None


@pytest.mark.gpu
@pytest.mark.parametrize("needs", [(True, True, True), (True, True, False), (True, False, True), (True, False, False),
                                   (False, True, True), (False, False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_needs_long_rows(backend, needs, dtype):
    # rows longer than the cute backward keeps on chip (8192): swept in chunks, dx chunk-major beside the
    # column sums when both are asked for; 601 rows, several a CTA, 12000 columns (a partial chunk)
    x, weight, bias, dy = inputs((601, 12000), dtype)
    cache = resolve("layer_norm", backend)[1](x, weight, bias, eps=1e-5)[1]
    grads = backward_kernel(backend, "layer_norm")(dy, cache, needs, eps=1e-5)
    expected = run(kcourse_ln("python"), x, weight, bias, dy)[1:]
    for need, g, e, k in zip(needs, grads, expected, (1, 601, 601)):
        if need:
            assert_close(g, e, k=k)
        else:
            assert g is None


def test_deterministic(backend):
    x, weight, bias, dy = inputs((30, 70))
    first, second = run(kcourse_ln(backend), x, weight, bias, dy), run(kcourse_ln(backend), x, weight, bias, dy)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("affine", [(True, True), (False, False)])
@pytest.mark.parametrize("shape", [(9, 1000), (3, 200)])  # 200: one block forward, chunked backward
def test_triton_chunked_rows(triton_chunks, shape, affine):
    x, weight, bias, dy = inputs(shape, affine=affine)
    check("triton", x * 3 + 3, weight, bias, dy)
    check_large_offset("triton", shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_long_rows(dtype):
    # longer than the forward holds on chip (16384) and than the backward does (8192)
    require_backend("triton")
    check("triton", *inputs((2, 20000), dtype))


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    x, weight, bias, _ = inputs((3, 7), torch.float64)
    leaves = [t.requires_grad_() for t in (x, weight, bias)]
    assert torch.autograd.gradcheck(lambda x, w, b: blas.layer_norm(x, w, b, backend=name), leaves)
    assert torch.autograd.gradcheck(lambda x: blas.layer_norm(x, eps=0.5, backend=name), leaves[:1])
    x1, b1 = randn(6, dtype=torch.float64).requires_grad_(), randn(6, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, b: blas.layer_norm(x, None, b, backend=name), (x1, b1))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_validation(name):
    require_backend(name)
    x, weight, bias = randn(3, 4), randn(4), randn(4)
    ln = lambda *args, **kw: blas.layer_norm(*args, backend=name, **kw)  # noqa: E731
    raises(ValueError, re.escape("layer_norm: x is (3, 4) and weight is (5,); weight must be (4,), the size of x's "
                                 "last dimension"), ln, x, randn(5), bias)
    raises(ValueError, re.escape("layer_norm: bias must be 1-D, got 2-D of shape (1, 4)"), ln, x, weight, randn(1, 4))
    raises(ValueError, "layer_norm: x must have at least one dimension, got a 0-d tensor", ln, randn(3)[0])
    raises(ValueError, "layer_norm: eps must be positive, got 0.0", ln, x, weight, bias, eps=0)
    raises(ValueError, "layer_norm: eps must be positive, got -1.0", ln, x, weight, bias, eps=-1.0)
    raises(TypeError, "layer_norm: eps must be a real number, got str", ln, x, weight, bias, eps="1e-5")
    raises(TypeError, "layer_norm: x is torch.float32 but bias is torch.float16", ln, x, weight, bias.half())
    raises(TypeError, "layer_norm: x must be a floating-point tensor, got torch.int64", ln, x.long())
    if name == "triton":
        raises(TypeError, "layer_norm: the triton backend does not support torch.float64", ln, x.double())


@pytest.mark.gpu
# (1001, 6000), (2049, 8192), (333, 4098): rows of more than 4096 kept on chip (the cute backward
# stages the next row in shared memory there in 16 bits), odd row counts (a row slot past the end)
# (64, 65536), (3, 131072), (7, 20000), (2, 262144), (5, 200000), (1000, 8193): rows spread over a cluster of
# CTAs that each keep their share (the cute forward; ragged last shares; 512-thread CTAs past 16384 a share;
# scalar accesses at 8193)
@pytest.mark.parametrize("shape", [(4096, 4096), (8192, 1024), (1000, 8193), (512, 16384), (64, 65536), (3, 131072),
                                   (1001, 6000), (2049, 8192), (333, 4098), (7, 20000), (2, 262144), (5, 200000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_layer_norm_large(backend, dtype, shape):
    check(backend, *inputs(shape, dtype))
