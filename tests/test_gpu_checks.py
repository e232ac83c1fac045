"""GPU checks at realistic sizes that the per-op tests do not make (CUDA only, marker ``gpu``):

* every op launches on the caller's stream and never synchronizes with the host: captured in a
  CUDA graph on a side stream, the replay on fresh inputs gives the bits of an eager call;
* the reductions are deterministic: the same inputs give the same bits twice (forward, and the
  backward of the row-wise primitives);
* a GPT trained for many steps on each GPU backend follows the pytorch backend's loss curve (the
  training test's 20 steps, then a looser bound over the rest: float32 rounding differences grow
  through the optimizer).
"""
import pytest
import torch

import kcourse
from kcourse import blas
from kcourse.modules import GPT, GPTConfig

pytestmark = pytest.mark.gpu  # the ``backend`` fixture (tests/conftest.py) runs pytorch, triton and cute


def backend_or_skip(name):
    info = kcourse.backends()[name]
    if not info.available:
        pytest.skip(f"{name} backend unavailable here: {info.reason}")
    return name


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


# op name -> (make the inputs, call the op on them): realistic sizes, bfloat16 where the op takes it
CASES = {
    "copy": (lambda: (randn(1 << 24),), lambda x: blas.copy(x)),
    "axpby": (lambda: (randn(1 << 24), randn(1 << 24)), lambda x, y: blas.axpby(x, y, 1.5, -0.5)),
    "dot": (lambda: (randn(1 << 24), randn(1 << 24)), lambda x, y: blas.dot(x, y)),
    "gemv": (lambda: (randn(4096, 4096), randn(4096)), lambda a, x: blas.gemv(a, x)),
    "geru": (lambda: (randn(4096, 4096), randn(4096), randn(4096)), lambda a, x, y: blas.geru(a, x, y)),
    "gemm": (lambda: (randn(2048, 4096), randn(4096, 2048)), lambda a, b: blas.gemm(a, b)),
    "softmax": (lambda: (randn(8192, 4096),), lambda x: blas.softmax(x)),
    "layer_norm": (lambda: (randn(8192, 4096), randn(4096), randn(4096)), lambda x, w, b: blas.layer_norm(x, w, b)),
    "rms_norm": (lambda: (randn(8192, 4096), randn(4096)), lambda x, w: blas.rms_norm(x, w)),
    "cross_entropy": (lambda: (randn(8192, 8192), torch.randint(0, 8192, (8192,), device="cuda")),
                      lambda x, t: blas.cross_entropy(x, t)),
    "gelu": (lambda: (randn(8192, 4096),), lambda x: blas.gelu(x)),
    "attention": (lambda: (randn(4, 16, 2048, 128), randn(4, 16, 2048, 128), randn(4, 16, 2048, 128)),
                  lambda q, k, v: blas.attention(q, k, v, causal=True)),
}
ROWWISE = ("softmax", "layer_norm", "rms_norm", "cross_entropy")


@pytest.mark.parametrize("op", CASES)
def test_op_replays_from_a_cuda_graph(backend, op):
    make, call = CASES[op]
    with kcourse.use_backend(backend):
        torch.manual_seed(0)
        inputs = make()
        call(*inputs)  # compile / autotune outside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call(*inputs)
        fresh = make()
        for static, new in zip(inputs, fresh):
            static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want = call(*fresh)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("op", [op for op in CASES if op != "attention"])
def test_same_bits_twice(backend, op):
    make, call = CASES[op]
    with kcourse.use_backend(backend):
        torch.manual_seed(0)
        inputs = make()
        if op in ROWWISE:  # and the backward (x and the weights' gradients)
            grads = [t.requires_grad_() for t in inputs if t.is_floating_point()]
            runs = []
            for _ in range(2):
                out = call(*inputs)
                dy = torch.ones_like(out) if out.dim() == 0 else torch.randn(
                    out.shape, device="cuda", dtype=out.dtype, generator=torch.Generator("cuda").manual_seed(1))
                runs.append((out, *torch.autograd.grad(out, grads, dy)))
        else:
            runs = [(call(*inputs),) for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def train_losses(backend, steps):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=256, mlp="swiglu",
                       norm="rmsnorm", pos="rope", n_kv_head=2, bias=False)
    model = GPT(config, backend=backend).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    text = torch.randint(0, 64, (1 << 16,), generator=gen)
    text = (text + torch.arange(text.numel()) % 7).clamp_max(255)  # some structure to learn
    losses = []
    for _ in range(steps):
        start = torch.randint(0, text.numel() - 129, (16,), generator=gen)
        batch = torch.stack([text[s:s + 129] for s in start.tolist()]).cuda()
        _, loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


@pytest.mark.parametrize("name", ["triton", "cute"])
def test_long_training_follows_pytorch(name):
    steps = 200
    got = train_losses(backend_or_skip(name), steps)
    want = train_losses("pytorch", steps)
    torch.testing.assert_close(got[:20], want[:20], rtol=2e-3, atol=0)  # as tests/test_training.py
    torch.testing.assert_close(got, want, rtol=2e-2, atol=0)
    assert want[-20:].mean() < want[:5].mean() - 0.5  # it trained (the data's entropy is about 4.2 nats)
