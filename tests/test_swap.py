import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DTYPES, in_buffer, outside, randn, require_dtype

SIZES = [1, 7, 1000, 4097]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    x, y = randn(33, dtype=dtype), randn(33, dtype=dtype)
    x2, y2 = blas.swap(x, y, backend="python")
    assert torch.equal(x2, y) and torch.equal(y2, x)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_swap(backend, dtype, n, layout):
    require_dtype(backend, dtype)
    x, y = randn(n, dtype=dtype, layout=layout), randn(n, dtype=dtype)
    x0, y0 = x.clone(), y.clone()
    x2, y2 = blas.swap(x, y, backend=backend)
    assert torch.equal(x2, y0) and torch.equal(y2, x0)
    assert torch.equal(x, x0) and torch.equal(y, y0), "out-of-place swap modified its inputs"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_swap_inplace(backend, dtype, n):
    x, xbuf = in_buffer(n, dtype=dtype)
    y = randn(n, dtype=dtype)
    x0, y0, untouched = x.clone(), y.clone(), outside(x, xbuf).clone()
    rx, ry = blas.swap_(x, y, backend=backend)
    assert rx is x and ry is y
    assert torch.equal(x, y0) and torch.equal(y, x0)
    assert torch.equal(outside(x, xbuf), untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swap_inplace_matrices(backend, dtype):
    x, y = randn(37, 19, dtype=dtype, layout="transposed"), randn(37, 19, dtype=dtype)
    x0, y0 = x.clone(), y.clone()
    blas.swap_(x, y, backend=backend)
    assert torch.equal(x, y0) and torch.equal(y, x0)


@pytest.mark.gpu
def test_swap_large(backend):
    x, y = randn(2**24), randn(2**24)
    x0, y0 = x.clone(), y.clone()
    blas.swap_(x, y, backend=backend)
    assert torch.equal(x, y0) and torch.equal(y, x0)
