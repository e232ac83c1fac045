import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, assert_close, randn, require_dtype

SIZES = [1, 7, 1000, 4097, 100_003]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    x, y = randn(1000, dtype=dtype), randn(1000, dtype=dtype)
    expected = (x.double() * y.double()).sum().to(dtype)
    assert_close(blas.dot(x, y, backend="python"), expected, k=1000)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_dot(backend, dtype, n, layout):
    require_dtype(backend, dtype)
    x, y = randn(n, dtype=dtype, layout=layout), randn(n, dtype=dtype)
    z = blas.dot(x, y, backend=backend)
    assert z.shape == () and z.dtype == dtype and z.device == x.device
    assert_close(z, blas.dot(x, y, backend="python"), k=n)


def test_dot_accumulates_in_float32(backend):
    # 4096 * 1.0 + 1.0 terms: a float16 accumulator stops growing at 2048, float32 does not
    x = torch.ones(4097, dtype=torch.float16, device=randn(1).device)
    assert blas.dot(x, x, backend=backend).item() == 4096.0  # 4097 rounds to 4096 in float16


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2**20 + 3, 2**24])
def test_dot_large(backend, n):
    x, y = randn(n), randn(n)
    assert_close(blas.dot(x, y, backend=backend), blas.dot(x, y, backend="python"), k=n)
