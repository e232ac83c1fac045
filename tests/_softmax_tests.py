"""The tests of softmax and log_softmax, one set for both: ``test_softmax.py`` and
``test_log_softmax.py`` import them and define the fixture ``op`` (the op's name, which is also
the name of its ``torch.nn.functional`` reference)."""
import re

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from kcourse.backend import backward_kernel, resolve
from kcourse.blas.triton import _softmax
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, raises, randn, require_dtype

# (shape, dim, layout): 1-D rows, rows of a matrix, every dim of a 3-D tensor; each in every
# layout of _util.randn ("transposed" needs two dims)
CASES = [(shape, dim, layout)
         for shape, dim in [((1,), 0), ((7,), 0), ((4097,), -1), ((1000, 7), -1), ((7, 1000), 0),
                            ((4, 7, 13), 0), ((4, 7, 13), 1), ((4, 7, 13), -1)]
         for layout in ("contiguous", "transposed", "strided") if len(shape) > 1 or layout != "transposed"]


def run(op, backend, x, dim, dy):
    """``(y, dx)``: the op on ``backend`` and its gradient for the seed ``dy``, through autograd."""
    x = x.detach().requires_grad_(True)
    y = getattr(blas, op)(x, dim, backend=backend)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx


def check(op, backend, x, dim, dy):
    """The forward against the python reference and ``torch.nn.functional``; the gradient against
    the python reference's backward and torch's own (in float64), both at this backend's output y.

    The backward is a function of (y, dy): evaluating the references at the same y keeps the
    forward's rounding (checked on its own) out of the gradient comparison. Through
    ``exp(y) * sum(dy)`` one ulp of a float16 y would move log_softmax's dx by up to ulp(y) |sum dy|.
    """
    y, dx = run(op, backend, x, dim, dy)
    assert_close(y, run(op, "python", x, dim, dy)[0])
    assert_close(y, getattr(F, op)(x, dim))
    n = x.shape[dim]
    assert_close(dx, backward_kernel("python", op)(dy, (y,), (True,), dim=dim % x.dim())[0], k=n)
    assert_close(dx, torch_grad(op, dy, y, dim), k=n)
    return y, dx


def torch_grad(op, dy, y, dim):
    """The gradient at the output ``y`` by the backward that F.<op>'s autograd runs, in float64."""
    backward = torch._softmax_backward_data if op == "softmax" else torch._log_softmax_backward_data
    return backward(dy.double(), y.double(), dim, torch.float64).to(y.dtype)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(op, dtype, dim):
    x, dy = 3 * randn(5, 6, 33, dtype=dtype), randn(5, 6, 33, dtype=dtype)
    y, dx = run(op, "python", x, dim, dy)
    assert_close(y, getattr(F, op)(x.double(), dim).to(dtype))
    assert_close(dx, torch_grad(op, dy, y, dim), k=x.shape[dim])  # at the same (rounded) y: see check()


@pytest.mark.parametrize("shape, dim, layout", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_forward_and_gradient(op, backend, dtype, shape, dim, layout):
    require_dtype(backend, dtype)
    x, dy = randn(*shape, dtype=dtype, layout=layout).mul_(3), randn(*shape, dtype=dtype, layout=layout)
    x0 = x.clone()
    check(op, backend, x, dim, dy)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_two_passes(op, dtype, monkeypatch):
    # rows longer than the triton kernel keeps on chip: an online max and sum, then a second sweep.
    # One real case past MAX_ONE_PASS, and smaller limits to cover ragged chunks in every layout.
    n = _softmax.MAX_ONE_PASS + 27
    check(op, "triton", 3 * randn(2, n, dtype=dtype), -1, randn(2, n, dtype=dtype))
    monkeypatch.setattr(_softmax, "MAX_ONE_PASS", 16)
    monkeypatch.setattr(_softmax, "CHUNK", 8)
    for shape, dim, layout in [((3, 100), -1, "contiguous"), ((100, 3), 0, "transposed"), ((2, 3, 21), 2, "strided"),
                               ((21, 2, 3), 0, "contiguous")]:
        x, dy = randn(*shape, dtype=dtype, layout=layout).mul_(3), randn(*shape, dtype=dtype, layout=layout)
        check(op, "triton", x, dim, dy)


# A few long rows, each spread over a cluster of CTAs (the cute backend's _rows.split_rows):
# (shape, dim, layout, cluster). cluster None: split_rows's own choice -- shares kept in registers,
# shares swept in chunks, scalar accesses (odd or strided rows), rows of a transposed view, the
# forward's shares of 16384-32768 kept by 512-thread CTAs (ragged: 250000, 131080); an int: that
# cluster size forced, with a ragged last share, or a share past the row's end (empty CTAs).
CLUSTER_CASES = [((3, 50000), -1, "contiguous", None), ((2, 20001), -1, "contiguous", None),
                 ((2, 250000), -1, "contiguous", None), ((1, 131080), -1, "contiguous", None),
                 ((2, 120000), -1, "contiguous", 4),
                 ((1, 300000), -1, "contiguous", None), ((5, 9000), -1, "strided", None),
                 ((2, 3, 40000), -1, "contiguous", None), ((40000, 2), 0, "transposed", None),
                 ((3, 8193), -1, "contiguous", 2), ((2, 40000), -1, "contiguous", 3),
                 ((1, 70001), -1, "contiguous", 7), ((2, 300000), -1, "contiguous", 8)]


@pytest.mark.parametrize("shape, dim, layout, cluster", CLUSTER_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cluster_rows(op, backend, dtype, shape, dim, layout, cluster, monkeypatch):
    if backend != "cute":
        pytest.skip("the cute backend's plan")
    from kcourse.blas import tuning
    from kcourse.blas.cute import _rows
    from _cute import compiled_kernels

    if not _rows.clusters_supported():
        pytest.skip("thread block clusters need sm_90+")

    seen = compiled_kernels(monkeypatch)
    x, dy = randn(*shape, dtype=dtype, layout=layout).mul_(3), randn(*shape, dtype=dtype, layout=layout)
    x.select(dim, 5).fill_(20.0)  # a large logit in the first CTA's share: the shares' maxima differ
    with tuning.override(op, cluster=cluster):
        check(op, backend, x, dim, dy)
    # the forward's plan (autograd may hand the backward a contiguous dy, whose rows need no split)
    clusters = {p.cluster for name, key in seen for p in key if isinstance(p, _rows.Plan) and name == "_softmax_factory"}
    assert clusters == {cluster} if cluster else len(clusters) == 1 and min(clusters) > 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_permuted_and_expanded(op, backend, dtype):
    # a dense permuted 4-D view (the output keeps its layout) and a stride-0 broadcast row
    x = randn(3, 4, 5, 6, dtype=dtype).permute(2, 0, 3, 1)
    for dim in range(4):
        y, _ = check(op, backend, x, dim, randn(5, 3, 6, 4, dtype=dtype))
        if backend == "triton":
            assert y.stride() == x.stride()
    x = randn(1, 37, dtype=dtype).expand(5, 37)
    for dim in (0, 1):
        check(op, backend, x, dim, randn(5, 37, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_logits(op, backend, dtype):
    # +-1e4 logits: every exp is of a value <= 0 after the max is subtracted, so nothing overflows
    x = randn(6, 300, dtype=dtype)
    x[:, ::7] = 1e4
    x[::2, 3::11] = -1e4
    x[5] = -1e4  # a row where every logit is -1e4
    for dim in (0, 1):
        y, dx = check(op, backend, x, dim, randn(6, 300, dtype=dtype))
        assert torch.isfinite(y).all() and torch.isfinite(dx).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the interpreter computes the NaN row in NumPy
def test_all_inf_row_is_nan_like_torch(op, backend):
    x = randn(3, 10)
    x[1] = -torch.inf
    y = getattr(blas, op)(x, -1, backend=backend)
    expected = getattr(F, op)(x, -1)
    assert y[1].isnan().all() and expected[1].isnan().all()
    assert_close(y[[0, 2]], expected[[0, 2]])


@pytest.mark.parametrize("shape, dim", [((0, 5), 1), ((3, 0), 1), ((3, 0), 0)])
def test_empty(op, backend, shape, dim):
    x = randn(*shape)
    assert getattr(blas, op)(x, dim, backend=backend).shape == shape


@pytest.mark.parametrize("shape, dim", [((0, 5), 1), ((3, 0), 1), ((3, 0), 0), ((2, 0, 4), 1), ((0,), 0)])
def test_python_empty(op, shape, dim):
    # an empty reduced dim: an empty result and an empty gradient, as torch
    x = randn(*shape)
    y, dx = run(op, "python", x, dim, randn(*shape))
    assert y.shape == dx.shape == shape
    assert torch.equal(y, getattr(F, op)(x, dim))


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(op, name):
    x = randn(4, 5, 6, dtype=torch.float64).requires_grad_(True)
    for dim in (0, 1, 2):
        assert torch.autograd.gradcheck(lambda t: getattr(blas, op)(t, dim, backend=name), [x])


def test_backward_skips_unneeded(op, backend):
    y, cache = resolve(op, backend)[1](randn(3, 8), dim=1)
    assert backward_kernel(backend, op)(randn(3, 8), cache, (False,), dim=1) == (None,)


@pytest.mark.gpu
# (1001, 8192): rows that exactly fill a CTA, spread over 512 threads by the cute forward (_rows.spread_row)
@pytest.mark.parametrize("shape, dim", [((4096, 1024), -1), ((1024, 16384), -1), ((64, 131072), -1),
                                        ((4, 16, 512, 512), -1), ((1024, 2048), 0), ((1001, 8192), -1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_large(op, backend, dtype, shape, dim):
    check(op, backend, 3 * randn(*shape, dtype=dtype), dim, randn(*shape, dtype=dtype))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_validation(op, name):
    f = getattr(blas, op)
    raises(ValueError, re.escape(f"{op}: dim 2 is out of range for x of shape (3, 4)"), f, randn(3, 4), 2, backend=name)
    raises(ValueError, re.escape(f"{op}: dim -3 is out of range for x of shape (3, 4)"), f, randn(3, 4), -3,
           backend=name)
    raises(ValueError, re.escape(f"{op}: dim 0 is out of range for x of shape ()"), f, randn(), 0, backend=name)
    raises(TypeError, f"{op}: dim must be an int, got float", f, randn(3, 4), 1.0, backend=name)
    raises(TypeError, f"{op}: x must be a floating-point tensor, got torch.int64", f,
           torch.arange(4, device=DEVICE), 0, backend=name)
    raises(TypeError, f"{op}: x must be a torch.Tensor, got list", f, [1.0, 2.0], 0, backend=name)


def test_triton_has_no_float64(op):
    raises(TypeError, re.escape(f"{op}: the triton backend does not support torch.float64 (x (3, 4)); "
                                "it supports float32, float16, bfloat16"),
           getattr(blas, op), randn(3, 4, dtype=torch.float64), -1, backend="triton")
