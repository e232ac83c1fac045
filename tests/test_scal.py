import importlib

import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DTYPES, assert_close, in_buffer, outside, randn, require_backend, require_dtype

SIZES = [1, 7, 1000, 4097]
ALPHAS = [2.5, -0.75, 0.0, 1.0]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    x = randn(33, dtype=dtype)
    expected = (-1.5 * x.double()).to(dtype)
    assert_close(blas.scal(x, -1.5, backend="python"), expected)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_scal(backend, dtype, n, layout, alpha):
    require_dtype(backend, dtype)
    x = randn(n, dtype=dtype, layout=layout)
    x0 = x.clone()
    assert_close(blas.scal(x, alpha, backend=backend), blas.scal(x, alpha, backend="python"))
    assert torch.equal(x, x0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scal_inplace(backend, dtype):
    x, buffer = in_buffer(4097, dtype=dtype)
    expected = blas.scal(x, -3.0, backend="python")
    untouched = outside(x, buffer).clone()
    assert blas.scal_(x, -3.0, backend=backend) is x
    assert_close(x, expected)
    assert torch.equal(outside(x, buffer), untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scal_matrix_views(backend, dtype):
    A = randn(33, 65, dtype=dtype, layout="transposed")
    assert_close(blas.scal(A, 0.5, backend=backend), blas.scal(A, 0.5, backend="python"))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2**20 + 3, 2**24])
def test_scal_large(backend, n):
    x = randn(n)
    assert_close(blas.scal(x, 1.25, backend=backend), blas.scal(x, 1.25, backend="python"))


@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernels", ["triton", "cute"])
def test_scal_kernel_reads_alpha_from_memory(kernels, dtype, layout):
    # the kernels' alpha as a 0-d float32 tensor on the device (linear_cross_entropy's backward scale,
    # computed on the GPU): the same product, formed in float32 and rounded once, in place too
    require_backend(kernels)
    scal = importlib.import_module(f"kcourse.blas.{kernels}.scal").scal
    x = randn(37, 41, dtype=dtype, layout=layout)
    alpha = torch.tensor(1 / 3, dtype=torch.float32, device=x.device)
    expected = (x.float() * (1 / 3)).to(dtype)
    assert torch.equal(scal(x, alpha, torch.empty_like(x)), expected)
    assert scal(x, alpha, x) is x
    assert torch.equal(x, expected)
