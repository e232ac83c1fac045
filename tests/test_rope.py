import pytest
import torch

from kcourse import blas
from _util import ALL_DTYPES, DEVICE, DTYPES, assert_close, randn, require_dtype

# (x's shape (..., T, D), its layout, positions): no leading dims to three, odd T, D = 2, 6, 64, 128.
# Kept small: the triton interpreter runs one program per (block of rows, position).
CASES = [
    ((7, 2), "contiguous", None), ((7, 2), "strided", "shuffled"), ((1, 1, 1, 64), "heads", None),
    ((2, 3, 9, 64), "contiguous", "shuffled"), ((2, 3, 9, 64), "heads", None), ((2, 3, 9, 64), "strided", "far"),
    ((3, 5, 128), "heads", "shuffled"), ((3, 5, 128), "contiguous", None), ((2, 2, 5, 6), "strided", None),
    ((2, 1, 2, 3, 8), "heads", "shuffled"),
]


def make_x(shape, dtype=torch.float32, layout="contiguous"):
    """x of ``shape``: row-major; "heads": (..., H, T, D) as a transposed (..., T, H, D) tensor (the
    usual q/k layout); "strided": every third element of the last dim."""
    if layout == "heads" and len(shape) > 2:
        *lead, H, T, D = shape
        return torch.randn(*lead, T, H, D, dtype=dtype, device=DEVICE).transpose(-3, -2)
    return randn(*shape, dtype=dtype, layout=layout)


def positions_for(T, kind, dtype=torch.int64):
    """None (0..T-1), or explicit non-monotone positions, some of them large."""
    if kind is None:
        return None
    p = torch.randperm(T, device=DEVICE) * 37 + (100_000 if kind == "far" else 0)
    return p.to(dtype)


def rope_float64(x, base, positions):
    """A direct float64 rope: each pair (x1_i, x2_i) as the complex number x1_i + j x2_i, multiplied
    by exp(j theta) with theta = p * base^(-2i/D)."""
    T, D = x.shape[-2:]
    p = torch.arange(T, device=x.device) if positions is None else positions
    freq = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64, device=x.device)
    theta = p.double()[:, None] * freq  # (T, D/2)
    z = torch.complex(x[..., : D // 2].double(), x[..., D // 2:].double()) * torch.polar(torch.ones_like(theta), theta)
    return torch.cat([z.real, z.imag], dim=-1)


def rope_and_grad(x, dy, base, positions, backend):
    """rope on ``backend`` (a torch function for a callable) and dx for the seed ``dy``."""
    x = x.detach().requires_grad_(True)
    y = backend(x, base, positions) if callable(backend) else blas.rope(x, base, positions, backend=backend)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y.detach(), dx


# not float64 at positions ~1e5: there an ulp of the float64 angle (~1e-11) exceeds float64's tolerance
@pytest.mark.parametrize("dtype, kind", [(d, k) for d in ALL_DTYPES for k in (None, "shuffled", "far")
                                         if d != torch.float64 or k != "far"])
def test_python_reference(dtype, kind):
    x, dy = randn(2, 3, 33, 64, dtype=dtype), randn(2, 3, 33, 64, dtype=dtype)
    positions = positions_for(33, kind)
    y, dx = rope_and_grad(x, dy, 10000.0, positions, "python")
    y64, dx64 = rope_and_grad(x.double(), dy.double(), 10000.0, positions, rope_float64)
    assert_close(y, y64.to(dtype))
    assert_close(dx, dx64.to(dtype))


@pytest.mark.parametrize("shape, layout, kind", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_rope(backend, dtype, shape, layout, kind):
    require_dtype(backend, dtype)
    x, dy = make_x(shape, dtype, layout), randn(*shape, dtype=dtype)
    positions = positions_for(shape[-2], kind)
    x0 = x.clone()
    y, dx = rope_and_grad(x, dy, 10000.0, positions, backend)
    y_ref, dx_ref = rope_and_grad(x, dy, 10000.0, positions, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    assert torch.equal(x, x0)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_far_positions(backend, dtype, index_dtype):
    # positions past 100000, another base: the angles must stay accurate (float64 in every backend)
    x, dy = make_x((2, 4, 9, 128), dtype, "heads"), randn(2, 4, 9, 128, dtype=dtype)
    positions = positions_for(9, "far", index_dtype)
    y, dx = rope_and_grad(x, dy, 500000.0, positions, backend)
    y64, dx64 = rope_and_grad(x.double(), dy.double(), 500000.0, positions, rope_float64)
    assert_close(y, y64.to(dtype))
    assert_close(dx, dx64.to(dtype))


def test_rope_positions_view(backend):
    # positions as a strided view; the default positions equal arange(T)
    x = randn(3, 10, 8)
    buffer = torch.arange(20, device=DEVICE)
    assert_close(blas.rope(x, positions=buffer[::2], backend=backend), rope_float64(x, 10000.0, buffer[::2]).float())
    default = torch.arange(10, device=DEVICE)
    assert torch.equal(blas.rope(x, backend=backend), blas.rope(x, positions=default, backend=backend))


def test_rope_layouts(backend):
    # y is laid out as x and dx as dy where they are dense: a permuted q or k (or its gradient) is
    # read through its strides, never copied. Compiled, y keeps x's layout (the fake strides are the
    # real ones); dx's layout there is AOTAutograd's to choose (torch 2.11 makes the tangent contiguous)
    x, dy = make_x((2, 3, 5, 8), layout="heads"), make_x((2, 3, 5, 8), layout="heads")
    y_ref, dx_ref = rope_and_grad(x.contiguous(), dy.contiguous(), 10000.0, None, "python")

    def rope(x):
        return blas.rope(x, backend=backend)

    for run in (rope, torch.compile(rope, backend="aot_eager", fullgraph=True)):
        x_leaf = x.detach().requires_grad_(True)
        y = run(x_leaf)
        (dx,) = torch.autograd.grad(y, x_leaf, dy)
        assert y.stride() == x.stride()
        assert run is not rope or dx.stride() == dy.stride()
        assert_close(y, y_ref)
        assert_close(dx, dx_ref)


def test_rope_is_a_rotation(backend):
    # norms of the pairs are kept; position 0 is the identity
    x = randn(4, 6, 64)
    y = blas.rope(x, backend=backend)
    pairs = lambda t: t[..., :32] ** 2 + t[..., 32:] ** 2
    assert_close(pairs(y), pairs(x), k=4)
    assert_close(y[:, 0], x[:, 0])


def test_rope_empty(backend):
    x = torch.empty(2, 0, 4, device=DEVICE, requires_grad=True)
    y = blas.rope(x, backend=backend)
    assert y.shape == (2, 0, 4)
    y.sum().backward()
    assert x.grad.shape == (2, 0, 4)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_gradcheck_float64(name):
    x = make_x((2, 3, 5, 6), torch.float64, "heads").requires_grad_(True)
    positions = torch.tensor([4, 0, 9, 2, 7], device=DEVICE)
    assert torch.autograd.gradcheck(lambda t: blas.rope(t, 100.0, positions, backend=name), (x,))
    assert torch.autograd.gradcheck(lambda t: blas.rope(t, backend=name), (x,))


@pytest.mark.parametrize("name", ["python", "pytorch", "triton"])
def test_rope_validation(name):
    x = randn(2, 5, 8)
    x0 = x.clone()
    with pytest.raises(ValueError, match=r"rope: x is \(2, 5, 7\); its last dimension D = 7 must be even"):
        blas.rope(randn(2, 5, 7), backend=name)
    with pytest.raises(ValueError, match=r"rope: x must be \(..., T, D\), got shape \(8,\)"):
        blas.rope(randn(8), backend=name)
    with pytest.raises(ValueError, match=r"rope: x is \(2, 5, 8\) and positions is \(4,\); positions must be \(5,\)"):
        blas.rope(x, positions=torch.arange(4, device=DEVICE), backend=name)
    with pytest.raises(TypeError, match="rope: positions must be an int64 or int32 tensor, got torch.float32"):
        blas.rope(x, positions=torch.arange(5, device=DEVICE).float(), backend=name)
    with pytest.raises(ValueError, match="rope: base must be positive, got -1.0"):
        blas.rope(x, base=-1, backend=name)
    with pytest.raises(TypeError, match="rope: base must be a real number, got str"):
        blas.rope(x, base="10000", backend=name)
    assert torch.equal(x, x0)


def test_rope_triton_float64():
    with pytest.raises(TypeError, match="rope: the triton backend does not support torch.float64"):
        blas.rope(randn(3, 4, dtype=torch.float64), backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "heads"])
@pytest.mark.parametrize("shape", [(4, 32, 4096, 128), (1, 8, 32768, 64), (2, 16, 1023, 256)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_large(backend, dtype, shape, layout):
    x, dy = make_x(shape, dtype, layout), randn(*shape, dtype=dtype)
    y, dx = rope_and_grad(x, dy, 10000.0, None, backend)
    y_ref, dx_ref = rope_and_grad(x, dy, 10000.0, None, "python")
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)


@pytest.mark.gpu
def test_rope_past_2_31(backend):
    # x has 2^31 + 2^20 elements: int64 offsets along T and the leading dims
    x = make_x((1, 8, 2**21 + 1024, 128), torch.float16, "heads")
    y = blas.rope(x, backend=backend)
    tail = slice(-16, None)
    positions = torch.arange(x.shape[-2], device=DEVICE)[tail]
    assert_close(y[..., tail, :], blas.rope(x[..., tail, :], positions=positions, backend="python"))
