"""Tensors of more than 2^31 elements: index arithmetic must be int64 (GPU only: ~4 GiB each).

Each result is compared with the python reference on slices whose values depend only on the
inputs' tails, the elements that sit past 2^31."""
import pytest
import torch

from kcourse import blas
from _util import assert_close, randn

BIG = 2**31 + 2**20 + 7
F16 = torch.float16

pytestmark = pytest.mark.gpu


def test_level1_past_2_31(backend):
    x, y = randn(BIG, dtype=F16), randn(BIG, dtype=F16)
    tail = slice(BIG - 5000, BIG)
    assert_close(blas.scal(x, 0.5, backend=backend)[tail], 0.5 * x[tail])
    assert_close(blas.axpby(x, y, 2.0, -1.0, backend=backend)[tail], blas.axpby(x[tail], y[tail], 2.0, -1.0, backend="python"))
    z = blas.copy(x, backend=backend)
    assert torch.equal(z[tail], x[tail])
    del z
    # dot: the tail's partial sums must land; compare against float64 in chunks
    expected = sum((x[i:i + 2**28].double() * y[i:i + 2**28].double()).sum() for i in range(0, BIG, 2**28))
    assert_close(blas.dot(x, y, backend=backend), expected.to(F16), k=BIG)


def test_level2_past_2_31(backend):
    m, n = 2**16 + 3, 2**15 + 1  # m n > 2^31
    A, x, y = randn(m, n, dtype=F16), randn(n, dtype=F16), randn(m, dtype=F16)
    rows = slice(m - 64, m)
    out = blas.gemv(A, x, y, 1.0, 1.0, backend=backend)
    assert_close(out[rows], blas.gemv(A[rows], x, y[rows], 1.0, 1.0, backend="python"), k=n)
    out = blas.gemv(A.mT[:, rows], y[rows], backend=backend)  # a transposed view reaching the end
    assert_close(out, blas.gemv(A[rows].mT.contiguous(), y[rows], backend="python"), k=64)
    del out
    xm = randn(m, dtype=F16)
    expected = blas.geru(A[rows], xm[rows], x, -1.0, backend="python")
    blas.geru_(A, xm, x, -1.0, backend=backend)
    assert_close(A[rows], expected)


def test_gemm_past_2_31(backend):
    m, k, n = 2**21 + 5, 1024, 64  # A has 2^31 + 5 * 1024 elements
    A, B = randn(m, k, dtype=F16), randn(k, n, dtype=F16)
    rows = slice(m - 128, m)
    out = blas.gemm(A, B, backend=backend)
    assert_close(out[rows], blas.gemm(A[rows], B, backend="python"), k=k)
