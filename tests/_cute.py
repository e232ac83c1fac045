"""What the cute compile tests share (tests/test_cute_compile*.py): CPU tensors in the layouts the
kernels specialize on, and a spy on the kernels ``_compile`` is asked for. Import only after
``pytest.importorskip("cutlass")``."""
import pytest
import torch

from kcourse.blas.cute import _compile

# The dtypes a compile test takes: float16 builds the bfloat16 kernels with another element type, so
# on the CPU it runs with -m slow only (the GPU runs include it); the CPU suite keeps its time budget
DTYPES = (torch.float32, pytest.param(torch.float16, marks=pytest.mark.slow, id="torch.float16"), torch.bfloat16)


def t(*shape, dtype, layout="contiguous"):
    """A CPU tensor of ``shape`` laid out as asked (its values are never read)."""
    if layout == "contiguous":
        return torch.zeros(shape, dtype=dtype)
    if layout == "transposed":
        return torch.zeros(*shape[:-2], shape[-1], shape[-2], dtype=dtype).mT
    if layout == "strided":
        return torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]
    if layout == "misaligned":  # the first element 2 or 4 bytes past a 16-byte boundary
        return torch.zeros(shape[0] + 1, *shape[1:], dtype=dtype)[1:]
    raise ValueError(layout)


def compiled_kernels(monkeypatch) -> list:
    """Record the (factory name, key) of every kernel ``_compile`` is asked for."""
    seen, real = [], _compile.compile_only

    def spy(factory, key, *args):
        seen.append((factory.__name__, key))
        return real(factory, key, *args)

    monkeypatch.setattr(_compile, "compile_only", spy)
    return seen


def recorded_kernels(monkeypatch) -> list:
    """Record the (factory name, key) of every kernel ``_compile`` is asked for, compiling none (the
    plans alone; the compile tests check that the keys build)."""
    seen = []

    class Recorded:
        def check(self, args):
            pass

    def record(factory, key, *args):
        seen.append((factory.__name__, key))
        return Recorded()

    monkeypatch.setattr(_compile, "compile_only", record)
    return seen


def fresh_plans(monkeypatch, module, *names):
    """Give ``module``'s planners ``names`` (``_compile.plan_cache``) an empty cache for the test: plans
    made under a decision the test patches must not outlive it, nor plans made before be used under it."""
    for name in names:
        monkeypatch.setattr(module, name, _compile.plan_cache(getattr(module, name).__wrapped__))
