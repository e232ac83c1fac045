"""Training end to end: the same tiny GPT, seed and batches give the same loss sequence on every
backend; the examples train, resume exactly, and classify digits."""
import functools
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kcourse.modules import GPT, GPTConfig
from _util import DEVICE

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
# Loss sequences agree to this relative tolerance in float32: kernels sum in different orders, and
# AdamW amplifies those differences a little each step (measured drift stays well below it).
LOSS_RTOL = 2e-3


def example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def python_losses(arch_name):
    return losses("python", ARCHS[arch_name])


def losses(backend, arch, steps=STEPS):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_embd=32, **arch)
    model = GPT(config, backend=backend).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        start = torch.randint(0, 40, (4, 1), generator=gen)
        idx = ((start + torch.arange(16) * 7) % 40).to(DEVICE)  # learnable: next = previous + 7 (mod 40)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return torch.tensor(out)


ARCHS = {"gpt2": {}, "llama": dict(mlp="swiglu", norm="rmsnorm", pos="rope", n_kv_head=2, bias=False)}


# Triton's CPU interpreter takes ~8 s a step here: by default the first steps are compared, every
# step with -m slow (the GPU runs include it).
FIRST_STEPS = 3


@functools.lru_cache(maxsize=None)
def python_first_losses(arch_name):
    return losses("python", ARCHS[arch_name], FIRST_STEPS)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("steps", [pytest.param(STEPS, id="all-steps", marks=pytest.mark.slow),
                                   pytest.param(FIRST_STEPS, id="first")])
def test_same_loss_sequence_on_every_backend(backend, arch, steps):
    if steps == STEPS:
        reference = python_losses(arch)
        assert reference[-1] < reference[0] - 0.2, "the tiny model did not learn"
    else:
        reference = python_first_losses(arch)
    torch.testing.assert_close(losses(backend, ARCHS[arch], steps), reference, rtol=LOSS_RTOL, atol=0)


def test_train_gpt_resume_is_exact(tmp_path):
    train_gpt = example("train_gpt")
    common = ["--backend", "pytorch", "--device", DEVICE, "--n-layer", "1", "--n-embd", "32", "--block-size", "16",
              "--batch-size", "4", "--corpus-bytes", "20000", "--sample", "0", "--quiet"]
    whole = train_gpt.train(train_gpt.parse_args(common + ["--steps", "8", "--out", str(tmp_path / "a")]))
    train_gpt.train(train_gpt.parse_args(common + ["--steps", "8", "--stop-at", "4", "--out", str(tmp_path / "b")]))
    resumed = train_gpt.train(train_gpt.parse_args(common + ["--steps", "8", "--out", str(tmp_path / "b"), "--resume"]))
    if DEVICE == "cpu":
        assert resumed == whole
    else:  # on CUDA, SDPA's flash backward adds dq with atomics: sums may round differently run to run
        torch.testing.assert_close(resumed, whole, rtol=1e-5, atol=0)
    assert (tmp_path / "b" / "loss.png").exists() and (tmp_path / "b" / "checkpoint.pt").exists()


@pytest.mark.slow  # ~75 s of training on a CPU
def test_train_mlp_reaches_95_percent():
    pytest.importorskip("sklearn", reason="scikit-learn provides the digits data set (pip install -e '.[dev]')")
    accuracy = example("train_mlp").main(["--backend", "pytorch", "--device", DEVICE])
    assert accuracy >= 0.95


def test_train_gpt_amp_and_compile_options():
    """--amp defaults to CUDA with float32 weights; combinations that cannot work are refused."""
    train_gpt = example("train_gpt")
    parse = train_gpt.parse_args
    assert not parse(["--device", "cpu"]).amp and parse(["--device", "cpu", "--amp"]).amp
    assert parse(["--device", "cuda"]).amp and not parse(["--device", "cuda", "--no-amp"]).amp
    assert not parse(["--device", "cuda", "--dtype", "bfloat16"]).amp
    assert parse(["--device", "cuda", "--compile-mode", "reduce-overhead"]).compile
    for bad in (["--device", "cuda", "--dtype", "bfloat16", "--amp"], ["--device", "cuda", "--compile", "--cuda-graph"],
                ["--device", "cpu", "--compile-mode", "reduce-overhead"]):
        with pytest.raises(SystemExit):
            parse(bad)
