"""kcourse ops under torch.autocast each op's output dtype is that of the torch op
it stands for under the same autocast; float64 is never cast; gradients reach float32 leaves as
float32; a tiny GPT with float32 weights under autocast matches torch.nn under autocast."""
import pytest
import torch
import torch.nn.functional as F

import torch_reference as ref
from kcourse import blas
from kcourse.modules import GPT, GPTConfig
from test_modules import GPT2, LLAMA, gpt_inputs

EAGER = ("python", "pytorch")
DEVICE = "cpu"  # autocast("cpu"): the CPU policy, whatever the machine


def _autocast_dtypes():
    params = [torch.bfloat16]
    try:
        with torch.autocast("cpu", torch.float16):
            ok = torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16
    except RuntimeError:
        ok = False
    params.append(torch.float16 if ok else pytest.param(
        torch.float16, marks=pytest.mark.skip(reason=f"torch {torch.__version__} has no float16 CPU autocast")))
    return params


AUTOCAST_DTYPES = _autocast_dtypes()


def _cases(low):
    """name -> (make inputs, kcourse call(backend, *inputs), torch call(*inputs)); ``low`` is the
    autocast dtype, used for inputs already in low precision (the projections of a model)."""
    t = lambda *s, dtype=torch.float32: torch.randn(*s, dtype=dtype)  # noqa: E731
    target = torch.tensor([1, 0, 6, 2])
    tokens = torch.tensor([[1, 3], [5, 0]])

    def rope_ref(x):
        return ref.rope(x)

    return {
        "gemm": (lambda: (t(3, 4), t(4, 5)), lambda b, A, B: blas.gemm(A, B, backend=b), torch.matmul),
        "gemm_bias": (lambda: (t(3, 4), t(4, 5), t(5)), lambda b, A, B, C: blas.gemm(A, B, C, beta=1.0, backend=b),
                      lambda A, B, C: torch.addmm(C, A, B)),
        "gemm_mixed": (lambda: (t(3, 4), t(4, 5, dtype=low)), lambda b, A, B: blas.gemm(A, B, backend=b), torch.matmul),
        "gemm_batched": (lambda: (t(2, 3, 4), t(2, 4, 5)), lambda b, A, B: blas.gemm(A, B, backend=b), torch.matmul),
        "gemv": (lambda: (t(3, 4), t(4)), lambda b, A, x: blas.gemv(A, x, backend=b), torch.mv),
        "geru": (lambda: (t(3, 4), t(3), t(4)), lambda b, A, x, y: blas.geru(A, x, y, backend=b), torch.addr),
        "attention": (lambda: (t(1, 2, 3, 8), t(1, 2, 3, 8), t(1, 2, 3, 8)),
                      lambda b, q, k, v: blas.attention(q, k, v, causal=True, backend=b),
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "softmax": (lambda: (t(3, 5),), lambda b, x: blas.softmax(x, backend=b), lambda x: F.softmax(x, -1)),
        "softmax_low": (lambda: (t(3, 5, dtype=low),), lambda b, x: blas.softmax(x, backend=b),
                        lambda x: F.softmax(x, -1)),
        "log_softmax": (lambda: (t(3, 5),), lambda b, x: blas.log_softmax(x, backend=b),
                        lambda x: F.log_softmax(x, -1)),
        "log_softmax_low": (lambda: (t(3, 5, dtype=low),), lambda b, x: blas.log_softmax(x, backend=b),
                            lambda x: F.log_softmax(x, -1)),
        "cross_entropy": (lambda: (t(4, 7),), lambda b, x: blas.cross_entropy(x, target, backend=b),
                          lambda x: F.cross_entropy(x, target)),
        "cross_entropy_low": (lambda: (t(4, 7, dtype=low),), lambda b, x: blas.cross_entropy(x, target, backend=b),
                              lambda x: F.cross_entropy(x, target)),
        "layer_norm": (lambda: (t(3, 8), t(8), t(8)), lambda b, x, w, bi: blas.layer_norm(x, w, bi, backend=b),
                       lambda x, w, bi: F.layer_norm(x, (8,), w, bi)),
        "layer_norm_low": (lambda: (t(3, 8, dtype=low),), lambda b, x: blas.layer_norm(x, backend=b),
                           lambda x: F.layer_norm(x, (8,))),
        "rms_norm": (lambda: (t(3, 8), t(8)), lambda b, x, w: blas.rms_norm(x, w, backend=b),
                     lambda x, w: F.rms_norm(x, (8,), w, 1e-6)),
        "rms_norm_low": (lambda: (t(3, 8, dtype=low),), lambda b, x: blas.rms_norm(x, backend=b),
                         lambda x: F.rms_norm(x, (8,), None, 1e-6)),
        "axpby_mixed": (lambda: (t(3, 4), t(3, 4, dtype=low)), lambda b, x, y: blas.axpby(x, y, 2.0, 0.5, backend=b),
                        lambda x, y: 2.0 * x + 0.5 * y),
        "axpby_low": (lambda: (t(3, 4, dtype=low), t(3, 4, dtype=low)),
                      lambda b, x, y: blas.axpby(x, y, 2.0, 0.5, backend=b), lambda x, y: 2.0 * x + 0.5 * y),
        "gelu": (lambda: (t(3, 5),), lambda b, x: blas.gelu(x, backend=b), F.gelu),
        "gelu_low": (lambda: (t(3, 5, dtype=low),), lambda b, x: blas.gelu(x, "tanh", backend=b),
                     lambda x: F.gelu(x, approximate="tanh")),
        "silu": (lambda: (t(3, 5, dtype=low),), lambda b, x: blas.silu(x, backend=b), F.silu),
        "relu": (lambda: (t(3, 5),), lambda b, x: blas.relu(x, backend=b), F.relu),
        "swiglu": (lambda: (t(3, 5, dtype=low), t(3, 5, dtype=low)), lambda b, g, u: blas.swiglu(g, u, backend=b),
                   lambda g, u: F.silu(g) * u),
        "embedding": (lambda: (t(6, 4),), lambda b, w: blas.embedding(tokens, w, backend=b),
                      lambda w: F.embedding(tokens, w)),
        "rope": (lambda: (t(1, 2, 3, 8, dtype=low),), lambda b, x: blas.rope(x, backend=b), rope_ref),
        "scal": (lambda: (t(3, 4),), lambda b, x: blas.scal(x, 3.0, backend=b), lambda x: 3.0 * x),
    }


# On CPU these follow torch's CPU autocast lists (mv, addr, softmax and the norms are not in them),
# on CUDA torch's CUDA lists: kcourse.blas._library.AUTOCAST keeps one table per device.


def _params():
    return list(_cases(torch.bfloat16))


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("case", _params())
def test_output_dtype_follows_torch(case, dtype, name):
    make, ours, theirs = _cases(dtype)[case]
    torch.manual_seed(0)
    inputs = make()
    with torch.autocast(DEVICE, dtype):
        expected = theirs(*inputs)
        got = ours(name, *inputs)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    # low-precision results (or inputs) round differently along kcourse's and torch's paths: a few
    # units in the last place of the autocast dtype (bfloat16 2^-8, float16 2^-11)
    low = expected.dtype in (torch.bfloat16, torch.float16) or any(t.dtype != torch.float32 for t in inputs)
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    tol = dict(rtol=4 * unit, atol=4 * unit) if low else {}
    torch.testing.assert_close(got.float(), expected.float(), **tol)


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("dtype", AUTOCAST_DTYPES, ids=str)
def test_float64_is_never_cast(name, dtype):
    d = lambda *s: torch.randn(*s, dtype=torch.float64)  # noqa: E731
    target = torch.tensor([1, 0, 2])
    with torch.autocast(DEVICE, dtype):
        outs = {
            "gemm": blas.gemm(d(3, 4), d(4, 5), backend=name),
            "gemv": blas.gemv(d(3, 4), d(4), backend=name),
            "geru": blas.geru(d(3, 4), d(3), d(4), backend=name),
            "attention": blas.attention(d(1, 2, 3, 4), d(1, 2, 3, 4), d(1, 2, 3, 4), backend=name),
            "softmax": blas.softmax(d(3, 4), backend=name),
            "log_softmax": blas.log_softmax(d(3, 4), backend=name),
            "cross_entropy": blas.cross_entropy(d(3, 4), target, backend=name),
            "layer_norm": blas.layer_norm(d(3, 4), d(4), d(4), backend=name),
            "rms_norm": blas.rms_norm(d(3, 4), d(4), backend=name),
            "axpby": blas.axpby(d(3), d(3), backend=name),
            "dot": blas.dot(d(3), d(3), backend=name),
            "swiglu": blas.swiglu(d(3), d(3), backend=name),
        }
    for op, out in outs.items():
        assert out.dtype == torch.float64, op
    # exact: the same values as without autocast
    torch.manual_seed(0)
    A, B = d(3, 4), d(4, 5)
    with torch.autocast(DEVICE, dtype):
        inside = blas.gemm(A, B, backend=name)
    torch.testing.assert_close(inside, blas.gemm(A, B, backend=name), rtol=0, atol=0)


@pytest.mark.parametrize("name", EAGER)
def test_gradients_reach_float32_leaves_as_float32(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, requires_grad=True)
    W = torch.randn(8, 8, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    target = torch.tensor([1, 0, 7, 2, 3, 5])
    with torch.autocast(DEVICE, torch.bfloat16):
        h = blas.gemm(blas.layer_norm(x, w, b, backend=name), W, backend=name)  # bf16 (2, 3, 8)
        assert h.dtype == torch.bfloat16
        q = h.view(2, 3, 2, 4).transpose(1, 2)
        a = blas.attention(q, q, q, causal=True, backend=name).transpose(1, 2).reshape(2, 3, 8)
        r = blas.axpby(a, x, backend=name)  # float32: promoted to the residual stream's dtype
        assert r.dtype == torch.float32
        loss = blas.cross_entropy(blas.rms_norm(r, w, backend=name).reshape(6, 8), target, backend=name)
        assert loss.dtype == torch.float32
    loss.backward()
    for leaf in (x, W, w, b):
        assert leaf.grad is not None and leaf.grad.dtype == torch.float32
        assert torch.isfinite(leaf.grad).all()


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gpt_under_autocast_matches_torch_nn(name, arch):
    config = GPTConfig(**(GPT2 if arch == "gpt2" else LLAMA))
    torch.manual_seed(0)
    ours = GPT(config, backend=name)
    theirs = ref.GPT(config)
    theirs.load_state_dict(ours.state_dict())
    idx, targets = gpt_inputs(config)
    idx, targets = idx.cpu(), targets.cpu()
    losses = []
    for model in (ours, theirs):
        with torch.autocast(DEVICE, torch.bfloat16):
            logits, loss = model(idx, targets)
        loss.backward()
        losses.append(loss.detach())
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(losses[0], losses[1], rtol=2e-2, atol=0)
    grads = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        scale = grads[n].grad.abs().max().item() + 1e-6
        torch.testing.assert_close(p.grad, grads[n].grad, rtol=0.1, atol=0.1 * scale, msg=n)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_compiled_gpt_under_autocast_matches_eager(arch):
    """torch.compile (inductor) of a float32 GPT called under autocast: the eager autocast loss and
    gradients. Inductor allocates and reads every buffer by the fake implementations' dtypes, so a
    backward fake giving a gradient another dtype than its kernel's reads memory wrongly."""
    config = GPTConfig(**(GPT2 if arch == "gpt2" else LLAMA))
    torch.manual_seed(0)
    model = GPT(config, backend="pytorch")
    idx, targets = (t.cpu() for t in gpt_inputs(config))
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    results = []
    for run in (model, compiled):
        model.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, torch.bfloat16):
            _, loss = run(idx, targets)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (eager_loss, eager_grads), (loss, grads) = results
    assert loss.dtype == torch.float32
    # the same kernels on the same bf16-rounded operands: equal up to the order of float32 sums
    # (inductor may add a tied weight's two gradients the other way round)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=0)
    for n, g in grads.items():
        scale = eager_grads[n].abs().max().item()
        torch.testing.assert_close(g, eager_grads[n], rtol=1e-5, atol=1e-6 * scale, msg=n)
