"""linear_cross_entropy (cross_entropy(x @ weight.T + bias, target) a chunk of rows at a time): the
loss and the gradients of x, weight and bias, on every backend, against the python reference and
against torch (F.linear, then F.cross_entropy in float64), for each reduction, with the rows split
into several chunks (``_host.CHUNKS`` = 5, no minimum size) and the gradients computed in the forward
("mean", "sum") or recomputed in the backward ("none", or when only some inputs want them)."""
import pytest
import torch
import torch.nn.functional as F

from kcourse import blas
from kcourse.blas import _host
from _util import ALL_DTYPES, DEVICE, assert_close, assert_device_assert, raises, randn, require_backend, require_dtype

V = 29  # classes; N = 23 rows of K = 16 features, in chunks of 5 rows (the last one of 3)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(_host, "CHUNKS", 5)
    monkeypatch.setattr(_host, "MIN_CHUNK_LOGITS", 1)


def inputs(dtype, N=23, K=16, bias=True, layout="contiguous"):
    x = randn(N, K, dtype=dtype, layout=layout)
    # a head's scale (logits of unit size): a logit's rounding, amplified by exp, stays within the sums' noise
    weight = randn(V, K, dtype=dtype, layout=layout).mul_(K ** -0.5)  # in place: the layout kept
    target = torch.randint(0, V, (N,), device=DEVICE)
    target[1::7] = -100  # ignored rows
    return x, weight, target, (randn(V, dtype=dtype) if bias else None)


def run(fn, x, weight, target, bias, dout=None, wants=(True, True, True)):
    """``[loss, dx, dweight, dbias]`` of ``loss = fn(x, weight, target, bias)`` pulled back from ``dout``
    (random, of the loss's shape); a gradient is None where it is not wanted or there is no bias."""
    leaves = [t if t is None else t.detach().requires_grad_(want) for t, want in zip((x, weight, bias), wants)]
    loss = fn(leaves[0], leaves[1], target, leaves[2])
    free = [t for t in leaves if t is not None and t.requires_grad]
    if dout is None:
        dout = torch.randn(loss.shape, dtype=loss.dtype, device=loss.device)
    grads = iter(torch.autograd.grad(loss, free, dout)) if free else iter(())
    return [loss.detach()] + [next(grads) if t is not None and t.requires_grad else None for t in leaves]


def fused(backend, reduction):
    return lambda x, w, t, b: blas.linear_cross_entropy(x, w, t, b, reduction=reduction, backend=backend)


def torch_composition(reduction):
    """F.linear in the inputs' dtype (rounded once, as the fused op's logits), the loss in float64."""
    def fn(x, w, t, b):
        return F.cross_entropy(F.linear(x, w, b).double(), t, reduction=reduction).to(x.dtype)
    return fn


def check(backend, dtype, reduction, *args, wants=(True, True, True)):
    x = args[0]
    dout = torch.randn(() if reduction != "none" else x.shape[:1], dtype=dtype, device=DEVICE)
    got = run(fused(backend, reduction), *args, dout=dout, wants=wants)
    for expected in (run(fused("python", reduction), *args, dout=dout, wants=wants),
                     run(torch_composition(reduction), *args, dout=dout, wants=wants)):
        for i, (a, e) in enumerate(zip(got, expected)):
            assert (a is None) == (e is None), i
            if a is not None:  # dx sums V terms, dweight and dbias N (the loss: one row's V, or N rows);
                # dweight and dbias are rounded to their dtype once per chunk: the noise grows as sqrt(chunks)
                N = x.shape[0]
                chunks = -(-N // _host.chunk_rows(N, V)) if backend != "python" and N else 1
                n = N * chunks
                assert_close(a, e, k=(V, V, n, n)[i])
    return got


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_the_composition(backend, dtype, reduction):
    require_dtype(backend, dtype)
    check(backend, dtype, reduction, *inputs(dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_reference(dtype):
    """The reference (all rows at once) against torch, the gradients computed ahead and recomputed."""
    for reduction in ("mean", "none"):
        check("python", dtype, reduction, *inputs(dtype))


@pytest.mark.parametrize("wants", [(True, False, False), (False, True, True)])
def test_some_gradients(backend, wants):
    """A frozen head (only x's gradient), or a frozen input: only those computed, still equal."""
    got = check(backend, torch.float32, "mean", *inputs(torch.float32), wants=wants)
    assert [g is not None for g in got[1:]] == list(wants)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_views(backend, layout):
    """x and weight as transposed or strided views, the target strided: read in place."""
    x, weight, target, bias = inputs(torch.float32, layout=layout)
    target = torch.stack([target, target], 1)[:, 0]  # stride 2
    check(backend, torch.float32, "sum", x, weight, target, bias)


def test_no_bias_one_chunk_and_no_grad(backend, monkeypatch):
    monkeypatch.setattr(_host, "MIN_CHUNK_LOGITS", 4 * V)  # one chunk of all 4 rows
    args = inputs(torch.float32, N=4, bias=False)
    check(backend, torch.float32, "mean", *args)
    with torch.no_grad():
        loss = blas.linear_cross_entropy(*args[:3], backend=backend)
    assert_close(loss, run(fused("python", "mean"), *args)[0])


def test_all_ignored_and_empty(backend):
    """Every row ignored: a mean of NaN (0/0) and zero gradients, as cross_entropy; no rows: NaN, 0,
    an empty loss, zero gradients; no features (K = 0): the logits are the bias."""
    x, weight, target, bias = inputs(torch.float32)
    got = run(fused(backend, "mean"), x, weight, torch.full_like(target, -100), bias)
    assert got[0].isnan() and all(torch.equal(g, torch.zeros_like(g)) for g in got[1:])
    for reduction, loss in (("mean", float("nan")), ("sum", 0.0)):
        got = run(fused(backend, reduction), x[:0], weight, target[:0], bias)
        assert torch.equal(got[0], torch.tensor(loss, device=DEVICE)) or (got[0].isnan() and loss != loss)
        assert got[1].shape == (0, 16) and all(torch.equal(g, torch.zeros_like(g)) for g in got[2:])
    assert run(fused(backend, "none"), x[:0], weight, target[:0], bias)[0].shape == (0,)
    check(backend, torch.float32, "sum", x[:, :0], weight[:, :0], target, bias)


def test_nonfinite(backend):
    """A NaN in a row of x makes that row's loss NaN; the other rows are untouched (reduction "none")."""
    x, weight, target, bias = inputs(torch.float32)
    x[2, 3] = float("nan")
    target[2] = 0
    loss = blas.linear_cross_entropy(x, weight, target, bias, reduction="none", backend=backend)
    expected = blas.linear_cross_entropy(x, weight, target, bias, reduction="none", backend="python")
    assert loss[2].isnan() and not loss[torch.arange(23) != 2].isnan().any()
    assert_close(loss[torch.arange(23) != 2], expected[torch.arange(23) != 2], k=V)


def test_autocast():
    """float32 weights under CPU autocast: the product in bfloat16, the loss float32, as torch's."""
    x, weight, target, bias = inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = blas.linear_cross_entropy(x, weight, target, bias, backend="pytorch")
        expected = F.cross_entropy(F.linear(x, weight, bias), target)
    assert loss.dtype == expected.dtype == torch.float32
    assert_close(loss.bfloat16(), expected.bfloat16(), k=V)


def test_bad_input():
    op = blas.linear_cross_entropy
    x, weight, target, bias = inputs(torch.float32)
    raises(ValueError, r"linear_cross_entropy: x is \(23, 16\) and weight is \(29, 15\); weight must be \(V, 16\)",
           op, x, weight[:, :15], target)
    raises(ValueError, r"linear_cross_entropy: weight is \(29, 16\) and bias is \(28,\)", op, x, weight, target, bias[:28])
    raises(ValueError, r"linear_cross_entropy: x is \(23, 16\) and target is \(22,\)", op, x, weight, target[:22])
    raises(TypeError, "linear_cross_entropy: target must be an int64 or int32", op, x, weight, target.float())
    raises(ValueError, "linear_cross_entropy: reduction must be", op, x, weight, target, reduction="avg")
    raises(ValueError, r"linear_cross_entropy: weight is \(0, 16\); it needs at least one class", op, x, weight[:0],
           target)
    raises(TypeError, "linear_cross_entropy: x is torch.float32 but weight is torch.float64", op, x, weight.double(),
           target)
    if DEVICE != "cuda":  # on CUDA the cross_entropy kernels assert on the device: test_out_of_range_asserts_on_gpu
        bad = target.clone()
        bad[4] = V
        raises(IndexError, rf"linear_cross_entropy: target\[4\] = {V} is out of range", op, x, weight, bad)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pytorch", "triton", "cute"])
def test_out_of_range_asserts_on_gpu(name):
    require_backend(name)
    assert_device_assert("import torch; from kcourse import blas; x = torch.randn(4, 8, device='cuda'); "
                         "w = torch.randn(100, 8, device='cuda'); t = torch.tensor([0, -100, -1, 2], device='cuda'); "
                         f"loss = blas.linear_cross_entropy(x, w, t, backend={name!r})",
                         "kcourse cross_entropy: target[2] = -1 is out of range [0, 100)" if name == "cute" else None)


def test_backward_spends_the_cache(backend):
    """Eagerly, the backward scales the gradients the forward computed in place (no second copy of
    dweight): a second backward through the same graph is refused by autograd, not answered wrongly."""
    x, weight, target, bias = inputs(torch.float32)
    x, weight, bias = (t.requires_grad_() for t in (x, weight, bias))
    loss = blas.linear_cross_entropy(x, weight, target, bias, backend=backend)
    dx, = torch.autograd.grad(loss, [x], torch.tensor(0.5, device=DEVICE), retain_graph=True)
    assert_close(dx, run(fused("python", "mean"), x, weight, target, bias, dout=torch.tensor(0.5, device=DEVICE))[1],
                 k=V)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, [x])
