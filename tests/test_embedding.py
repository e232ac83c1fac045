import re

import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, assert_device_assert, raises, randn, require_backend, require_dtype

# (V, D, indices' shape)
SHAPES = [(1, 1, (1,)), (10, 7, (13,)), (50, 33, (4, 9)), (7, 1000, (2, 3, 5)), (3, 1500, (6,)), (5, 4097, (2,))]
# (indices' layout, weight's layout)
LAYOUTS = [("contiguous", "contiguous"), ("strided", "transposed"), ("contiguous", "strided")]


def indices(V, shape, dtype=torch.int64, layout="contiguous"):
    """Random indices in [0, V) of ``shape``: contiguous, or every other element of a larger tensor."""
    if layout == "strided":
        return torch.randint(0, V, (*shape[:-1], 2 * shape[-1]), dtype=dtype, device=DEVICE)[..., ::2]
    return torch.randint(0, V, shape, dtype=dtype, device=DEVICE)


def embedding_and_grad(idx, weight, dy, backend):
    """embedding on ``backend`` (a torch function for a callable) and dweight for the seed ``dy``."""
    weight = weight.detach().requires_grad_(True)
    out = backend(idx, weight) if callable(backend) else blas.embedding(idx, weight, backend=backend)
    (dweight,) = torch.autograd.grad(out, weight, dy)
    return out.detach(), dweight


def max_count(idx):
    """The most times one index repeats: the longest sum in dweight."""
    return int(torch.bincount(idx.flatten().long()).max()) if idx.numel() else 1


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype, index_dtype):
    weight, idx = randn(20, 33, dtype=dtype), indices(20, (7, 11), index_dtype)  # 77 tokens, 20 rows: repeats
    dy = randn(7, 11, 33, dtype=dtype)
    out, dweight = embedding_and_grad(idx, weight, dy, "python")
    out64, dweight64 = embedding_and_grad(idx, weight.double(), dy.double(), F.embedding)
    assert torch.equal(out, weight[idx])
    assert_close(dweight, dweight64.to(dtype), k=max_count(idx))


@pytest.mark.parametrize("index_layout, weight_layout", LAYOUTS)
@pytest.mark.parametrize("V, D, index_shape", SHAPES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_embedding(backend, dtype, V, D, index_shape, index_layout, weight_layout):
    require_dtype(backend, dtype)
    weight, idx = randn(V, D, dtype=dtype, layout=weight_layout), indices(V, index_shape, layout=index_layout)
    dy = randn(*index_shape, D, dtype=dtype)
    weight0, idx0 = weight.clone(), idx.clone()
    out, dweight = embedding_and_grad(idx, weight, dy, backend)
    out_ref, dweight_ref = embedding_and_grad(idx, weight, dy, "python")
    assert torch.equal(out, out_ref)  # a gather: exact
    assert_close(dweight, dweight_ref, k=max_count(idx))
    # F.embedding in float64 (in half precision PyTorch's CPU backward accumulates in half)
    out64, dweight64 = embedding_and_grad(idx, weight.double(), dy.double(), F.embedding)
    assert torch.equal(out, out64.to(dtype))
    assert_close(dweight, dweight64.to(dtype), k=max_count(idx))
    assert torch.equal(weight, weight0) and torch.equal(idx, idx0)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_repeated_indices(backend, dtype, index_dtype):
    # 600 tokens over 5 rows (and row 3 never used): each row of dweight sums ~120 rows of dy in float32
    weight = randn(6, 70, dtype=dtype)
    idx = torch.randint(0, 5, (20, 30), dtype=index_dtype, device=DEVICE)
    idx[idx == 3] = 4
    dy = randn(20, 30, 70, dtype=dtype)
    out, dweight = embedding_and_grad(idx, weight, dy, backend)
    _, dweight_torch = embedding_and_grad(idx.long(), weight.double(), dy.double(), F.embedding)
    assert torch.equal(out, weight[idx.long()])
    assert_close(dweight, dweight_torch.to(dtype), k=max_count(idx))
    assert torch.equal(dweight[3], torch.zeros_like(dweight[3]))


def test_embedding_empty(backend):
    weight = randn(5, 3).requires_grad_(True)
    out = blas.embedding(torch.empty(2, 0, dtype=torch.int64, device=DEVICE), weight, backend=backend)
    assert out.shape == (2, 0, 3)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros(5, 3, device=DEVICE))


@pytest.mark.parametrize("D", [3, 0])
@pytest.mark.parametrize("name", ["python", "pytorch", "triton", "cute"])
def test_embedding_no_columns(name, D):
    # D = 0: an empty output and an empty (V, 0) gradient
    require_backend(name)
    weight = randn(5, D).requires_grad_(True)
    idx = torch.tensor([[1, 4], [4, 0]], device=DEVICE)
    out = blas.embedding(idx, weight, backend=name)
    assert torch.equal(out, weight.detach()[idx])
    dy = randn(2, 2, D)
    out.backward(dy)
    expected = torch.zeros(5, D, device=DEVICE).index_add_(0, idx.flatten(), dy.reshape(4, D))
    assert torch.equal(weight.grad, expected)


@pytest.mark.skipif(DEVICE == "cuda", reason="on CUDA the kernels assert on the device: test_out_of_range_asserts_on_gpu")
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_embedding_out_of_range_raises(name, index_dtype):
    # every backend refuses an index outside [0, V) naming the op, the argument, the entry and its
    # value (not torch's bare "index out of range in self", nor NaN rows)
    require_backend(name)
    weight = randn(10, 3)
    for bad, at in [(-1, "[1]"), (10, "[1]"), (1000, "[1]")]:
        idx = torch.tensor([0, bad, 3], dtype=index_dtype)
        raises(IndexError, re.escape(f"embedding: indices{at} = {bad} is out of range for weight (10, 3) of 10 rows; "
                                     "indices must be in [0, 10)"), blas.embedding, idx, weight, backend=name)
    idx = torch.tensor([[3, 1, 2], [9, 0, -2]], dtype=index_dtype)[:, ::2]  # a strided view: the first bad entry
    raises(IndexError, re.escape("embedding: indices[1, 1] = -2 is out of range"), blas.embedding, idx, weight,
           backend=name)
    raises(IndexError, re.escape("embedding: indices[0] = 0 is out of range for weight (0, 3) of 0 rows"),
           blas.embedding, torch.tensor([0]), randn(0, 3), backend=name)
    assert blas.embedding(torch.zeros(0, dtype=index_dtype), randn(0, 3), backend=name).shape == (0, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["python", "pytorch", "triton", "cute"])
def test_out_of_range_asserts_on_gpu(name):
    # on CUDA the check is a device assert (no host synchronization); cute's kernel names the index
    require_backend(name)
    assert_device_assert("import torch; from kcourse import blas; "
                         "w = torch.randn(10, 64, device='cuda'); i = torch.tensor([0, 3, 10, 2], device='cuda'); "
                         f"out = blas.embedding(i, w, backend={name!r})",
                         "kcourse embedding: indices[2] = 10 is out of range [0, 10)" if name == "cute" else None)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    weight = randn(6, 5, dtype=torch.float64, layout="transposed").requires_grad_(True)
    idx = torch.tensor([[0, 5, 5], [2, 0, 5]], device=DEVICE)
    assert torch.autograd.gradcheck(lambda w: blas.embedding(idx, w, backend=name), (weight,))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_embedding_validation(name):
    weight, idx = randn(10, 4), torch.tensor([1, 2], device=DEVICE)
    weight0 = weight.clone()
    with pytest.raises(TypeError, match="embedding: indices must be an int64 or int32 tensor, got torch.float32"):
        blas.embedding(idx.float(), weight, backend=name)
    with pytest.raises(TypeError, match="embedding: indices must be an int64 or int32 tensor, got list"):
        blas.embedding([1, 2], weight, backend=name)
    with pytest.raises(TypeError, match="embedding: indices must be an int64 or int32 tensor, got torch.int16"):
        blas.embedding(idx.short(), weight, backend=name)
    with pytest.raises(ValueError, match=r"embedding: weight must be 2-D, got 1-D of shape \(10,\)"):
        blas.embedding(idx, weight[:, 0], backend=name)
    with pytest.raises(TypeError, match="embedding: weight must be a floating-point tensor, got torch.int64"):
        blas.embedding(idx, idx[:, None], backend=name)
    assert torch.equal(weight, weight0)


def test_embedding_triton_float64():
    with pytest.raises(TypeError, match="embedding: the triton backend does not support torch.float64"):
        blas.embedding(torch.tensor([0], device=DEVICE), randn(3, 2, dtype=torch.float64), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("V, D, tokens", [(131072, 1024, (8, 2048)), (50257, 768, (16, 1024)),
                                          (32000, 4096, (4, 4096))])
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_large(backend, dtype, V, D, tokens):
    weight, idx = randn(V, D, dtype=dtype), indices(V, tokens)
    idx[:, ::7] = 0  # a hot row: many atomic adds on the same addresses
    dy = randn(*tokens, D, dtype=dtype)
    out, dweight = embedding_and_grad(idx, weight, dy, backend)
    out_ref, dweight_ref = embedding_and_grad(idx, weight, dy, "python")
    assert torch.equal(out, out_ref)
    assert_close(dweight, dweight_ref, k=max_count(idx))


@pytest.mark.gpu
def test_embedding_past_2_31(backend):
    # the output has 2^31 + 5 * 1024 elements: int64 row offsets
    weight = randn(1000, 1024, dtype=torch.float16)
    idx = indices(1000, (2**21 + 5,))
    out = blas.embedding(idx, weight, backend=backend)
    assert torch.equal(out[-64:], weight[idx[-64:]])
