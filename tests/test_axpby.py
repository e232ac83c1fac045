import math

import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DTYPES, assert_close, in_buffer, outside, randn, require_dtype

SIZES = [1, 7, 1000, 4097]
SCALARS = [(1.0, 1.0), (2.0, -0.5), (-1.5, 0.0), (0.0, 3.0)]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    x, y = randn(33, dtype=dtype), randn(33, dtype=dtype)
    expected = (2.0 * x.double() - 0.5 * y.double()).to(dtype)
    assert_close(blas.axpby(x, y, 2.0, -0.5, backend="python"), expected)


@pytest.mark.parametrize("alpha, beta", SCALARS)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_axpby(backend, dtype, n, layout, alpha, beta):
    require_dtype(backend, dtype)
    x, y = randn(n, dtype=dtype, layout=layout), randn(n, dtype=dtype)
    x0, y0 = x.clone(), y.clone()
    assert_close(blas.axpby(x, y, alpha, beta, backend=backend), blas.axpby(x, y, alpha, beta, backend="python"))
    assert torch.equal(x, x0) and torch.equal(y, y0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpby_inplace(backend, dtype):
    x = randn(4097, dtype=dtype, layout="strided")
    y, buffer = in_buffer(4097, dtype=dtype)
    x0, untouched = x.clone(), outside(y, buffer).clone()
    expected = blas.axpby(x, y, -2.0, 0.5, backend="python")
    assert blas.axpby_(x, y, -2.0, 0.5, backend=backend) is y
    assert_close(y, expected)
    assert torch.equal(x, x0) and torch.equal(outside(y, buffer), untouched)


@pytest.mark.parametrize("inplace", [False, True])
def test_axpby_beta0_ignores_nan(backend, inplace):
    x = randn(1000)
    y = torch.full_like(x, math.nan)
    y[::2] = math.inf
    out = blas.axpby_(x, y, 2.0, 0.0, backend=backend) if inplace else blas.axpby(x, y, 2.0, 0.0, backend=backend)
    assert_close(out, 2.0 * x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpby_matrix_views(backend, dtype):
    x, y = randn(33, 65, dtype=dtype, layout="transposed"), randn(33, 65, dtype=dtype, layout="strided")
    assert_close(blas.axpby(x, y, 0.5, 2.0, backend=backend), blas.axpby(x, y, 0.5, 2.0, backend="python"))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2**20 + 3, 2**24])
def test_axpby_large(backend, n):
    x, y = randn(n), randn(n)
    assert_close(blas.axpby(x, y, 1.5, -2.0, backend=backend), blas.axpby(x, y, 1.5, -2.0, backend="python"))
