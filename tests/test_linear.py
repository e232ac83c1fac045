"""linear: ``act(x @ weight.T + bias)`` and its gradients (x, weight, bias) of every backend against
the python reference and against F.linear and the torch activation in float64; the activation in the
epilogue of the triton gemm's pointer and Hopper (TMA) kernels; shapes that do not chain refused."""
import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, assert_close, raises, randn, require_dtype, spy_aten_recorded

ACTIVATIONS = [None, "gelu", "gelu_tanh", "relu", "silu"]
TORCH_ACT = {None: lambda z: z, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
             "relu": F.relu, "silu": F.silu}
# x (..., K) and weight (N, K): odd sizes, a batch of rows, one row
SHAPES = [((7, 33), 17), ((2, 5, 40), 24), ((33,), 9)]


def run(fn, x, weight, bias, dy):
    """``[y, dx, dweight, dbias]`` of ``y = fn(x, weight, bias)`` pulled back from dy (None for no bias)."""
    leaves = [t if t is None else t.detach().requires_grad_() for t in (x, weight, bias)]
    y = fn(*leaves)
    grads = iter(torch.autograd.grad(y, [t for t in leaves if t is not None], dy))
    return [y.detach()] + [None if t is None else next(grads) for t in leaves]


def kcourse_linear(backend, activation):
    return lambda x, w, b: blas.linear(x, w, b, activation, backend=backend)


def torch_linear(activation):
    """F.linear and the activation in float64, rounded to x's dtype."""
    def fn(x, w, b):
        z = F.linear(x.double(), w.double(), None if b is None else b.double())
        return TORCH_ACT[activation](z).to(x.dtype)
    return fn


def check(backend, activation, x, weight, bias, dy):
    """backend vs the python reference and vs float64 torch: y sums K products; dx sums N terms,
    dweight and dbias M (the rows), of dz rounded once to the dtype first (room for it: 4x)."""
    K, N, M = weight.shape[1], weight.shape[0], x.numel() // max(x.shape[-1], 1)
    got = run(kcourse_linear(backend, activation), x, weight, bias, dy)
    for expected in (run(kcourse_linear("python", activation), x, weight, bias, dy),
                     run(torch_linear(activation), x, weight, bias, dy)):
        for a, e, k in zip(got, expected, (K, 4 * N, 4 * M, 4 * M)):
            assert (a is None) == (e is None)
            if a is not None:
                assert_close(a, e, k=k)
    return got


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype, activation):
    x, weight, bias, dy = randn(3, 5, 33, dtype=dtype), randn(17, 33, dtype=dtype), randn(17, dtype=dtype), \
        randn(3, 5, 17, dtype=dtype)
    got = run(kcourse_linear("python", activation), x, weight, bias, dy)
    for a, e, k in zip(got, run(torch_linear(activation), x, weight, bias, dy), (33, 4 * 17, 4 * 15, 4 * 15)):
        assert_close(a, e, k=k)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_linear(backend, dtype, shape, activation):
    require_dtype(backend, dtype)
    x_shape, N = shape
    x, weight, bias = randn(*x_shape, dtype=dtype), randn(N, x_shape[-1], dtype=dtype), randn(N, dtype=dtype)
    y = check(backend, activation, x, weight, bias, randn(*x_shape[:-1], N, dtype=dtype))[0]
    assert y.shape == (*x_shape[:-1], N) and y.dtype == dtype


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_no_bias_and_views(backend, activation):
    x = randn(2, 30, 17, layout="transposed")  # a .mT view
    weight = randn(11, 17, layout="strided")
    assert not x.is_contiguous() and not weight.is_contiguous()
    check(backend, activation, x, weight, None, randn(2, 30, 11))


@pytest.mark.parametrize("shape", [((0, 8), 5), ((4, 0), 3), ((4, 6), 0)], ids=str)
def test_empty(backend, shape):
    (M, K), N = shape
    x, weight, bias = randn(M, K), randn(N, K), randn(N)
    y, dx, dweight, dbias = check(backend, "gelu", x, weight, bias, randn(M, N))
    assert y.shape == (M, N) and dx.shape == (M, K) and dweight.shape == (N, K) and dbias.shape == (N,)


def test_nonfinite_rows(backend):
    # a NaN or inf in a row of x reaches that row's outputs only, through every activation alike
    x, weight = randn(3, 8), randn(5, 8)
    x[1, 2] = float("nan")
    for activation in ACTIVATIONS:
        y = blas.linear(x, weight, None, activation, backend=backend)
        assert y[1].isnan().all() and y[[0, 2]].isfinite().all()


def test_frozen_weight(backend):
    x, weight, bias = randn(6, 10).requires_grad_(), randn(4, 10), randn(4).requires_grad_()
    y = blas.linear(x, weight, bias, "silu", backend=backend)
    dx, dbias = torch.autograd.grad(y, [x, bias], torch.ones_like(y))
    expected = torch.autograd.grad(torch_linear("silu")(x, weight, bias), [x, bias], torch.ones_like(y))
    assert_close(dx, expected[0], k=4)
    assert_close(dbias, expected[1], k=6)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_backward_spends_the_cache(backend, activation, monkeypatch):
    """Eagerly, the backward writes dz over the pre-activation z it saved (no second (M, N) tensor):
    the gradients are right, and a second backward through the same graph is refused by autograd,
    not answered from the overwritten z. Without an activation nothing is saved beyond x and W.
    Recorded by ATen's autograd (the pytorch backend on CUDA) the graph is ATen's: a second backward
    runs, as torch's."""
    recorded = spy_aten_recorded(monkeypatch)
    x, weight, bias = randn(6, 10).requires_grad_(), randn(4, 10).requires_grad_(), randn(4).requires_grad_()
    dy = randn(6, 4)
    y = blas.linear(x, weight, bias, activation, backend=backend)
    got = torch.autograd.grad(y, [x, weight, bias], dy, retain_graph=True)
    expected = run(torch_linear(activation), x, weight, bias, dy)[1:]
    for g, e, k in zip(got, expected, (16, 24, 24)):
        assert_close(g, e, k=k)
    if activation is None or recorded:
        assert_close(torch.autograd.grad(y, [x], dy)[0], expected[0], k=16)
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(y, [x], dy)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("case", [(136, 200, 72), (64, 64, 2048)], ids=["tiles", "split-k"])
def test_triton_tma_epilogue(triton_tma, case, activation):
    # the bias and the activation in the Hopper kernel's epilogue, storing z for the backward too;
    # a 64 x 64 output over k = 2048 takes the split-K path (the activation in its summing kernel)
    M, K, N = case
    x, weight, bias = randn(M, K, dtype=torch.float16), randn(N, K, dtype=torch.float16), randn(N, dtype=torch.float16)
    y = blas.linear(x, weight, bias, activation, backend="triton")
    assert len(triton_tma) == 1, "the product did not take the Hopper kernel"
    assert_close(y, blas.linear(x, weight, bias, activation, backend="python"), k=K)


def test_autocast():
    x, weight, bias = randn(4, 8), randn(3, 8), randn(3)
    device = "cuda" if DEVICE == "cuda" else "cpu"
    with torch.autocast(device, dtype=torch.bfloat16):
        y = blas.linear(x, weight, bias, "gelu", backend="pytorch")
        expected = F.gelu(F.linear(x, weight, bias))
    assert y.dtype == expected.dtype == torch.bfloat16
    assert_close(y, expected, k=8)


def test_validation(backend):
    x, weight = randn(3, 4), randn(5, 4)
    raises(ValueError, r"linear: x is \(3, 6\) and weight is \(5, 4\); weight must be \(N, 6\)",
           blas.linear, randn(3, 6), weight, backend=backend)
    raises(ValueError, r"linear: weight is \(5, 4\) and bias is \(4,\); bias must be \(5,\)",
           blas.linear, x, weight, randn(4), backend=backend)
    raises(ValueError, r"linear: activation must be one of 'none', 'gelu', 'gelu_tanh', 'relu', 'silu'",
           blas.linear, x, weight, None, "tanh", backend=backend)
    raises(ValueError, r"linear: x must have at least one dimension", blas.linear, randn(4)[0], weight,
           backend=backend)
    raises(TypeError, r"linear: x is torch.float32 but weight is torch.float64", blas.linear, x, weight.double(),
           backend=backend)
