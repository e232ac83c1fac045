"""The pytorch backend's ops recorded by ATen's autograd (``<op>_autograd``, ``kcourse.backend.autograd_kernel``):
where a composite runs, its outputs and gradients equal the op's own autograd formula's (the same ATen
kernels, called from C++ autograd nodes), in every dtype it takes; where its kernels would break the
op contract it declines and the formula runs; cuBLAS's half-precision reductions are off in the
backward's products and the user's setting is given back."""
import pytest
import torch

import kcourse.backend as backend_module
from kcourse import blas
from _util import DEVICE, TOL, spy_aten_recorded

CUDA = DEVICE == "cuda"
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _t(*shape, dtype, grad=True):
    return torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_(grad)


def _cases(dtype):
    """op -> (inputs, call(*inputs) -> one output tensor, does the composite run here?)."""
    half_cpu = not CUDA and dtype in (torch.float16, torch.bfloat16)
    tokens = lambda t: t.view(2, 13, 3, 16).transpose(1, 2)  # noqa: E731  (B, H, T, D) views of a projection
    return {
        "linear": ((_t(2, 13, 24, dtype=dtype), _t(40, 24, dtype=dtype), _t(40, dtype=dtype)),
                   lambda x, w, b: blas.linear(x, w, b, backend="pytorch"), not half_cpu),
        "linear-gelu": ((_t(26, 24, dtype=dtype), _t(40, 24, dtype=dtype), _t(40, dtype=dtype)),
                        lambda x, w, b: blas.linear(x, w, b, "gelu", backend="pytorch"), CUDA),
        "linear-silu-nobias": ((_t(26, 24, dtype=dtype).mT.contiguous().mT, _t(40, 24, dtype=dtype)),
                               lambda x, w: blas.linear(x, w, None, "silu", backend="pytorch"), CUDA),
        "layer_norm": ((_t(2, 13, 48, dtype=dtype), _t(48, dtype=dtype), _t(48, dtype=dtype)),
                       lambda x, w, b: blas.layer_norm(x, w, b, backend="pytorch"), CUDA),
        "rms_norm": ((_t(26, 48, dtype=dtype), _t(48, dtype=dtype)),
                     lambda x, w: blas.rms_norm(x, w, backend="pytorch"), CUDA and _fused_rms()),
        "add_layer_norm": ((_t(26, 48, dtype=dtype), _t(26, 48, dtype=dtype), _t(48, dtype=dtype), _t(48, dtype=dtype)),
                           lambda x, r, w, b: torch.stack(blas.add_layer_norm(x, r, w, b, backend="pytorch")), CUDA),
        "add_rms_norm": ((_t(26, 48, dtype=dtype), _t(26, 48, dtype=dtype), _t(48, dtype=dtype)),
                         lambda x, r, w: torch.stack(blas.add_rms_norm(x, r, w, backend="pytorch")),
                         CUDA and _fused_rms()),
        "attention": ((_t(2, 13, 48, dtype=dtype), _t(2, 13, 48, dtype=dtype), _t(2, 13, 48, dtype=dtype)),
                      lambda q, k, v: blas.attention(tokens(q), tokens(k), tokens(v), causal=True, backend="pytorch"),
                      not CUDA or dtype in (torch.float16, torch.bfloat16)),
    }


def _fused_rms():
    from kcourse.blas.pytorch.rms_norm import FUSED
    return FUSED


def _formula_only(monkeypatch):
    monkeypatch.setattr(backend_module, "autograd_kernel", lambda name, op: None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(_cases(torch.float32)))
def test_composite_equals_the_formula(case, dtype, monkeypatch):
    inputs, call, runs = _cases(dtype)[case]
    dy = None
    results = []
    for composite in (True, False):
        with monkeypatch.context() as m:
            recorded = spy_aten_recorded(m)
            if not composite:
                _formula_only(m)
            out = call(*inputs)
            dy = torch.randn_like(out) if dy is None else dy
            grads = torch.autograd.grad(out, inputs, dy)
        assert recorded == ([("pytorch", case.split("-")[0])] if composite and runs else []), recorded
        results.append((out, grads))
    (out, grads), (ref, ref_grads) = results
    rtol, atol = TOL[dtype]
    assert out.dtype == ref.dtype and out.stride() == ref.stride(), (out.stride(), ref.stride())
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == r.dtype and g.shape == r.shape
        # the same kernels, so the same values but for the order of a sum (a bias gradient: ATen's column sum
        # against the formula's addmv), within the dtype's tolerance
        torch.testing.assert_close(g, r, rtol=rtol, atol=atol)


@pytest.mark.skipif(not CUDA, reason="the norms run under ATen's autograd on CUDA only")
def test_layer_norm_bias_alone_takes_the_formula(monkeypatch):
    """ATen's CUDA column sums give dbias wrongly past 65536 rows unless dweight is computed too
    (torch 2.11): a bias wanting a gradient beside a weight that does not keeps the op's formula."""
    recorded = spy_aten_recorded(monkeypatch)
    x, w, b = _t(70000, 8, dtype=torch.float32), _t(8, dtype=torch.float32, grad=False), _t(8, dtype=torch.float32)
    dy = torch.randn(70000, 8, device=DEVICE)
    db, = torch.autograd.grad(blas.layer_norm(x, w, b, backend="pytorch"), [b], dy)
    assert recorded == []
    torch.testing.assert_close(db, dy.double().sum(0).float(), rtol=1e-5, atol=1e-3)


def test_declined_where_aten_breaks_the_contract(monkeypatch):
    """A half linear on the CPU (ATen's CPU products are not the backend's), and any call without a gradient."""
    recorded = spy_aten_recorded(monkeypatch)
    x, w = _t(4, 8, dtype=torch.bfloat16), _t(6, 8, dtype=torch.bfloat16)
    blas.linear(x.cpu(), w.cpu(), backend="pytorch")
    with torch.no_grad():
        blas.linear(x, w, backend="pytorch")  # no gradient wanted: the kernel alone
    assert recorded == []


@pytest.mark.skipif(not CUDA, reason="cuBLAS's reduction setting concerns CUDA")
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_backward_products_sum_in_float32(dtype):
    """During the node's products the half-precision reductions are off; before and after, the user's
    setting stands (here: on, PyTorch's default)."""
    from kcourse.blas.pytorch.gemm import _FLAGS
    get, set_ = _FLAGS[dtype]
    before = get()
    state = before if isinstance(before, tuple) else (before,)
    set_(True, *state[1:])
    try:
        x, w, b = _t(64, 32, dtype=dtype), _t(48, 32, dtype=dtype), _t(48, dtype=dtype)
        y = blas.linear(x, w, b, "gelu", backend="pytorch")
        seen = []
        node = y.grad_fn.next_functions[0][0]  # the activation's node, then the product's
        while "mm" not in type(node).__name__.lower():
            node = node.next_functions[0][0]
        node.register_prehook(lambda grad_outputs: seen.append(get()))  # after the kcourse hook: its setting
        y.sum().backward()
        flag = lambda s: s[0] if isinstance(s, tuple) else s  # noqa: E731
        assert [flag(s) for s in seen] == [False]
        assert flag(get()) is True
    finally:
        set_(*state)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_linear_takes_its_formula_while_a_graph_is_captured(monkeypatch):
    """A replay costs no host time: under capture linear runs its own formula (less GPU time)."""
    recorded = spy_aten_recorded(monkeypatch)
    x, w, b = _t(64, 32, dtype=torch.bfloat16), _t(48, 32, dtype=torch.bfloat16), _t(48, dtype=torch.bfloat16)
    blas.linear(x, w, b, backend="pytorch").sum().backward()  # eagerly: recorded, and cuBLAS is warm
    assert recorded == [("pytorch", "linear")]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = blas.linear(x, w, b, backend="pytorch")
    assert recorded == [("pytorch", "linear")] and type(y.grad_fn).__name__ == "linear_functionBackward"
    graph.replay()
    torch.testing.assert_close(y, torch.addmm(b, x, w.t()), rtol=1.6e-2, atol=1e-2)


def test_no_hook_stays_on_the_inputs():
    """The hooks live on each call's own autograd node: inputs used again (leaves, say) collect none."""
    q, k, v = (_t(1, 2, 13, 16, dtype=torch.float32) for _ in range(3))
    x, w = _t(5, 8, dtype=torch.float32), _t(6, 8, dtype=torch.float32)
    for _ in range(3):
        blas.attention(q, k, v, causal=True, backend="pytorch").sum().backward()
        blas.linear(x, w, backend="pytorch").sum().backward()
    assert all(not t._backward_hooks for t in (q, k, v, x, w))
