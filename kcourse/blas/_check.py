"""Argument validation shared by every backend: one place, run before any kernel writes anything.

Each ``check_<op>`` raises ``TypeError`` (wrong kind of argument, unsupported dtype) or
``ValueError`` (shapes, devices, aliasing) with a message that names the op, the argument and the
shapes, e.g. ``gemm: A is (3, 4) and B is (5, 6); A's columns (4) must equal B's rows (5)``.
They return what the caller needs (the output shape), never a modified tensor. An index out of
range (embedding's indices, cross_entropy's targets) is an ``IndexError``, as in torch, naming the
op, the argument, the bad entry and its value: on the host for CPU tensors, by a device assert in
the kernels on a GPU (``index_range``, ``assert_indices``). Meta tensors are refused by the
backends whose kernels read data (triton, cute).
"""
from __future__ import annotations

import numbers

import torch

from ..backend import triton_interpreting

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
DTYPES = {
    "python": FLOATS,
    "pytorch": FLOATS,
    "triton": (torch.float32, torch.float16, torch.bfloat16),
    "cute": (torch.float32, torch.float16, torch.bfloat16),
}


def shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def tensor(op: str, name: str, t, ndims: tuple[int, ...] | None = None) -> torch.Tensor:
    """``t`` must be a floating-point tensor with one of ``ndims`` dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{op}: {name} must be a floating-point tensor, got {t.dtype}")
    if ndims is not None and t.dim() not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{op}: {name} must be {want}, got {t.dim()}-D of shape {shape(t)}")
    return t


def scalar(op: str, name: str, value) -> float:
    """``value`` must be a real Python number (or a 0-d tensor holding one)."""
    if type(value) is float or type(value) is int:  # the common case, without the slower ABC check below
        return float(value)
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex():
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: {name} must be a real number, got {type(value).__name__}")
    return float(value)


def broadcasts_to(shape, out) -> bool:
    """Does a tensor of ``shape`` broadcast to exactly ``out``? (``torch.broadcast_shapes`` answers
    too, but costs several microseconds of Python per call, and gemm is called per layer.)"""
    return len(shape) <= len(out) and all(s in (1, o) for s, o in zip(reversed(shape), reversed(out)))


def same_kind(op: str, backend: str, **tensors: torch.Tensor | None) -> None:
    """All tensors share dtype and device, and ``backend`` supports both."""
    first_name = first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first_name, first, device = name, t, t.device
            continue
        if t.dtype != first.dtype:
            raise TypeError(f"{op}: {first_name} is {first.dtype} but {name} is {t.dtype}; "
                            "all tensors must share one dtype")
        if t.device != device:
            raise ValueError(f"{op}: {first_name} is on {device} but {name} is on {t.device}; "
                             "all tensors must be on one device")
    if first.dtype not in DTYPES[backend]:
        supported = ", ".join(str(d).replace("torch.", "") for d in DTYPES[backend])
        raise TypeError(f"{op}: the {backend} backend does not support {first.dtype} "
                        f"({first_name} {shape(first)}); it supports {supported}")
    on_gpu = device.type == "cuda"
    if device.type == "meta" and backend in ("triton", "cute"):
        raise ValueError(f"{op}: the {backend} backend cannot run on meta tensors ({first_name} {shape(first)} "
                         "is on meta: no data for a kernel to read); use the python or pytorch backend to "
                         "trace shapes")
    if backend == "triton" and not on_gpu and not triton_interpreting():
        raise ValueError(f"{op}: the triton backend needs CUDA tensors, but {first_name} is on "
                         f"{device}; move the tensors to a GPU or set TRITON_INTERPRET=1")
    if backend == "cute" and not on_gpu:
        raise ValueError(f"{op}: the cute backend needs CUDA tensors, but {first_name} is on {device}")


def same_shape(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{op}: {a_name} is {shape(a)} and {b_name} is {shape(b)}; they must have the same shape")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] byte addresses that ``t`` can touch."""
    start = t.data_ptr()
    last = start + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 1) * t.element_size()
    return start, last + t.element_size() - 1


def _overlaps_itself(t: torch.Tensor) -> bool:
    """True when two elements of ``t`` may share memory (broadcast or overlapping strides)."""
    dims = sorted((abs(st), s) for s, st in zip(t.shape, t.stride()) if s > 1)
    reach = 0  # largest offset reachable through the dims seen so far
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


# Overlap of two strided views. A byte of ``t`` lies at ``t.data_ptr() + sum_k i_k st_k e + b`` with
# 0 <= i_k < n_k and 0 <= b < e (e its element size, st_k its strides); the views share a byte when
#     sum_k i_k (st_k e) - sum_k j_k (so_k eo) + (b - b') = o.data_ptr() - t.data_ptr()
# has a solution with every variable in its range: a bounded linear equation in integers. Each term is
# (coefficient c > 0, lo, hi). Terms of equal coefficients merge (c x + c y = c (x + y), ranges add), and
# so does a term whose coefficient is k times a smaller one's when that one's range has at least k
# values (its multiples then fill every gap): a contiguous block or a row of whole elements becomes
# one range. Two terms left are solved exactly (a linear Diophantine equation: the solutions are
# x0 + w c2/g, y0 - w c1/g, and the bounds leave an interval of w); more are enumerated over the
# smallest range, pruned by the reachable [min, max], up to ``_OVERLAP_BUDGET`` steps.
# So the answer is exact for any two 1-D or 2-D views (at most 4 + 1 terms; in practice the merges
# leave two or three) unless the budget runs out, which only views of 3+ dims with distinct strides on
# both sides and long sizes can reach: then the views are reported as overlapping (a refusal, never a
# missed overlap).
_OVERLAP_BUDGET = 4096


def _merge_terms(terms: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``terms`` (c, lo, hi) with equal coefficients, and coefficients k times a smaller one whose range
    has >= k values, merged; sorted by coefficient."""
    merged: list[tuple[int, int, int]] = []
    for c, lo, hi in sorted(terms):
        if merged:
            c0, lo0, hi0 = merged[-1]
            if c % c0 == 0 and hi0 - lo0 + 1 >= c // c0:
                k = c // c0
                merged[-1] = (c0, lo0 + k * lo, hi0 + k * hi)
                continue
        merged.append((c, lo, hi))
    if len(merged) < len(terms):  # a merge can enable another (a wider range)
        return _merge_terms(merged)
    return merged


def _solve2(c1: int, lo1: int, hi1: int, c2: int, lo2: int, hi2: int, d: int) -> bool:
    """Is there x in [lo1, hi1], y in [lo2, hi2] with c1 x + c2 y = d (c1, c2 > 0)?"""
    g, p, q = _egcd(c1, c2)
    if d % g:
        return False
    x0, y0, a, b = p * (d // g), q * (d // g), c2 // g, c1 // g  # x = x0 + a w, y = y0 - b w
    w_lo = max(-((x0 - lo1) // a), -((hi2 - y0) // b))  # ceil((lo1 - x0) / a), ceil((y0 - hi2) / b)
    w_hi = min((hi1 - x0) // a, (y0 - lo2) // b)
    return w_lo <= w_hi


def _egcd(a: int, b: int) -> tuple[int, int, int]:
    """(g, p, q) with a p + b q = g = gcd(a, b)."""
    p0, q0, p1, q1 = 1, 0, 0, 1
    while b:
        k = a // b
        a, b, p0, q0, p1, q1 = b, a - k * b, p1, q1, p0 - k * p1, q0 - k * q1
    return a, p0, q0


def _solvable(terms: list[tuple[int, int, int]], d: int, budget: list[int]) -> bool:
    """Does ``sum c x = d`` have a solution with every x in its [lo, hi]? True also when the budget runs out."""
    budget[0] -= 1
    if sum(c * lo for c, lo, _ in terms) > d or sum(c * hi for c, _, hi in terms) < d:
        return False
    if not terms:
        return d == 0
    if len(terms) == 1:
        c, lo, hi = terms[0]
        return d % c == 0 and lo <= d // c <= hi
    if len(terms) == 2:
        return _solve2(*terms[0], *terms[1], d)
    i = min(range(len(terms)), key=lambda k: terms[k][2] - terms[k][1])  # enumerate the smallest range
    c, lo, hi = terms[i]
    rest = terms[:i] + terms[i + 1:]
    for x in range(lo, hi + 1):
        if budget[0] <= 0:
            return True  # out of budget: conservatively an overlap
        if _solvable(rest, d - c * x, budget):
            return True
    return False


def plain(t: torch.Tensor) -> bool:
    """Is ``t`` an eager tensor holding memory (not a meta, fake, functional or wrapped tensor)?"""
    return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and not t.is_meta


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do the views ``a`` and ``b`` share a byte of memory? Exact for 1-D and 2-D views (see above);
    beyond, possibly True for views that only interleave (never False for views that overlap).
    Tensors without addresses (meta tensors, and the fake tensors torch.compile traces with) are
    taken as disjoint: the eager call on real tensors makes the check. While torch.compile traces,
    addresses are unknown and views are taken as disjoint too; a compiled graph's in-place op checks
    its real target when it runs (``_library._checking_aliases``)."""
    if torch.compiler.is_compiling() or a.numel() == 0 or b.numel() == 0 or a.device != b.device \
            or not (plain(a) and plain(b)):
        return False
    lo, hi = _span(a)
    o_lo, o_hi = _span(b)
    if lo > o_hi or o_lo > hi:  # disjoint address ranges: the common case, decided at once
        return False
    ea, eb = a.element_size(), b.element_size()
    terms = [(st * ea, 0, n - 1) for n, st in zip(a.shape, a.stride()) if n > 1 and st]
    terms += [(st * eb, 1 - n, 0) for n, st in zip(b.shape, b.stride()) if n > 1 and st]  # -c j = c (-j)
    terms.append((1, 1 - eb, ea - 1))  # b - b': the bytes within one element of each
    return _solvable(_merge_terms(terms), b.data_ptr() - a.data_ptr(), [_OVERLAP_BUDGET])


def target(op: str, name: str, t: torch.Tensor, **inputs: torch.Tensor | None) -> None:
    """An in-place target must be writable element by element and share no memory with ``inputs``
    (two views of one buffer that interleave without sharing an element are fine: ``overlap``)."""
    if t.numel() == 0:
        return
    if _overlaps_itself(t):
        raise ValueError(f"{op}: the target {name} {shape(t)} with strides {t.stride()} has elements "
                         "that share memory (an expanded or overlapping view); it cannot be written in place")
    for other_name, other in inputs.items():
        if other is not None and overlap(t, other):
            raise ValueError(f"{op}: the target {name} {shape(t)} overlaps the input {other_name} "
                             f"{shape(other)} in memory; in-place targets must not alias an input")


# ----------------------------------------------------------------------------- per-op checks
# Each returns the output shape. `y`/`C` is the in-place target when `inplace` is true.

def check_copy(backend, x, y=None, *, inplace=False):
    op = "copy_" if inplace else "copy"
    tensor(op, "x", x)
    if inplace:
        tensor(op, "y", y)
        same_shape(op, "x", x, "y", y)
    same_kind(op, backend, x=x, y=y)
    if inplace:
        target(op, "y", y, x=x)
    return x.shape


def check_swap(backend, x, y, *, inplace=False):
    op = "swap_" if inplace else "swap"
    tensor(op, "x", x), tensor(op, "y", y)
    same_shape(op, "x", x, "y", y)
    same_kind(op, backend, x=x, y=y)
    if inplace:
        target(op, "x", x, y=y)
        target(op, "y", y)
    return x.shape


def check_scal(backend, x, alpha, *, inplace=False):
    op = "scal_" if inplace else "scal"
    tensor(op, "x", x)
    scalar(op, "alpha", alpha)
    same_kind(op, backend, x=x)
    if inplace:
        target(op, "x", x)
    return x.shape


def check_axpby(backend, x, y, alpha, beta, *, inplace=False):
    op = "axpby_" if inplace else "axpby"
    tensor(op, "x", x), tensor(op, "y", y)
    scalar(op, "alpha", alpha), scalar(op, "beta", beta)
    same_shape(op, "x", x, "y", y)
    same_kind(op, backend, x=x, y=y)
    if inplace:
        target(op, "y", y, x=x)
    return x.shape


def check_dot(backend, x, y):
    tensor("dot", "x", x, (1,)), tensor("dot", "y", y, (1,))
    if x.shape != y.shape:
        raise ValueError(f"dot: x is {shape(x)} and y is {shape(y)}; they must have the same length")
    same_kind("dot", backend, x=x, y=y)
    return ()


def check_gemv(backend, A, x, y, alpha, beta, *, inplace=False):
    op = "gemv_" if inplace else "gemv"
    tensor(op, "A", A, (2,)), tensor(op, "x", x, (1,))
    scalar(op, "alpha", alpha), scalar(op, "beta", beta)
    if inplace and y is None:
        raise TypeError(f"{op}: y is the in-place target and cannot be None")
    if y is not None:
        tensor(op, "y", y, (1,))
    m, n = A.shape
    if x.shape[0] != n:
        raise ValueError(f"{op}: A is {shape(A)} and x is {shape(x)}; A's columns ({n}) must equal x's length")
    if y is not None and y.shape[0] != m:
        raise ValueError(f"{op}: A is {shape(A)} and y is {shape(y)}; A's rows ({m}) must equal y's length")
    same_kind(op, backend, A=A, x=x, y=y)
    if inplace:
        target(op, "y", y, A=A, x=x)
    return (m,)


def check_geru(backend, A, x, y, alpha, *, inplace=False):
    op = "geru_" if inplace else "geru"
    tensor(op, "A", A, (2,)), tensor(op, "x", x, (1,)), tensor(op, "y", y, (1,))
    scalar(op, "alpha", alpha)
    m, n = A.shape
    if x.shape[0] != m:
        raise ValueError(f"{op}: A is {shape(A)} and x is {shape(x)}; A's rows ({m}) must equal x's length")
    if y.shape[0] != n:
        raise ValueError(f"{op}: A is {shape(A)} and y is {shape(y)}; A's columns ({n}) must equal y's length")
    same_kind(op, backend, A=A, x=x, y=y)
    if inplace:
        target(op, "A", A, x=x, y=y)
    return (m, n)


def check_gemm(backend, A, B, C, alpha, beta, *, inplace=False):
    """A (..., m, k) @ B (..., k, n) with 2-D or 3-D operands; the batch dims broadcast."""
    op = "gemm_" if inplace else "gemm"
    tensor(op, "A", A, (2, 3)), tensor(op, "B", B, (2, 3))
    scalar(op, "alpha", alpha), scalar(op, "beta", beta)
    if inplace and C is None:
        raise TypeError(f"{op}: C is the in-place target and cannot be None")
    if C is not None:
        tensor(op, "C", C)
    m, k = A.shape[-2:]
    k2, n = B.shape[-2:]
    if k != k2:
        raise ValueError(f"{op}: A is {shape(A)} and B is {shape(B)}; A's columns ({k}) must equal B's rows ({k2})")
    batch = ()
    if A.dim() == 3 or B.dim() == 3:
        ba = A.shape[0] if A.dim() == 3 else 1
        bb = B.shape[0] if B.dim() == 3 else 1
        if ba != bb and 1 not in (ba, bb):
            raise ValueError(f"{op}: A is {shape(A)} and B is {shape(B)}; their batch sizes ({ba}, {bb}) "
                             "must be equal or one of them 1")
        batch = (bb if ba == 1 else ba,)  # a batch of 1 broadcasts, to 0 as well (as torch.matmul)
    out = (*batch, m, n)
    if C is not None:
        if inplace and tuple(C.shape) != out:
            raise ValueError(f"{op}: A is {shape(A)}, B is {shape(B)} and C is {shape(C)}; "
                             f"the target C must be {out}")
        if not inplace:
            if not broadcasts_to(C.shape, out):
                raise ValueError(f"{op}: A is {shape(A)}, B is {shape(B)} and C is {shape(C)}; "
                                 f"C must broadcast to the output shape {out}")
    same_kind(op, backend, A=A, B=B, C=C)
    if inplace:
        target(op, "C", C, A=A, B=B)
    return out


# ----------------------------------------------------------------------------- transformer primitives
# Each returns the op's normalized parameters (a dict passed to the backend kernels).

def _dim(op: str, x: torch.Tensor, dim) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}: dim {dim} is out of range for x of shape {shape(x)}")
    return dim % x.dim()


def index_range(op: str, name: str, idx: torch.Tensor, n: int, what: str, ignore_index: int | None = None) -> None:
    """Every entry of ``idx`` (other than ``ignore_index``) must lie in [0, n): an ``IndexError`` naming
    the op, the argument, the first bad entry and its position, as torch raises for such an index.

    On the CPU (and through the triton interpreter) this reads the indices on the host: one pass,
    no copy. On a GPU that read would synchronize the host with the device on every call, so it is
    not done here: each backend's kernel checks its indices on the device instead (``assert_indices``
    a device assert of the same condition: the process learns of it as CUDA errors are learned, at
    the next synchronization; its message cannot carry the value)."""
    if idx.device.type != "cpu" or idx.numel() == 0 or type(idx) is not torch.Tensor or torch.compiler.is_compiling():
        return  # on a GPU: the kernels' device asserts; a fake or functional tensor (a trace) holds no values
    lo, hi = idx.aminmax()
    if lo >= 0 and hi < n:
        return
    bad = (idx < 0) | (idx >= n)
    if ignore_index is not None:
        bad &= idx != ignore_index
    if not bad.any():
        return
    where = tuple(int(i) for i in bad.nonzero()[0])
    at = "[" + ", ".join(str(i) for i in where) + "]"
    ignoring = "" if ignore_index is None else f" or ignore_index ({ignore_index})"
    raise IndexError(f"{op}: {name}{at} = {int(idx[where])} is out of range for {what}; "
                     f"{name} must be in [0, {n}){ignoring}")


def assert_indices(idx: torch.Tensor, n: int, ignore_index: int | None = None) -> None:
    """On a GPU: a device-side assert (``torch._assert_async``, no host synchronization) that every
    entry of ``idx`` other than ``ignore_index`` lies in [0, n); for backends whose kernels cannot
    assert themselves. Elsewhere nothing: ``index_range`` checked on the host. A few small kernels over
    the N indices (a min/max, then one comparison), next to the op's N * D or N * V elements."""
    if idx.device.type != "cuda" or idx.numel() == 0:
        return
    if ignore_index is not None and not 0 <= ignore_index < n:
        idx = idx.masked_fill(idx == ignore_index, 0)
    lo, hi = torch.aminmax(idx)
    torch._assert_async((lo >= 0) & (hi < n), "kcourse: an index is out of range (embedding or cross_entropy)")


def check_softmax(backend, x, dim, *, op="softmax"):
    tensor(op, "x", x)
    same_kind(op, backend, x=x)
    return {"dim": _dim(op, x, dim)}


def _targets(op: str, target, name: str, x: torch.Tensor, ignore_index, reduction) -> None:
    """``target``: class indices, one per row of the 2-D ``x`` (called ``name``), on x's device; a
    known reduction; an int ignore_index."""
    if not isinstance(target, torch.Tensor) or target.dtype not in (torch.int64, torch.int32):
        got = target.dtype if isinstance(target, torch.Tensor) else type(target).__name__
        raise TypeError(f"{op}: target must be an int64 or int32 tensor of class indices, got {got}")
    if target.shape != x.shape[:1]:
        raise ValueError(f"{op}: {name} is {shape(x)} and target is {shape(target)}; target must be "
                         f"({x.shape[0]},), one class index per row")
    if target.device != x.device:
        raise ValueError(f"{op}: {name} is on {x.device} but target is on {target.device}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")


def check_cross_entropy(backend, logits, target, ignore_index, reduction):
    op = "cross_entropy"
    tensor(op, "logits", logits, (2,))
    _targets(op, target, "logits", logits, ignore_index, reduction)
    if logits.shape[1] == 0:
        raise ValueError(f"{op}: logits is {shape(logits)}; it needs at least one class (V >= 1)")
    same_kind(op, backend, logits=logits)
    N, V = logits.shape
    index_range(op, "target", target, V, f"logits {shape(logits)} of {V} classes", ignore_index)
    return {"ignore_index": ignore_index, "reduction": reduction}


def check_linear_cross_entropy(backend, x, weight, target, bias, ignore_index, reduction):
    op = "linear_cross_entropy"
    tensor(op, "x", x, (2,))
    tensor(op, "weight", weight, (2,))
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"{op}: x is {shape(x)} and weight is {shape(weight)}; weight must be (V, {x.shape[1]}), "
                         "one row of x's width per class (torch.nn.Linear's layout)")
    if weight.shape[0] == 0:
        raise ValueError(f"{op}: weight is {shape(weight)}; it needs at least one class (V >= 1)")
    if bias is not None:
        tensor(op, "bias", bias, (1,))
        if bias.shape != weight.shape[:1]:
            raise ValueError(f"{op}: weight is {shape(weight)} and bias is {shape(bias)}; bias must be "
                             f"({weight.shape[0]},), one per class")
    _targets(op, target, "x", x, ignore_index, reduction)
    same_kind(op, backend, x=x, weight=weight, bias=bias)
    V = weight.shape[0]
    index_range(op, "target", target, V, f"weight {shape(weight)} of {V} classes", ignore_index)
    return {"ignore_index": ignore_index, "reduction": reduction}


ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu", "silu")


def check_linear(backend, x, weight, bias, activation):
    op = "linear"
    tensor(op, "x", x)
    tensor(op, "weight", weight, (2,))
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{op}: x is {shape(x)} and weight is {shape(weight)}; weight must be "
                         f"(N, {x.shape[-1]}), one row of x's last dimension per output (torch.nn.Linear's layout)")
    if bias is not None:
        tensor(op, "bias", bias, (1,))
        if bias.shape != weight.shape[:1]:
            raise ValueError(f"{op}: weight is {shape(weight)} and bias is {shape(bias)}; bias must be "
                             f"({weight.shape[0]},), one per output")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {', '.join(map(repr, ACTIVATIONS))} (or None), "
                         f"got {activation!r}")
    same_kind(op, backend, x=x, weight=weight, bias=bias)
    return {"activation": activation}


def check_linear_swiglu(backend, x, w_gate, w_up, b_gate, b_up):
    op = "linear_swiglu"
    tensor(op, "w_up", w_up, (2,))
    for name, w, b in (("w_gate", w_gate, b_gate), ("w_up", w_up, b_up)):
        try:
            check_linear(backend, x, w, b, "none")
        except ValueError as e:  # the same message, of this op and this weight
            raise ValueError(str(e).replace("linear: ", f"{op}: ", 1).replace("weight", name)) from None
    if w_up.shape != w_gate.shape:
        raise ValueError(f"{op}: w_gate is {shape(w_gate)} and w_up is {shape(w_up)}; they must have one shape")
    if (b_gate is None) != (b_up is None):
        raise ValueError(f"{op}: b_gate and b_up must both be given or both be None")
    same_kind(op, backend, x=x, w_gate=w_gate, w_up=w_up, b_gate=b_gate, b_up=b_up)
    return {}


def _norm_params(op, backend, x, eps, residual=None, **params):
    """eps, after the checks of a norm of x over its last dim: the (D,) parameters ``params`` (weight, bias;
    None or 1-D of D), and for the fused add + norms a ``residual`` of x's shape; one dtype and device."""
    tensor(op, "x", x)
    if residual is not None:
        tensor(op, "residual", residual)
        same_shape(op, "x", x, "residual", residual)
    if x.dim() == 0:
        raise ValueError(f"{op}: x must have at least one dimension, got a 0-d tensor")
    d = x.shape[-1]
    for name, p in params.items():
        if p is None:
            continue
        tensor(op, name, p, (1,))
        if p.shape[0] != d:
            raise ValueError(f"{op}: x is {shape(x)} and {name} is {shape(p)}; {name} must be ({d},), "
                             "the size of x's last dimension")
    same_kind(op, backend, x=x, residual=residual, **params)
    eps = scalar(op, "eps", eps)
    if not eps > 0:
        raise ValueError(f"{op}: eps must be positive, got {eps}")
    return {"eps": eps}


def check_layer_norm(backend, x, weight, bias, eps):
    return _norm_params("layer_norm", backend, x, eps, weight=weight, bias=bias)


def check_rms_norm(backend, x, weight, eps):
    return _norm_params("rms_norm", backend, x, eps, weight=weight)


def check_add_layer_norm(backend, x, residual, weight, bias, eps):
    tensor("add_layer_norm", "residual", residual)
    return _norm_params("add_layer_norm", backend, x, eps, residual, weight=weight, bias=bias)


def check_add_rms_norm(backend, x, residual, weight, eps):
    tensor("add_rms_norm", "residual", residual)
    return _norm_params("add_rms_norm", backend, x, eps, residual, weight=weight)


def check_activation(backend, op, x, **params):
    tensor(op, "x", x)
    same_kind(op, backend, x=x)
    if "approximate" in params and params["approximate"] not in ("none", "tanh"):
        raise ValueError(f"{op}: approximate must be 'none' or 'tanh', got {params['approximate']!r}")
    return params


def check_swiglu(backend, gate, up):
    tensor("swiglu", "gate", gate), tensor("swiglu", "up", up)
    same_shape("swiglu", "gate", gate, "up", up)
    same_kind("swiglu", backend, gate=gate, up=up)
    return {}


def check_embedding(backend, indices, weight):
    op = "embedding"
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int64, torch.int32):
        got = indices.dtype if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise TypeError(f"{op}: indices must be an int64 or int32 tensor, got {got}")
    tensor(op, "weight", weight, (2,))
    if indices.device != weight.device:
        raise ValueError(f"{op}: indices is on {indices.device} but weight is on {weight.device}")
    same_kind(op, backend, weight=weight)
    V = weight.shape[0]
    index_range(op, "indices", indices, V, f"weight {shape(weight)} of {V} rows")
    return {}


def check_rope(backend, x, base, positions):
    op = "rope"
    tensor(op, "x", x)
    if x.dim() < 2:
        raise ValueError(f"{op}: x must be (..., T, D), got shape {shape(x)}")
    T, D = x.shape[-2:]
    if D % 2:
        raise ValueError(f"{op}: x is {shape(x)}; its last dimension D = {D} must be even (two halves rotate)")
    base = scalar(op, "base", base)
    if not base > 0:
        raise ValueError(f"{op}: base must be positive, got {base}")
    if positions is not None:
        if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int64, torch.int32):
            got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise TypeError(f"{op}: positions must be an int64 or int32 tensor, got {got}")
        if positions.shape != (T,):
            raise ValueError(f"{op}: x is {shape(x)} and positions is {shape(positions)}; positions must be ({T},)")
        if positions.device != x.device:
            raise ValueError(f"{op}: x is on {x.device} but positions is on {positions.device}")
    same_kind(op, backend, x=x)
    return {"base": base}


def check_attention(backend, q, k, v, kv_len, causal, scale):
    op = "attention"
    tensor(op, "q", q, (4,)), tensor(op, "k", k, (4,)), tensor(op, "v", v, (4,))
    B, H, Tq, D = q.shape
    if kv_len is not None:
        if not isinstance(kv_len, torch.Tensor):
            raise TypeError(f"{op}: kv_len must be None or a torch.Tensor, got {type(kv_len).__name__}")
        if kv_len.dtype not in (torch.int32, torch.int64) or kv_len.shape != (B,):
            raise ValueError(f"{op}: kv_len is {kv_len.dtype} of shape {shape(kv_len)}; it must be int32 or int64 "
                             f"of shape (B,) = ({B},), one key count per batch row of q {shape(q)}")
        if kv_len.device != q.device:
            raise ValueError(f"{op}: kv_len is on {kv_len.device} and q on {q.device}; they must share a device")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k is {shape(k)} and v is {shape(v)}; they must have the same shape")
    Bk, Hkv, Tk, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"{op}: q is {shape(q)} and k is {shape(k)}; batch and head dim must match "
                         "(q (B, H, Tq, D), k and v (B, Hkv, Tk, D))")
    if D == 0:
        raise ValueError(f"{op}: q is {shape(q)}; the head dim D must be at least 1")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"{op}: q is {shape(q)} and k, v are {shape(k)}; q's heads ({H}) must be a multiple "
                         f"of k's and v's heads ({Hkv}) (q (B, H, Tq, D), k and v (B, Hkv, Tk, D))")
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    scale = D ** -0.5 if scale is None else scalar(op, "scale", scale)
    same_kind(op, backend, q=q, k=k, v=v)
    return {"causal": causal, "scale": scale}
