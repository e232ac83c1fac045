"""Every cute kernel compiles (for sm_90a where there is no GPU): CI's check that a CuTe DSL kernel
still builds, on machines that cannot run it. Each case calls a cute op on CPU tensors inside
``_compile.compiling_only()``, so the op picks its kernel variant exactly as on a GPU (vector width
from alignment and strides, gemm path, orientation) and compiles it; nothing is launched. Whether
the kernels compute the right thing is the other test files' job, on a GPU."""
import importlib
import itertools

import pytest
import torch

pytest.importorskip("cutlass", reason="the CuTe DSL is not installed (pip install -e '.[cute]')")

from kcourse.blas.cute import _compile  # noqa: E402
from _cute import DTYPES, compiled_kernels, t  # noqa: E402



def elementwise(op, layout, dtype, shape=(37, 41)):
    x, y, out = (t(*shape, dtype=dtype, layout=layout) for _ in range(3))
    return {
        "copy": lambda f: f(x, out),
        "swap": lambda f: f(x, y, x, y),
        "scal": lambda f: (f(x, 0.5, out), f(x, torch.tensor(0.5), out)),  # and alpha read from memory
        "axpby": lambda f: (f(x, y, 2.0, -1.0, out), f(x, None, 2.0, 0.0, out)),  # and beta == 0
    }[op]


def level2(op, layout, dtype, m=67, n=45):
    A, out = t(m, n, dtype=dtype, layout=layout), t(m, n, dtype=dtype)
    x, y = t(n, dtype=dtype, layout="strided" if layout == "strided" else "contiguous"), t(m, dtype=dtype)
    xm, yn = t(m, dtype=dtype), t(n, dtype=dtype)
    return {
        "dot": lambda f: f(t(4099, dtype=dtype, layout=layout if layout != "transposed" else "contiguous"),
                           t(4099, dtype=dtype, layout=layout if layout != "transposed" else "contiguous")),
        "gemv": lambda f: (f(A, x, y, 1.0, 0.5, y), f(A, x, None, 2.0, 0.0, t(m, dtype=dtype))),
        "geru": lambda f: (f(A, xm, yn, 0.5, out), f(out, xm, yn, 0.5, out)),  # and in place
    }[op]


def gemm(layout, dtype, m=160, n=136, k=72):
    A, B = t(m, k, dtype=dtype, layout=layout), t(k, n, dtype=dtype, layout=layout)
    C, out = t(m, n, dtype=dtype), t(m, n, dtype=dtype)
    bias = torch.zeros(n, dtype=dtype).expand(m, n)
    batched = (t(3, m, k, dtype=dtype), t(k, n, dtype=dtype).expand(3, k, n), t(3, m, n, dtype=dtype))
    return lambda f: (f(A, B, None, 1.0, 0.0, out), f(A, B, C, 1.0, 0.5, C), f(A, B, bias, 1.0, 1.0, out),
                      f(batched[0], batched[1], None, 1.0, 0.0, batched[2]))


CASES = ([(op, elementwise) for op in ("copy", "swap", "scal", "axpby")]
         + [(op, level2) for op in ("dot", "gemv", "geru")])
LAYOUTS = ("contiguous", "transposed", "strided", "misaligned")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,case", CASES, ids=[op for op, _ in CASES])
def test_kernels_compile(monkeypatch, op, case, dtype, layout):
    seen = compiled_kernels(monkeypatch)
    kernel = getattr(importlib.import_module(f"kcourse.blas.cute.{op}"), op)
    with _compile.compiling_only():
        case(op, layout, dtype)(kernel)
    assert seen, f"{op} compiled no kernel"


@pytest.mark.parametrize("layout", ("contiguous", "transposed", "misaligned"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemm_kernels_compile(monkeypatch, dtype, layout):
    seen = compiled_kernels(monkeypatch)
    from kcourse.blas.cute.gemm import gemm as kernel

    with _compile.compiling_only():
        gemm(layout, dtype)(kernel)
    assert seen, "gemm compiled no kernel"
    if dtype != torch.float32 and layout != "misaligned":  # aligned 16-bit operands take the Hopper path
        assert any("sm90" in name.lower() for name, _ in seen), seen


def test_a_compiled_kernel_is_reused(monkeypatch):
    x, out = torch.zeros(1000), torch.zeros(1000)
    from kcourse.blas.cute.copy import copy

    with _compile.compiling_only():
        copy(x, out)
        before = dict(_compile.COMPILE_SECONDS)
        copy(torch.zeros(5000), torch.zeros(5000))  # another size of the same shape class
    assert _compile.COMPILE_SECONDS == before


def _layouts():
    """Tensors of shapes with dims of extent 1 and 0, in every dim order, contiguous or not, and
    views 4 bytes off a 16-byte boundary."""
    for shape in [(2, 3, 4), (1, 3, 1, 4), (2, 0, 3), (5, 1, 7), (3, 1)]:
        for perm in itertools.permutations(range(len(shape))):
            x = torch.zeros(shape).permute(*perm)
            yield x
            yield x.contiguous()
    yield torch.zeros(5, 8)[:, ::2]
    yield torch.zeros(41)[1:].view(5, 8)


def test_operand_mirrors_the_tensor():
    # plans decide on Operand stand-ins and launch on the tensors: every answer a plan reads must be
    # the tensor's own, and contiguous() must stand for the copy torch would make
    for x in _layouts():
        o = _compile.Operand.of(x)
        assert (o.shape, o.stride(), o.dim(), o.numel(), o.element_size()) == \
               (x.shape, x.stride(), x.dim(), x.numel(), x.element_size())
        assert o.data_ptr() == x.data_ptr() % 16 and o.is_contiguous() == x.is_contiguous(), (x.shape, x.stride())
        copy = x.contiguous()
        assert o.contiguous().stride() == copy.stride(), (x.shape, x.stride())
        assert o.contiguous().data_ptr() == copy.data_ptr() % 16
    new = _compile.Operand.new((2, 1, 0, 3), torch.bfloat16)
    assert new.stride() == torch.empty(2, 1, 0, 3).stride() and new.element_size() == 2


def test_plans_follow_the_layout(monkeypatch):
    # a plan is cached per layout: the same shape with another alignment or strides gets its own
    # kernel (a narrower vector, the mma.sync attention), never the plan of the layout before it
    from kcourse.blas.cute.attention import attention
    from kcourse.blas.cute.softmax import softmax

    def tensor(*shape, dtype, off):  # ``off`` elements past a 16-byte boundary
        return torch.zeros(torch.Size(shape).numel() + off, dtype=dtype)[off:].view(shape)

    seen = compiled_kernels(monkeypatch)
    with _compile.compiling_only():
        for off in (0, 1, 0):
            softmax(tensor(6, 64, dtype=torch.float32, off=off), 1)
            q = tensor(1, 2, 128, 64, dtype=torch.bfloat16, off=2 * off)
            attention(q, q, q, None, False, 0.125)
    vecs = [key[3].vec for name, key in seen if name == "_softmax_factory"]
    assert vecs == [4, 1, 4], seen
    kernels = [name for name, _ in seen if name != "_softmax_factory"]
    assert kernels == ["_AttentionFwdSm90", "_fwd_factory", "_AttentionFwdSm90"], seen
