import math

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, randn, require_dtype

SHAPES = [(1,), (7,), (1000,), (4097,), (33, 65), (2, 3, 5, 7)]
# (shape, layout) pairs; "transposed" needs two dims
CASES = [(s, layout) for s in SHAPES for layout in ("contiguous", "transposed", "strided")
         if len(s) > 1 or layout != "transposed"]
MODES = ["none", "tanh"]


def gelu_and_grad(x, dy, approximate, backend):
    """gelu(x) on ``backend`` (a torch function for a callable) and dx for the seed ``dy``."""
    x = x.detach().requires_grad_(True)
    y = backend(x) if callable(backend) else blas.gelu(x, approximate, backend=backend)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx


@pytest.mark.parametrize("approximate", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype, approximate):
    tails = torch.tensor([0.0, -30.0, 30.0], dtype=dtype, device=DEVICE)
    x = torch.cat([randn(33, 65, dtype=dtype).flatten() * 3, tails])
    dy = torch.randn_like(x)
    y, dx = gelu_and_grad(x, dy, approximate, "python")
    y64, dx64 = gelu_and_grad(x.double(), dy.double(), approximate, lambda t: F.gelu(t, approximate=approximate))
    assert_close(y, y64.to(dtype))
    assert_close(dx, dx64.to(dtype))


@pytest.mark.parametrize("approximate", MODES)
@pytest.mark.parametrize("shape, layout", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_gelu(backend, dtype, shape, layout, approximate):
    require_dtype(backend, dtype)
    x = randn(*shape, dtype=dtype, layout=layout).mul_(2)
    dy = randn(*shape, dtype=dtype)
    x0 = x.clone()
    y, dx = gelu_and_grad(x, dy, approximate, backend)
    y_ref, dx_ref = gelu_and_grad(x, dy, approximate, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    y_torch, dx_torch = gelu_and_grad(x, dy, approximate, lambda t: F.gelu(t, approximate=approximate))
    assert_close(y, y_torch)
    assert_close(dx, dx_torch)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("approximate", MODES)
def test_gelu_extremes(backend, approximate):
    # the tails: exp overflow in the tanh/sigmoid form, erf saturation; exact zeros
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 5.0, -5.0, 20.0, -20.0, 100.0, -100.0, 1e4, -1e4], device=DEVICE)
    dy = torch.ones_like(x)
    y, dx = gelu_and_grad(x, dy, approximate, backend)
    y_torch, dx_torch = gelu_and_grad(x, dy, approximate, lambda t: F.gelu(t, approximate=approximate))
    assert_close(y, y_torch)
    assert_close(dx, dx_torch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", MODES)
def test_gelu_infinities(backend, dtype, approximate):
    # the formula's values, on every backend: gelu(+inf) = +inf, gelu(-inf) = -inf * 0 = NaN. Enough
    # elements for torch's vectorized CPU kernel, whose exact form gave NaN at +inf
    x = torch.tensor([math.inf, -math.inf] * 20, dtype=dtype, device=DEVICE)
    y = blas.gelu(x, approximate, backend=backend)
    assert (y[0::2] == math.inf).all() and y[1::2].isnan().all()


def test_gelu_empty(backend):
    x = torch.empty(0, 5, device=DEVICE, requires_grad=True)
    y = blas.gelu(x, backend=backend)
    assert y.shape == (0, 5)
    y.sum().backward()
    assert x.grad.shape == (0, 5)


@pytest.mark.parametrize("approximate", MODES)
@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name, approximate):
    x = randn(4, 7, dtype=torch.float64, layout="transposed").requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: blas.gelu(t, approximate, backend=name), (x,))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_gelu_validation(name):
    x = randn(3, 4)
    x0 = x.clone()
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh', got 'erf'"):
        blas.gelu(x, "erf", backend=name)
    with pytest.raises(TypeError, match="gelu: x must be a floating-point tensor, got torch.int64"):
        blas.gelu(torch.ones(3, dtype=torch.int64, device=DEVICE), backend=name)
    with pytest.raises(TypeError, match="gelu: x must be a torch.Tensor, got list"):
        blas.gelu([1.0], backend=name)
    assert torch.equal(x, x0)


def test_gelu_triton_float64():
    with pytest.raises(TypeError, match="gelu: the triton backend does not support torch.float64"):
        blas.gelu(randn(3, dtype=torch.float64), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", MODES)
@pytest.mark.parametrize("shape", [(4096, 4097), (8, 1024, 1023)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_large(backend, dtype, shape, approximate):
    x, dy = 3 * randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    y, dx = gelu_and_grad(x, dy, approximate, backend)
    y_ref, dx_ref = gelu_and_grad(x, dy, approximate, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
