import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DTYPES, assert_close, in_buffer, outside, randn, require_dtype

SIZES = [1, 7, 1000, 4097]
LAYOUTS = ["contiguous", "strided"]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    x = randn(33, dtype=dtype)
    assert torch.equal(blas.copy(x, backend="python"), x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_copy(backend, dtype, n, layout):
    require_dtype(backend, dtype)
    x = randn(n, dtype=dtype, layout=layout)
    assert_close(blas.copy(x, backend=backend), blas.copy(x, backend="python"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_nd_views(backend, dtype):
    # a transposed 3-D source into a target with other strides: the kernel follows both layouts
    x = randn(5, 7, 9, dtype=dtype).permute(2, 0, 1)
    y, buffer = in_buffer(9, 5, 7, dtype=dtype)
    untouched = outside(y, buffer).clone()
    out = blas.copy_(x, y, backend=backend)
    assert out is y
    assert torch.equal(y, x)
    assert torch.equal(outside(y, buffer), untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_inplace_writes_only_target(backend, dtype):
    x = randn(1001, dtype=dtype, layout="strided")
    x0 = x.clone()
    y, buffer = in_buffer(1001, dtype=dtype)
    untouched = outside(y, buffer).clone()
    blas.copy_(x, y, backend=backend)
    assert torch.equal(y, x0) and torch.equal(x, x0)
    assert torch.equal(outside(y, buffer), untouched)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2**20 + 3, 2**24])
def test_copy_large(backend, n):
    x = randn(n)
    assert torch.equal(blas.copy(x, backend=backend), x)


@pytest.mark.parametrize("name", ["python", "pytorch", "triton", "cute"])
def test_copy_between_interleaved_views_of_one_buffer(name):
    # the even and the odd elements of one buffer share no element: not an alias
    from _util import require_backend

    require_backend(name)
    buf = randn(12)
    buf0 = buf.clone()
    blas.copy_(buf[0::2], buf[1::2], backend=name)
    assert torch.equal(buf[1::2], buf0[0::2]) and torch.equal(buf[0::2], buf0[0::2])
    # the same for columns of a matrix: every other column into the ones between
    buf = randn(6, 8)
    buf0 = buf.clone()
    blas.copy_(buf[:, 0::2], buf[:, 1::2], backend=name)
    assert torch.equal(buf[:, 1::2], buf0[:, 0::2]) and torch.equal(buf[:, 0::2], buf0[:, 0::2])
