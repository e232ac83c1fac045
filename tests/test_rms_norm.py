"""rms_norm: forward and gradients (x, weight) of every backend against the python reference and
torch.nn.functional.rms_norm, the reference against float64 torch."""
import re

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from kcourse.backend import backward_kernel, resolve
from _util import ALL_DTYPES, DTYPES, assert_close, raises, randn, require_backend, require_dtype

SHAPES = [(1, 64), (7, 33), (3, 5, 1000), (2, 4097)]


def inputs(shape, dtype=torch.float32, weighted=True, layout="contiguous"):
    """x, weight or None, and the incoming gradient dy."""
    weight = randn(shape[-1], dtype=dtype) if weighted else None
    return randn(*shape, dtype=dtype, layout=layout), weight, randn(*shape, dtype=dtype)


def run(fn, x, weight, dy):
    """``[y, dx, dweight]`` of ``y = fn(x, weight)`` pulled back from dy (None for a missing weight)."""
    leaves = [t if t is None else t.detach().requires_grad_() for t in (x, weight)]
    y = fn(*leaves)
    grads = iter(torch.autograd.grad(y, [t for t in leaves if t is not None], dy))
    return [y.detach()] + [None if t is None else next(grads) for t in leaves]


def kcourse_rms(backend, eps=1e-6):
    return lambda x, w: blas.rms_norm(x, w, eps, backend=backend)


def torch_rms(eps=1e-6, dtype=torch.float64):
    """F.rms_norm computed in ``dtype`` (float64: the truth) and rounded back to the inputs' dtype."""
    def fn(x, w):
        return F.rms_norm(x.to(dtype), x.shape[-1:], None if w is None else w.to(dtype), eps).to(x.dtype)
    return fn


def assert_results(actual, expected, rows):
    """y and dx elementwise, dweight as a sum over ``rows`` rows."""
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), i
        if a is not None:
            assert_close(a, e, k=rows if i == 2 else 1)


def check(backend, x, weight, dy, eps=1e-6):
    """backend vs the python reference and vs F.rms_norm on the inputs upcast to float32 (float64 stays)."""
    rows = x.numel() // max(x.shape[-1], 1)
    got = run(kcourse_rms(backend, eps), x, weight, dy)
    assert_results(got, run(kcourse_rms("python", eps), x, weight, dy), rows)
    assert_results(got, run(torch_rms(eps, torch.promote_types(x.dtype, torch.float32)), x, weight, dy), rows)
    return got


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype, weighted):
    x, weight, dy = inputs((5, 300), dtype, weighted)
    assert_results(run(kcourse_rms("python"), x, weight, dy), run(torch_rms(), x, weight, dy), rows=5)
    rstd = resolve("rms_norm", "python")[1](x, weight, eps=1e-6)[1][2]  # in the accumulation dtype
    assert rstd.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_rms_norm(backend, dtype, shape):
    require_dtype(backend, dtype)
    x, weight, dy = inputs(shape, dtype)
    before = [t.clone() for t in (x, weight, dy)]
    y = check(backend, x, weight, dy)[0]
    assert y.dtype == dtype and y.shape == x.shape
    assert all(torch.equal(t, t0) for t, t0 in zip((x, weight, dy), before))


def test_weight_none(backend):
    check(backend, *inputs((7, 33), weighted=False))


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 100)])
@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous(backend, dtype, layout, shape):
    x, _, dy = inputs(shape, dtype, layout=layout)
    assert x.stride(-1) != 1
    check(backend, x, randn(shape[-1], dtype=dtype, layout="strided"), dy)


@pytest.mark.parametrize("eps", [1e-8, 0.1, 10.0])
def test_eps(backend, eps):
    x, weight, dy = inputs((7, 33))
    check(backend, 0.1 * x, weight, dy, eps)  # mean(x^2) ~ 0.01: eps matters


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitude(backend, dtype):
    x, weight, dy = inputs((7, 1000), dtype)
    x = (x.float() * 1e3 + 1e3).to(dtype)
    got = check(backend, x, weight, dy)
    assert_results(got, run(torch_rms(), x, weight, dy), rows=7)


def test_one_row_and_empty(backend):
    check(backend, *inputs((100,)))  # x 1-D: one row
    x, weight, dy = inputs((0, 33))
    y, dx, dweight = run(kcourse_rms(backend), x, weight, dy)
    assert y.shape == dx.shape == (0, 33)
    assert torch.equal(dweight, torch.zeros_like(weight))
    x, weight, dy = inputs((3, 4, 0))  # rows of no columns: empty outputs, as torch's
    y, dx, dweight = run(kcourse_rms(backend), x, weight, dy)
    assert y.shape == dx.shape == (3, 4, 0) and dweight.shape == (0,)


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
def test_backward_needs(backend, needs):
    # the backward kernel computes only what `needs` asks for and returns None for the rest
    x, weight, dy = inputs((7, 33))
    cache = resolve("rms_norm", backend)[1](x, weight, eps=1e-6)[1]
    grads = backward_kernel(backend, "rms_norm")(dy, cache, needs, eps=1e-6)
    assert len(grads) == 2
    for need, g, e in zip(needs, grads, run(kcourse_rms("python"), x, weight, dy)[1:]):
        if need:
            assert_close(g, e, k=7)
        else:
            assert g is None


@pytest.mark.gpu
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_needs_long_rows(backend, needs, dtype):
    # rows longer than the cute backward keeps on chip (8192): swept in chunks, dx chunk-major beside the
    # column sum when both are asked for; 601 rows, several a CTA, 12000 columns (a partial chunk)
    x, weight, dy = inputs((601, 12000), dtype)
    cache = resolve("rms_norm", backend)[1](x, weight, eps=1e-6)[1]
    grads = backward_kernel(backend, "rms_norm")(dy, cache, needs, eps=1e-6)
    for need, g, e, k in zip(needs, grads, run(kcourse_rms("python"), x, weight, dy)[1:], (1, 601)):
        if need:
            assert_close(g, e, k=k)
        else:
            assert g is None


def test_deterministic(backend):
    x, weight, dy = inputs((30, 70))
    first, second = run(kcourse_rms(backend), x, weight, dy), run(kcourse_rms(backend), x, weight, dy)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("shape", [(9, 1000), (3, 200)])  # 200: one block forward, chunked backward
def test_triton_chunked_rows(triton_chunks, shape, weighted):
    x, weight, dy = inputs(shape, weighted=weighted)
    check("triton", x * 3 + 3, weight, dy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_long_rows(dtype):
    # longer than the forward holds on chip (16384) and than the backward does (8192)
    require_backend("triton")
    check("triton", *inputs((2, 20000), dtype))


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    x, weight, _ = inputs((3, 7), torch.float64)
    x, weight = x.requires_grad_(), weight.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: blas.rms_norm(x, w, backend=name), (x, weight))
    assert torch.autograd.gradcheck(lambda x: blas.rms_norm(x, eps=0.5, backend=name), (x,))
    x1 = randn(6, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: blas.rms_norm(x, backend=name), (x1,))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_validation(name):
    require_backend(name)
    x, weight = randn(3, 4), randn(4)
    rms = lambda *args, **kw: blas.rms_norm(*args, backend=name, **kw)  # noqa: E731
    raises(ValueError, re.escape("rms_norm: x is (3, 4) and weight is (5,); weight must be (4,), the size of x's "
                                 "last dimension"), rms, x, randn(5))
    raises(ValueError, re.escape("rms_norm: weight must be 1-D, got 2-D of shape (1, 4)"), rms, x, randn(1, 4))
    raises(ValueError, "rms_norm: x must have at least one dimension, got a 0-d tensor", rms, randn(3)[0])
    raises(ValueError, "rms_norm: eps must be positive, got 0.0", rms, x, weight, eps=0.0)
    raises(TypeError, "rms_norm: eps must be a real number, got NoneType", rms, x, weight, eps=None)
    raises(TypeError, "rms_norm: x is torch.float32 but weight is torch.bfloat16", rms, x, weight.bfloat16())
    raises(TypeError, "rms_norm: weight must be a torch.Tensor, got list", rms, x, [1.0] * 4)
    if name == "triton":
        raises(TypeError, "rms_norm: the triton backend does not support torch.float64", rms, x.double())


@pytest.mark.gpu
# (1001, 6000), (2049, 8192), (333, 4098): rows of more than 4096 kept on chip (two to a cute
# backward CTA of 512 threads), odd row counts (a row slot past the end)
# (64, 65536), (3, 131072), (7, 20000), (2, 262144), (5, 200000), (1000, 8193): rows spread over a cluster of
# CTAs that each keep their share (the cute forward; ragged last shares; 512-thread CTAs past 16384 a share;
# scalar accesses at 8193)
@pytest.mark.parametrize("shape", [(4096, 4096), (8192, 1024), (1000, 8193), (512, 16384), (64, 65536), (3, 131072),
                                   (1001, 6000), (2049, 8192), (333, 4098), (7, 20000), (2, 262144), (5, 200000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_large(backend, dtype, shape):
    check(backend, *inputs(shape, dtype))
