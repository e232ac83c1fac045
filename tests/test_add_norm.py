"""add_rms_norm and add_layer_norm (h = x + residual, y = norm(h)): both outputs and the gradients of
x, residual and the parameters, pulled back from both outputs' gradients, of every backend against
the python reference and against torch (F.rms_norm / F.layer_norm of x + residual); the reference
against float64 torch."""
import re

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from kcourse.backend import backward_kernel, resolve
from _util import ALL_DTYPES, DTYPES, assert_close, raises, randn, require_backend, require_dtype

CASES = ("add_rms_norm", "add_layer_norm")  # named ``case``: conftest's backend fixture skips a backend without it
EPS = {"add_rms_norm": 1e-6, "add_layer_norm": 1e-5}
SHAPES = [(7, 33), (3, 5, 40)]  # odd columns, a batch of rows; 1-D and empty ones: test_one_row_and_empty


def inputs(case, shape, dtype=torch.float32, affine=True, layout=("contiguous", "contiguous")):
    """x, residual, the parameters ([weight] or [weight, bias], None where not ``affine``), dy and dh."""
    count = 1 if case == "add_rms_norm" else 2
    params = [randn(shape[-1], dtype=dtype) if affine else None for _ in range(count)]
    x, residual = (randn(*shape, dtype=dtype, layout=lay) for lay in layout)
    return x, residual, params, randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)


def kcourse_fn(case, backend, eps=None):
    op = getattr(blas, case)
    return lambda x, r, *params: op(x, r, *params, eps=EPS[case] if eps is None else eps, backend=backend)


def torch_fn(case, eps=None, dtype=torch.float64):
    """h = x + residual rounded once to x's dtype, then F.rms_norm / F.layer_norm of h computed in ``dtype``
    (float64: the truth) and rounded back to x's dtype; the gradient of h (dh plus the norm's) summed
    in ``dtype`` and rounded once."""
    eps = EPS[case] if eps is None else eps
    norm = F.rms_norm if case == "add_rms_norm" else F.layer_norm

    def fn(x, r, *params):
        h = x.to(dtype) + r.to(dtype)
        # h's value rounded to x's dtype, its gradient passed through in ``dtype``: dh and the norm's
        # gradient add before the one rounding to x's dtype, as the op's backward does
        h = h + (h.to(x.dtype).to(dtype) - h).detach()
        y = norm(h, h.shape[-1:], *(p if p is None else p.to(dtype) for p in params), eps=eps)
        return y.to(x.dtype), h.to(x.dtype)
    return fn


def run(fn, x, residual, params, dy, dh):
    """``[y, h, dx, dresidual, *dparams]`` of ``(y, h) = fn(x, residual, *params)`` pulled back from dy and dh
    (either None: that output unused); None for a missing parameter."""
    leaves = [t if t is None else t.detach().requires_grad_() for t in (x, residual, *params)]
    y, h = fn(*leaves)
    used = [(o, g) for o, g in ((y, dy), (h, dh)) if g is not None]
    grads = iter(torch.autograd.grad([o for o, _ in used], [t for t in leaves if t is not None],
                                     [g for _, g in used], allow_unused=True, materialize_grads=True))
    return [y.detach(), h.detach()] + [None if t is None else next(grads) for t in leaves]


def assert_results(actual, expected, rows):
    """y, h, dx and dresidual elementwise, the parameters' gradients as sums over ``rows`` rows."""
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), i
        if a is not None:
            assert_close(a, e, k=rows if i >= 4 else 1)


def check(case, backend, x, residual, params, dy, dh, eps=None):
    """backend vs the python reference and vs torch on the inputs upcast to float32 (float64 stays)."""
    rows = x.numel() // max(x.shape[-1], 1)
    got = run(kcourse_fn(case, backend, eps), x, residual, params, dy, dh)
    assert_results(got, run(kcourse_fn(case, "python", eps), x, residual, params, dy, dh), rows)
    upcast = torch.promote_types(x.dtype, torch.float32)
    assert_results(got, run(torch_fn(case, eps, upcast), x, residual, params, dy, dh), rows)
    return got


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(case, dtype):
    args = inputs(case, (5, 300), dtype)
    got = run(kcourse_fn(case, "python"), *args)
    assert_results(got, run(torch_fn(case), *args), rows=5)
    assert torch.equal(got[2], got[3])  # dx = dresidual
    cache = resolve(case, "python")[1](*args[:2], *args[2], eps=EPS[case])[1]  # the norm's cache, of h
    assert torch.equal(cache[0], got[1])
    assert cache[-1].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_add_norm(backend, case, dtype, shape):
    require_dtype(backend, dtype)
    args = inputs(case, shape, dtype)
    before = [t.clone() for t in (*args[:2], *args[2], *args[3:])]
    y, h = check(case, backend, *args)[:2]
    assert y.dtype == h.dtype == dtype and y.shape == h.shape == args[0].shape
    assert all(torch.equal(t, t0) for t, t0 in zip((*args[:2], *args[2], *args[3:]), before))


@pytest.mark.parametrize("case", CASES)
def test_parameters_none(backend, case):
    check(case, backend, *inputs(case, (7, 33), affine=False))
    if case == "add_layer_norm":  # weight without bias, bias without weight
        x, r, (w, b), dy, dh = inputs(case, (7, 33))
        check(case, backend, x, r, [w, None], dy, dh)
        check(case, backend, x, r, [None, b], dy, dh)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", [("transposed", "strided"), ("strided", "contiguous")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous(backend, case, dtype, layout):
    x, r, params, dy, dh = inputs(case, (3, 5, 12), dtype, layout=layout)
    params = [randn(12, dtype=dtype, layout="strided") for _ in params]
    check(case, backend, x, r, params, dy, dh)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("used", ["y", "h"])
def test_one_output_used(backend, case, used):
    # h's gradient None (the last block's h unused): dx = the norm's; y's None: dx = dh, the parameters' 0
    x, r, params, dy, dh = inputs(case, (7, 33))
    if used == "y":
        check(case, backend, x, r, params, dy, None)
    else:
        got = check(case, backend, x, r, params, None, dh)
        assert torch.equal(got[2], dh) and all(torch.equal(g, torch.zeros_like(g)) for g in got[4:])


@pytest.mark.parametrize("case", CASES)
def test_residual_only_needs_grad(backend, case):
    x, r, params, dy, dh = inputs(case, (7, 33))
    r = r.requires_grad_()
    y, h = kcourse_fn(case, backend)(x, r, *params)
    (dr,) = torch.autograd.grad([y, h], [r], [dy, dh])
    assert_close(dr, run(kcourse_fn(case, "python"), x, r, params, dy, dh)[3])


@pytest.mark.parametrize("case", CASES)
def test_one_row_and_empty(backend, case):
    check(case, backend, *inputs(case, (50,)))  # 1-D: one row
    x, r, params, dy, dh = inputs(case, (0, 33))
    got = run(kcourse_fn(case, backend), x, r, params, dy, dh)
    assert all(t.shape == (0, 33) for t in got[:4])
    assert all(torch.equal(g, torch.zeros_like(p)) for g, p in zip(got[4:], params))
    x, r, params, dy, dh = inputs(case, (3, 4, 0))  # rows of no columns: empty outputs
    got = run(kcourse_fn(case, backend), x, r, params, dy, dh)
    assert all(t.shape == (3, 4, 0) for t in got[:4]) and all(g.shape == (0,) for g in got[4:])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("needs", [(True, False), (False, True), (True, True)])
def test_backward_needs(backend, case, needs):
    # the backward kernel computes only what `needs` asks for (x's and residual's, then every parameter's)
    x, r, params, dy, dh = inputs(case, (7, 33))
    cache = resolve(case, backend)[1](x, r, *params, eps=EPS[case])[1]
    full = (needs[0], not needs[0], *[needs[1]] * len(params))
    grads = backward_kernel(backend, case)((dy, dh), cache, full, eps=EPS[case])
    assert len(grads) == len(full)
    for need, g, e in zip(full, grads, run(kcourse_fn(case, "python"), x, r, params, dy, dh)[2:]):
        if need:
            assert_close(g, e, k=7)
        else:
            assert g is None


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", [(5, 300), (3, 200)])  # 200: one block forward, chunked backward
def test_triton_chunked_rows(triton_chunks, case, shape):
    x, r, params, dy, dh = inputs(case, shape)
    check(case, "triton", x * 3 + 3, r, params, dy, dh)
    check(case, "triton", x, r, params, dy, None)  # no dh, dx beside the column sums


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name, case):
    x, r, params, _, _ = inputs(case, (3, 7), torch.float64)
    leaves = [t.requires_grad_() for t in (x, r, *params)]
    assert torch.autograd.gradcheck(kcourse_fn(case, name), leaves)
    assert torch.autograd.gradcheck(kcourse_fn(case, name, eps=0.5), leaves[:2])  # no parameters, eps matters


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_validation(name, case):
    require_backend(name)
    x, w = randn(3, 4), randn(4)
    op = lambda *args, **kw: getattr(blas, case)(*args, backend=name, **kw)  # noqa: E731
    raises(ValueError, re.escape(f"{case}: x is (3, 4) and residual is (4, 3); they must have the same shape"),
           op, x, randn(4, 3))
    raises(ValueError, re.escape(f"{case}: x is (3, 4) and residual is (4,); they must have the same shape"),
           op, x, randn(4))
    raises(TypeError, f"{case}: x is torch.float32 but residual is torch.bfloat16", op, x, x.bfloat16())
    raises(TypeError, f"{case}: residual must be a torch.Tensor, got NoneType", op, x, None)
    raises(ValueError, re.escape(f"{case}: x is (3, 4) and weight is (5,); weight must be (4,), the size of x's "
                                 "last dimension"), op, x, x, randn(5))
    raises(TypeError, f"{case}: x is torch.float32 but weight is torch.float64", op, x, x, w.double())
    raises(ValueError, f"{case}: eps must be positive, got 0.0", op, x, x, w, eps=0.0)
    if case == "add_layer_norm":
        raises(ValueError, re.escape(f"{case}: x is (3, 4) and bias is (3,)"), op, x, x, w, randn(3))
    if name == "triton":
        raises(TypeError, f"{case}: the triton backend does not support torch.float64", op, x.double(), x.double())
