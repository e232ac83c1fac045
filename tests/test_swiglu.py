import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, randn, require_dtype

SHAPES = [(1,), (7,), (1000,), (4097,), (33, 65), (2, 3, 5, 7)]
# (shape, gate's layout, up's layout); "transposed" needs two dims
CASES = [(s, lg, lu) for s in SHAPES for lg, lu in [("contiguous", "contiguous"), ("transposed", "strided"),
                                                    ("strided", "contiguous")]
         if len(s) > 1 or lg != "transposed"]


def torch_swiglu(gate, up):
    return F.silu(gate) * up


def swiglu_and_grads(gate, up, dy, backend, needs=(True, True)):
    """swiglu on ``backend`` (a torch function for a callable) and the gradients of the inputs
    flagged in ``needs`` for the seed ``dy``."""
    gate, up = (t.detach().requires_grad_(need) for t, need in zip((gate, up), needs))
    y = backend(gate, up) if callable(backend) else blas.swiglu(gate, up, backend=backend)
    grads = torch.autograd.grad(y, [t for t in (gate, up) if t.requires_grad], dy)
    return y.detach(), grads


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    gate, up, dy = 3 * randn(33, 65, dtype=dtype), randn(33, 65, dtype=dtype), randn(33, 65, dtype=dtype)
    y, grads = swiglu_and_grads(gate, up, dy, "python")
    y64, grads64 = swiglu_and_grads(gate.double(), up.double(), dy.double(), torch_swiglu)
    assert_close(y, y64.to(dtype))
    for g, g64 in zip(grads, grads64):
        assert_close(g, g64.to(dtype))


@pytest.mark.parametrize("shape, gate_layout, up_layout", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_swiglu(backend, dtype, shape, gate_layout, up_layout):
    require_dtype(backend, dtype)
    gate, up = randn(*shape, dtype=dtype, layout=gate_layout).mul_(3), randn(*shape, dtype=dtype, layout=up_layout)
    dy = randn(*shape, dtype=dtype)
    inputs = (gate.clone(), up.clone())
    y, grads = swiglu_and_grads(gate, up, dy, backend)
    for expected_y, expected_grads in (swiglu_and_grads(gate, up, dy, "python"),
                                       swiglu_and_grads(gate, up, dy, torch_swiglu)):
        assert_close(y, expected_y)
        for g, g_ref in zip(grads, expected_grads):
            assert_close(g, g_ref)
    assert torch.equal(gate, inputs[0]) and torch.equal(up, inputs[1])


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_one_gradient(backend, dtype, needs):
    # only the input that requires grad gets one (the kernel skips the other)
    gate, up, dy = randn(9, 70, dtype=dtype), randn(9, 70, dtype=dtype), randn(9, 70, dtype=dtype)
    y, (grad,) = swiglu_and_grads(gate, up, dy, backend, needs)
    y_ref, (grad_ref,) = swiglu_and_grads(gate, up, dy, "python", needs)
    assert_close(y, y_ref)
    assert_close(grad, grad_ref)


def test_swiglu_extremes(backend):
    gate = torch.tensor([0.0, -0.0, 20.0, -20.0, 100.0, -100.0, 1e4, -1e4], device=DEVICE)
    up = torch.linspace(-2, 2, 8, device=DEVICE)
    dy = torch.ones_like(up)
    y, grads = swiglu_and_grads(gate, up, dy, backend)
    y_torch, grads_torch = swiglu_and_grads(gate, up, dy, torch_swiglu)
    assert_close(y, y_torch)
    for g, g_ref in zip(grads, grads_torch):
        assert_close(g, g_ref)


def test_swiglu_empty(backend):
    gate = torch.empty(0, 4, device=DEVICE, requires_grad=True)
    up = torch.empty(0, 4, device=DEVICE, requires_grad=True)
    y = blas.swiglu(gate, up, backend=backend)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert gate.grad.shape == up.grad.shape == (0, 4)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    gate = randn(5, 6, dtype=torch.float64, layout="transposed").requires_grad_(True)
    up = randn(5, 6, dtype=torch.float64, layout="strided").requires_grad_(True)
    assert torch.autograd.gradcheck(lambda g, u: blas.swiglu(g, u, backend=name), (gate, up))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_swiglu_validation(name):
    gate, up = randn(3, 4), randn(3, 4)
    inputs = (gate.clone(), up.clone())
    with pytest.raises(ValueError, match=r"swiglu: gate is \(3, 4\) and up is \(4, 3\); they must have the same shape"):
        blas.swiglu(gate, up.mT, backend=name)
    with pytest.raises(TypeError, match="swiglu: gate is torch.float32 but up is torch.float16; all tensors must share"):
        blas.swiglu(gate, up.half(), backend=name)
    with pytest.raises(TypeError, match="swiglu: up must be a floating-point tensor, got torch.int64"):
        blas.swiglu(gate, torch.ones(3, 4, dtype=torch.int64, device=DEVICE), backend=name)
    assert torch.equal(gate, inputs[0]) and torch.equal(up, inputs[1])


def test_swiglu_triton_float64():
    with pytest.raises(TypeError, match="swiglu: the triton backend does not support torch.float64"):
        blas.swiglu(randn(3, dtype=torch.float64), randn(3, dtype=torch.float64), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 11008), (3, 1000, 1023)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_large(backend, dtype, shape):
    gate, up, dy = 3 * randn(*shape, dtype=dtype), randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    y, grads = swiglu_and_grads(gate, up, dy, backend)
    y_ref, grads_ref = swiglu_and_grads(gate, up, dy, "python")
    assert_close(y, y_ref)
    for g, g_ref in zip(grads, grads_ref):
        assert_close(g, g_ref)
