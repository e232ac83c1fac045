"""kcourse.modules against the same model on the python backend and against torch.nn, forward
and every parameter's gradient; causality; the backend switch; and that forwards compute only
through kcourse.blas ops."""
import copy

import pytest
import torch
import torch.nn as nn

import kcourse
import torch_reference as ref
from kcourse import blas
from kcourse.modules import (GPT, MLP, Attention, Embedding, GPTConfig, LayerNorm, Linear, RMSNorm,
                             SwiGLU, set_backend)
from _util import DEVICE

GPT2 = dict(vocab_size=61, block_size=24, n_layer=2, n_head=4, n_embd=32, mlp="gelu", norm="layernorm",
            pos="learned", bias=True, tie_weights=True)
LLAMA = dict(vocab_size=61, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp="swiglu",
             norm="rmsnorm", pos="rope", bias=False, tie_weights=False)
DTYPES = (torch.float32, torch.bfloat16)


def close(actual, expected, dtype, scale=1.0):
    """Model-level tolerance: a few roundings of the dtype per layer, relative to the tensor's scale."""
    rtol, atol = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (4e-2, 2e-2)}[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=atol * scale)


def run(model, inputs, seed_grad=None):
    """Forward, then backward of a fixed random projection of the output; returns (out, grads)."""
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    out = out[1] if isinstance(out, tuple) else out
    (out * seed_grad).sum().backward() if seed_grad is not None else out.backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(ours, theirs, inputs, dtype, seed_grad=None):
    out, grads = run(ours, inputs, seed_grad)
    out_ref, grads_ref = run(theirs, inputs, seed_grad)
    close(out, out_ref, dtype, out_ref.abs().max().item() + 1)
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        scale = grads_ref[name].abs().max().item() + 1e-3
        close(grads[name], grads_ref[name], dtype, scale)


# ----------------------------------------------------------------------------- per module
def module_cases(backend):
    x = lambda *s: torch.randn(*s, device=DEVICE)  # noqa: E731
    return {
        "linear": (lambda: Linear(33, 17, backend=backend), lambda: nn.Linear(33, 17), (x(3, 5, 33),)),
        "linear_nobias": (lambda: Linear(33, 17, False, backend), lambda: nn.Linear(33, 17, bias=False), (x(7, 33),)),
        "layernorm": (lambda: LayerNorm(40, backend=backend), lambda: nn.LayerNorm(40), (x(3, 5, 40),)),
        "rmsnorm": (lambda: RMSNorm(40, backend=backend), lambda: nn.RMSNorm(40, eps=1e-6), (x(3, 5, 40),)),
        "embedding": (lambda: Embedding(50, 16, backend=backend), lambda: nn.Embedding(50, 16),
                      (torch.randint(0, 50, (3, 9), device=DEVICE),)),
        "mlp": (lambda: MLP(24, 64, backend=backend), lambda: ref.MLP(24, 64), (x(2, 7, 24),)),
        "swiglu": (lambda: SwiGLU(24, 64, backend=backend), lambda: ref.SwiGLU(24, 64), (x(2, 7, 24),)),
        "attention": (lambda: Attention(32, 4, backend=backend), lambda: ref.Attention(32, 4), (x(2, 9, 32),)),
        "attention_gqa_rope": (lambda: Attention(32, 4, 2, rope=True, bias=True, backend=backend),
                               lambda: ref.Attention(32, 4, 2, rope=True, bias=True), (x(2, 9, 32),)),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(module_cases(None)))
def test_module_matches_torch_nn(backend, case, dtype):
    make, make_ref, inputs = module_cases(backend)[case]
    torch.manual_seed(0)
    ours = make().to(DEVICE, dtype)
    theirs = make_ref().to(DEVICE, dtype)
    theirs.load_state_dict(ours.state_dict())
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    seed = torch.randn_like(theirs(*inputs).float()).to(dtype)
    compare(ours, theirs, inputs, dtype, seed)


@pytest.mark.parametrize("case", list(module_cases(None)))
def test_python_backend_matches_torch_nn(case):
    make, make_ref, inputs = module_cases("python")[case]
    ours, theirs = make().to(DEVICE), make_ref().to(DEVICE)
    theirs.load_state_dict(ours.state_dict())
    seed = torch.randn_like(theirs(*inputs))
    compare(ours, theirs, inputs, torch.float32, seed)


# ----------------------------------------------------------------------------- whole GPT
def gpt_inputs(config, B=2, T=19):
    idx = torch.randint(0, config.vocab_size, (B, T), device=DEVICE)
    return idx, torch.randint(0, config.vocab_size, (B, T), device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gpt_matches_python_backend_and_torch_nn(backend, arch, dtype):
    config = GPTConfig(**(GPT2 if arch == "gpt2" else LLAMA))
    torch.manual_seed(0)
    ours = GPT(config, backend=backend).to(DEVICE, dtype)
    reference = set_backend(copy.deepcopy(ours), "python")
    theirs = ref.GPT(config).to(DEVICE, dtype)
    theirs.load_state_dict(ours.state_dict())
    inputs = gpt_inputs(config)
    compare(ours, reference, inputs, dtype)
    compare(ours, theirs, inputs, dtype)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gpt_fused_and_unfused_loss_agree(backend, arch):
    """``fused_loss`` (the head and the loss as linear_cross_entropy, no logits) against the head then
    cross_entropy on the same weights: the same loss and gradients; ``return_logits=True`` gives both."""
    torch.manual_seed(0)
    fused = GPT(GPTConfig(**(GPT2 if arch == "gpt2" else LLAMA)), backend=backend).to(DEVICE)
    unfused = copy.deepcopy(fused)
    unfused.config = GPTConfig(**{**vars(fused.config), "fused_loss": False})
    inputs = gpt_inputs(fused.config)
    assert fused(*inputs)[0] is None and unfused(*inputs)[0] is not None
    compare(fused, unfused, inputs, torch.float32)
    logits, loss = fused(*inputs, return_logits=True)
    assert logits.shape == (*inputs[0].shape, fused.config.vocab_size)
    close(loss, unfused(*inputs)[1], torch.float32)


def test_gpt_fused_false_runs_each_op_alone(backend, monkeypatch):
    """``GPTConfig(fused=False)``: the MLP's activation as its own op after c_fc, the head then
    cross_entropy; the same loss and gradients as the fused model on the same weights."""
    from _util import spy_kernels

    torch.manual_seed(0)
    fused = GPT(GPTConfig(**GPT2), backend=backend).to(DEVICE)
    plain = GPT(GPTConfig(**{**GPT2, "fused": False}), backend=backend).to(DEVICE)
    plain.load_state_dict(fused.state_dict())
    inputs = gpt_inputs(fused.config)
    compare(fused, plain, inputs, torch.float32)
    calls = spy_kernels(monkeypatch)
    plain(*inputs)
    assert (backend, "gelu") in calls and (backend, "cross_entropy") in calls
    assert (backend, "linear_cross_entropy") not in calls


def test_gpt_python_backend_matches_torch_nn():
    for arch in (GPT2, LLAMA, {**LLAMA, "fused_loss": False}):
        config = GPTConfig(**arch)
        ours = GPT(config, backend="python").to(DEVICE)
        theirs = ref.GPT(config).to(DEVICE)
        theirs.load_state_dict(ours.state_dict())
        compare(ours, theirs, gpt_inputs(config), torch.float32)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_causality(backend, arch):
    config = GPTConfig(**(GPT2 if arch == "gpt2" else LLAMA))
    model = GPT(config, backend=backend).to(DEVICE)
    idx, _ = gpt_inputs(config, B=1, T=16)
    changed = idx.clone()
    changed[0, 10] = (idx[0, 10] + 1) % config.vocab_size
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, :10], b[:, :10]), "a later token changed earlier logits"
    assert not torch.equal(a[:, 10:], b[:, 10:])


def test_generate_shapes_and_greedy_is_deterministic():
    model = GPT(GPTConfig(**GPT2)).to(DEVICE)
    idx = torch.zeros((2, 3), dtype=torch.long, device=DEVICE)
    out = model.generate(idx, 30, temperature=0, use_cache=False)  # longer than block_size: the context is cropped
    assert out.shape == (2, 33) and torch.equal(out[:, :3], idx)
    assert torch.equal(out, model.generate(idx, 30, temperature=0, use_cache=False))
    sampled = model.generate(idx, 5, temperature=0.8, top_k=5)
    assert sampled.shape == (2, 8) and int(sampled.max()) < GPT2["vocab_size"]


# ----------------------------------------------------------------------------- the switch
def test_backend_reaches_every_submodule_and_set_backend():
    model = GPT(GPTConfig(**LLAMA), backend="python")
    kmods = [m for m in model.modules() if isinstance(m, kcourse.modules.Module)]
    assert kmods and all(m.backend == "python" for m in kmods)
    set_backend(model, "pytorch")
    assert all(m.backend == "pytorch" for m in kmods)
    set_backend(model, None)
    assert all(m.backend is None for m in kmods)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        set_backend(model, "nope")


def test_context_applies_where_backend_is_none(monkeypatch):
    from _util import spy_kernels

    model = Linear(8, 4).to(DEVICE)
    calls = spy_kernels(monkeypatch)
    with kcourse.use_backend("python"):
        model(torch.randn(3, 8, device=DEVICE))
    assert calls == [("python", "linear")]


# ----------------------------------------------------------------------------- only kcourse.blas
ALLOWED = {"reshape", "view", "split", "transpose", "permute", "expand", "expand_as", "__getitem__", "arange",
           "size", "dim", "mT", "__get__", "shape", "contiguous", "numel", "unsqueeze", "squeeze", "flatten",
           "device", "dtype", "is_floating_point", "requires_grad"}


def test_forward_computes_only_through_blas(monkeypatch):
    """Record every torch function a forward calls outside kcourse.blas ops: only views remain."""
    from torch.overrides import TorchFunctionMode

    depth = [0]
    for name in blas.__all__:
        real = getattr(blas, name)

        def wrapped(*args, _real=real, **kwargs):
            depth[0] += 1
            try:
                return _real(*args, **kwargs)
            finally:
                depth[0] -= 1
        monkeypatch.setattr(blas, name, wrapped)

    seen = set()

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if depth[0] == 0:
                seen.add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    for arch in (GPT2, LLAMA):
        model = GPT(GPTConfig(**arch), backend="pytorch").to(DEVICE)
        idx, targets = gpt_inputs(GPTConfig(**arch))
        with Record():
            model(idx, targets)
    assert seen <= ALLOWED, f"forward computed outside kcourse.blas: {sorted(seen - ALLOWED)}"


def test_modules_source_has_no_torch_math():
    """No torch.nn layers, torch.nn.functional, matmul/softmax/SDPA calls or `@` in kcourse/modules."""
    import ast
    import pathlib

    banned_attrs = {"matmul", "mm", "bmm", "softmax", "log_softmax", "scaled_dot_product_attention", "functional",
                    "Linear", "LayerNorm", "RMSNorm", "Embedding", "GELU", "ReLU", "SiLU", "layer_norm", "gelu"}
    root = pathlib.Path(kcourse.modules.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            assert not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult)), f"{where}: @"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert not (node.value.id in ("torch", "nn", "F") and node.attr in banned_attrs), \
                    f"{where}: {node.value.id}.{node.attr}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any("functional" in n for n in names), f"{where}: imports torch.nn.functional"
