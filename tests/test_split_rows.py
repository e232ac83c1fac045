"""The triton backend's norms' backward on rows split over several programs that meet once per row
(``kcourse/blas/triton/_split.py``: rows of 8192 < D <= 16384 columns), with and without the
residual add, against the python reference on both sides of the lengths where the split starts and
stops, in every dtype, every set of gradients asked for; the split path is checked to be the one
taken. On a GPU only: programs that wait for each other cannot run in Triton's interpreter (one
program at a time), where these rows take the two-sweep kernel, tested in each op's own file."""
import pytest
import torch

from kcourse import blas
from _util import DEVICE, DTYPES, assert_close, randn, require_backend

pytestmark = pytest.mark.gpu

# columns: 8192 held by one program; 8193 (a block of one column), 12000 and 16384 split in two;
# 16385 swept twice; row counts that leave a group short
NORM_SHAPES = [(33, 8192), (5, 8193), (601, 12000), (67, 16384), (3, 16385)]


@pytest.fixture(autouse=True)
def triton_on_gpu():
    if DEVICE != "cuda":
        pytest.skip("programs that wait for each other need a GPU")
    require_backend("triton")


@pytest.fixture
def kernels(monkeypatch):
    """The names of the kernels the norms launch."""
    from kcourse.blas.triton import _norm

    names = []

    def spy(kernel, *args, _launch=_norm.launch, **kwargs):
        names.append(kernel.fn.__name__)
        return _launch(kernel, *args, **kwargs)

    monkeypatch.setattr(_norm, "launch", spy)
    return names


def grads(op, fused, backend, x, residual, weight, bias, dys):
    """The outputs of ``op`` (``add_<op>`` when fused: y and h) and the gradients of x, the residual,
    weight and bias (those given), pulled back from ``dys``."""
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    residual = residual.detach().requires_grad_() if fused else None
    params = (weight,) if bias is None else (weight, bias.detach().requires_grad_())
    if fused:
        outs = getattr(blas, "add_" + op)(x, residual, *params, backend=backend)
    else:
        outs = (getattr(blas, op)(x, *params, backend=backend),)
    leaves = [t for t in (x, residual, *params) if t is not None]
    return [o.detach() for o in outs] + list(torch.autograd.grad(outs, leaves, dys[:len(outs)]))


@pytest.mark.parametrize("shape", NORM_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op, fused", [("layer_norm", False), ("rms_norm", False), ("layer_norm", True),
                                       ("rms_norm", True)])
def test_norm(op, fused, dtype, shape, kernels):
    x, weight = randn(*shape, dtype=dtype) * 2 + 1, randn(shape[-1], dtype=dtype)
    residual = randn(*shape, dtype=dtype) if fused else None
    bias = randn(shape[-1], dtype=dtype) if op == "layer_norm" else None
    dys = [randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)]
    got = grads(op, fused, "triton", x, residual, weight, bias, dys)
    expected = grads(op, fused, "python", x, residual, weight, bias, dys)
    outputs = 2 if fused else 1
    for i, (a, e) in enumerate(zip(got, expected)):
        parameter = i >= outputs + 1 + fused  # dweight, dbias: sums over the rows
        assert_close(a, e, k=shape[0] if parameter else 1)
    assert ("norm_split_backward_kernel" in kernels) == (8192 < shape[-1] <= 16384), kernels


@pytest.mark.parametrize("needs", [(True, True, True), (True, False, False), (False, True, True), (False, False, True)])
def test_norm_backward_needs(needs):
    from kcourse.backend import backward_kernel, resolve

    x, weight, bias, dy = randn(37, 12000), randn(12000), randn(12000), randn(37, 12000)
    cache = resolve("layer_norm", "triton")[1](x, weight, bias, eps=1e-5)[1]
    got = backward_kernel("triton", "layer_norm")(dy, cache, needs, eps=1e-5)
    leaves = [t.requires_grad_() for t in (x.clone(), weight.clone(), bias.clone())]
    expected = torch.autograd.grad(blas.layer_norm(*leaves, backend="python"), leaves, dy)
    for need, g, e, k in zip(needs, got, expected, (1, 37, 37)):
        if need:
            assert_close(g, e, k=k)
        else:
            assert g is None


def test_layer_norm_large_offset():
    # mean 1e4, std 1: the backward's xhat from the forward's stable statistics
    x, weight, bias, dy = randn(3, 12000) + 1e4, randn(12000), randn(12000), randn(3, 12000)
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    got = torch.autograd.grad(blas.layer_norm(*leaves, backend="triton"), leaves, dy)
    exact = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    expected = torch.autograd.grad(torch.nn.functional.layer_norm(exact[0], (12000,), *exact[1:], 1e-5), exact,
                                   dy.double())
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e.float(), rtol=1e-3, atol=2e-2)


def test_deterministic():
    x, weight, bias, dy = randn(64, 16384), randn(16384), randn(16384), randn(64, 16384)
    runs = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        y = blas.layer_norm(*leaves, backend="triton")
        runs.append([y.detach(), *torch.autograd.grad(y, leaves, dy)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("layout", ["strided", "transposed"])
def test_strided_input(layout):
    x, weight, dy = randn(40, 12000, layout=layout), randn(12000), randn(40, 12000)
    got = grads("rms_norm", False, "triton", x, None, weight, None, [dy])
    for a, e, k in zip(got, grads("rms_norm", False, "python", x, None, weight, None, [dy]), (1, 1, 40)):
        assert_close(a, e, k=k)
