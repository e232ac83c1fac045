"""Validation: every bad argument is a ValueError/TypeError naming the op, the argument and the
shapes, raised before anything is written (all arguments are unchanged afterwards)."""
import re

import pytest
import torch

from kcourse import blas
from _util import DEVICE, raises, randn

BACKENDS = ["python", "pytorch", "triton"]


@pytest.fixture(params=BACKENDS)
def any_backend(request):
    import kcourse

    info = kcourse.backends()[request.param]
    if not info.available:
        pytest.skip(f"{request.param} backend unavailable here: {info.reason}")
    return request.param


def test_gemm_shapes(any_backend):
    b = any_backend
    raises(ValueError, re.escape("gemm: A is (3, 4) and B is (5, 6); A's columns (4) must equal B's rows (5)"),
           blas.gemm, randn(3, 4), randn(5, 6), backend=b)
    raises(ValueError, r"gemm: A must be 2-D or 3-D, got 1-D of shape \(3,\)", blas.gemm, randn(3), randn(3, 2), backend=b)
    raises(ValueError, r"gemm: A is \(2, 3, 4\) and B is \(5, 4, 6\); their batch sizes \(2, 5\)",
           blas.gemm, randn(2, 3, 4), randn(5, 4, 6), backend=b)
    raises(ValueError, r"gemm: A is \(3, 4\), B is \(4, 6\) and C is \(5,\); C must broadcast to the output shape \(3, 6\)",
           blas.gemm, randn(3, 4), randn(4, 6), randn(5), 1.0, 1.0, backend=b)
    raises(ValueError, r"gemm_: A is \(3, 4\), B is \(4, 6\) and C is \(6,\); the target C must be \(3, 6\)",
           blas.gemm_, randn(3, 4), randn(4, 6), randn(6), backend=b)
    raises(TypeError, "gemm_: C is the in-place target and cannot be None", blas.gemm_, randn(3, 4), randn(4, 6), None, backend=b)


def test_dtype_and_device_mismatch(any_backend):
    b = any_backend
    raises(TypeError, r"gemm: A is torch.float32 but B is torch.float16", blas.gemm,
           randn(3, 4), randn(4, 5, dtype=torch.float16), backend=b)
    raises(TypeError, r"axpby_: x is torch.float32 but y is torch.bfloat16", blas.axpby_,
           randn(4), randn(4, dtype=torch.bfloat16), backend=b)
    other = torch.empty(4, device="meta")
    raises(ValueError, r"dot: x is on .* but y is on meta; all tensors must be on one device", blas.dot, randn(4), other, backend=b)


def test_not_a_tensor_or_not_float(any_backend):
    b = any_backend
    raises(TypeError, "copy: x must be a torch.Tensor, got list", blas.copy, [1.0, 2.0], backend=b)
    raises(TypeError, "scal: x must be a floating-point tensor, got torch.int64", blas.scal,
           torch.arange(4, device=DEVICE), 2.0, backend=b)
    raises(TypeError, "scal: alpha must be a real number, got str", blas.scal, randn(4), "2", backend=b)
    raises(TypeError, "axpby: beta must be a real number, got complex", blas.axpby, randn(4), randn(4), 1.0, 1j, backend=b)


def test_unsupported_dtype_names_backend():
    raises(TypeError, r"gemv: the triton backend does not support torch.float64 \(A \(3, 4\)\); it supports float32, float16, bfloat16",
           blas.gemv, randn(3, 4, dtype=torch.float64), randn(4, dtype=torch.float64), backend="triton")


@pytest.mark.parametrize("op, args, pattern", [
    ("copy_", lambda: (randn(4), randn(5)), r"copy_: x is \(4,\) and y is \(5,\); they must have the same shape"),
    ("swap", lambda: (randn(4), randn(2, 2)), r"swap: x is \(4,\) and y is \(2, 2\); they must have the same shape"),
    ("axpby", lambda: (randn(4), randn(3)), r"axpby: x is \(4,\) and y is \(3,\); they must have the same shape"),
    ("dot", lambda: (randn(4), randn(3)), r"dot: x is \(4,\) and y is \(3,\); they must have the same length"),
    ("dot", lambda: (randn(2, 2), randn(4)), r"dot: x must be 1-D, got 2-D of shape \(2, 2\)"),
    ("gemv", lambda: (randn(3, 4), randn(3)), r"gemv: A is \(3, 4\) and x is \(3,\); A's columns \(4\) must equal x's length"),
    ("gemv", lambda: (randn(3, 4), randn(4), randn(4), 1.0, 1.0), r"gemv: A is \(3, 4\) and y is \(4,\); A's rows \(3\) must equal y's length"),
    ("gemv_", lambda: (randn(3, 4), randn(4), None), r"gemv_: y is the in-place target and cannot be None"),
    ("geru", lambda: (randn(3, 4), randn(4), randn(4)), r"geru: A is \(3, 4\) and x is \(4,\); A's rows \(3\) must equal x's length"),
    ("geru_", lambda: (randn(3, 4), randn(3), randn(3)), r"geru_: A is \(3, 4\) and y is \(3,\); A's columns \(4\) must equal y's length"),
])
def test_shape_errors(any_backend, op, args, pattern):
    raises(ValueError if "None" not in pattern else TypeError, pattern, getattr(blas, op), *args(), backend=any_backend)


def test_inplace_target_aliasing_an_input(any_backend):
    b = any_backend
    buf = randn(10)
    raises(ValueError, r"axpby_: the target y \(5,\) overlaps the input x \(5,\)", blas.axpby_, buf[:5], buf[3:8], backend=b)
    raises(ValueError, r"swap_: the target x \(4,\) overlaps the input y \(4,\)", blas.swap_, buf[:4], buf[2:6], backend=b)
    raises(ValueError, r"copy_: the target y \(6,\) overlaps the input x \(6,\)", blas.copy_, buf[:6], buf[4:], backend=b)
    A = randn(4, 4)
    raises(ValueError, r"gemv_: the target y \(4,\) overlaps the input A \(4, 4\)", blas.gemv_, A, randn(4), A[0], backend=b)
    raises(ValueError, r"geru_: the target A \(4, 4\) overlaps the input x \(4,\)", blas.geru_, A, A[:, 1], randn(4), backend=b)
    raises(ValueError, r"gemm_: the target C \(4, 4\) overlaps the input A \(4, 4\)", blas.gemm_, A, randn(4, 4), A, backend=b)
    raises(ValueError, r"gemm_: the target C \(4, 4\) overlaps the input B \(4, 4\)", blas.gemm_, randn(4, 4), A.mT, A, backend=b)


def test_inplace_target_with_shared_elements(any_backend):
    expanded = randn(1, 5).expand(4, 5)
    raises(ValueError, r"scal_: the target x \(4, 5\) with strides \(0, 1\) has elements that share memory",
           blas.scal_, expanded, 2.0, backend=any_backend)


def test_disjoint_views_of_one_buffer_are_fine(any_backend):
    buf = randn(10)
    x, y = buf[:5], buf[5:]
    x0, y0 = x.clone(), y.clone()
    blas.swap_(x, y, backend=any_backend)
    assert torch.equal(x, y0) and torch.equal(y, x0)


def test_interleaved_views_are_not_aliases(any_backend):
    """Views of one buffer whose address ranges interleave but that share no element are accepted;
    views that share one are refused."""
    b = any_backend
    buf = randn(10)
    blas.copy_(buf[0::2], buf[1::2], backend=b)
    blas.axpby_(buf[0:9:3], buf[1::3], 2.0, 1.0, backend=b)  # 0 3 6 and 1 4 7
    raises(ValueError, r"copy_: the target y \(4,\) overlaps the input x \(4,\)", blas.copy_, buf[0:8:2],
           buf[2::2], backend=b)  # 2, 4, 6 in both
    raises(ValueError, r"copy_: the target y \(3,\) overlaps the input x \(3,\)", blas.copy_, buf[0::4],
           buf[2::3], backend=b)  # 8 in both
    m = randn(6, 9)
    blas.gemv_(m[:, :4], randn(4), m[:, 4], backend=b)
    blas.geru_(m[:, 5:8], m[:, 4], m[0, :3], backend=b)  # A (6, 3) and x, y elsewhere in m
    raises(ValueError, r"geru_: the target A \(6, 3\) overlaps the input y \(3,\)", blas.geru_, m[:, 5:8], m[:, 4],
           m[2, 6:9], backend=b)  # m[2, 6:8] is in both
    C, A = m[:, 1::2], m[:, 0::2][:, :4]  # the odd columns, and four of the even ones
    blas.gemm_(A, randn(4, 4), C, backend=b)
    raises(ValueError, r"gemm_: the target C \(6, 4\) overlaps the input A \(6, 4\)", blas.gemm_, m[:, :4],
           randn(4, 4), m[:, 3:7], backend=b)


def test_overlap_is_exact_for_1d_and_2d_views():
    """``_check.overlap`` against the set of bytes each view touches, for random strided views (and a
    uint8 view, other element sizes) of one buffer: exact for 1-D and 2-D; 3-D views are never
    wrongly disjoint."""
    import itertools
    import random

    from kcourse.blas._check import overlap

    def touched(t):
        e = t.element_size()
        return {t.data_ptr() + sum(i * s for i, s in zip(idx, t.stride())) * e + b
                for idx in itertools.product(*map(range, t.shape)) for b in range(e)}

    rng = random.Random(30)
    buf = torch.zeros(400)

    def view(base):
        nd = rng.choice([1, 2, 2, 3])
        return base.as_strided([rng.randint(1, 5) for _ in range(nd)], [rng.randint(0, 12) for _ in range(nd)],
                               rng.randint(0, 60))

    for _ in range(3000):
        a, b = view(buf), view(buf if rng.random() < 0.8 else buf.view(torch.uint8))
        exact = bool(touched(a) & touched(b))
        if a.dim() <= 2 and b.dim() <= 2:
            assert overlap(a, b) == exact, (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(),
                                            b.storage_offset())
        elif exact:
            assert overlap(a, b)


def test_meta_tensors_refused_by_kernel_backends():
    """triton and cute kernels read data: meta tensors are refused naming the op and the argument
    (rather than a bare NotImplementedError 'Cannot copy out of meta tensor' from torch)."""
    from kcourse.blas import _check

    x = torch.empty(3, 4, device="meta")
    for name in ("triton", "cute"):
        with pytest.raises(ValueError, match=rf"softmax: the {name} backend cannot run on meta tensors \(x \(3, 4\)"):
            _check.check_softmax(name, x, -1)
    import kcourse

    if kcourse.backends()["triton"].available:
        raises(ValueError, r"gemm: the triton backend cannot run on meta tensors \(A \(3, 4\)", blas.gemm, x,
               torch.empty(4, 2, device="meta"), backend="triton")
        raises(ValueError, r"embedding: the triton backend cannot run on meta tensors \(weight \(3, 4\)",
               blas.embedding, torch.zeros(2, dtype=torch.int64, device="meta"), x, backend="triton")
    for name in ("python", "pytorch"):
        assert blas.gemm(x, torch.empty(4, 2, device="meta"), backend=name).shape == (3, 2)
