"""A lean, capturable training step. On every backend that runs here: how many kernels a step of a
tiny GPT launches and that kcourse's own glue (modules, autograd, autograd's engine) copies
nothing it need not. On a GPU: a step never synchronizes with the host, and the whole step --
forward, backward, AdamW -- captured in a CUDA graph replays the loss sequence of eager steps,
in a test and in examples/train_gpt.py --cuda-graph."""
import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kcourse.modules import GPT, GPTConfig
from _util import DEVICE
from test_training import example

LAYERS = 2
ARCHS = {"gpt2": {}, "llama": dict(mlp="swiglu", norm="rmsnorm", pos="rope", n_kv_head=2, bias=False)}
STEPS, WARMUP = 8, 3  # GPU tests: steps in all, eager steps before the capture
# Eager and graphed steps run the same kernels on the same values; only the order of atomic
# additions (embedding backward, SDPA's dq) can differ between runs, as between any two eager runs.
LOSS_RTOL = 1e-4
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and host syncs need a CUDA GPU")


def make(backend, arch, capturable=False):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=LAYERS, n_head=4, n_embd=32, **ARCHS[arch])
    model = GPT(config, backend=backend).to(DEVICE)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=capturable)


def batches(n):
    """``n`` (inputs, targets) pairs (4, 15), contiguous; learnable: next = previous + 7 (mod 40)."""
    gen = torch.Generator().manual_seed(1)
    seqs = [(torch.randint(0, 40, (4, 1), generator=gen) + torch.arange(16) * 7) % 40 for _ in range(n)]
    return [(s[:, :-1].contiguous().to(DEVICE), s[:, 1:].contiguous().to(DEVICE)) for s in seqs]


def train_step(model, opt, x, y):
    _, loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


# ----------------------------------------------------------------------------- kernels and copies
class StepSpy(TorchDispatchMode):
    """Counts the backend kernels a step calls (``kernels``, by op: a BLAS op's forward and its
    pullback's ops, a primitive's forward) and the aten ops that move data (copies,
    concatenations, casts) run outside those kernels (``copies``): by the modules, the pullbacks and
    autograd's engine, e.g. AccumulateGrad copying a gradient into its parameter's layout."""
    COPIES = {"copy_", "clone", "cat", "_to_copy", "new_empty_strided"}

    def __init__(self, monkeypatch):
        super().__init__()
        self.depth, self.kernels, self.copies = 0, collections.Counter(), collections.Counter()
        import kcourse.backend as backend_module

        def spied(lookup, counted):
            def patched(name, op):
                kernel = lookup(name, op)
                if kernel is None:
                    return None

                def run(*args, **kwargs):
                    self.kernels[op] += counted
                    self.depth += 1
                    try:
                        return kernel(*args, **kwargs)
                    finally:
                        self.depth -= 1
                return run
            return patched

        monkeypatch.setattr(backend_module, "_kernel", spied(backend_module._kernel, 1))
        monkeypatch.setattr(backend_module, "backward_kernel", spied(backend_module.backward_kernel, 0))
        monkeypatch.setattr(backend_module, "_RESOLVED", {})  # kernels resolved before now: through the spy too

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.depth == 0 and name in self.COPIES:
            self.copies[name] += 1
        return func(*args, **(kwargs or {}))


def expected_kernels(arch):
    """Per step: one linear per Linear of the blocks (its gemms and gemv, forward and backward, run
    inside it; the MLP's gelu in c_fc's), each residual add in the op of the norm that reads the sum
    (the attention's in ln_2, the MLP's in the next block's ln_1 or in ln_f), the LM head and the
    loss as one linear_cross_entropy, and nothing else: no scal (every scale in a GPT is 1), no copy
    kernel, one axpby (GPT-2's tokens + positions)."""
    L = LAYERS
    if arch == "gpt2":  # c_attn, c_proj, c_fc (with the gelu), c_proj per layer; ln_1 of the first block alone
        return {"linear": 4 * L, "axpby": 1, "layer_norm": 1, "add_layer_norm": 2 * L, "attention": L,
                "embedding": 2, "linear_cross_entropy": 1}
    # c_attn, c_proj, w_down; w_gate, w_up and the gated unit as one linear_swiglu
    return {"linear": 3 * L, "linear_swiglu": L, "rms_norm": 1, "add_rms_norm": 2 * L, "rope": 2 * L,
            "attention": L, "embedding": 1, "linear_cross_entropy": 1}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_kernels_and_copies_per_step(backend, arch, monkeypatch):
    """The kernels of a step, and what it copies outside them, at most: per layer the attention
    output (B, H, T, hd) -> (B, T, H hd) and its gradient back (the attention kernels' layout),
    and one concatenation of the q, k, v gradients into the projection's gradient (split's
    backward); with rope on the pytorch backend also the q and k gradients (SDPA returns them in
    q's and k's strided layout, and a primitive's backward kernels take a contiguous gradient).
    No weight gradient is copied into its parameter's layout, no head gradient is copied before
    that concatenation."""
    model, opt = make(backend, arch)
    (x, y), = batches(1)
    train_step(model, opt, x, y)  # first-call work (compiles, autotuning) is not counted
    with StepSpy(monkeypatch) as spy:
        train_step(model, opt, x, y)
    assert dict(spy.kernels) == expected_kernels(arch)
    copies = spy.copies
    clones = 2 * LAYERS + (2 * LAYERS if backend == "pytorch" and arch == "llama" else 0)
    assert copies["clone"] <= clones and copies["cat"] <= LAYERS, copies
    assert copies["copy_"] == copies["new_empty_strided"] == copies["_to_copy"] == 0, copies
    weights = [p for name, p in model.named_parameters() if name.endswith("weight") and p.dim() == 2]
    assert all(p.grad.stride() == p.stride() for p in weights)


# ----------------------------------------------------------------------------- on a GPU
@cuda_only
@pytest.mark.parametrize("arch", list(ARCHS))
def test_step_does_not_synchronize(backend, arch):
    """No kcourse op waits for the GPU: a step runs under torch.cuda.set_sync_debug_mode("error")."""
    model, opt = make(backend, arch, capturable=True)
    data = batches(2)
    train_step(model, opt, *data[0])  # compiles and autotunes: that synchronizes, once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_step(model, opt, *data[1])
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda_only
@pytest.mark.parametrize("arch", list(ARCHS))
def test_captured_step_matches_eager(backend, arch):
    """examples/train_gpt.py's step (with gradient clipping) eagerly, then warmed up, captured in a
    CUDA graph (train_gpt.capture) and replayed: the same loss sequence."""
    train_gpt = example("train_gpt")
    data = batches(STEPS)
    model, opt = make(backend, arch, capturable=True)
    eager = [train_gpt.train_step(model, opt, x, y).item() for x, y in data]

    model, opt = make(backend, arch, capturable=True)
    side = torch.cuda.Stream()
    graphed = [train_gpt.on_side_stream(side, train_gpt.train_step, model, opt, x, y).item() for x, y in data[:WARMUP]]
    step = train_gpt.capture(model, opt, *data[WARMUP])
    graphed += [step(x, y).item() for x, y in data[WARMUP:]]
    assert eager[-1] < eager[0] - 0.1, "the tiny model did not learn"
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=LOSS_RTOL, atol=0)


@cuda_only
def test_train_gpt_cuda_graph_gives_the_same_losses(tmp_path):
    train_gpt = example("train_gpt")
    common = ["--backend", "triton", "--device", "cuda", "--n-layer", "1", "--n-embd", "32", "--block-size", "16",
              "--batch-size", "4", "--corpus-bytes", "20000", "--sample", "0", "--quiet", "--steps", str(STEPS)]
    eager = train_gpt.train(train_gpt.parse_args(common + ["--out", str(tmp_path / "eager")]))
    graphed = train_gpt.train(train_gpt.parse_args(common + ["--out", str(tmp_path / "graphed"), "--cuda-graph"]))
    assert len(graphed) == STEPS
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=LOSS_RTOL, atol=0)
