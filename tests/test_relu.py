import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, randn, require_dtype

SHAPES = [(1,), (7,), (1000,), (4097,), (33, 65), (2, 3, 5, 7)]
# (shape, layout) pairs; "transposed" needs two dims
CASES = [(s, layout) for s in SHAPES for layout in ("contiguous", "transposed", "strided")
         if len(s) > 1 or layout != "transposed"]


def relu_and_grad(x, dy, backend):
    """relu(x) on ``backend`` (a torch function for a callable) and dx for the seed ``dy``."""
    x = x.detach().requires_grad_(True)
    y = backend(x) if callable(backend) else blas.relu(x, backend=backend)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx


def with_zeros(x):
    """``x`` with about a third of its elements set to exact zeros (+0 and -0)."""
    x = x.clone()
    x.view(-1)[::3] = 0.0
    x.view(-1)[1::6] = -0.0
    return x


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    x, dy = with_zeros(randn(33, 65, dtype=dtype)), randn(33, 65, dtype=dtype)
    y, dx = relu_and_grad(x, dy, "python")
    y64, dx64 = relu_and_grad(x.double(), dy.double(), F.relu)
    assert torch.equal(y, y64.to(dtype))  # relu rounds nothing: exact
    assert torch.equal(dx, dx64.to(dtype))


@pytest.mark.parametrize("shape, layout", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_relu(backend, dtype, shape, layout):
    require_dtype(backend, dtype)
    x = randn(*shape, dtype=dtype, layout=layout)
    dy = randn(*shape, dtype=dtype)
    x0 = x.clone()
    y, dx = relu_and_grad(x, dy, backend)
    y_ref, dx_ref = relu_and_grad(x, dy, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    y_torch, dx_torch = relu_and_grad(x, dy, F.relu)
    assert torch.equal(y, y_torch)
    assert torch.equal(dx, dx_torch)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_zeros_and_specials(backend, dtype):
    # subgradient 0 at exact zeros (as torch); NaN propagates forward and passes dy back, as torch
    x = with_zeros(randn(100, dtype=dtype))
    x[-4:] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0], dtype=dtype)
    dy = randn(100, dtype=dtype)
    y, dx = relu_and_grad(x, dy, backend)
    y_torch, dx_torch = relu_and_grad(x, dy, F.relu)
    assert torch.equal(y.isnan(), y_torch.isnan()) and torch.equal(y.nan_to_num(), y_torch.nan_to_num())
    assert torch.equal(dx, dx_torch)
    assert torch.equal(dx[x == 0], torch.zeros_like(dx[x == 0]))


def test_relu_empty(backend):
    x = torch.empty(0, device=DEVICE, requires_grad=True)
    y = blas.relu(x, backend=backend)
    assert y.shape == (0,)
    y.sum().backward()
    assert x.grad.shape == (0,)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    x = randn(5, 6, dtype=torch.float64, layout="transposed")
    x = (x + 0.1 * x.sign()).requires_grad_(True)  # keep finite differences away from the kink at 0
    assert torch.autograd.gradcheck(lambda t: blas.relu(t, backend=name), (x,))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_relu_validation(name):
    x = randn(3, 4)
    x0 = x.clone()
    with pytest.raises(TypeError, match="relu: x must be a floating-point tensor, got torch.bool"):
        blas.relu(torch.ones(3, dtype=torch.bool, device=DEVICE), backend=name)
    with pytest.raises(ValueError, match="unknown backend 'numpy'"):
        blas.relu(x, backend="numpy")
    assert torch.equal(x, x0)


def test_relu_triton_float64():
    with pytest.raises(TypeError, match="relu: the triton backend does not support torch.float64"):
        blas.relu(randn(3, dtype=torch.float64), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 4097), (8, 1024, 1023)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_large(backend, dtype, shape):
    x, dy = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    y, dx = relu_and_grad(x, dy, backend)
    assert torch.equal(y, F.relu(x))
    assert torch.equal(dx, relu_and_grad(x, dy, "python")[1])
