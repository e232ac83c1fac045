"""Every cute kernel of the pointwise primitives (gelu, silu, relu, swiglu), embedding and rope
compiles (for sm_90a where there is no GPU), forward and backward, in the variant a GPU call with
the same layouts would take: each case calls the cute op on CPU tensors inside
``_compile.compiling_only()`` and checks which kernels (factory and key) were compiled. Whether the
kernels compute the right thing is tests/test_<op>.py's job, on a GPU."""
import importlib

import pytest
import torch

pytest.importorskip("cutlass", reason="the CuTe DSL is not installed (pip install -e '.[cute]')")

from kcourse.blas.cute import _compile  # noqa: E402
from _cute import DTYPES, compiled_kernels, t  # noqa: E402

WIDEST = {torch.float32: 4, torch.float16: 8, torch.bfloat16: 8}  # elements in 16 bytes


@pytest.fixture
def compiled(monkeypatch) -> list:
    return compiled_kernels(monkeypatch)


def op(name):
    return importlib.import_module(f"kcourse.blas.cute.{name}")


# ----------------------------------------------------------------------------- activations

def activation_calls(x, y, dy):
    """(name, call) for every forward and backward kernel of the four activations; x, y inputs, dy a seed."""
    gelu, silu, relu, swiglu = (op(n) for n in ("gelu", "silu", "relu", "swiglu"))
    calls = []
    for approximate in ("none", "tanh"):
        calls.append((f"gelu {approximate}", lambda a=approximate: gelu.gelu(x, a)))
        calls.append((f"gelu {approximate} backward",
                      lambda a=approximate: gelu.gelu_backward(dy, (x,), (True,), a)))
    calls += [
        ("silu", lambda: silu.silu(x)), ("silu backward", lambda: silu.silu_backward(dy, (x,), (True,))),
        ("relu", lambda: relu.relu(x)), ("relu backward", lambda: relu.relu_backward(dy, (x,), (True,))),
        ("swiglu", lambda: swiglu.swiglu(x, y)),
    ]
    for needs in ((True, True), (True, False), (False, True)):
        calls.append((f"swiglu backward {needs}", lambda n=needs: swiglu.swiglu_backward(dy, (x, y), n)))
    return calls


def elementwise_keys(compiled):
    return [key for name, key in compiled if name == "elementwise_kernel"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_activations_compile_contiguous(compiled, dtype):
    # contiguous operands: one dim, 128-bit vectors, for each of the 12 kernels
    x, y, dy = (t(37, 41, dtype=dtype) for _ in range(3))
    for name, call in activation_calls(x, y, dy):
        before = len(compiled)
        with _compile.compiling_only():
            call()
        keys = elementwise_keys(compiled[before:])
        assert len(keys) == 1, (name, compiled[before:])
        _, key_dtype, rank, vec, unit_inner = keys[0]
        assert (key_dtype, rank, vec, unit_inner) == (dtype, 1, WIDEST[dtype], True), (name, keys[0])
    assert len({key[0] for key in elementwise_keys(compiled)}) == 12  # 12 distinct declarations


@pytest.mark.parametrize("layout, rank, vec", [("transposed", 2, 1), ("strided", 1, 1), ("misaligned", 1, 1)])
def test_activations_compile_other_layouts(compiled, layout, rank, vec):
    # x (and y) in another layout, dy contiguous: the backward kernels see mixed strides. Transposed
    # next to row-major: two dims, element by element; every other element (x[..., ::2], and its
    # contiguous empty_like): one dim of strides 2 and 1; misaligned by 2 bytes: element by element
    dtype = torch.bfloat16
    x, y, dy = t(37, 41, dtype=dtype, layout=layout), t(37, 41, dtype=dtype, layout=layout), t(37, 41, dtype=dtype)
    for name, call in activation_calls(x, y, dy):
        if layout == "transposed" and "backward" not in name:
            continue  # x.mT and its empty_like output merge into one dense dim: the contiguous kernel
        before = len(compiled)
        with _compile.compiling_only():
            call()
        keys = elementwise_keys(compiled[before:])
        assert len(keys) == 1 and keys[0][2:4] == (rank, vec), (name, keys)


def test_activations_reject_unmergeable_layouts(compiled):
    # 5 dims that cannot merge (a permuted x next to a row-major dy): the shared strided_layout
    # error, raised before any kernel
    x, dy = torch.zeros(3, 4, 5, 6, 7).permute(4, 2, 0, 3, 1), torch.zeros(7, 5, 3, 6, 4)
    with _compile.compiling_only(), pytest.raises(ValueError, match="gelu: the kernel indexes at most 4 dims"):
        op("gelu").gelu_backward(dy, (x,), (True,), "none")
    assert compiled == []


def test_activation_kernel_is_reused(compiled):
    with _compile.compiling_only():
        op("silu").silu(torch.zeros(1000))
        before = dict(_compile.COMPILE_SECONDS)
        op("silu").silu(torch.zeros(5000))  # another size, same shape class
    assert _compile.COMPILE_SECONDS == before


# ----------------------------------------------------------------------------- embedding

@pytest.mark.parametrize("index_dtype", (torch.int64, torch.int32), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embedding_compiles(compiled, dtype, index_dtype):
    V, D = 50, 1024
    weight, idx = t(V, D, dtype=dtype), torch.zeros(4, 9, dtype=index_dtype)
    embedding = op("embedding")
    with _compile.compiling_only():
        out, cache = embedding.embedding(idx, weight)
        embedding.embedding_backward(t(4, 9, D, dtype=dtype), cache, (False, True))
    assert out.shape == (4, 9, D)
    vec = WIDEST[dtype]
    red = min(vec, 4)  # float32 per red.global.add.v4 (sm_90a)
    assert compiled == [("gather_kernel", (dtype, index_dtype, vec, 32)),
                        ("scatter_add_kernel", (dtype, index_dtype, vec, red, 32))]


@pytest.mark.parametrize("weight_layout, D, vec, lanes", [
    ("transposed", 33, 1, 32),  # column stride V: element by element, through both strides
    ("strided", 40, 1, 32),  # column stride 2
    ("contiguous", 7, 1, 8),  # a short odd row: 8 lanes per token, 32 tokens per warp step
    ("contiguous", 6, 2, 4),  # 64-bit float32 vectors
])
def test_embedding_compiles_other_layouts(compiled, weight_layout, D, vec, lanes):
    dtype = torch.float32
    weight = t(10, D, dtype=dtype, layout=weight_layout)
    idx = torch.zeros(3, 14, dtype=torch.int64)[:, ::2]  # strided indices: a copy-free view
    embedding = op("embedding")
    with _compile.compiling_only():
        _, cache = embedding.embedding(idx, weight)
        embedding.embedding_backward(t(3, 7, D, dtype=dtype), cache, (False, True))
    gather = [key for name, key in compiled if name == "gather_kernel"]
    scatter = [key for name, key in compiled if name == "scatter_add_kernel"]
    assert gather == [(dtype, torch.int64, vec, lanes)], gather
    dout_vec = 4 if D % 4 == 0 else 2 if D % 2 == 0 else 1  # dout is contiguous whatever weight's layout
    assert len(scatter) == 1 and scatter[0][2] == dout_vec, scatter


def test_embedding_empty_compiles_nothing(compiled):
    embedding = op("embedding")
    with _compile.compiling_only():
        out, cache = embedding.embedding(torch.zeros(2, 0, dtype=torch.int64), t(5, 3, dtype=torch.float32))
        _, dweight = embedding.embedding_backward(t(2, 0, 3, dtype=torch.float32), cache, (False, True))
    assert out.shape == (2, 0, 3) and dweight.shape == (5, 3)
    assert compiled == []


# ----------------------------------------------------------------------------- rope

def rope_x(shape, dtype, layout):
    """x (..., T, D): "heads" is (..., H, T, D) as a transposed (..., T, H, D) tensor; "strided": every
    other element of the last dim."""
    if layout == "heads":
        *lead, H, T, D = shape
        return torch.zeros(*lead, T, H, D, dtype=dtype).transpose(-3, -2)
    if layout == "sliced":  # every other index of each leading dim: leading strides that cannot merge
        *lead, T, D = shape
        return torch.zeros(*(2 * s for s in lead), T, D, dtype=dtype)[(slice(None, None, 2),) * len(lead)]
    return t(*shape, dtype=dtype, layout=layout)


# (shape, layout, positions' dtype, merged leading rank, vector width (None: 16 bytes), lanes, rows
# per task: ROWS, 1)
ROPE_CASES = [
    ((2, 3, 9, 64), "contiguous", None, 1, None, None, 1),
    ((2, 3, 9, 64), "heads", torch.int32, 2, None, None, 1),
    ((3, 5, 128), "contiguous", torch.int64, 1, None, None, 1),
    ((7, 2), "contiguous", None, 1, 1, 1, 1),  # no leading dims, D = 2: one pair per row
    ((2, 2, 5, 6), "strided", torch.int64, 1, 1, 4, 1),  # D stride 2: element by element
    ((2, 1, 2, 3, 8), "heads", None, 2, None, None, 1),  # a size-1 leading dim dropped
    ((2, 3, 4, 5, 8), "sliced", torch.int64, 3, None, None, 1),  # three leading dims that cannot merge
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, layout, pos_dtype, rank, vec, lanes, rows", ROPE_CASES)
def test_rope_compiles(compiled, dtype, shape, layout, pos_dtype, rank, vec, lanes, rows):
    x = rope_x(shape, dtype, layout)
    T, D = shape[-2:]
    positions = None if pos_dtype is None else torch.zeros(T, dtype=pos_dtype)
    rope = op("rope")
    with _compile.compiling_only():
        y, cache = rope.rope(x, positions, 10000.0)
        rope.rope_backward(t(*shape, dtype=dtype), cache, (True, False), 10000.0)
    assert y.shape == x.shape
    vec = vec or min(WIDEST[dtype], D // 2)
    lanes = lanes or min(32, (D // 2) // vec)
    forward = (dtype, pos_dtype, rank, vec, lanes, rows)
    assert compiled[0] == ("rope_kernel", forward), compiled
    # the backward rotates the contiguous dout: one merged leading dim
    assert len(compiled) == 2 and compiled[1][0] == "rope_kernel", compiled
    backward = compiled[1][1]
    assert backward[:3] == (dtype, pos_dtype, 1) and backward[5] == rows, backward


def test_rope_empty_compiles_nothing(compiled):
    with _compile.compiling_only():
        y, _ = op("rope").rope(torch.zeros(2, 0, 4), None, 10000.0)
    assert y.shape == (2, 0, 4) and compiled == []
