import math

import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DTYPES, assert_close, in_buffer, outside, randn, require_dtype

SHAPES = [(1, 1), (7, 13), (1000, 7), (33, 1000), (257, 129)]
LAYOUTS = ["contiguous", "transposed", "strided"]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    A, x, y = randn(33, 65, dtype=dtype), randn(65, dtype=dtype), randn(33, dtype=dtype)
    expected = (1.5 * (A.double() @ x.double()) - 2.0 * y.double()).to(dtype)
    assert_close(blas.gemv(A, x, y, 1.5, -2.0, backend="python"), expected, k=65)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_gemv(backend, dtype, shape, layout):
    require_dtype(backend, dtype)
    m, n = shape
    A, x, y = randn(m, n, dtype=dtype, layout=layout), randn(n, dtype=dtype, layout="strided"), randn(m, dtype=dtype)
    inputs = [t.clone() for t in (A, x, y)]
    assert_close(blas.gemv(A, x, y, -0.5, 2.0, backend=backend), blas.gemv(A, x, y, -0.5, 2.0, backend="python"), k=n)
    assert all(torch.equal(t, t0) for t, t0 in zip((A, x, y), inputs))


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.0, 1.0), (2.0, 1.0), (-1.0, -0.5), (0.0, 0.0)])
def test_gemv_scalars(backend, alpha, beta):
    A, x, y = randn(65, 33), randn(33), randn(65)
    expected = blas.gemv(A, x, y, alpha, beta, backend="python")
    assert_close(blas.gemv(A, x, y, alpha, beta, backend=backend), expected, k=33)
    assert_close(blas.gemv(A, x, None, alpha, backend=backend), blas.gemv(A, x, None, alpha, backend="python"), k=33)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_inplace(backend, dtype, layout):
    A, x = randn(129, 70, dtype=dtype, layout=layout), randn(70, dtype=dtype)
    y, buffer = in_buffer(129, dtype=dtype)
    expected = blas.gemv(A, x, y, 0.75, -1.0, backend="python")
    untouched = outside(y, buffer).clone()
    assert blas.gemv_(A, x, y, 0.75, -1.0, backend=backend) is y
    assert_close(y, expected, k=70)
    assert torch.equal(outside(y, buffer), untouched)


@pytest.mark.parametrize("inplace", [False, True])
def test_gemv_beta0_ignores_nan(backend, inplace):
    A, x = randn(100, 37), randn(37)
    y = torch.full((100,), math.nan, device=A.device)
    out = blas.gemv_(A, x, y, 2.0, 0.0, backend=backend) if inplace else blas.gemv(A, x, y, 2.0, 0.0, backend=backend)
    assert_close(out, blas.gemv(A, x, None, 2.0, backend="python"), k=37)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("shape", [(37, 3001), (5, 4099), (200, 8195)])
def test_gemv_few_long_rows(backend, shape, layout):
    # a bias gradient's shape (few outputs, long rows): the triton kernel splits the columns (2, 4
    # and 4 slices here, the last ragged; on a GPU more) and adds the partial sums up with alpha and
    # beta, in place too
    m, n = shape
    bf16 = torch.bfloat16
    A, x, y = randn(m, n, dtype=bf16, layout=layout), randn(n, dtype=bf16), randn(m, dtype=bf16)
    expected = blas.gemv(A, x, y, 0.5, -1.0, backend="python")
    assert_close(blas.gemv(A, x, y, 0.5, -1.0, backend=backend), expected, k=n)
    assert blas.gemv_(A, x, y, 0.5, -1.0, backend=backend) is y
    assert_close(y, expected, k=n)


def test_triton_gemv_splits():
    from kcourse.blas.triton.gemv import splits

    assert [splits(m, n, 132) for m, n in [(768, 16384), (3072, 16384), (16384, 768), (768, 1023)]] == [16, 11, 1, 1]
    assert [splits(m, n, 4) for m, n in [(37, 3001), (5, 4099), (200, 8195)]] == [2, 4, 4]
    assert splits(0, 8192, 132) == 1  # no rows: nothing to split


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("shape", [(4096, 4096), (4097, 1023), (1, 4096), (768, 16384), (2304, 16387)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_large(backend, dtype, shape, layout):
    m, n = shape
    A, x, y = randn(m, n, dtype=dtype, layout=layout), randn(n, dtype=dtype), randn(m, dtype=dtype)
    assert_close(blas.gemv(A, x, y, 1.0, 1.0, backend=backend), blas.gemv(A, x, y, 1.0, 1.0, backend="python"), k=n)


@pytest.mark.parametrize("name", ["python", "pytorch", "triton", "cute"])
def test_gemv_target_beside_A_in_one_buffer(name):
    # y the last column of a buffer whose first four columns are A: disjoint, though their address
    # ranges interleave; the product is written there and nowhere else
    from _util import require_backend

    require_backend(name)
    buf, x = randn(7, 5), randn(4)
    A, y = buf[:, :4], buf[:, 4]
    A0, y0 = A.clone(), y.clone()
    blas.gemv_(A, x, y, 2.0, 0.5, backend=name)
    assert_close(y, blas.gemv(A0, x, y0, 2.0, 0.5, backend="python"), k=4)
    assert torch.equal(A, A0)
