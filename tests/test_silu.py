import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, randn, require_dtype

SHAPES = [(1,), (7,), (1000,), (4097,), (33, 65), (2, 3, 5, 7)]
# (shape, layout) pairs; "transposed" needs two dims
CASES = [(s, layout) for s in SHAPES for layout in ("contiguous", "transposed", "strided")
         if len(s) > 1 or layout != "transposed"]


def silu_and_grad(x, dy, backend):
    """silu(x) on ``backend`` (a torch function for a callable) and dx for the seed ``dy``."""
    x = x.detach().requires_grad_(True)
    y = backend(x) if callable(backend) else blas.silu(x, backend=backend)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    tails = torch.tensor([0.0, -100.0, 100.0], dtype=dtype, device=DEVICE)
    x = torch.cat([randn(33, 65, dtype=dtype).flatten() * 4, tails])
    dy = torch.randn_like(x)
    y, dx = silu_and_grad(x, dy, "python")
    y64, dx64 = silu_and_grad(x.double(), dy.double(), F.silu)
    assert_close(y, y64.to(dtype))
    assert_close(dx, dx64.to(dtype))


@pytest.mark.parametrize("shape, layout", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_silu(backend, dtype, shape, layout):
    require_dtype(backend, dtype)
    x = randn(*shape, dtype=dtype, layout=layout).mul_(3)
    dy = randn(*shape, dtype=dtype)
    x0 = x.clone()
    y, dx = silu_and_grad(x, dy, backend)
    y_ref, dx_ref = silu_and_grad(x, dy, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    y_torch, dx_torch = silu_and_grad(x, dy, F.silu)
    assert_close(y, y_torch)
    assert_close(dx, dx_torch)
    assert torch.equal(x, x0)


def test_silu_extremes(backend):
    # sigmoid's tails (exp(-|x|) never overflows) and exact zeros
    x = torch.tensor([0.0, -0.0, 1e-30, 20.0, -20.0, 88.0, -88.0, 100.0, -100.0, 1e4, -1e4], device=DEVICE)
    dy = torch.ones_like(x)
    y, dx = silu_and_grad(x, dy, backend)
    y_torch, dx_torch = silu_and_grad(x, dy, F.silu)
    assert_close(y, y_torch)
    assert_close(dx, dx_torch)


def test_silu_empty(backend):
    x = torch.empty(3, 0, device=DEVICE, requires_grad=True)
    y = blas.silu(x, backend=backend)
    assert y.shape == (3, 0)
    y.sum().backward()
    assert x.grad.shape == (3, 0)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    x = randn(5, 6, dtype=torch.float64, layout="strided").requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: blas.silu(t, backend=name), (x,))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_silu_validation(name):
    x = randn(3, 4)
    x0 = x.clone()
    with pytest.raises(TypeError, match="silu: x must be a floating-point tensor, got torch.int32"):
        blas.silu(torch.ones(3, dtype=torch.int32, device=DEVICE), backend=name)
    with pytest.raises(TypeError, match="silu: x must be a torch.Tensor, got float"):
        blas.silu(1.0, backend=name)
    assert torch.equal(x, x0)


def test_silu_triton_float64():
    with pytest.raises(TypeError, match="silu: the triton backend does not support torch.float64"):
        blas.silu(randn(3, dtype=torch.float64), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 4097), (8, 1024, 1023)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_large(backend, dtype, shape):
    x, dy = 3 * randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    y, dx = silu_and_grad(x, dy, backend)
    y_ref, dx_ref = silu_and_grad(x, dy, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)


@pytest.mark.gpu
def test_silu_past_2_31(backend):
    # int64 indexing: the elements past 2^31 (the activations share the elementwise launcher)
    n = 2**31 + 2**20 + 7
    x = randn(n, dtype=torch.float16)
    y = blas.silu(x, backend=backend)
    tail = slice(n - 5000, n)
    assert_close(y[tail], blas.silu(x[tail], backend="python"))
