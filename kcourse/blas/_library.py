"""Every kcourse op as a ``torch.library`` custom op: ``torch.ops.kcourse.<op>(..., backend)``.

This is the one dispatch module: ``kcourse.blas`` (the public API) calls these ops, and the
autograd formulas registered here call them too. Each op is declared once, with

  - its implementation: the kernel of the backend named by its last argument, looked up by name
    (``kcourse.backend.resolve``); it runs on whichever device the tensors are on;
  - a fake implementation: the output's shape, dtype and strides, computed from the inputs'
    metadata alone, so ``torch.compile`` traces through the op without running it. It
    runs the same validation as the eager call, so a traced call with bad arguments fails alike;
  - an autograd formula whose backward runs on the forward's backend: for the BLAS ops a pullback
    composed of these same ops, for the transformer primitives the backend's backward kernel,
    itself a custom op (``torch.ops.kcourse.<op>_backward``);
  - an autocast rule: torch's own policy for the ATen op it stands for (``AUTOCAST``).

The backend is an argument, resolved before the op is called, so nothing traced reads a
ContextVar or imports a module, and a compiled graph records which backend runs each op.
Inductor's generated code calls each op's twin ``torch.ops.kcourse._<op>`` (``_inductor_fallbacks``):
the same schema, implementation and fake, without the op's Python autograd and autocast kernels,
which a compiled graph has applied already (three Python frames less a call).

The ``op_`` variants mutate their target (``Tensor(a!)`` in the schema) and return nothing; the
public ``kcourse.blas.<op>_`` returns the target. Outputs of the out-of-place ops are contiguous,
except those of the elementwise and softmax-like ops, laid out as their input where that is dense
(a permuted view), as ``torch.empty_like``, and attention's output and gradients, ordered as their
inputs order heads and tokens (``_layout.heads_like``): the fake implementations promise one layout
and the implementations keep it.

BLAS conventions kept on every backend, whatever the kernel underneath does: with ``beta == 0``
``C``/``y`` is not read (NaN there does not reach the result); with ``alpha == 0`` ``A``, ``B``,
``x`` and ``y`` are not read: the result is ``beta * C`` (zeros when ``beta == 0`` too), or ``A``
for ``geru``.
"""
from __future__ import annotations

import functools
import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from .. import backend as backends
from . import _cache, _check, _layout
from ._host import acc_dtype as _acc_dtype

LIB = torch.library.Library("kcourse", "DEF")
ops = torch.ops.kcourse


def _source_tag() -> str:
    """``kcourse-<hash>`` of the modules that decide what a compiled graph of kcourse ops holds (this
    one's schemas, fake implementations and autograd formulas, and the validation they run)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return f"kcourse-{digest.hexdigest()[:16]}"


def _tag_compile_caches() -> None:
    """Add ``_source_tag()`` to torch.compile's cache key (``torch.compiler.config.cache_key_tag``).
    Inductor's and AOTAutograd's on-disk caches key a graph on its ops' names, not on the Python code
    behind a custom op, so after a change of kcourse they would hand back a graph built on the old
    fake implementations: buffers of the old shapes or dtypes, read as the new kernels write them."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return
    tag = _source_tag()
    if tag not in config.cache_key_tag:
        config.cache_key_tag = f"{config.cache_key_tag}+{tag}" if config.cache_key_tag else tag


_tag_compile_caches()

# torch's autocast policy, per device, for the ATen op each kcourse op stands for:
#   "lower"   runs in the autocast dtype (mm, addmv, addr, scaled_dot_product_attention)
#   "fp32"    computes in float32 (softmax, log_softmax, nll_loss, layer_norm on CUDA)
#   "promote" runs in the widest floating dtype of its inputs (a residual add of a float32 stream
#             and a bfloat16 projection, as torch's type promotion gives for ``x + y``)
# Ops not listed (the activations, rope, embedding, copy, scal) run in their inputs' dtype.
# float64 tensors are never cast.
_PROMOTE = {"axpby": "promote", "dot": "promote", "swap": "promote", "swiglu": "promote"}
AUTOCAST = {
    "cuda": {"gemm": "lower", "gemv": "lower", "geru": "lower", "attention": "lower", "softmax": "fp32",
             "log_softmax": "fp32", "cross_entropy": "fp32", "layer_norm": "fp32", "rms_norm": "fp32",
             "add_layer_norm": "fp32", "add_rms_norm": "fp32", "linear": "lower", "linear_swiglu": "lower",
             "linear_cross_entropy": "lower", **_PROMOTE},
    "cpu": {"gemm": "lower", "attention": "lower", "cross_entropy": "fp32", "linear": "lower",
            "linear_swiglu": "lower", "linear_cross_entropy": "lower", "add_layer_norm": "promote", "add_rms_norm": "promote",
            **_PROMOTE},  # torch's CPU lists
}


def _cast(args: tuple, policy: str | None, device: str) -> tuple:
    """``args`` with their floating tensors on ``device`` cast as autocast ``policy`` says (float64 never).
    Runs on every call under autocast, twice for most (the public API's validation, then ``call``):
    one pass, and ``args`` itself when nothing needs a cast."""
    if policy is None:
        return args
    if policy == "lower":
        dtype = torch.get_autocast_dtype(device)
    elif policy == "fp32":
        dtype = torch.float32
    else:  # "promote": the widest floating dtype among them
        dtype = None
        for a in args:
            if isinstance(a, Tensor) and a.is_floating_point() and a.device.type == device:
                dtype = a.dtype if dtype is None else torch.promote_types(dtype, a.dtype)
        if dtype is None:
            return args
    cast = None
    for i, a in enumerate(args):
        if (isinstance(a, Tensor) and a.dtype != dtype and a.dtype != torch.float64 and a.is_floating_point()
                and a.device.type == device):
            if cast is None:
                cast = list(args)
            cast[i] = a.to(dtype)
    return args if cast is None else tuple(cast)


AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
# Inside an op autocast is off (its kernels choose their own precision), as for torch's own ops.
NO_AUTOCAST = {device: torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
               for device, key in AUTOCAST_KEYS.items()}


def autocast_kernel(name: str, device: str) -> Callable:
    """Op ``name``'s autocast kernel for ``device``'s autocast key: its arguments cast by the policy,
    then the op below autocast."""
    op, policy, excluded = getattr(ops, name).default, AUTOCAST[device].get(name), NO_AUTOCAST[device]

    def kernel(keyset, *args):
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return op(*_cast(args, policy, device))

    return kernel


def _register_autocast(name: str) -> None:
    for device, key in AUTOCAST_KEYS.items():
        LIB.impl(name, autocast_kernel(name, device), key, with_keyset=True)


IMPLS: dict[str, Callable] = {}  # op name -> its implementation (what torch.ops.kcourse.<op> runs)
# op name -> the apply of a torch.autograd.Function running it eagerly (``call``), taken below
# ``torch.autograd.Function.apply``'s Python layer, whose two jobs ``call`` does itself: it refuses
# functorch transforms and sends a dead functorch wrapper to the dispatcher
APPLY: dict[str, Callable] = {}


def _define(schema: str, impl: Callable, fake: Callable) -> str:
    name = schema[: schema.index("(")]
    LIB.define(schema)
    checked = _checking_aliases(name, impl)
    LIB.impl(name, checked, "CompositeExplicitAutograd")

    def traced(*args, **kwargs):  # the fake runs only while a graph is traced
        _inductor_fallbacks()
        return fake(*args, **kwargs)

    torch.library.register_fake(f"kcourse::{name}", traced, lib=LIB)
    _register_autocast(name)
    # its twin for inductor's generated code (_inductor_fallbacks): the same schema, implementation and
    # fake, no Python autograd or autocast layer; the graph it runs in has done both already
    LIB.define("_" + schema, tags=getattr(ops, name).default.tags)
    LIB.impl("_" + name, checked, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kcourse::_{name}", fake, lib=LIB)
    IMPLS[name] = impl
    return name


def _checking_aliases(name: str, impl: Callable) -> Callable:
    """``impl`` of an in-place op behind the check that its targets alias none of its other tensors,
    for calls through ``torch.ops.kcourse`` (a compiled graph at run time). The public API checks
    before calling eagerly, but a trace cannot read addresses (``_check.overlap``), and inductor may
    hand the kernel its real, overlapping target: refused here, as eagerly, not raced."""
    args = getattr(ops, name).default._schema.arguments
    written = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    if not written:
        return impl
    names = [a.name for a in args]

    def checked(*values):
        for i in written:
            others = {names[j]: v for j, v in enumerate(values) if j != i and isinstance(v, Tensor)}
            _check.target(name, names[i], values[i], **others)
        return impl(*values)

    return checked


_FALLBACKS = []  # [True] once every op has its inductor lowering


def _inductor_fallbacks() -> None:
    """Gives every kcourse op its inductor lowering, the extern call of the op that inductor makes
    for any custom op it meets, before inductor lowers a graph holding one. Left to inductor, torch
    2.11 first formats the op's arguments for an info log, eagerly, whether the log is on or not:
    each argument's IR node printed with its inputs, recursively, which in the backward graph of a
    12-layer GPT unfolds the whole graph into a tree (a first compiled step of minutes, not seconds).
    Called by the fake implementations, that is while a graph is traced, once inductor is loaded."""
    lowering = sys.modules.get("torch._inductor.lowering")
    if _FALLBACKS or lowering is None:
        return
    _FALLBACKS.append(True)
    from torch._library.utils import get_layout_constraint_tag
    for name in IMPLS:
        op, twin = getattr(ops, name).default, getattr(ops, "_" + name).default
        if op not in lowering.lowerings:  # the layout rule inductor would pick: the op's tag, else its default
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(twin, layout_constraint=constraint, warn=False)
            lowering.lowerings[op] = lowering.lowerings[twin]  # the generated code calls the twin


def _autocasting(args: tuple) -> str | None:
    """The device type of the first tensor in ``args`` if autocast is on for it, else None."""
    if not torch._C._is_any_autocast_enabled():  # the common case, one C call
        return None
    device = next((a.device.type for a in args if isinstance(a, Tensor)), None)
    return device if device in NO_AUTOCAST and torch.is_autocast_enabled(device) else None


def autocast_inputs(name: str, *tensors):
    """``tensors`` as op ``name`` receives them under the active autocast (unchanged without one):
    the public API validates these, so that mixed dtypes that autocast reconciles pass."""
    device = _autocasting(tensors)
    return tensors if device is None else _cast(tensors, AUTOCAST[device].get(name), device)


def call(name: str, *args):
    """Run op ``name``: what ``torch.ops.kcourse.<name>(*args)`` does, without its dispatch cost.

    Eagerly, on plain tensors with no torch dispatch mode active, the op's implementation runs
    directly, inside a ``torch.autograd.Function`` built from the same autograd formula when a
    gradient is wanted, with the same autocast rule: tens of microseconds of host time less per
    call than the dispatcher's Python autograd and autocast layers. Anything else (torch.compile
    tracing, fake or meta tensors, a TorchDispatchMode) goes through ``torch.ops.kcourse``, where
    PyTorch sees the op whole. Under a ``torch.func`` transform (grad, vmap, jacrev, ...), which
    kcourse ops do not support (no batching rules, no functorch autograd), a clear error."""
    if torch._C._are_functorch_transforms_active():
        raise NotImplementedError(f"{name}: torch.func transforms (grad, vmap, jacrev, ...) are not supported by "
                                  "kcourse ops; differentiate with torch.autograd (loss.backward(), "
                                  "torch.autograd.grad) and batch with a leading dimension")
    if _tracing():
        return getattr(ops, name)(*args)
    requires_grad = False
    for a in args:  # one pass: every tensor plain, and does any want a gradient?
        if isinstance(a, Tensor):
            if not _check.plain(a) or _functorch_wrapped(a):
                return getattr(ops, name)(*args)
            requires_grad = requires_grad or a.requires_grad
    device = _autocasting(args)
    if device is not None:
        with torch._C._ExcludeDispatchKeyGuard(NO_AUTOCAST[device]):
            return _run(name, _cast(args, AUTOCAST[device].get(name), device), requires_grad)
    return _run(name, args, requires_grad)


def _tracing() -> bool:
    """torch.compile tracing, or a TorchDispatchMode active."""
    return torch.compiler.is_compiling() or bool(torch._C._len_torch_dispatch_stack())


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor  # (a tensor left over from a transform)


def _run(name: str, args: tuple, requires_grad: bool):
    """The op's implementation, inside its autograd Function when a gradient is wanted; or, where the
    backend records the op with ATen's autograd (``backends.autograd_kernel``), that."""
    if requires_grad and torch.is_grad_enabled():
        composite = backends.autograd_kernel(args[-1], name)
        if composite is not None:
            out = composite(*args[:-1])
            if out is not None:
                return out
        apply = APPLY.get(name)
        if apply is not None:
            return apply(*args)
    return IMPLS[name](*args)


def kernel(op: str, backend: str) -> Callable:
    return backends.resolve(op, backend)[1]


def _new(like: Tensor, shape) -> Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


# ============================================================================= the BLAS ops
# Each ``_<op>_into`` writes its result into ``out`` (a new tensor, or the in-place target).

def _copy_into(x, backend, out):
    return kernel("copy", backend)(x, out) if x.numel() else out


def _swap_into(x, y, backend, out_x, out_y):
    return kernel("swap", backend)(x, y, out_x, out_y) if x.numel() else (out_x, out_y)


def _scal_into(x, alpha, backend, out):
    return kernel("scal", backend)(x, alpha, out) if x.numel() else out


def _axpby_into(x, y, alpha, beta, backend, out):
    return kernel("axpby", backend)(x, y if beta != 0 else None, alpha, beta, out) if x.numel() else out


def _beta_times(C, beta, backend, out):
    """``beta * C`` (C broadcast to ``out``), or zeros for ``beta == 0``: the BLAS answer when
    ``alpha == 0``, where the product's operands are not read."""
    if beta == 0 or C is None:
        return out.zero_()
    return _scal_into(C.expand(out.shape), beta, backend, out)


def _gemv_into(A, x, y, alpha, beta, backend, out):
    if not out.numel():
        return out
    if alpha == 0:
        return _beta_times(y, beta, backend, out)
    return kernel("gemv", backend)(A, x, y if beta != 0 else None, alpha, beta, out)


def _geru_into(A, x, y, alpha, backend, out):
    if not out.numel():
        return out
    if alpha == 0:
        return out if out is A else _copy_into(A, backend, out)
    return kernel("geru", backend)(A, x, y, alpha, out)


def gemm_shape(A: Tensor, B: Tensor) -> tuple[int, ...]:
    """The output shape of ``A @ B``: 2-D operands, or a broadcast batch (a 2-D operand, or one of
    batch 1, is shared: batch 1 against batch 0 is batch 0, as ``torch.matmul``)."""
    if A.dim() == B.dim() == 2:
        return (A.shape[0], B.shape[1])
    ba = A.shape[0] if A.dim() == 3 else 1
    bb = B.shape[0] if B.dim() == 3 else 1
    return (bb if ba == 1 else ba, A.shape[-2], B.shape[-1])


def _gemm_into(A, B, C, alpha, beta, backend, out):
    """Expand the operands to the output's rank (stride-0 views, no copies) and run the kernel."""
    if not out.numel():
        return out
    if alpha == 0:
        return _beta_times(C, beta, backend, out)
    if out.dim() == 3:
        A, B = A.expand(out.shape[0], *A.shape[-2:]), B.expand(out.shape[0], *B.shape[-2:])
    C = C.expand(out.shape) if C is not None and beta != 0 else None
    return kernel("gemm", backend)(A, B, C, alpha, beta, out)


def _copy(x, backend):
    return _copy_into(x, backend, _new(x, x.shape))


def _copy_(x, y, backend):
    _copy_into(x, backend, y)


def _swap(x, y, backend):
    return tuple(_swap_into(x, y, backend, _new(x, x.shape), _new(y, y.shape)))


def _swap_(x, y, backend):
    _swap_into(x, y, backend, x, y)


def _scal(x, alpha, backend):
    return _scal_into(x, alpha, backend, _new(x, x.shape))


def _scal_(x, alpha, backend):
    _scal_into(x, alpha, backend, x)


def _axpby(x, y, alpha, beta, backend):
    return _axpby_into(x, y, alpha, beta, backend, _new(x, x.shape))


def _axpby_(x, y, alpha, beta, backend):
    _axpby_into(x, y, alpha, beta, backend, y)


def _dot(x, y, backend):
    if not x.numel():
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return kernel("dot", backend)(x, y)


def _gemv(A, x, y, alpha, beta, backend):
    return _gemv_into(A, x, y, alpha, beta, backend, _new(A, A.shape[:1]))


def _gemv_(A, x, y, alpha, beta, backend):
    _gemv_into(A, x, y, alpha, beta, backend, y)


def _geru(A, x, y, alpha, backend):
    return _geru_into(A, x, y, alpha, backend, _new(A, A.shape))


def _geru_(A, x, y, alpha, backend):
    _geru_into(A, x, y, alpha, backend, A)


def _gemm(A, B, C, alpha, beta, backend):
    return _gemm_into(A, B, C, alpha, beta, backend, _new(A, gemm_shape(A, B)))


def _gemm_(A, B, C, alpha, beta, backend):
    _gemm_into(A, B, C, alpha, beta, backend, C)


def _nothing(*args):
    return None


def _validated(check: Callable, fake: Callable) -> Callable:
    """A fake implementation that first runs the eager call's validation."""
    def validated_fake(*args):
        check(*args)
        return fake(*args)
    return validated_fake


_define("copy(Tensor x, str backend) -> Tensor", _copy,
        _validated(lambda x, b: _check.check_copy(b, x), lambda x, b: x.new_empty(x.shape)))
_define("copy_(Tensor x, Tensor(a!) y, str backend) -> ()", _copy_, _nothing)
_define("swap(Tensor x, Tensor y, str backend) -> (Tensor, Tensor)", _swap,
        _validated(lambda x, y, b: _check.check_swap(b, x, y),
                   lambda x, y, b: (x.new_empty(x.shape), y.new_empty(y.shape))))
_define("swap_(Tensor(a!) x, Tensor(b!) y, str backend) -> ()", _swap_, _nothing)
_define("scal(Tensor x, float alpha, str backend) -> Tensor", _scal,
        _validated(lambda x, a, b: _check.check_scal(b, x, a), lambda x, a, b: x.new_empty(x.shape)))
_define("scal_(Tensor(a!) x, float alpha, str backend) -> ()", _scal_, _nothing)
_define("axpby(Tensor x, Tensor y, float alpha, float beta, str backend) -> Tensor", _axpby,
        _validated(lambda x, y, a, be, b: _check.check_axpby(b, x, y, a, be),
                   lambda x, y, a, be, b: x.new_empty(x.shape)))
_define("axpby_(Tensor x, Tensor(a!) y, float alpha, float beta, str backend) -> ()", _axpby_, _nothing)
_define("dot(Tensor x, Tensor y, str backend) -> Tensor", _dot,
        _validated(lambda x, y, b: _check.check_dot(b, x, y), lambda x, y, b: x.new_empty(())))
_define("gemv(Tensor A, Tensor x, Tensor? y, float alpha, float beta, str backend) -> Tensor", _gemv,
        _validated(lambda A, x, y, a, be, b: _check.check_gemv(b, A, x, y, a, be),
                   lambda A, x, y, a, be, b: A.new_empty(A.shape[:1])))
_define("gemv_(Tensor A, Tensor x, Tensor(a!) y, float alpha, float beta, str backend) -> ()", _gemv_, _nothing)
_define("geru(Tensor A, Tensor x, Tensor y, float alpha, str backend) -> Tensor", _geru,
        _validated(lambda A, x, y, a, b: _check.check_geru(b, A, x, y, a), lambda A, x, y, a, b: A.new_empty(A.shape)))
_define("geru_(Tensor(a!) A, Tensor x, Tensor y, float alpha, str backend) -> ()", _geru_, _nothing)
_define("gemm(Tensor A, Tensor B, Tensor? C, float alpha, float beta, str backend) -> Tensor", _gemm,
        _validated(lambda A, B, C, a, be, b: _check.check_gemm(b, A, B, C, a, be),
                   lambda A, B, C, a, be, b: A.new_empty(gemm_shape(A, B))))
_define("gemm_(Tensor A, Tensor B, Tensor(a!) C, float alpha, float beta, str backend) -> ()", _gemm_, _nothing)


# ----------------------------------------------------------------------------- their pullbacks
#
#     gemm  C = a A B + b C0   dA = a dC B^T (gemm)   dB = a A^T dC (gemm)   dC0 = b dC (scal)
#     gemv  y = a A x + b y0   dA = a dy x^T (geru)   dx = a A^T dy (gemv)   dy0 = b dy (scal)
#     geru  A = A0 + a x y^T   dA0 = dA               dx = a dA y (gemv)     dy = a dA^T x (gemv)
#     dot   z = x^T y          dx = dz y (gemm)       dy = dz x (gemm)   (k = 1: dz stays on the device)
#     axpby r = a x + b y      dx = a dr (scal)       dy = b dr (scal)
#
# Each pullback calls the ops above on the forward's backend, so under ``create_graph=True`` it is
# itself differentiable (double backward). What a training step does not pay for:
#   - validation: the operands are the forward's, and the gradient's shape, dtype and device were
#     matched to the output by autograd's engine;
#   - a copy of every weight gradient: a weight W (out, in) enters Linear as the view W.mT. Its
#     gradient A^T dC written row-major would reach W transposed, and autograd would copy it into
#     W's layout. So a gradient whose operand is such a view is computed transposed,
#     (a dC^T A)^T: one gemm, landing in W's own layout (``_product``);
#   - a scale by exactly 1 (a residual, a bias added with beta = 1): the gradient passes through;
#   - a fill of ones per bias gradient: ``_sum_to``'s ones are one cached element, broadcast;
#   - host synchronizations: none, so a whole step can be captured in a CUDA graph.


def _scaled(grad: Tensor, a: float, backend: str) -> Tensor:
    return grad if a == 1 else call("scal", grad, a, backend)


def _column_major(t: Tensor) -> bool:
    """Is ``t`` a transposed view of a row-major matrix (a weight ``W`` passed as ``W.mT``)?"""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1


def _product(X: Tensor, Y: Tensor, a: float, backend: str, like: Tensor) -> Tensor:
    """``a X Y`` (one gemm), laid out as ``like`` when that is a transposed view of the same shape."""
    if _column_major(like) and X.shape[:-2] == Y.shape[:-2] == like.shape[:-2]:
        return call("gemm", Y.mT, X.mT, None, a, 0.0, backend).mT
    return call("gemm", X, Y, None, a, 0.0, backend)


def _sum_to(grad: Tensor, shape, backend: str) -> Tensor:
    """Sum ``grad`` over the dimensions that broadcasting expanded from ``shape``: one gemv."""
    if grad.shape == shape:
        return grad
    lead = grad.dim() - len(shape)
    padded = (1,) * lead + tuple(shape)
    reduced = [d for d in range(grad.dim()) if padded[d] == 1 and grad.shape[d] != 1]
    kept = [d for d in range(grad.dim()) if d not in reduced]
    R, K = math.prod(grad.shape[d] for d in reduced), math.prod(grad.shape[d] for d in kept)
    rows = grad.permute(*reduced, *kept).reshape(R, K)  # (R, K)
    return call("gemv", rows.mT, _cache.ones(R, grad), None, 1.0, 0.0, backend).reshape(shape)  # (K, R) @ (R,)


def _register(name: str, setup: Callable, backward: Callable) -> None:
    """``setup``/``backward`` as op ``name``'s autograd formula, for torch.ops.kcourse and ``call``."""
    torch.library.register_autograd(f"kcourse::{name}", backward, setup_context=setup, lib=LIB)
    impl = IMPLS[name]

    def forward(ctx, *args):  # forward(ctx, ...) rather than setup_context: apply then binds no signature
        out = impl(*args)
        setup(ctx, args, out)
        ctx.private_extras = True  # ``call``'s caller, a kcourse.blas function, never returns the extras
        return tuple(out) if isinstance(out, list) else out

    listed = "-> Tensor[]" in str(getattr(ops, name).default._schema)
    function = type(f"{name}_function", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod((lambda ctx, *grads: backward(ctx, grads)) if listed else backward),
    })
    APPLY[name] = super(torch.autograd.Function, function).apply


def _setup_scalars(ctx, inputs, output):  # copy, swap, scal, axpby: no tensor saved
    ctx.inputs = [None if isinstance(t, Tensor) else t for t in inputs]


_register("copy", _setup_scalars, lambda ctx, dy: (dy, None))
_register("swap", _setup_scalars, lambda ctx, dx_new, dy_new: (dy_new, dx_new, None))  # x' = y, y' = x


def _scal_backward(ctx, dy):
    _, alpha, backend = ctx.inputs
    return _scaled(dy, alpha, backend), None, None


def _axpby_backward(ctx, dr):
    _, _, alpha, beta, backend = ctx.inputs
    dx = _scaled(dr, alpha, backend) if ctx.needs_input_grad[0] else None
    dy = _scaled(dr, beta, backend) if ctx.needs_input_grad[1] else None
    return dx, dy, None, None, None


_register("scal", _setup_scalars, _scal_backward)
_register("axpby", _setup_scalars, _axpby_backward)


def _setup_dot(ctx, inputs, output):
    x, y, ctx.backend = inputs
    ctx.save_for_backward(x, y)


def _dot_backward(ctx, dz):
    x, y = ctx.saved_tensors
    dz = dz.reshape(1, 1)
    dx = call("gemm", y[:, None], dz, None, 1.0, 0.0, ctx.backend)[:, 0] if ctx.needs_input_grad[0] else None
    dy = call("gemm", x[:, None], dz, None, 1.0, 0.0, ctx.backend)[:, 0] if ctx.needs_input_grad[1] else None
    return dx, dy, None


_register("dot", _setup_dot, _dot_backward)


def _setup_gemv(ctx, inputs, output):
    A, x, _, ctx.alpha, ctx.beta, ctx.backend = inputs
    ctx.save_for_backward(A, x)


def _gemv_backward(ctx, dy):
    A, x = ctx.saved_tensors
    a, b, be = ctx.alpha, ctx.beta, ctx.backend
    dA = call("geru", torch.zeros_like(A), dy, x, a, be) if ctx.needs_input_grad[0] else None  # (m, n)
    dx = call("gemv", A.mT, dy, None, a, 0.0, be) if ctx.needs_input_grad[1] else None  # (n, m) @ (m,)
    dy0 = _scaled(dy, b, be) if ctx.needs_input_grad[2] else None
    return dA, dx, dy0, None, None, None


_register("gemv", _setup_gemv, _gemv_backward)


def _setup_geru(ctx, inputs, output):
    _, x, y, ctx.alpha, ctx.backend = inputs
    ctx.save_for_backward(x, y)


def _geru_backward(ctx, dA):
    x, y = ctx.saved_tensors
    a, be = ctx.alpha, ctx.backend
    dx = call("gemv", dA, y, None, a, 0.0, be) if ctx.needs_input_grad[1] else None  # (m, n) @ (n,)
    dy = call("gemv", dA.mT, x, None, a, 0.0, be) if ctx.needs_input_grad[2] else None  # (n, m) @ (m,)
    return dA, dx, dy, None, None


_register("geru", _setup_geru, _geru_backward)


def _setup_gemm(ctx, inputs, output):
    A, B, C, ctx.alpha, ctx.beta, ctx.backend = inputs
    ctx.C_shape = None if C is None else C.shape
    ctx.save_for_backward(A, B)


def _shared(X: Tensor, dC: Tensor) -> bool:
    """Is operand ``X`` one matrix for the whole batch of ``dC`` (2-D, or a batch of 1 broadcast)?"""
    return dC.dim() == 3 and (X.dim() == 2 or X.shape[0] == 1 != dC.shape[0])


def _gemm_backward(ctx, dC):
    """dA = a dC B^T, dB = a A^T dC, dC0 = b dC, each summed over the batch where its operand was
    broadcast. An operand shared by the batch gets its gradient from one gemm over the stacked batch
    (float32 accumulation over every term, rounded once), not a sum of rounded per-batch products."""
    A, B = ctx.saved_tensors
    a, b, be = ctx.alpha, ctx.beta, ctx.backend
    dA = dB = dC0 = None
    if ctx.needs_input_grad[0]:
        if _shared(A, dC):  # one (m, b*n) @ (b*n, k) gemm
            (m, k), (bs, _, n) = A.shape[-2:], dC.shape
            dA = _product(dC.permute(1, 0, 2).reshape(m, bs * n), B.expand(bs, -1, -1).mT.reshape(bs * n, k),
                          a, be, like=A.reshape(m, k)).reshape(A.shape)
        else:
            dA = _sum_to(_product(dC, B.mT, a, be, like=A), A.shape, be)  # (.., m, n)(.., n, k)
    if ctx.needs_input_grad[1]:
        if _shared(B, dC):  # one (k, b*m) @ (b*m, n) gemm
            (k, n), rows = B.shape[-2:], dC.shape[0] * dC.shape[1]
            dB = _product(A.expand(dC.shape[0], -1, -1).reshape(rows, k).mT, dC.reshape(rows, n), a, be,
                          like=B.reshape(k, n)).reshape(B.shape)
        else:
            dB = _sum_to(_product(A.mT, dC, a, be, like=B), B.shape, be)  # (.., k, m)(.., m, n)
    if ctx.needs_input_grad[2]:
        dC0 = _sum_to(_scaled(dC, b, be), ctx.C_shape, be)
    return dA, dB, dC0, None, None, None


_register("gemm", _setup_gemm, _gemm_backward)


# ============================================================================= the transformer primitives
# A backend module exports ``<op>(*inputs, **params) -> (out, cache)`` and
# ``<op>_backward(dout, cache, needs, **params) -> grads`` (llm.c style). The custom op
# ``<op>(inputs, params, backend) -> [out, *extras]`` returns the output and the tensors the forward
# made for the backward (a norm's mean and rstd, a logsumexp), so that autograd can save them. The
# backward reads ``cache = (*saved, *extras)``, where ``saved`` names inputs and the output.
# An op of several differentiable outputs (``outs``: the fused add + norms' y and h) returns them as
# a tuple, ``((y, h), cache)``, and its backward kernel takes their gradients as one, ``(dy, dh)``,
# dh None when h's gradient is zero.


@dataclass(frozen=True)
class Primitive:
    inputs: str  # the tensor inputs, as in a schema
    params: str  # the parameters, as in a schema (the backend kernels' keyword arguments)
    check: Callable  # (backend, inputs, params) -> the eager call's validation
    out: Callable  # (*inputs, **params) -> the output (empty), as the fake implementation gives it
    saved: tuple[str, ...]  # what the backward reads first: input names and "out"
    extras: Callable = lambda *inputs, **params: []  # the forward's other tensors, empty
    grads: tuple = ("dout",)  # per input, where its gradient's shape comes from: "dout", "row"
    #                           (the last dim of dout), a name in ``saved``, or None (not differentiable)
    strided_dout: bool = False  # the backward kernels read dout through its strides, and a gradient of
    #                             dout's shape ("dout" in ``grads``) is laid out as dout (empty_like)
    outs: tuple[str, ...] = ("out",)  # the differentiable outputs, the first of dout's shape; names for ``saved``
    tied: tuple[tuple[int, int], ...] = ()  # (i, j): input i's gradient is input j's (x + residual: the same),
    #                                         computed once, as j's, and returned for both
    spends_cache: bool = False  # eagerly, the backward kernel may return its saved extras, overwritten
    #                             (``in_place=True``): no second copy of gradients the forward computed
    inference_only: tuple[str, ...] = ()  # inputs that, when given, leave the op without a backward
    #                                       (attention's kv_len): a gradient through it is refused
    heads: bool = False  # the output and each saved input's gradient are (B, H, T, D), laid out as that
    #                      input orders heads and tokens (``_layout.heads_like``: the output as q)

    @functools.cached_property  # read on every call: parsed once
    def input_names(self) -> list[str]:
        return [a.split()[-1] for a in self.inputs.split(",")]

    @functools.cached_property
    def param_names(self) -> list[str]:
        return [a.split()[-1] for a in self.params.split(",")] if self.params else []


def _row_stats(n: int):
    """Fake per-row statistics (N,) in the accumulation dtype, ``n`` of them."""
    def stats(x, *rest, **params):
        return [x.new_empty(math.prod(x.shape[:-1]), dtype=_acc_dtype(x)) for _ in range(n)]
    return stats


def _like(x, *rest, **params):
    """An output laid out as ``x`` where ``x`` is dense (permuted or not), else contiguous."""
    return torch.empty_like(x)


def _dense(x, *rest, **params):
    """A contiguous output of ``x``'s shape."""
    return x.new_empty(x.shape)


def _conform(out: Tensor, spec: "Primitive", inputs: tuple) -> Tensor:
    """``out`` in the layout the fake implementation promised (a copy only where a backend's
    kernel chose another one)."""
    if spec.out is _like:
        return _laid_out_as(out, inputs[0])
    if spec.heads:
        return _layout.laid_out_like_heads(out, inputs[0])
    return out.contiguous()


def _laid_out_as(out: Tensor, x: Tensor) -> Tensor:
    """``out`` (of ``x``'s shape) laid out as ``torch.empty_like(x)`` would be: itself, or a copy."""
    if x.is_contiguous() and out.is_contiguous():
        return out
    if out.stride() == torch.empty_like(x, device="meta").stride():
        return out
    return torch.empty_like(x).copy_(out)


def _heads_of_q(q, *rest, **params):
    """An output of q's shape, laid out as q orders its heads and tokens (``_layout.heads_like``)."""
    return _layout.heads_like(q)


def _loss(logits, target, ignore_index, reduction):
    return logits.new_empty(logits.shape[:1] if reduction == "none" else ())


def _embedded(indices, weight):
    return weight.new_empty((*indices.shape, weight.shape[1]))


def _attention_lse(q, k, v, kv_len, causal, scale):
    return [q.new_empty(q.shape[:3], dtype=_acc_dtype(q))]


def _head_loss(x, weight, target, bias, ignore_index, reduction, grads, float32_loss):
    dtype = torch.float32 if float32_loss and x.dtype != torch.float64 else x.dtype
    return x.new_empty(x.shape[:1] if reduction == "none" else (), dtype=dtype)


def _head_extras(x, weight, target, bias, ignore_index, reduction, grads, float32_loss):
    """linear_cross_entropy's cache beyond its inputs (``_host.linear_cross_entropy_ops``): the
    gradients for dout = 1 (each in its input's dtype) and n_valid when the forward computes them,
    else each row's lse."""
    if grads and reduction != "none":
        return [x.new_empty(x.shape), weight.new_empty(weight.shape),
                *([bias.new_empty(bias.shape)] if bias is not None else []), x.new_empty((), dtype=_acc_dtype(x))]
    return [x.new_empty(x.shape[:1], dtype=_acc_dtype(x))]


def _linear_out(x, weight, *rest, **params):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_extras(x, weight, bias, activation):
    """The pre-activation z = x W^T + b as rows (M, N), where an activation's backward reads it."""
    return [] if activation == "none" else [x.new_empty((math.prod(x.shape[:-1]), weight.shape[0]))]


def _swiglu_extras(x, w_gate, *rest):
    """The gate's and the up projection's outputs g and u as rows (M, F), which the backward reads."""
    return [x.new_empty((math.prod(x.shape[:-1]), w_gate.shape[0])) for _ in range(2)]


def _dense_pair(x, *rest, **params):
    """Two contiguous outputs of ``x``'s shape (the fused add + norms' y and h)."""
    return x.new_empty(x.shape), x.new_empty(x.shape)


PRIMITIVES: dict[str, Primitive] = {
    "softmax": Primitive("Tensor x", "int dim", lambda b, x, p: _check.check_softmax(b, x, p["dim"]),
                         _like, saved=("out",)),
    "log_softmax": Primitive("Tensor x", "int dim",
                             lambda b, x, p: _check.check_softmax(b, x, p["dim"], op="log_softmax"),
                             _like, saved=("out",)),
    "cross_entropy": Primitive("Tensor logits, Tensor target", "int ignore_index, str reduction",
                               lambda b, x, t, p: _check.check_cross_entropy(b, x, t, **p), _loss,
                               saved=("logits", "target"), extras=_row_stats(1),
                               grads=("logits", None)),
    "layer_norm": Primitive("Tensor x, Tensor? weight, Tensor? bias", "float eps",
                            lambda b, x, w, bi, p: _check.check_layer_norm(b, x, w, bi, **p), _dense,
                            saved=("x", "weight"), extras=_row_stats(2), grads=("dout", "row", "row")),
    "rms_norm": Primitive("Tensor x, Tensor? weight", "float eps",
                          lambda b, x, w, p: _check.check_rms_norm(b, x, w, **p), _dense,
                          saved=("x", "weight"), extras=_row_stats(1), grads=("dout", "row")),
    "add_layer_norm": Primitive("Tensor x, Tensor residual, Tensor? weight, Tensor? bias", "float eps",
                                lambda b, x, r, w, bi, p: _check.check_add_layer_norm(b, x, r, w, bi, **p),
                                _dense_pair, saved=("h", "weight"), extras=_row_stats(2),
                                grads=("dout", "dout", "row", "row"), outs=("y", "h"), tied=((1, 0),)),
    "add_rms_norm": Primitive("Tensor x, Tensor residual, Tensor? weight", "float eps",
                              lambda b, x, r, w, p: _check.check_add_rms_norm(b, x, r, w, **p),
                              _dense_pair, saved=("h", "weight"), extras=_row_stats(1),
                              grads=("dout", "dout", "row"), outs=("y", "h"), tied=((1, 0),)),
    "linear": Primitive("Tensor x, Tensor weight, Tensor? bias", "str activation",
                        lambda b, x, w, bi, p: _check.check_linear(b, x, w, bi, p["activation"]), _linear_out,
                        saved=("x", "weight"), extras=_linear_extras, grads=("x", "weight", "row"),
                        spends_cache=True),
    "linear_swiglu": Primitive("Tensor x, Tensor w_gate, Tensor w_up, Tensor? b_gate, Tensor? b_up", "",
                               lambda b, x, wg, wu, bg, bu, p: _check.check_linear_swiglu(b, x, wg, wu, bg, bu),
                               _linear_out, saved=("x", "w_gate", "w_up"), extras=_swiglu_extras,
                               grads=("x", "w_gate", "w_up", "row", "row"), spends_cache=True),
    "linear_cross_entropy": Primitive("Tensor x, Tensor weight, Tensor target, Tensor? bias",
                                      "int ignore_index, str reduction, bool grads, bool float32_loss",
                                      lambda b, x, w, t, bi, p: _check.check_linear_cross_entropy(
                                          b, x, w, t, bi, p["ignore_index"], p["reduction"]),
                                      _head_loss, saved=("x", "weight", "target", "bias"), extras=_head_extras,
                                      grads=("x", "weight", None, "bias"), spends_cache=True),
    "gelu": Primitive("Tensor x", "str approximate",
                      lambda b, x, p: _check.check_activation(b, "gelu", x, **p), _like, saved=("x",)),
    "silu": Primitive("Tensor x", "", lambda b, x, p: _check.check_activation(b, "silu", x), _like, saved=("x",)),
    "relu": Primitive("Tensor x", "", lambda b, x, p: _check.check_activation(b, "relu", x), _like, saved=("x",)),
    "swiglu": Primitive("Tensor gate, Tensor up", "", lambda b, g, u, p: _check.check_swiglu(b, g, u), _like,
                        saved=("gate", "up"), grads=("dout", "dout")),
    "embedding": Primitive("Tensor indices, Tensor weight", "",
                           lambda b, i, w, p: _check.check_embedding(b, i, w), _embedded,
                           saved=("indices", "weight"), grads=(None, "weight")),
    "rope": Primitive("Tensor x, Tensor? positions", "float base",
                      lambda b, x, pos, p: _check.check_rope(b, x, p["base"], pos), _like,
                      saved=("positions",), grads=("dout", None), strided_dout=True),
    "attention": Primitive("Tensor q, Tensor k, Tensor v, Tensor? kv_len", "bool causal, float scale",
                           lambda b, q, k, v, kv_len, p: _check.check_attention(b, q, k, v, kv_len, **p),
                           _heads_of_q, saved=("q", "k", "v", "out"), extras=_attention_lse,
                           grads=("q", "k", "v", None), strided_dout=True, inference_only=("kv_len",), heads=True),
}



def _kept_lse(q, k, v, kv_len, causal, scale):
    """The pytorch backend's attention keeps the lse of ATen's flash kernel where it calls that
    kernel itself (``keeps_lse``), else an empty one (its backward then recomputes the forward)."""
    from .pytorch.attention import keeps_lse
    if keeps_lse(q, k, v, kv_len, causal, scale):
        return _attention_lse(q, k, v, kv_len, causal, scale)
    return [q.new_empty((0,), dtype=torch.float32)]


def _lse_and_log_probs(logits, target, ignore_index, reduction):
    """The pytorch backend's cross_entropy keeps each row's lse and the (N, V) log-probabilities."""
    from .pytorch.cross_entropy import log_probs_like
    return [*_row_stats(1)(logits), log_probs_like(logits)]


EXTRAS_BY_BACKEND = {("attention", "pytorch"): _kept_lse,  # (op, backend) -> its own ``extras``
                     ("cross_entropy", "pytorch"): _lse_and_log_probs}


def _split(spec: Primitive, args: tuple) -> tuple[tuple, dict, str]:
    n = len(spec.input_names)
    return args[:n], dict(zip(spec.param_names, args[n:-1])), args[-1]


def _define_primitive(op: str, spec: Primitive) -> None:
    params = f"{spec.params}, " if spec.params else ""

    k = len(spec.outs)  # the differentiable outputs; the extras follow them
    saved = len(spec.saved)

    def forward(*args):
        inputs, p, backend = _split(spec, args)
        out, cache = kernel(op, backend)(*inputs, **p)
        result = [_conform(out, spec, inputs)] if k == 1 else [_conform(o, spec, inputs) for o in out]
        if len(cache) > saved:  # the extras (attention's lse, a fused op's cached activations)
            result += [t.contiguous() for t in cache[saved:]]
        return result

    def forward_fake(*args):
        inputs, p, backend = _split(spec, args)
        spec.check(backend, *inputs, p)
        extras = EXTRAS_BY_BACKEND.get((op, backend), spec.extras)(*inputs, **p)
        out = spec.out(*inputs, **p)
        return [*(out if k > 1 else (out,)), *extras]

    _define(f"{op}({spec.inputs}, {params}str backend) -> Tensor[]", forward, forward_fake)

    def kernel_needs(needs) -> list:
        """``needs`` with each tied input's gradient asked of the input it is tied to."""
        needs = list(needs)
        for i, j in spec.tied:
            needs[j], needs[i] = needs[j] or needs[i], False
        return needs

    def backward(dout, *rest, in_place=False):
        douts, (saved, needs, *args) = rest[:k - 1], rest[k - 1:]
        p, backend = dict(zip(spec.param_names, args[:-1])), args[-1]
        needs = kernel_needs(needs)
        grads = backends.backward_kernel(backend, op)((dout, *douts) if k > 1 else dout, tuple(saved), tuple(needs),
                                                      **p, **({"in_place": True} if in_place else {}))
        if spec.heads:  # each gradient laid out as its input
            named = dict(zip(spec.saved, saved))
            return [_layout.laid_out_like_heads(g, named[where]) for g, where, need in zip(grads, spec.grads, needs)
                    if need]
        return [_laid_out_as(g, dout) if spec.strided_dout and where == "dout" else g.contiguous()
                for g, where, need in zip(grads, spec.grads, needs) if need]

    def backward_fake(dout, *rest):
        saved, needs, *args = rest[k - 1:]
        named = dict(zip(spec.saved, saved))
        shapes = {"dout": dout.shape, "row": dout.shape[-1:]}
        # a gradient has its input's dtype: dout's for "dout" and "row" (whose inputs have the output's
        # dtype), the saved input's own otherwise (linear_cross_entropy's float32 loss under autocast
        # has bf16 inputs: inductor allocates and reads each buffer as this says)
        return [torch.empty_like(dout) if spec.strided_dout and g == "dout"
                else dout.new_empty(shapes[g]) if g in shapes
                else _layout.heads_like(named[g]) if spec.heads else named[g].new_empty(named[g].shape)
                for g, need in zip(spec.grads, kernel_needs(needs)) if need]

    more = "".join(f"Tensor? d{name}, " for name in spec.outs[1:])  # the other outputs' gradients (None: zero)
    _define(f"{op}_backward(Tensor dout, {more}Tensor?[] saved, bool[] needs, {params}str backend) -> Tensor[]",
            backward, backward_fake)

    n = len(spec.input_names)
    position = {name: i for i, name in enumerate((*spec.input_names, *spec.outs))}  # in (*inputs, *outputs)
    at = [position[name] for name in spec.saved]  # what the backward reads first, in (*inputs, *outputs)
    refused_at = [(name, position[name]) for name in spec.inference_only]

    def setup(ctx, inputs, output):
        # runs on every call that wants a gradient: the positions are worked out once (``at``)
        tensors = (*inputs[:n], *output)
        ctx.n, ctx.args = n, inputs[n:]
        ctx.refused = [name for name, i in refused_at if tensors[i] is not None]
        extras = output[k:]
        ctx.save_for_backward(*(tensors[i] for i in at), *extras)
        if extras:
            ctx.mark_non_differentiable(*extras)
        ctx.set_materialize_grads(False)  # no zeros made for the extras' gradients

    def pullback(ctx, grads):
        needs = list(ctx.needs_input_grad[:ctx.n])
        rest = [None] * len(ctx.args)
        if not any(needs) or all(g is None for g in grads[:k]):
            return (*[None] * ctx.n, *rest)
        if ctx.refused:
            raise ValueError(f"{op}: a call with {ctx.refused[0]} has no backward (inference only); differentiate "
                             f"a call without {ctx.refused[0]}")
        dout = grads[0] if grads[0] is not None else torch.zeros_like(grads[1])  # only h used: the norm's is 0
        dout = dout if spec.strided_dout else dout.contiguous()
        more = [None if g is None else g.contiguous() for g in grads[1:k]]
        args = (dout, *more, list(ctx.saved_tensors), needs, *ctx.args)
        # Eagerly (the forward ran through ``call``'s Function, so what it saved is plain; the incoming
        # gradients plain too), without create_graph or autocast, the backward kernel runs directly:
        # ``call`` would find the same and run it, a few microseconds later. Otherwise the backward op,
        # through ``call``: with create_graph it is recorded (its own backward refuses second
        # derivatives), and under autocast it runs with autocast off, as every kcourse op. Only run
        # directly may a backward spend its cache (torch.ops keeps its outputs, torch.compile's graphs
        # are functional), and only under ``call``, whose caller never sees the extras.
        direct = (getattr(ctx, "private_extras", False) and not torch.is_grad_enabled() and not _tracing()
                  and not torch._C._is_any_autocast_enabled()
                  and all(g is None or _check.plain(g) for g in (dout, *more)))
        got = iter(backward(*args, in_place=spec.spends_cache) if direct else call(f"{op}_backward", *args))
        result = [next(got) if need else None for need in kernel_needs(needs)]
        for i, j in spec.tied:
            result[i] = result[j] if needs[i] else None
            result[j] = result[j] if needs[j] else None
        return (*result, *rest)

    _register(op, setup, pullback)

    def no_second_derivative(ctx, *grads):
        raise NotImplementedError(f"{op}: second derivatives are not implemented (the backward kernels are not "
                                  "differentiable); compute first derivatives only")

    _register(f"{op}_backward", lambda ctx, inputs, output: None, no_second_derivative)


for _op, _spec in PRIMITIVES.items():
    _define_primitive(_op, _spec)
