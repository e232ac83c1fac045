"""Tolerances and input factories shared by every test (one table, one place)."""
import math

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALL_DTYPES = (torch.float64, *DTYPES)

# (rtol, atol) per dtype for results that are rounded once from a float32 (float64) value: the
# two sides may differ by accumulation order in float32 plus one rounding of the output.
TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, k: int = 1, slack: torch.Tensor | None = None) -> None:
    """``actual`` equals ``expected`` to ``TOL[dtype]``; ``atol`` grows as sqrt(k) for sums of k terms
    (random inputs of unit scale give sums of size ~sqrt(k) and rounding noise in proportion).
    ``slack`` (expected's shape): an element off by no more than its slack passes too, for sums
    whose terms are far larger than the sum (its rounding error follows the terms, not the sum)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if slack is not None:
        actual = torch.where((actual.double() - expected.double()).abs() <= slack, expected, actual)
    rtol, atol = TOL[actual.dtype]
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * math.sqrt(max(k, 1)))


def require_backend(name: str) -> None:
    """Skip (saying why) where backend ``name`` cannot run here."""
    import pytest

    import kcourse

    info = kcourse.backends()[name]
    if not info.available:
        pytest.skip(f"{name} backend unavailable here: {info.reason}")


def require_cute_clusters() -> None:
    """Skip (saying why) unless the cute kernels run here with thread block clusters (a GPU of sm_90+)."""
    import pytest

    if DEVICE != "cuda":
        pytest.skip("the cute kernels run on a GPU")
    require_backend("cute")
    from kcourse.blas.cute import _rows

    if not _rows.clusters_supported():
        pytest.skip("thread block clusters need sm_90+")


def require_dtype(backend: str, dtype: torch.dtype) -> None:
    """Skip (saying why) where the backend has no kernel for ``dtype``: float64 runs on python and pytorch only."""
    import pytest

    if dtype == torch.float64 and backend in ("triton", "cute"):
        pytest.skip(f"{backend} has no float64")


def randn(*shape: int, dtype=torch.float32, layout: str = "contiguous") -> torch.Tensor:
    """Fresh N(0, 1) values of ``shape``, laid out as asked:

    contiguous: row-major;  transposed: a ``.mT`` view of a row-major (..., n, m) tensor (2-D+);
    strided: every third element of a larger buffer along the last dim (not contiguous).
    """
    if layout == "contiguous":
        return torch.randn(shape, dtype=dtype, device=DEVICE)
    if layout == "transposed":
        return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device=DEVICE).mT
    if layout == "strided":
        return torch.randn(*shape[:-1], 3 * shape[-1], dtype=dtype, device=DEVICE)[..., ::3]
    raise ValueError(layout)


def in_buffer(*shape: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A strided view (every other element of the last dim) and the whole buffer it lives in,
    so a test can check that an in-place op wrote its target and nothing beside it."""
    buffer = torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype, device=DEVICE)
    return buffer[..., ::2], buffer


def outside(view: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """The elements of ``buffer`` that ``in_buffer``'s view does not cover."""
    return buffer[..., 1::2]


def spy_kernels(monkeypatch) -> list:
    """Record ``(backend, op)`` each time a backend kernel runs (patches the kernel lookup)."""
    import kcourse.backend as backend_module

    calls, real = [], backend_module._kernel

    def spy(name, op):
        kernel = real(name, op)

        def recorded(*args, **kwargs):
            calls.append((name, op))
            return kernel(*args, **kwargs)

        return recorded

    monkeypatch.setattr(backend_module, "_kernel", spy)
    monkeypatch.setattr(backend_module, "_RESOLVED", {})  # kernels resolved before now: through the spy too
    return calls


def raises(exc, pattern, fn, *args, **kwargs):
    """Call ``fn``: it raises ``exc`` matching ``pattern``, and no tensor argument changed (NaNs
    compare equal; meta tensors hold no values)."""
    import pytest

    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and not a.is_meta]
    before = [t.clone() for t in tensors]
    with pytest.raises(exc, match=pattern):
        fn(*args, **kwargs)
    for t, t0 in zip(tensors, before):
        assert torch.equal(t, t0) or (t.isnan() == t0.isnan()).all(), "an argument changed before the error"


def assert_device_assert(script: str, message: str | None = None) -> None:
    """Run ``script`` (Python source using CUDA) in a child process: it must die of a device-side
    assert (which kills the CUDA context, hence the child) before printing "no error". With
    ``message``: a kernel that reports the error itself and traps (the cute kernels) must have
    printed it, and the launch failed."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script + "; torch.cuda.synchronize(); print('no error')"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "no error" not in result.stdout, result.stdout
    if message is not None:
        assert message in result.stdout, (result.stdout[-2000:], result.stderr[-2000:])
        failed = result.stderr.lower().replace(" ", "")  # "unspecified launch failure", cudaErrorLaunchFailure
        assert "launchfailure" in failed, result.stderr[-2000:]
    else:
        assert "device-side assert" in result.stderr or "Assertion" in result.stderr, result.stderr[-2000:]


def import_benchmarks(*names: str) -> tuple:
    """The modules ``benchmarks.<name>``: a package of the source checkout, not installed."""
    import importlib
    from pathlib import Path

    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(Path(__file__).resolve().parents[1]))
        return tuple(importlib.import_module(f"benchmarks.{name}") for name in names)


def spy_aten_recorded(monkeypatch) -> list:
    """The (backend, op) of each eager call that a backend recorded with ATen's autograd
    (``kcourse.backend.autograd_kernel`` answering, not None), appended as the calls run."""
    import kcourse.backend as backend_module

    seen, real = [], backend_module.autograd_kernel

    def spied(name, op):
        kernel = real(name, op)
        if kernel is None:
            return None

        def run(*args):
            out = kernel(*args)
            if out is not None:
                seen.append((name, op))
            return out
        return run

    monkeypatch.setattr(backend_module, "autograd_kernel", spied)
    return seen
