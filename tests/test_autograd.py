"""Pullbacks of the BLAS ops: gradients against the python reference's, gradcheck in float64,
the backward pinned to the forward's backend, and no work for inputs that need no gradient."""
import pytest
import torch

import kcourse
from kcourse import blas
from _util import DEVICE, DTYPES, assert_close, randn, spy_kernels

# op name, a factory of its inputs (m=7, n=5, k=6), the call, and the reduction length of its grads
CASES = {
    "copy": (lambda d: [randn(7, 5, dtype=d)], lambda x, b: blas.copy(x, backend=b), 1),
    "swap": (lambda d: [randn(9, dtype=d), randn(9, dtype=d)],
             lambda x, y, b: torch.cat(blas.swap(x, y, backend=b)) * torch.arange(18, device=DEVICE), 1),
    "scal": (lambda d: [randn(9, dtype=d)], lambda x, b: blas.scal(x, -1.5, backend=b), 1),
    "axpby": (lambda d: [randn(9, dtype=d), randn(9, dtype=d)], lambda x, y, b: blas.axpby(x, y, 2.0, -0.5, backend=b), 1),
    "dot": (lambda d: [randn(9, dtype=d), randn(9, dtype=d)], lambda x, y, b: blas.dot(x, y, backend=b), 1),
    "gemv": (lambda d: [randn(7, 5, dtype=d, layout="transposed"), randn(5, dtype=d), randn(7, dtype=d)],
             lambda A, x, y, b: blas.gemv(A, x, y, 1.5, -2.0, backend=b), 7),
    "geru": (lambda d: [randn(7, 5, dtype=d), randn(7, dtype=d), randn(5, dtype=d)],
             lambda A, x, y, b: blas.geru(A, x, y, 0.5, backend=b), 7),
    "gemm": (lambda d: [randn(7, 6, dtype=d), randn(6, 5, dtype=d, layout="transposed"), randn(7, 5, dtype=d)],
             lambda A, B, C, b: blas.gemm(A, B, C, 2.0, 0.5, backend=b), 7),
    "gemm_bias": (lambda d: [randn(3, 7, 6, dtype=d), randn(6, 5, dtype=d), randn(5, dtype=d)],
                  lambda A, B, C, b: blas.gemm(A, B, C, 1.0, 1.0, backend=b), 21),
    "gemm_batched": (lambda d: [randn(1, 7, 6, dtype=d), randn(3, 6, 5, dtype=d), randn(7, 1, dtype=d)],
                     lambda A, B, C, b: blas.gemm(A, B, C, -1.0, 2.0, backend=b), 21),
}


def grads(case, backend, inputs, seed_grad):
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = CASES[case][1](*leaves, backend)
    out.backward(seed_grad)
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_match_reference(backend, case, dtype):
    inputs = CASES[case][0](dtype)
    out = CASES[case][1](*inputs, "python")
    seed = torch.randn_like(out)
    expected_out, expected = grads(case, "python", inputs, seed)
    actual_out, actual = grads(case, backend, inputs, seed)
    assert_close(actual_out, expected_out, k=CASES[case][2])
    for g, g_ref in zip(actual, expected):
        assert_close(g, g_ref, k=CASES[case][2])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(case, name):
    inputs = [t.detach().requires_grad_(True) for t in CASES[case][0](torch.float64)]
    assert torch.autograd.gradcheck(lambda *xs: CASES[case][1](*xs, name), inputs)


@pytest.mark.parametrize("case", ["dot", "gemm", "axpby"])
@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_second_derivatives_float64(case, name):
    inputs = [t.detach().requires_grad_(True) for t in CASES[case][0](torch.float64)]
    assert torch.autograd.gradgradcheck(lambda *xs: CASES[case][1](*xs, name), inputs)


@pytest.mark.parametrize("case", ["gemm", "gemv", "geru", "dot"])
def test_reference_gradients_are_torch_autograd(case):
    # the python backend's pullback (composed BLAS ops) equals autograd through plain torch ops
    inputs = CASES[case][0](torch.float64)
    out = CASES[case][1](*inputs, "python")
    seed = torch.randn_like(out)
    _, ours = grads(case, "python", inputs, seed)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    torch_fn = {
        "gemm": lambda A, B, C: 2.0 * A @ B + 0.5 * C,
        "gemv": lambda A, x, y: 1.5 * A @ x - 2.0 * y,
        "geru": lambda A, x, y: A + 0.5 * torch.outer(x, y),
        "dot": lambda x, y: (x * y).sum(),
    }[case]
    torch_fn(*leaves).backward(seed)
    for g, t in zip(ours, leaves):
        torch.testing.assert_close(g, t.grad)


def test_backward_runs_on_the_forward_backend(monkeypatch):
    A, B = randn(7, 6, dtype=torch.float64).requires_grad_(), randn(6, 5, dtype=torch.float64).requires_grad_()
    with kcourse.use_backend("python"):
        out = blas.gemm(A, B)
    calls = spy_kernels(monkeypatch)
    with kcourse.use_backend("pytorch"):  # a different block at backward time must not matter
        out.sum().backward()
    assert calls == [("python", "gemm"), ("python", "gemm")]  # dA and dB: two gemm calls


@pytest.mark.parametrize("beta, ops", [(0.5, ["gemm", "scal", "gemv"]), (1.0, ["gemm", "gemv"])])
def test_no_work_for_inputs_without_grad(monkeypatch, beta, ops):
    A, B = randn(7, 6).requires_grad_(), randn(6, 5)
    C = randn(5).requires_grad_()
    out = blas.gemm(A, B, C, 1.0, beta, backend="python")
    calls = spy_kernels(monkeypatch)
    out.sum().backward()
    # dA (gemm), dC (scal unless beta == 1, then a gemv summing the bias over the rows); nothing for B
    assert [op for _, op in calls] == ops
    assert B.grad is None
    torch.testing.assert_close(C.grad, torch.full_like(C, 7 * beta))


def test_inplace_ops_refuse_grad():
    x = randn(5).requires_grad_()
    with pytest.raises(RuntimeError, match="scal_: in-place ops are not differentiable"):
        blas.scal_(x, 2.0)
    with torch.no_grad():
        blas.scal_(x, 2.0)


def test_primitive_backward_runs_on_the_forward_backend(monkeypatch):
    # softmax's own backward kernel (not a composition): it must be the forward backend's
    import kcourse.backend as backend_module

    seen = []
    real = backend_module.backward_kernel
    monkeypatch.setattr(backend_module, "backward_kernel", lambda name, op: seen.append((name, op)) or real(name, op))
    x = randn(4, 9, dtype=torch.float64).requires_grad_()
    with kcourse.use_backend("python"):
        y = blas.softmax(x)
    with kcourse.use_backend("pytorch"):
        (y * torch.randn_like(y)).sum().backward()
    assert seen == [("python", "softmax")]


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_primitive_without_grad_records_no_node(name):
    """A primitive whose inputs want no gradient (or under torch.no_grad) records no autograd node,
    and gives the same values as with one."""
    x, w = randn(4, 9), randn(9)
    bare = blas.layer_norm(x, w, backend=name)
    with torch.no_grad():
        no_grad = blas.layer_norm(x.requires_grad_(), w, backend=name)
    assert bare.grad_fn is None and no_grad.grad_fn is None
    tracked = blas.layer_norm(x, w, backend=name)
    assert tracked.grad_fn is not None
    torch.testing.assert_close(bare, tracked.detach(), rtol=0, atol=0)
    torch.testing.assert_close(no_grad, bare, rtol=0, atol=0)
