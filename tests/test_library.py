"""kcourse ops as torch.library custom ops every op exists as
``torch.ops.kcourse.<op>`` (the in-place variants declared as mutating their target, the
primitives with their ``<op>_backward``); ``torch.library.opcheck`` passes for each on the python
and pytorch backends; under FakeTensorMode the public ops give the eager output's metadata and the
eager errors; primitives refuse second derivatives and run their backward on the forward's
backend; the BLAS alpha == 0 rule; a batched gemm with a batch of 0."""
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kcourse
import kcourse.backend as backend_module
from kcourse import blas
from kcourse.backend import OPS
from kcourse.blas import _library
from _util import DEVICE, require_backend, spy_aten_recorded

kops = torch.ops.kcourse
BLAS_OPS = OPS[:OPS.index("softmax")]
PRIMITIVES = OPS[OPS.index("softmax"):]
INPLACE = tuple(op for op in blas.__all__ if op.endswith("_"))  # copy_, swap_, ..., gemm_
EAGER = ("python", "pytorch")


def test_op_lists_agree():
    assert BLAS_OPS == ("copy", "swap", "scal", "axpby", "dot", "gemv", "geru", "gemm")
    assert set(PRIMITIVES) == set(_library.PRIMITIVES)
    assert set(INPLACE) == {f"{op}_" for op in BLAS_OPS if op != "dot"}
    assert set(blas.__all__) == set(OPS) | set(INPLACE)


@pytest.mark.parametrize("op", [*OPS, *INPLACE, *(f"{p}_backward" for p in PRIMITIVES)])
def test_custom_op_exists(op):
    overload = getattr(kops, op).default
    assert isinstance(overload, torch._ops.OpOverload)
    schema = overload._schema
    assert schema.arguments[-1].name == "backend" and str(schema.arguments[-1].type) == "str"
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if op in INPLACE:  # the op_ variants mutate their target and return nothing
        target = {"swap_": ["x", "y"], "scal_": ["x"], "geru_": ["A"], "gemm_": ["C"]}.get(op, ["y"])
        assert written == target, schema
        assert len(schema.returns) == 0
    else:
        assert written == [], schema


# ----------------------------------------------------------------------------- opcheck
def _t(*shape, grad=True):
    return torch.randn(*shape, device=DEVICE).requires_grad_(grad)


def _forward_args(op, backend, grad=True):
    """Small float32 arguments of ``torch.ops.kcourse.<op>`` (backend last); one list per case."""
    t = lambda *s: _t(*s, grad=grad)  # noqa: E731
    plain = lambda *s: _t(*s, grad=False)  # noqa: E731  (in-place targets and their operands)
    half = lambda *s: _t(*s, grad=False).bfloat16().requires_grad_(grad)  # noqa: E731
    target = torch.tensor([1, -100, 6, 0], device=DEVICE)
    cases = {
        "copy": [(t(3, 4),)],
        "copy_": [(plain(3, 4), plain(3, 4))],
        "swap": [(t(5), t(5))],
        "swap_": [(plain(5), plain(5))],
        "scal": [(t(3, 4), 1.5)],
        "scal_": [(plain(3, 4), -0.5)],
        "axpby": [(t(3, 4), t(3, 4), 1.5, -0.5)],
        "axpby_": [(plain(3, 4), plain(3, 4), 1.5, -0.5)],
        "dot": [(t(7), t(7))],
        "gemv": [(t(3, 4), t(4), t(3), 1.5, 0.5), (t(3, 4), t(4), None, 2.0, 0.0)],
        "gemv_": [(plain(3, 4), plain(4), plain(3), 1.5, 0.5)],
        "geru": [(t(3, 4), t(3), t(4), 1.5)],
        "geru_": [(plain(3, 4), plain(3), plain(4), 1.5)],
        "gemm": [(t(3, 4), t(4, 5), t(3, 5), 1.5, 0.5),
                 (t(2, 3, 4), t(4, 5), t(5), 1.0, 1.0),  # shared B, bias row
                 (t(3, 4), t(2, 4, 5), None, 0.5, 0.0)],
        "gemm_": [(plain(3, 4), plain(4, 5), plain(3, 5), 1.5, 0.5)],
        "softmax": [(t(3, 5), 1)],
        "log_softmax": [(t(2, 3, 5), 1)],
        "cross_entropy": [(t(4, 7), target, -100, "mean"), (t(4, 7), target, -100, "none")],
        "linear": [(t(2, 3, 5), t(7, 5), t(7), "gelu_tanh"), (t(4, 5), t(7, 5), None, "none")],
        "linear_swiglu": [(t(2, 3, 5), t(7, 5), t(7, 5), t(7), t(7)), (t(4, 5), t(7, 5), t(7, 5), None, None)],
        "linear_cross_entropy": [(t(4, 5), t(7, 5), target, t(7), -100, "mean", grad, False),  # gradients ahead
                                 (t(4, 5), t(7, 5), target, None, -100, "none", False, True),
                                 # autocast's case: bf16 operands, gradients ahead, a float32 loss
                                 (half(4, 5), half(7, 5), target, half(7), -100, "mean", grad, True),
                                 (half(4, 5), half(7, 5), target, None, -100, "none", False, True)],
        "layer_norm": [(t(3, 8), t(8), t(8), 1e-5), (t(3, 8), None, None, 1e-5)],
        "rms_norm": [(t(3, 8), t(8), 1e-6)],
        "add_layer_norm": [(t(3, 8), t(3, 8), t(8), t(8), 1e-5), (t(3, 8), t(3, 8), None, None, 1e-5)],
        "add_rms_norm": [(t(3, 8), t(3, 8), t(8), 1e-6)],
        "gelu": [(t(3, 5), "none"), (t(3, 5), "tanh")],
        "silu": [(t(3, 5),)],
        "relu": [(t(3, 5),)],
        "swiglu": [(t(3, 5), t(3, 5))],
        "embedding": [(torch.tensor([[1, 3], [3, 0]], device=DEVICE), t(6, 4))],
        "rope": [(t(2, 3, 4, 6), None, 10000.0), (t(3, 4), torch.tensor([5, 0, 2], device=DEVICE), 500.0),
                 (t(2, 4, 3, 6).transpose(1, 2).detach().requires_grad_(grad), None, 10000.0)],  # q's layout
        "attention": [(t(1, 2, 4, 8), t(1, 1, 5, 8), t(1, 1, 5, 8), None, True, 0.35),
                      (t(2, 2, 3, 4), t(2, 2, 3, 4), t(2, 2, 3, 4), None, False, 0.5),
                      # a static KV cache (inference only: no gradient)
                      (plain(2, 2, 1, 8), plain(2, 1, 5, 8), plain(2, 1, 5, 8),
                       torch.tensor([3, 0], dtype=torch.int32, device=DEVICE), False, 0.35)],
    }
    return [(*args, backend) for args in cases[op]]


def _backward_args(op, backend):
    """Arguments of ``torch.ops.kcourse.<op>_backward``: what the forward saves, as autograd hands it."""
    spec = _library.PRIMITIVES[op]
    result = []
    for args in _forward_args(op, backend, grad=False):
        inputs, params, _ = _library._split(spec, args)
        outs = getattr(kops, op)(*args)
        k = len(spec.outs)
        named = dict(zip(spec.input_names, inputs), **dict(zip(spec.outs, outs)))
        saved = [named[n] for n in spec.saved] + list(outs[k:])
        needs = [g is not None and (inputs[i] is not None) for i, g in enumerate(spec.grads)]
        douts = [torch.randn_like(o) for o in outs[:k]]
        result.append((*douts, saved, needs, *params.values(), backend))
    return result


# test_aot_dispatch_dynamic traces each op with aot_autograd under dynamic shapes and compares
# with eager, forward and backward: about 1 s per op. The default run keeps it for every forward
# op (in-place ones included) on the pytorch backend; marked slow: the python backend (the
# registrations it checks are the same for both backends; only the kernels differ, and those are
# covered by test_faketensor here and by the op tests) and the ``_backward`` ops (already traced,
# fake implementation and all, in the backward graph of their forward op's check).
FAST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


def _opcheck_params():
    params = []
    for name in EAGER:
        for op in [*OPS, *INPLACE, *(f"{p}_backward" for p in PRIMITIVES)]:
            params.append(pytest.param(name, op, FAST_UTILS, id=f"{name}-{op}-fast"))
            slow = [pytest.mark.slow] if name == "python" or op.endswith("_backward") else []
            params.append(pytest.param(name, op, ("test_aot_dispatch_dynamic",), marks=slow, id=f"{name}-{op}-aot"))
    return params


@pytest.mark.parametrize("name, op, utils", _opcheck_params())
def test_opcheck(name, op, utils):
    torch.manual_seed(0)
    if op.endswith("_backward"):
        # Backward kernels are called with tensors that need no gradient (autograd runs them under
        # no_grad); their own autograd formula only refuses (test_second_derivative_raises).
        cases = _backward_args(op.removesuffix("_backward"), name)
    else:
        cases = _forward_args(op, name)
    for args in cases:
        result = torch.library.opcheck(getattr(kops, op).default, args, test_utils=utils, raise_exception=False)
        assert all(v == "SUCCESS" for v in result.values()), (args, result)


# ----------------------------------------------------------------------------- fake tensors
def _public_cases():
    """(name, call) pairs of public ops with float32 inputs, some strided, to compare eager and fake."""
    t = lambda *s: torch.randn(*s, device=DEVICE)  # noqa: E731
    tokens = torch.tensor([[1, 3, 0], [2, 2, 5]], device=DEVICE)
    target = torch.tensor([1, -100, 6, 0], device=DEVICE)
    return [
        ("copy", lambda b: (t(4, 3).mT,), lambda b, x: blas.copy(x, backend=b)),
        ("copy_", lambda b: (t(3, 4), t(3, 4)), lambda b, x, y: blas.copy_(x, y, backend=b)),
        ("swap", lambda b: (t(5), t(10)[::2]), lambda b, x, y: blas.swap(x, y, backend=b)),
        ("swap_", lambda b: (t(5), t(5)), lambda b, x, y: blas.swap_(x, y, backend=b)),
        ("scal", lambda b: (t(3, 4)[:, ::2],), lambda b, x: blas.scal(x, 2.0, backend=b)),
        ("scal_", lambda b: (t(3, 4),), lambda b, x: blas.scal_(x, 2.0, backend=b)),
        ("axpby", lambda b: (t(3, 4), t(4, 3).mT), lambda b, x, y: blas.axpby(x, y, 2.0, 0.5, backend=b)),
        ("axpby_", lambda b: (t(3, 4), t(3, 4)), lambda b, x, y: blas.axpby_(x, y, 2.0, 0.5, backend=b)),
        ("dot", lambda b: (t(7), t(7)), lambda b, x, y: blas.dot(x, y, backend=b)),
        ("dot_f64", lambda b: (t(7).double(), t(7).double()), lambda b, x, y: blas.dot(x, y, backend=b)),
        ("gemv", lambda b: (t(4, 3).mT, t(4), t(3)), lambda b, A, x, y: blas.gemv(A, x, y, 1.0, 1.0, backend=b)),
        ("gemv_", lambda b: (t(3, 4), t(4), t(3)), lambda b, A, x, y: blas.gemv_(A, x, y, backend=b)),
        ("geru", lambda b: (t(3, 4), t(3), t(4)), lambda b, A, x, y: blas.geru(A, x, y, 0.5, backend=b)),
        ("geru_", lambda b: (t(3, 4), t(3), t(4)), lambda b, A, x, y: blas.geru_(A, x, y, backend=b)),
        ("gemm", lambda b: (t(3, 4), t(5, 4).mT, t(5)), lambda b, A, B, C: blas.gemm(A, B, C, 1.0, 1.0, backend=b)),
        ("gemm_batched", lambda b: (t(2, 3, 4), t(4, 5)), lambda b, A, B: blas.gemm(A, B, backend=b)),
        ("gemm_broadcast", lambda b: (t(1, 3, 4), t(2, 4, 5)), lambda b, A, B: blas.gemm(A, B, backend=b)),
        ("gemm_bf16", lambda b: (t(3, 4).bfloat16(), t(4, 5).bfloat16()), lambda b, A, B: blas.gemm(A, B, backend=b)),
        ("gemm_", lambda b: (t(3, 4), t(4, 5), t(3, 5)), lambda b, A, B, C: blas.gemm_(A, B, C, backend=b)),
        ("softmax", lambda b: (t(3, 5, 2).transpose(1, 2),), lambda b, x: blas.softmax(x, 1, backend=b)),
        ("log_softmax", lambda b: (t(3, 5),), lambda b, x: blas.log_softmax(x, 0, backend=b)),
        ("cross_entropy", lambda b: (t(4, 7), target), lambda b, x, y: blas.cross_entropy(x, y, backend=b)),
        ("cross_entropy_none", lambda b: (t(4, 7), target),
         lambda b, x, y: blas.cross_entropy(x, y, reduction="none", backend=b)),
        ("layer_norm", lambda b: (t(2, 3, 8), t(8), t(8)), lambda b, x, w, bi: blas.layer_norm(x, w, bi, backend=b)),
        ("rms_norm", lambda b: (t(8, 3).mT, t(8)), lambda b, x, w: blas.rms_norm(x, w, backend=b)),
        ("rms_norm_f64", lambda b: (t(3, 8).double(),), lambda b, x: blas.rms_norm(x, backend=b)),
        ("add_layer_norm", lambda b: (t(2, 3, 8), t(3, 2, 8).transpose(0, 1), t(8), t(8)),
         lambda b, x, r, w, bi: blas.add_layer_norm(x, r, w, bi, backend=b)),
        ("add_rms_norm", lambda b: (t(8, 3).mT, t(3, 8)), lambda b, x, r: blas.add_rms_norm(x, r, backend=b)),
        ("gelu", lambda b: (t(3, 5)[::2],), lambda b, x: blas.gelu(x, "tanh", backend=b)),
        ("silu", lambda b: (t(3, 5).half(),), lambda b, x: blas.silu(x, backend=b)),
        ("relu", lambda b: (t(3, 5).mT,), lambda b, x: blas.relu(x, backend=b)),
        ("swiglu", lambda b: (t(3, 5), t(3, 5)), lambda b, g, u: blas.swiglu(g, u, backend=b)),
        ("embedding", lambda b: (tokens, t(6, 4)), lambda b, i, w: blas.embedding(i, w, backend=b)),
        ("rope", lambda b: (t(2, 4, 3, 6).transpose(1, 2),), lambda b, x: blas.rope(x, backend=b)),
        ("attention", lambda b: (t(1, 4, 2, 8).transpose(1, 2), t(1, 1, 5, 8), t(1, 1, 5, 8)),
         lambda b, q, k, v: blas.attention(q, k, v, causal=True, backend=b)),
    ]


def _metadata(out):
    if isinstance(out, tuple):
        return tuple(_metadata(o) for o in out)
    return (tuple(out.shape), out.dtype, out.stride(), out.device)


def _public_params():
    return [pytest.param(c, id=c[0], marks=[])
            for c in _public_cases()]


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("case", _public_params())
def test_fake_output_matches_eager(name, case):
    _, make, call = case
    torch.manual_seed(0)
    inputs = make(name)
    eager = call(name, *[t.clone() for t in inputs])
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_inputs = [mode.from_tensor(t) for t in inputs]
        fake = call(name, *fake_inputs)
    assert _metadata(fake) == _metadata(eager)


def _bad_cases():
    """(call, inputs) pairs that the eager API refuses with a ValueError or TypeError."""
    t = lambda *s: torch.randn(*s, device=DEVICE)  # noqa: E731
    return {
        "gemm_inner": (lambda b, A, B: blas.gemm(A, B, backend=b), (t(3, 4), t(5, 6))),
        "gemm_C": (lambda b, A, B, C: blas.gemm(A, B, C, beta=1.0, backend=b), (t(3, 4), t(4, 5), t(2, 5))),
        "gemm_batch": (lambda b, A, B: blas.gemm(A, B, backend=b), (t(2, 3, 4), t(3, 4, 5))),
        "gemm_dtype": (lambda b, A, B: blas.gemm(A, B, backend=b), (t(3, 4), t(4, 5).double())),
        "gemm_int": (lambda b, A, B: blas.gemm(A, B, backend=b), (t(3, 4), torch.ones(4, 5, dtype=torch.int64))),
        "gemm__target": (lambda b, A, B, C: blas.gemm_(A, B, C, backend=b), (t(3, 4), t(4, 5), t(3, 4))),
        "gemv_x": (lambda b, A, x: blas.gemv(A, x, backend=b), (t(3, 4), t(3))),
        "geru_y": (lambda b, A, x, y: blas.geru(A, x, y, backend=b), (t(3, 4), t(3), t(3))),
        "dot_len": (lambda b, x, y: blas.dot(x, y, backend=b), (t(3), t(4))),
        "dot_2d": (lambda b, x, y: blas.dot(x, y, backend=b), (t(3, 1), t(3, 1))),
        "axpby_shape": (lambda b, x, y: blas.axpby(x, y, backend=b), (t(3), t(4))),
        "axpby_alpha": (lambda b, x, y: blas.axpby(x, y, "2", backend=b), (t(3), t(3))),
        "swap_shape": (lambda b, x, y: blas.swap(x, y, backend=b), (t(3), t(4))),
        "softmax_dim": (lambda b, x: blas.softmax(x, 2, backend=b), (t(3, 4),)),
        "log_softmax_int": (lambda b, x: blas.log_softmax(x, backend=b), (torch.ones(3, 4, dtype=torch.int32),)),
        "cross_entropy_target": (lambda b, x, y: blas.cross_entropy(x, y, backend=b),
                                 (t(4, 7), torch.zeros(3, dtype=torch.int64))),
        "cross_entropy_float_target": (lambda b, x, y: blas.cross_entropy(x, y, backend=b), (t(4, 7), t(4))),
        "cross_entropy_reduction": (lambda b, x, y: blas.cross_entropy(x, y, reduction="avg", backend=b),
                                    (t(4, 7), torch.zeros(4, dtype=torch.int64))),
        "layer_norm_weight": (lambda b, x, w: blas.layer_norm(x, w, backend=b), (t(3, 8), t(7))),
        "layer_norm_eps": (lambda b, x: blas.layer_norm(x, eps=-1.0, backend=b), (t(3, 8),)),
        "rms_norm_weight": (lambda b, x, w: blas.rms_norm(x, w, backend=b), (t(3, 8), t(8).double())),
        "add_rms_norm_residual": (lambda b, x, r: blas.add_rms_norm(x, r, backend=b), (t(3, 8), t(8))),
        "add_layer_norm_residual_dtype": (lambda b, x, r: blas.add_layer_norm(x, r, backend=b),
                                          (t(3, 8), t(3, 8).half())),
        "gelu_approximate": (lambda b, x: blas.gelu(x, "fast", backend=b), (t(3),)),
        "swiglu_shape": (lambda b, g, u: blas.swiglu(g, u, backend=b), (t(3, 4), t(4, 3))),
        "embedding_float": (lambda b, i, w: blas.embedding(i, w, backend=b), (t(3), t(6, 4))),
        "embedding_weight": (lambda b, i, w: blas.embedding(i, w, backend=b),
                             (torch.zeros(3, dtype=torch.int64), t(6))),
        "rope_odd": (lambda b, x: blas.rope(x, backend=b), (t(3, 5),)),
        "rope_positions": (lambda b, x, p: blas.rope(x, positions=p, backend=b),
                           (t(3, 4), torch.arange(4))),
        "attention_heads": (lambda b, q, k, v: blas.attention(q, k, v, backend=b),
                            (t(1, 3, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8))),
        "attention_dim": (lambda b, q, k, v: blas.attention(q, k, v, backend=b),
                          (t(1, 2, 4, 8), t(1, 2, 4, 6), t(1, 2, 4, 6))),
    }


def _eager_error(name, call, inputs):
    with pytest.raises((ValueError, TypeError)) as eager:
        call(name, *inputs)
    return eager


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("case", list(_bad_cases()))
def test_fake_invalid_arguments_raise_the_eager_error(name, case):
    call, inputs = _bad_cases()[case]
    eager = _eager_error(name, call, inputs)
    with FakeTensorMode() as mode:
        fake_inputs = [mode.from_tensor(t) for t in inputs]
        with pytest.raises(eager.type) as fake:
            call(name, *fake_inputs)
    assert str(fake.value) == str(eager.value)


# The custom ops themselves validate in their fake implementations: a traced call that bypasses the
# public API (or whose arguments only turn bad under tracing) fails with the eager message.
OP_BAD = {
    "gemm": (lambda t, b: (t(3, 4), t(5, 6), None, 1.0, 0.0, b),
             lambda t, b: blas.gemm(t(3, 4), t(5, 6), backend=b)),
    "gemv": (lambda t, b: (t(3, 4), t(3), None, 1.0, 0.0, b),
             lambda t, b: blas.gemv(t(3, 4), t(3), backend=b)),
    "dot": (lambda t, b: (t(3), t(4), b), lambda t, b: blas.dot(t(3), t(4), backend=b)),
    "axpby": (lambda t, b: (t(3), t(4), 1.0, 1.0, b), lambda t, b: blas.axpby(t(3), t(4), backend=b)),
    "softmax": (lambda t, b: (t(3, 4), 5, b), lambda t, b: blas.softmax(t(3, 4), 5, backend=b)),
    "linear": (lambda t, b: (t(3, 4), t(5, 6), None, "relu", b), lambda t, b: blas.linear(t(3, 4), t(5, 6), None,
                                                                                         "relu", backend=b)),
    "layer_norm": (lambda t, b: (t(3, 8), t(7), None, 1e-5, b),
                   lambda t, b: blas.layer_norm(t(3, 8), t(7), backend=b)),
    "add_rms_norm": (lambda t, b: (t(3, 8), t(3, 7), None, 1e-6, b),
                     lambda t, b: blas.add_rms_norm(t(3, 8), t(3, 7), backend=b)),
    "attention": (lambda t, b: (t(1, 3, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8), None, False, 0.5, b),
                  lambda t, b: blas.attention(t(1, 3, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8), scale=0.5, backend=b)),
}


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("op", list(OP_BAD))
def test_fake_impl_validates(name, op):
    make_args, eager_call = OP_BAD[op]
    with pytest.raises((ValueError, TypeError)) as eager:
        eager_call(lambda *s: torch.randn(*s, device=DEVICE), name)
    with FakeTensorMode() as mode:
        t = lambda *s: mode.from_tensor(torch.randn(*s, device=DEVICE))  # noqa: E731
        with pytest.raises(eager.type) as fake:
            getattr(kops, op)(*make_args(t, name))
    assert str(fake.value) == str(eager.value)


# ----------------------------------------------------------------------------- primitives' backward
def _primitive_call(op):
    """(inputs needing grad, call(backend, *inputs)) of a public primitive, float64."""
    t = lambda *s: torch.randn(*s, dtype=torch.float64, device=DEVICE).requires_grad_()  # noqa: E731
    tokens = torch.tensor([1, 3, 3], device=DEVICE)
    target = torch.tensor([1, 0, 6], device=DEVICE)
    return {
        "softmax": ((t(3, 5),), lambda b, x: blas.softmax(x, backend=b)),
        "log_softmax": ((t(3, 5),), lambda b, x: blas.log_softmax(x, backend=b)),
        "cross_entropy": ((t(3, 7),), lambda b, x: blas.cross_entropy(x, target, reduction="none", backend=b)),
        "linear": ((t(2, 3, 4), t(7, 4), t(7)), lambda b, x, w, bi: blas.linear(x, w, bi, "silu", backend=b)),
        "linear_swiglu": ((t(3, 4), t(6, 4), t(6, 4)), lambda b, x, wg, wu: blas.linear_swiglu(x, wg, wu, backend=b)),
        "linear_cross_entropy": ((t(3, 4), t(7, 4), t(7)), lambda b, x, w, bi: blas.linear_cross_entropy(
            x, w, target, bi, reduction="none", backend=b)),
        "layer_norm": ((t(3, 8), t(8), t(8)), lambda b, x, w, bi: blas.layer_norm(x, w, bi, backend=b)),
        "rms_norm": ((t(3, 8), t(8)), lambda b, x, w: blas.rms_norm(x, w, backend=b)),
        "add_layer_norm": ((t(3, 8), t(3, 8), t(8), t(8)),  # y and h stacked: one output
                           lambda b, x, r, w, bi: torch.stack(blas.add_layer_norm(x, r, w, bi, backend=b))),
        "add_rms_norm": ((t(3, 8), t(3, 8), t(8)),
                         lambda b, x, r, w: torch.stack(blas.add_rms_norm(x, r, w, backend=b))),
        "gelu": ((t(3, 5),), lambda b, x: blas.gelu(x, backend=b)),
        "silu": ((t(3, 5),), lambda b, x: blas.silu(x, backend=b)),
        "relu": ((t(3, 5),), lambda b, x: blas.relu(x, backend=b)),
        "swiglu": ((t(3, 5), t(3, 5)), lambda b, g, u: blas.swiglu(g, u, backend=b)),
        "embedding": ((t(6, 4),), lambda b, w: blas.embedding(tokens, w, backend=b)),
        "rope": ((t(3, 4),), lambda b, x: blas.rope(x, backend=b)),
        "attention": ((t(1, 2, 3, 4), t(1, 2, 3, 4), t(1, 2, 3, 4)),
                      lambda b, q, k, v: blas.attention(q, k, v, causal=True, backend=b)),
    }[op]


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("op", PRIMITIVES)
def test_second_derivative_raises(name, op, monkeypatch):
    """A kcourse backward is not differentiable: a clear error. Where the backend recorded the op with
    ATen's autograd, ATen's formulas hold: a second derivative, or ATen's error naming its kernel."""
    recorded = spy_aten_recorded(monkeypatch)
    inputs, call = _primitive_call(op)
    out = call(name, *inputs)
    v = torch.randn_like(out).requires_grad_()  # so that every first derivative is part of a graph
    grads = torch.autograd.grad(out, inputs, v, create_graph=True)
    assert all(g.requires_grad for g in grads)
    second = lambda: torch.autograd.grad(sum((g * torch.randn_like(g)).sum() for g in grads), [*inputs, v],  # noqa: E731
                                         allow_unused=True)
    if recorded:
        assert recorded == [(name, op)]
        try:
            second()
        except RuntimeError as e:
            assert re.match(r"derivative for aten::\w+ is not implemented", str(e)), e
        return
    with pytest.raises(NotImplementedError, match=f"^{op}: second derivatives are not implemented"):
        second()


@pytest.mark.parametrize("forward, ambient", [("python", "pytorch"), ("pytorch", "python")])
@pytest.mark.parametrize("op", PRIMITIVES)
def test_primitive_backward_runs_on_the_forward_backend(monkeypatch, op, forward, ambient):
    seen = []
    real = backend_module.backward_kernel
    monkeypatch.setattr(backend_module, "backward_kernel", lambda name, o: seen.append((name, o)) or real(name, o))
    recorded = spy_aten_recorded(monkeypatch)
    inputs, call = _primitive_call(op)
    with kcourse.use_backend(ambient):
        out = call(forward, *inputs)
        grads = torch.autograd.grad(out, inputs, torch.randn_like(out))
    # ATen's autograd runs ATen's backward kernels, of the pytorch backend, where that backend recorded the op
    assert seen == ([] if recorded == [(forward, op)] else [(forward, op)])
    assert all(g is not None and g.shape == x.shape for g, x in zip(grads, inputs))


@pytest.mark.parametrize("forward, ambient", [("python", "pytorch"), ("pytorch", "python")])
@pytest.mark.parametrize("op", ["gemm", "gemv", "geru", "dot", "axpby", "scal"])
def test_blas_pullback_runs_on_the_forward_backend(monkeypatch, op, forward, ambient):
    seen = []
    real = backend_module.resolve
    monkeypatch.setattr(backend_module, "resolve", lambda o, name=None: seen.append((o, name)) or real(o, name))
    t = lambda *s: torch.randn(*s, dtype=torch.float64, device=DEVICE).requires_grad_()  # noqa: E731
    inputs, call = {
        "gemm": ((t(3, 4), t(4, 5), t(5)), lambda b, A, B, C: blas.gemm(A, B, C, 1.5, 0.5, backend=b)),
        "gemv": ((t(3, 4), t(4), t(3)), lambda b, A, x, y: blas.gemv(A, x, y, 1.5, 0.5, backend=b)),
        "geru": ((t(3, 4), t(3), t(4)), lambda b, A, x, y: blas.geru(A, x, y, 1.5, backend=b)),
        "dot": ((t(5), t(5)), lambda b, x, y: blas.dot(x, y, backend=b)),
        "axpby": ((t(5), t(5)), lambda b, x, y: blas.axpby(x, y, 2.0, 3.0, backend=b)),
        "scal": ((t(5),), lambda b, x: blas.scal(x, 3.0, backend=b)),
    }[op]
    with kcourse.use_backend(ambient):
        out = call(forward, *inputs)
        seen.clear()
        grads = torch.autograd.grad(out, inputs, torch.randn_like(out))
    assert seen and all(name == forward for _, name in seen), seen
    assert all(g.shape == x.shape for g, x in zip(grads, inputs))


# ----------------------------------------------------------------------------- BLAS rules
ALL = ("python", "pytorch", "triton")


@pytest.mark.parametrize("name", ALL)
def test_alpha_zero_reads_no_operand(name):
    require_backend(name)
    nan = lambda *s: torch.full(s, float("nan"), device=DEVICE)  # noqa: E731
    C, y, A = torch.randn(3, 5, device=DEVICE), torch.randn(3, device=DEVICE), torch.randn(3, 4, device=DEVICE)
    same = dict(rtol=0, atol=0)
    torch.testing.assert_close(blas.gemm(nan(3, 4), nan(4, 5), C, 0.0, 2.0, backend=name), 2 * C, **same)
    torch.testing.assert_close(blas.gemm(nan(3, 4), nan(4, 5), None, 0.0, 0.0, backend=name), torch.zeros(3, 5, device=DEVICE), **same)
    torch.testing.assert_close(blas.gemm(nan(3, 4), nan(4, 5), nan(3, 5), 0.0, 0.0, backend=name),
                               torch.zeros(3, 5, device=DEVICE), **same)
    torch.testing.assert_close(blas.gemm(nan(2, 3, 4), nan(4, 5), C[0], 0.0, 0.5, backend=name),
                               (0.5 * C[0]).expand(2, 3, 5), **same)
    torch.testing.assert_close(blas.gemm_(nan(3, 4), nan(4, 5), C.clone(), 0.0, -1.0, backend=name), -C, **same)
    torch.testing.assert_close(blas.gemv(nan(3, 4), nan(4), y, 0.0, 3.0, backend=name), 3 * y, **same)
    torch.testing.assert_close(blas.gemv(nan(3, 4), nan(4), None, 0.0, 0.0, backend=name), torch.zeros(3, device=DEVICE), **same)
    torch.testing.assert_close(blas.gemv_(nan(3, 4), nan(4), y.clone(), 0.0, 0.0, backend=name), torch.zeros(3, device=DEVICE), **same)
    torch.testing.assert_close(blas.geru(A, nan(3), nan(4), 0.0, backend=name), A, **same)
    torch.testing.assert_close(blas.geru_(A.clone(), nan(3), nan(4), 0.0, backend=name), A, **same)


@pytest.mark.parametrize("name", ALL)
def test_gemm_batch_of_zero(name):
    require_backend(name)
    A = torch.randn(0, 3, 4, device=DEVICE, requires_grad=True)
    B = torch.randn(4, 5, device=DEVICE, requires_grad=True)
    C = torch.randn(5, device=DEVICE, requires_grad=True)
    out = blas.gemm(A, B, C, 1.0, 1.0, backend=name)
    assert out.shape == (0, 3, 5)
    out.sum().backward()
    assert A.grad.shape == (0, 3, 4)
    torch.testing.assert_close(B.grad, torch.zeros(4, 5, device=DEVICE), rtol=0, atol=0)
    torch.testing.assert_close(C.grad, torch.zeros(5, device=DEVICE), rtol=0, atol=0)
    # the other side: a shared A against a batch of 0
    A2 = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    B2 = torch.randn(0, 4, 5, device=DEVICE, requires_grad=True)
    out = blas.gemm(A2, B2, backend=name)
    assert out.shape == (0, 3, 5)
    (out * 2).sum().backward()
    torch.testing.assert_close(A2.grad, torch.zeros(3, 4, device=DEVICE), rtol=0, atol=0)
    assert B2.grad.shape == (0, 4, 5)
    A, B = A.detach(), B.detach()
    with FakeTensorMode() as mode:  # the fake implementation agrees
        fA, fB = mode.from_tensor(A), mode.from_tensor(B)
        assert blas.gemm(fA, fB, backend=name).shape == (0, 3, 5)


@pytest.mark.parametrize("name", ALL)
def test_gemm_batch_of_zero_full_C(name):
    require_backend(name)
    A, B = torch.randn(0, 3, 4, device=DEVICE), torch.randn(4, 5, device=DEVICE)
    target = torch.empty(0, 3, 5, device=DEVICE)
    assert blas.gemm_(A, B, target, 1.0, 0.0, backend=name) is target
    assert blas.gemm_(A, B, target, 1.0, 1.0, backend=name).shape == (0, 3, 5)
    assert blas.gemm(A, B, torch.randn(0, 3, 5, device=DEVICE), 1.0, 1.0, backend=name).shape == (0, 3, 5)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms_are_a_clear_error(transform):
    """torch.func transforms would reach kcourse ops without batching rules or functorch autograd:
    a NotImplementedError naming the op and what to use instead, not torch's internal message."""
    x = torch.randn(3, 4)
    f = {"grad": torch.func.grad(lambda x: blas.softmax(x, backend="pytorch").sum()),
         "vmap": torch.vmap(lambda x: blas.gelu(x, backend="pytorch"))}[transform]
    op = "softmax" if transform == "grad" else "gelu"
    with pytest.raises(NotImplementedError, match=f"^{op}: torch.func transforms .* not supported"):
        f(x)
