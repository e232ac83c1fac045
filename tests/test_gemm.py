import math

import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, in_buffer, outside, randn, require_backend, require_dtype

SHAPES = [(1, 1, 1), (7, 13, 5), (33, 1, 17), (65, 129, 33), (100, 64, 130)]  # (m, k, n)
LAYOUTS = ["nn", "tn", "nt", "tt", "ss"]  # A then B: n row-major, t transposed view, s strided
LAYOUT = {"n": "contiguous", "t": "transposed", "s": "strided"}


def operands(m, k, n, dtype, layout="nn", batch=()):
    A = randn(*batch, m, k, dtype=dtype, layout=LAYOUT[layout[0]])
    B = randn(*batch, k, n, dtype=dtype, layout=LAYOUT[layout[1]])
    return A, B


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    A, B = operands(33, 65, 17, dtype)
    C = randn(33, 17, dtype=dtype)
    expected = (2.0 * (A.double() @ B.double()) - 1.0 * C.double()).to(dtype)
    assert_close(blas.gemm(A, B, C, 2.0, -1.0, backend="python"), expected, k=65)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_gemm(backend, dtype, shape, layout):
    require_dtype(backend, dtype)
    m, k, n = shape
    A, B = operands(m, k, n, dtype, layout)
    C = randn(m, n, dtype=dtype, layout="transposed")
    inputs = [t.clone() for t in (A, B, C)]
    assert_close(blas.gemm(A, B, C, 1.5, -0.5, backend=backend), blas.gemm(A, B, C, 1.5, -0.5, backend="python"), k=k)
    assert all(torch.equal(t, t0) for t, t0 in zip((A, B, C), inputs))


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.0, 1.0), (-2.0, 0.5), (0.5, 1.0), (0.0, 0.0)])
def test_gemm_scalars(backend, alpha, beta):
    A, B = operands(65, 40, 33, torch.float32)
    C = randn(65, 33)
    assert_close(blas.gemm(A, B, C, alpha, beta, backend=backend), blas.gemm(A, B, C, alpha, beta, backend="python"), k=40)


@pytest.mark.parametrize("C_shape", [(33,), (65, 1), (1, 33), ()])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_broadcast_C(backend, dtype, C_shape):
    A, B = operands(65, 40, 33, dtype, "nt")
    C = randn(*C_shape, dtype=dtype) if C_shape else torch.tensor(0.25, dtype=dtype, device=DEVICE)
    out = blas.gemm(A, B, C, 1.0, 1.0, backend=backend)  # Linear: X W^T + b
    assert out.shape == (65, 33)
    assert_close(out, blas.gemm(A, B, C, 1.0, 1.0, backend="python"), k=40)


@pytest.mark.parametrize("dims", ["33", "32", "23"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_batched(backend, dtype, dims):
    # 3-D with 3-D, and a 3-D operand with a 2-D one (broadcast over the batch)
    A = randn(*((3,) if dims[0] == "3" else ()), 17, 24, dtype=dtype, layout="transposed")
    B = randn(*((3,) if dims[1] == "3" else ()), 24, 9, dtype=dtype)
    C = randn(9, dtype=dtype)
    out = blas.gemm(A, B, C, -1.0, 2.0, backend=backend)
    assert out.shape == (3, 17, 9)
    assert_close(out, blas.gemm(A, B, C, -1.0, 2.0, backend="python"), k=24)


def test_gemm_batch_of_one_broadcasts(backend):
    A, B = randn(1, 17, 24), randn(4, 24, 9)
    assert_close(blas.gemm(A, B, backend=backend), blas.gemm(A, B, backend="python"), k=24)


@pytest.mark.parametrize("shared", ["A", "A1", "B"])
def test_gemm_shared_operand_gradient_rounded_once(backend, shared):
    # an operand broadcast over the batch gets the sum of the batch's products as its gradient:
    # one gemm over the stacked batch, accumulated in float32 and rounded once (CPU and cuBLAS
    # float16 kernels land within ~2 ulps of the exact value), not a sum of per-batch products each
    # rounded to float16 (thousands of ulps off on the CPU, 20 on an H200)
    require_dtype(backend, torch.float16)
    a_batch, b_batch = {"A": ((), (6,)), "A1": ((1,), (6,)), "B": ((6,), ())}[shared]
    A = randn(*a_batch, 16, 129, dtype=torch.float16).requires_grad_()
    B = randn(*b_batch, 129, 8, dtype=torch.float16).requires_grad_()
    dC = randn(6, 16, 8, dtype=torch.float16)
    blas.gemm(A, B, backend=backend).backward(dC)
    A64, B64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    torch.matmul(A64, B64).backward(dC.double())
    grad, exact = (A.grad, A64.grad) if shared.startswith("A") else (B.grad, B64.grad)
    ulp = torch.finfo(torch.float16).eps * 2.0 ** torch.floor(torch.log2(exact.abs().clamp_min(2 ** -14)))
    # plus float32 accumulation's own error, up to k u sum |terms| over the k terms of a sum, which
    # matters where they cancel to near 0: dA sums b*n products dC B^T, dB b*m products A^T dC
    dC_abs, A_abs, B_abs = dC.double().abs(), A64.detach().abs(), B64.detach().abs()
    if shared.startswith("A"):
        sums, k = (dC_abs @ B_abs.expand(6, -1, -1).mT).sum(0), 6 * dC.shape[2]
    else:
        sums, k = (A_abs.mT @ dC_abs).sum(0), 6 * dC.shape[1]
    accumulation = k * 2.0 ** -24 * sums.reshape(exact.shape)
    assert ((grad.double() - exact).abs() <= 4 * ulp + accumulation).all()


def test_gemm_k_zero(backend):
    A, B, C = randn(5, 0), randn(0, 7), randn(5, 7)
    assert_close(blas.gemm(A, B, C, 1.0, 0.5, backend=backend), 0.5 * C)
    assert torch.equal(blas.gemm(A, B, backend=backend), torch.zeros(5, 7, device=DEVICE))


@pytest.mark.parametrize("inplace", [False, True])
def test_gemm_beta0_ignores_nan(backend, inplace):
    A, B = operands(40, 24, 33, torch.float32)
    C = torch.full((40, 33), math.nan, device=A.device)
    C[::2] = math.inf
    out = blas.gemm_(A, B, C, 2.0, 0.0, backend=backend) if inplace else blas.gemm(A, B, C, 2.0, 0.0, backend=backend)
    assert_close(out, blas.gemm(A, B, None, 2.0, backend="python"), k=24)


@pytest.mark.parametrize("layout", ["nn", "tt"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_inplace(backend, dtype, layout):
    A, B = operands(65, 40, 33, dtype, layout)
    C, buffer = in_buffer(65, 33, dtype=dtype)
    expected = blas.gemm(A, B, C, 0.5, -1.5, backend="python")
    untouched = outside(C, buffer).clone()
    assert blas.gemm_(A, B, C, 0.5, -1.5, backend=backend) is C
    assert_close(C, expected, k=40)
    assert torch.equal(outside(C, buffer), untouched)


def test_gemm_inplace_batched(backend):
    A, B = operands(17, 24, 9, torch.float32, "tn", batch=(3,))
    C = randn(3, 17, 9)
    expected = blas.gemm(A, B, C, 1.0, 1.0, backend="python")
    blas.gemm_(A, B, C, 1.0, 1.0, backend=backend)
    assert_close(C, expected, k=24)


LARGE = [  # (dtype, (m, k, n), layout): realistic sizes, every dtype, the layouts Linear's pullback uses
    *[(d, (4096, 4096, 4096), "nn") for d in DTYPES],
    (torch.bfloat16, (4096, 4096, 4096), "tn"), (torch.bfloat16, (4096, 4096, 4096), "nt"),
    *[(d, (1000, 4097, 2049), "nn") for d in DTYPES],
    (torch.float16, (1000, 4097, 2049), "tt"), (torch.float32, (4097, 1, 33), "nn"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape, layout", LARGE)
def test_gemm_large(backend, dtype, shape, layout):
    m, k, n = shape
    A, B = operands(m, k, n, dtype, layout)
    C = randn(n, dtype=dtype)
    assert_close(blas.gemm(A, B, C, 1.0, 1.0, backend=backend), blas.gemm(A, B, C, 1.0, 1.0, backend="python"), k=k)


@pytest.mark.gpu
def test_gemm_float32_is_ieee_unless_tf32(backend):
    # IEEE float32 products agree with the float64 truth to ~1e-6 relative; tf32 (10-bit
    # mantissa) lands near 1e-4. Turning tf32 on must make the error grow on tensor-core backends.
    A, B = operands(512, 2048, 512, torch.float32)
    truth = (A.double() @ B.double())

    def rel_err():
        out = blas.gemm(A, B, backend=backend).double()
        return ((out - truth).norm() / truth.norm()).item()

    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        ieee = rel_err()
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = rel_err()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert ieee < 1e-5, ieee
    assert tf32 < 5e-3, tf32
    assert tf32 > 10 * ieee, (ieee, tf32)


# (batch, m, k, n, layout, C): aligned products that the triton backend runs on its Hopper kernel
# (kcourse/blas/triton/_gemm_tma.py): tails in m, n and k, every operand orientation, batched with
# one operand shared, a bias row, a transposed C, beta 0, and split K (a 64 x 64 output over k = 2048)
TMA_CASES = [
    (None, 136, 136, 200, "nn", None), (None, 136, 136, 200, "tt", "full"), (None, 136, 256, 192, "nt", "bias"),
    (None, 200, 256, 136, "tn", None), (3, 72, 64, 136, "tn", "bias"), ("A", 128, 64, 72, "nt", "full"),
    ("B", 72, 128, 64, "tt", None), (None, 64, 2048, 64, "tn", None), (None, 64, 2048, 64, "nn", "full"),
]


@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_triton_tma(triton_tma, dtype, case):
    if DEVICE == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter multiplies bfloat16 tiles wrongly (the Hopper kernel has no upcast)")
    batch, m, k, n, layout, c = case
    A = randn(*((3,) if batch in (3, "A") else ()), m, k, dtype=dtype, layout=LAYOUT[layout[0]])
    B = randn(*((3,) if batch in (3, "B") else ()), k, n, dtype=dtype, layout=LAYOUT[layout[1]])
    C = {None: None, "bias": randn(n, dtype=dtype), "full": randn(m, n, dtype=dtype, layout="transposed")}[c]
    beta = 0.0 if C is None else -0.5
    out = blas.gemm(A, B, C, 1.5, beta, backend="triton")
    assert len(triton_tma) == 1, "the product did not take the Hopper kernel"
    assert_close(out, blas.gemm(A, B, C, 1.5, beta, backend="python"), k=k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_triton_tma_inplace(triton_tma, dtype):
    # out is C: the autotuner's runs must not fold their results into C
    if DEVICE == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter multiplies bfloat16 tiles wrongly (the Hopper kernel has no upcast)")
    A, B = randn(136, 64, dtype=dtype), randn(64, 200, dtype=dtype, layout="transposed")
    C = randn(136, 200, dtype=dtype)
    expected = blas.gemm(A, B, C, 0.5, -1.5, backend="python")
    assert blas.gemm_(A, B, C, 0.5, -1.5, backend="triton") is C
    assert len(triton_tma) == 1, "the product did not take the Hopper kernel"
    assert_close(C, expected, k=64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_pytorch_gemm_switches_half_reductions_off_and_gives_the_whole_setting_back(dtype):
    """The pytorch backend's switch of cuBLAS's half-precision split-K reductions: off for its call
    (the float32 accumulation kcourse promises), then the user's setting back, whole where torch
    keeps two parts (allow_reduced_precision, allow_splitk); nothing switched where it is off
    already. torch keeps the flags on a CPU too."""
    from kcourse.blas.pytorch import gemm as pytorch_gemm

    get, set_ = pytorch_gemm._FLAGS[dtype]
    before = get()
    try:
        for user in ([(True, True)] if isinstance(before, tuple) else [(True,)]):  # (True, False): refused by torch
            set_(*user)
            state = pytorch_gemm.reduced_precision_off(dtype)
            now = get()
            assert (now[0] if isinstance(now, tuple) else now) is False
            pytorch_gemm.restore(dtype, state)
            assert get() == (user if isinstance(before, tuple) else user[0])
        set_(False, *((False,) if isinstance(before, tuple) else ()))
        assert pytorch_gemm.reduced_precision_off(dtype) is None  # off already: nothing to switch
    finally:
        set_(*(before if isinstance(before, tuple) else (before,)))


@pytest.mark.skipif(DEVICE != "cuda", reason="cuBLAS's reduced-precision reductions exist only on CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_pytorch_gemm_reduces_in_float32_and_restores_the_flags(monkeypatch, dtype):
    """On a GPU: the flag is off while cuBLAS runs the product, on again after."""
    from kcourse.blas.pytorch import gemm as pytorch_gemm

    get, set_ = pytorch_gemm._FLAGS[dtype]
    seen = []
    real = torch.Tensor.addmm_
    monkeypatch.setattr(torch.Tensor, "addmm_", lambda *a, **k: seen.append(get()) or real(*a, **k))
    before = get()
    set_(True)
    try:
        blas.gemm(randn(64, 48, dtype=dtype), randn(48, 32, dtype=dtype), backend="pytorch")
        assert [s[0] if isinstance(s, tuple) else s for s in seen] == [False]
        now = get()
        assert (now[0] if isinstance(now, tuple) else now) is True
    finally:
        set_(*(before if isinstance(before, tuple) else (before,)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pytorch_bias_reaches_addmm_as_a_vector(dtype):
    """The pytorch backend hands a bias row broadcast down the rows (linear's, or a gemm's (N,) C) to
    ``torch.addmm`` as the (N,) vector, which ATen adds in cuBLASLt's epilogue on CUDA (beta = 1),
    not as the broadcast (M, N) matrix it would first copy into the output; a full C goes in whole."""
    from torch.profiler import ProfilerActivity, profile

    x, weight, bias, C = (randn(*shape, dtype=dtype) for shape in [(5, 3, 7), (11, 7), (11,), (15, 11)])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        y = blas.linear(x, weight, bias, backend="pytorch")
        by_vector = blas.gemm(x.reshape(15, 7), weight.mT, bias, beta=1.0, backend="pytorch")
        by_matrix = blas.gemm(x.reshape(15, 7), weight.mT, C, beta=1.0, backend="pytorch")
    shapes = [e.input_shapes[0] for e in prof.events() if e.name == "aten::addmm"]
    assert shapes == [[11], [11], [15, 11]], shapes
    assert_close(y, blas.linear(x, weight, bias, backend="python"), k=7)
    assert_close(by_vector, blas.gemm(x.reshape(15, 7), weight.mT, bias, beta=1.0, backend="python"), k=7)
    assert_close(by_matrix, blas.gemm(x.reshape(15, 7), weight.mT, C, beta=1.0, backend="python"), k=7)
