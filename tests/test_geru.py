import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DTYPES, assert_close, in_buffer, outside, randn, require_dtype

SHAPES = [(1, 1), (7, 13), (1000, 7), (33, 1000), (257, 129)]
LAYOUTS = ["contiguous", "transposed", "strided"]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    A, x, y = randn(33, 65, dtype=dtype), randn(33, dtype=dtype), randn(65, dtype=dtype)
    expected = (A.double() - 0.5 * torch.outer(x.double(), y.double())).to(dtype)
    assert_close(blas.geru(A, x, y, -0.5, backend="python"), expected)


@pytest.mark.parametrize("alpha", [1.0, -2.5, 0.0])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_geru(backend, dtype, shape, layout, alpha):
    require_dtype(backend, dtype)
    m, n = shape
    A, x, y = randn(m, n, dtype=dtype, layout=layout), randn(m, dtype=dtype, layout="strided"), randn(n, dtype=dtype)
    inputs = [t.clone() for t in (A, x, y)]
    assert_close(blas.geru(A, x, y, alpha, backend=backend), blas.geru(A, x, y, alpha, backend="python"))
    assert all(torch.equal(t, t0) for t, t0 in zip((A, x, y), inputs))


@pytest.mark.parametrize("dtype", DTYPES)
def test_geru_inplace(backend, dtype):
    A, buffer = in_buffer(65, 129, dtype=dtype)
    x, y = randn(65, dtype=dtype), randn(129, dtype=dtype)
    expected = blas.geru(A, x, y, 1.5, backend="python")
    untouched = outside(A, buffer).clone()
    assert blas.geru_(A, x, y, 1.5, backend=backend) is A
    assert_close(A, expected)
    assert torch.equal(outside(A, buffer), untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_geru_inplace_transposed(backend, dtype):
    A = randn(65, 129, dtype=dtype, layout="transposed")
    x, y = randn(65, dtype=dtype), randn(129, dtype=dtype)
    expected = blas.geru(A, x, y, -1.0, backend="python")
    blas.geru_(A, x, y, -1.0, backend=backend)
    assert_close(A, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("shape", [(4096, 4096), (4097, 1023)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_geru_large(backend, dtype, shape, layout):
    m, n = shape
    A, x, y = randn(m, n, dtype=dtype, layout=layout), randn(m, dtype=dtype), randn(n, dtype=dtype)
    assert_close(blas.geru(A, x, y, 0.5, backend=backend), blas.geru(A, x, y, 0.5, backend="python"))
