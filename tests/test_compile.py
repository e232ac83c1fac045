"""torch.compile of kcourse models GPT (GPT-2-like and Llama-like) and every
module trace whole (``fullgraph=True``, no graph break) and give eager's loss and gradients;
dynamic batch and sequence length recompile at most once per shape class; the backend switch is a
guard; a traced call with bad arguments raises the eager error.

Compiled on CPU with inductor (one case per backend: ~15 s each), otherwise with aot_eager (which
still traces forward and backward through the fake implementations, functionalized)."""
import logging

import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.registry import lookup_backend

import kcourse
import kcourse.backend as backend_module
from kcourse import blas
from kcourse.modules import GPT, MLP, Attention, Block, GPTConfig, LayerNorm, Linear, RMSNorm, SwiGLU
from _util import DEVICE, require_backend
from test_step import ARCHS, batches, make


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Counting:
    """A torch.compile backend that counts the graphs it compiles and runs them through aot_eager."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return lookup_backend("aot_eager")(gm, example_inputs)


def loss_and_grads(model, x, y, run=None):
    """The loss of ``run`` (default: ``model``) and the gradient of each of ``model``'s parameters."""
    model.zero_grad(set_to_none=True)
    _, loss = (model if run is None else run)(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def assert_rel(actual, expected, rtol=1e-5):
    """``actual`` within ``rtol`` of ``expected``, relative to the tensor's largest magnitude."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale)


# (backend, arch, compiler): one inductor case per eager backend, the rest aot_eager
GPT_CASES = [("python", "gpt2", "inductor"), ("python", "llama", "aot_eager"),
             ("pytorch", "gpt2", "aot_eager"), ("pytorch", "llama", "inductor"),
             ("triton", "gpt2", "aot_eager"),
             pytest.param("triton", "llama", "aot_eager", marks=pytest.mark.slow)]  # ~30 s in the interpreter


@pytest.mark.parametrize("name, arch, compiler", GPT_CASES)
def test_gpt_compiles_whole_and_matches_eager(name, arch, compiler, monkeypatch, request):
    require_backend(name)
    calls = []
    if compiler == "inductor":  # each kcourse op reaches inductor with its lowering made: no implicit
        # fallback, whose info log formats the op's upstream graph (eagerly on torch 2.11: minutes)
        from torch._inductor import config, exc
        monkeypatch.setattr(exc.OperatorIssue, "operator_str", staticmethod(lambda *a: calls.append(a[0]) or ""))
        no_cache = [config.patch(fx_graph_cache=False),  # lower the graph here, not load it from disk
                    torch._functorch.config.patch(enable_autograd_cache=False)]  # (config.patch: the
        for patch in no_cache:  # config modules' own mechanism; monkeypatch's undo deletes their entries)
            patch.__enter__()
            request.addfinalizer(lambda patch=patch: patch.__exit__(None, None, None))
        torch._logging.set_logs(inductor=logging.INFO)  # torch 2.13 formats the log's arguments only then
        request.addfinalizer(torch._logging.set_logs)
    model, _ = make(name, arch)
    x, y = batches(1)[0]
    if name == "triton" and DEVICE == "cpu":  # the interpreter: one layer, fewer tokens
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=4, n_embd=32, **ARCHS[arch]),
                    backend=name)
        x, y = x[:2, :8].contiguous(), y[:2, :8].contiguous()
    if name != "triton":  # through the interpreter explain's extra run costs ~10 s; fullgraph=True below
        explained = torch._dynamo.explain(model)(x, y)  # fails on any graph break anyway
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1
        torch._dynamo.reset()
    loss, grads = loss_and_grads(model, x, y)
    compiled = torch.compile(model, backend=compiler, fullgraph=True)
    loss_c, grads_c = loss_and_grads(model, x, y, compiled)
    assert not calls, f"implicit inductor fallbacks for {calls}"
    assert_rel(loss_c, loss)
    assert grads_c.keys() == grads.keys()
    for n in grads:
        assert_rel(grads_c[n], grads[n])


def module_cases():
    gpt2 = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=4, n_embd=32)
    llama = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=4, n_embd=32, **ARCHS["llama"])
    return {
        "linear": lambda: Linear(32, 24),
        "layernorm": lambda: LayerNorm(32),
        "rmsnorm": lambda: RMSNorm(32),
        "mlp": lambda: MLP(32, 64),
        "swiglu": lambda: SwiGLU(32, 64),
        "attention_gqa_rope": lambda: Attention(32, 4, 2, rope=True),
        "block_gpt2": lambda: Block(gpt2),
        "block_llama": lambda: Block(llama),
    }


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "block_llama" else c
                                  for c in module_cases()])  # block_llama's parts are cases of their own
def test_module_compiles_whole_and_matches_eager(case):
    torch.manual_seed(0)
    with kcourse.use_backend("pytorch"):
        module = module_cases()[case]().to(DEVICE)
    x = torch.randn(2, 7, 32, device=DEVICE, requires_grad=True)
    seed = torch.randn(2, 7, module(x).shape[-1], device=DEVICE)

    def run(m):
        x.grad = None
        module.zero_grad(set_to_none=True)
        out = m(x)
        (out * seed).sum().backward()
        return out.detach(), x.grad.clone(), {n: p.grad.clone() for n, p in module.named_parameters()}

    with kcourse.use_backend("pytorch"):
        out, dx, grads = run(module)
        out_c, dx_c, grads_c = run(torch.compile(module, backend="aot_eager", fullgraph=True))
    assert_rel(out_c, out)
    assert_rel(dx_c, dx)
    assert grads_c.keys() == grads.keys()
    for n in grads:
        assert_rel(grads_c[n], grads[n])


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a == "llama" else a for a in ARCHS])
def test_dynamic_shapes_recompile_once_per_shape_class(arch):
    # forward only (the gradients of compiled GPTs are compared above): the count is made there
    model, _ = make("pytorch", arch)
    counting = Counting()
    compiled = torch.compile(model, backend=counting, dynamic=None, fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    # the first shape compiles a static graph; a second batch size makes the batch dynamic, a
    # second sequence length the length: (B, T) -> graphs compiled so far, at most
    shapes = {(2, 8): 1, (3, 8): 2, (5, 8): 2, (2, 13): 3, (3, 13): 3, (5, 13): 3}
    with torch.no_grad():
        for (B, T), most in shapes.items():
            x = torch.randint(0, 40, (B, T), generator=gen).to(DEVICE)
            y = torch.randint(0, 40, (B, T), generator=gen).to(DEVICE)
            logits_c, loss_c = compiled(x, y)  # the fused head and loss: no logits
            assert counting.graphs <= most, ((B, T), counting.graphs)
            logits, loss = model(x, y)
            assert logits_c is None and logits is None
            assert_rel(loss_c, loss)


def test_use_backend_switch_recompiles_and_runs_the_new_backend(monkeypatch):
    ran = []
    real = backend_module.resolve
    monkeypatch.setattr(backend_module, "resolve", lambda op, name=None: ran.append((op, name)) or real(op, name))
    counting = Counting()
    f = torch.compile(lambda A, B: blas.softmax(blas.gemm(A, B)), backend=counting, fullgraph=True)
    A, B = torch.randn(3, 4, device=DEVICE), torch.randn(4, 5, device=DEVICE)
    expected = torch.softmax(A @ B, -1)
    for name, graphs in (("python", 1), ("pytorch", 2), ("python", 2), ("pytorch", 2)):
        ran.clear()
        with kcourse.use_backend(name):
            torch.testing.assert_close(f(A, B), expected)
        assert counting.graphs == graphs
        assert {b for _, b in ran} == {name}, ran
        assert {op for op, _ in ran} == {"gemm", "softmax"}, ran
    # the backend= argument is part of the graph too: no guard needed, and no leak of the block
    g = torch.compile(lambda A, B: blas.gemm(A, B, backend="python"), backend="aot_eager", fullgraph=True)
    ran.clear()
    with kcourse.use_backend("pytorch"):
        g(A, B)
    assert {b for _, b in ran} == {"python"}, ran


def test_compiled_code_does_not_guard_on_the_backend_cache():
    """A graph traced before an eager call fills the backend cache (backend._RESOLVED) still runs
    after it: the traced code never reads the cache, so its filling is no guard failure."""
    backend_module._RESOLVED.pop(("softmax", "pytorch"), None)
    counting = Counting()
    f = torch.compile(lambda x: blas.softmax(x, backend="pytorch"), backend=counting, fullgraph=True)
    x = torch.randn(3, 5, device=DEVICE)
    f(x)
    blas.softmax(x, backend="pytorch")
    assert ("softmax", "pytorch") in backend_module._RESOLVED
    torch.testing.assert_close(f(x), torch.softmax(x, -1))
    assert counting.graphs == 1


@pytest.mark.parametrize("name", ["python", "pytorch"])
@pytest.mark.parametrize("case", ["gemm_inner", "gemv_x", "attention_heads", "softmax_dim"])
def test_compiled_invalid_arguments_raise_the_eager_error(name, case):
    t = lambda *s: torch.randn(*s, device=DEVICE)  # noqa: E731
    call, inputs = {
        "gemm_inner": (lambda A, B: blas.gemm(A, B, backend=name), (t(3, 4), t(5, 6))),
        "gemv_x": (lambda A, x: blas.gemv(A, x, backend=name), (t(3, 4), t(3))),
        "attention_heads": (lambda q, k: blas.attention(q, k, k, backend=name), (t(1, 3, 4, 8), t(1, 2, 4, 8))),
        "softmax_dim": (lambda x: blas.softmax(x, 3, backend=name), (t(3, 4),)),
    }[case]
    with pytest.raises(ValueError) as eager:
        call(*inputs)
    with pytest.raises(ValueError) as compiled:
        torch.compile(call, backend="aot_eager", fullgraph=False)(*inputs)
    assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_inplace_op_through_torch_ops_refuses_an_aliased_target(name):
    """A compiled graph calls ``torch.ops.kcourse.<op>_`` on real tensors (its trace could not read
    addresses): an aliased target is the eager ValueError there too, never a kernel racing itself."""
    buf = torch.arange(8.0, device=DEVICE)
    with pytest.raises(ValueError) as eager:
        blas.copy_(buf[:-1], buf[1:], backend=name)
    with pytest.raises(ValueError) as through_ops:
        torch.ops.kcourse.copy_(buf[:-1], buf[1:], name)
    assert str(through_ops.value) == str(eager.value)
    assert torch.equal(buf, torch.arange(8.0, device=DEVICE))  # nothing written


def test_kv_cache_decode_step_compiles_whole():
    """A decode step with the KV cache traces whole: its cache writes are in-place kcourse ops
    (``copy_`` into buffers made by the eager prefill), whose aliasing check reads addresses only
    eagerly."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16), backend="pytorch")
    model = model.to(DEVICE).eval()
    prompt = torch.randint(0, 32, (2, 4), device=DEVICE)

    def step(tok, cache):
        return model.lm_head(model.hidden_states(tok, cache)[:, -1]).argmax(dim=-1, keepdim=True)

    with torch.no_grad():
        outputs = []
        for run in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
            cache = model.kv_cache(7)
            tokens = [step(prompt, cache)]  # the prefill, eager
            for _ in range(3):
                tokens.append(run(tokens[-1], cache))
            outputs.append(torch.cat(tokens, 1))
    assert torch.equal(outputs[1], outputs[0])


def test_inductor_code_calls_each_op_s_twin():
    """Inductor's generated code calls ``torch.ops.kcourse._<op>`` (the op's schema, implementation
    and fake without the Python autograd and autocast layers, which the compiled graph has done):
    forward and backward ops alike, an in-place op's write kept; results as eager."""
    from torch._inductor.utils import run_and_get_code

    def f(x, w, buf):
        y = blas.gelu(blas.gemm(x, w, backend="pytorch"), backend="pytorch")
        blas.copy_(y.detach(), buf, backend="pytorch")
        return y.sum() + buf.sum()

    x, w = torch.randn(3, 5, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    buf, eager_buf = torch.zeros(3, 4), torch.zeros(3, 4)
    expected = f(x, w, eager_buf)
    expected_grads = torch.autograd.grad(expected, (x, w))
    compiled = torch.compile(f, fullgraph=True)
    got, code = run_and_get_code(lambda: (lambda out: (out, torch.autograd.grad(out, (x, w))))(compiled(x, w, buf)))
    code = "\n".join(code)
    for op in ("gemm", "gelu", "gelu_backward", "copy_"):  # (the op's own name shows in comments)
        assert f"torch.ops.kcourse._{op}.default(" in code and f"torch.ops.kcourse.{op}.default(" not in code, op
    torch.testing.assert_close(got[0], expected)
    torch.testing.assert_close(buf, eager_buf)
    for a, e in zip(got[1], expected_grads):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("name", ["python", "pytorch"])
def test_attention_with_kv_len_compiles_with_inductor(name):
    # kv_len, an optional tensor input of the custom op, through inductor's fallback: eager's result
    q, k, v = (torch.randn(*s, device=DEVICE) for s in ((2, 4, 1, 16), (2, 2, 9, 16), (2, 2, 9, 16)))
    kv_len = torch.tensor([3, 9], dtype=torch.int32, device=DEVICE)
    attend = lambda q, k, v, kv_len: blas.attention(q, k, v, kv_len=kv_len, backend=name)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(attend, fullgraph=True)(q, k, v, kv_len), attend(q, k, v, kv_len))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_static_cache_decode_step_compiles_whole_once(arch):
    """On a static cache a decode step has the same shapes at every position (it writes by index_copy_
    at the device's position and attends over the whole buffer with kv_len): it traces whole, and
    after the first decode step's graph at most one recompile (the position made symbolic) serves
    every later step; the tokens are eager's."""
    torch.manual_seed(0)
    extra = dict(norm="rmsnorm", pos="rope", mlp="swiglu", bias=False, n_kv_head=1) if arch == "llama" else {}
    model = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16, **extra), backend="pytorch")
    model = model.to(DEVICE).eval()
    prompt = torch.randint(0, 32, (2, 4), device=DEVICE)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(tok, cache):
        return model.lm_head(model.hidden_states(tok, cache)[:, -1]).argmax(dim=-1, keepdim=True)

    with torch.no_grad():
        outputs = []
        for run in (step, torch.compile(step, backend=counting, fullgraph=True)):
            cache = model.kv_cache(16, static=True)
            tokens = [step(prompt, cache)]  # the prefill, eager
            for _ in range(6):
                tokens.append(run(tokens[-1], cache))
            outputs.append(torch.cat(tokens, 1))
    assert torch.equal(outputs[1], outputs[0])
    assert 1 <= len(graphs) <= 2, len(graphs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pytorch", "triton", "cute"])
def test_gpt_reduce_overhead_matches_eager(name, monkeypatch):
    """mode="reduce-overhead" (cudagraph trees): the warm-up run is eager but allocates from the graph's
    memory pool, so no op may keep a tensor made there (its caches start empty here, as in a fresh
    process); the replays give eager's loss and gradients."""
    require_backend(name)
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs need CUDA")
    from kcourse.blas import _cache, _rope
    monkeypatch.setattr(_cache, "_ONES", {})
    monkeypatch.setattr(_rope, "_TABLES", {})
    monkeypatch.setattr(_cache, "_STARTS", {})
    if name == "cute":
        from kcourse.blas.cute import _compile
        monkeypatch.setattr(_compile, "_workspaces", {})
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=128, block_size=64, n_layer=2, n_head=2, n_embd=64, mlp="swiglu",
                       norm="rmsnorm", pos="rope", bias=False)
    model = GPT(config, backend=name).to(DEVICE)
    x, y = (torch.randint(0, 128, (2, 64), device=DEVICE) for _ in range(2))
    loss, grads = loss_and_grads(model, x, y)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, recording, replay
        loss_c, grads_c = loss_and_grads(model, x, y, run=compiled)
    assert_rel(loss_c, loss)
    for n in grads:
        assert_rel(grads_c[n], grads[n], rtol=1e-4)


def test_compile_caches_are_keyed_on_kcourse_s_source(monkeypatch):
    # inductor's and AOTAutograd's disk caches key a graph on its ops' names: kcourse's source hash
    # in torch.compile's cache key makes a changed fake implementation compile anew
    from pathlib import Path

    from kcourse.blas import _library

    tag = _library._source_tag()
    assert tag in torch.compiler.config.cache_key_tag
    _library._tag_compile_caches()  # idempotent
    assert torch.compiler.config.cache_key_tag.count(tag) == 1
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",
                        lambda self: real(self) + (b"# changed" if self.name == "_library.py" else b""))
    assert _library._source_tag() != tag
