"""The switch: precedence, nesting, thread and task isolation, availability reports, clear errors."""
import asyncio
import re
import threading

import pytest
import torch

import kcourse
from kcourse import blas
from kcourse.backend import ENV_VAR, NAMES
from _util import spy_kernels


def test_default_is_pytorch(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert kcourse.get_backend() == "pytorch"


def test_environment_variable(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "python")
    assert kcourse.get_backend() == "python"
    monkeypatch.setenv(ENV_VAR, "numpy")
    with pytest.raises(ValueError, match=r"KCOURSE_BACKEND='numpy'.*python, pytorch, triton, cute"):
        kcourse.get_backend()


def test_precedence_call_over_context_over_env(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "pytorch")
    with kcourse.use_backend("python"):
        assert kcourse.get_backend() == "python"
        with kcourse.use_backend("pytorch"):
            assert kcourse.get_backend() == "pytorch"
        assert kcourse.get_backend() == "python"
        # the call's backend= wins over the block: an unknown name proves it was consulted first
        with pytest.raises(ValueError, match="unknown backend 'nope'"):
            blas.copy(torch.ones(3), backend="nope")
    assert kcourse.get_backend() == "pytorch"


def test_the_chosen_backend_runs(monkeypatch):
    calls = spy_kernels(monkeypatch)
    x = torch.randn(5)
    with kcourse.use_backend("python"):
        blas.scal(x, 2.0)
        blas.scal(x, 2.0, backend="pytorch")
    assert calls == [("python", "scal"), ("pytorch", "scal")]


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="valid backends are python, pytorch, triton, cute"):
        with kcourse.use_backend("cuda"):
            pass


def test_context_restored_after_exception():
    before = kcourse.get_backend()
    with pytest.raises(RuntimeError):
        with kcourse.use_backend("python"):
            raise RuntimeError("boom")
    assert kcourse.get_backend() == before


def test_threads_are_isolated():
    seen = {}
    barrier = threading.Barrier(2)

    def worker(name):
        with kcourse.use_backend(name):
            barrier.wait()  # both threads are inside their blocks at once
            seen[name] = kcourse.get_backend()
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("python", "pytorch")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"python": "python", "pytorch": "pytorch"}


def test_asyncio_tasks_are_isolated():
    async def task(name, started, other_started):
        with kcourse.use_backend(name):
            started.set()
            await other_started.wait()  # interleave with the other task inside its block
            return kcourse.get_backend()

    async def main():
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(task("python", a, b), task("pytorch", b, a))

    assert asyncio.run(main()) == ["python", "pytorch"]


def test_backends_report():
    report = kcourse.backends()
    assert tuple(report) == NAMES
    assert report["python"].available and report["pytorch"].available
    for info in report.values():
        if not info.available:
            assert info.reason and info.fix, info
            assert "unavailable" in str(info)


def test_unavailable_backend_is_a_clear_error():
    report = kcourse.backends()
    missing = [name for name, info in report.items() if not info.available]
    if not missing:
        pytest.skip("every backend is available on this machine")
    name = missing[0]
    with pytest.raises(RuntimeError, match=re.escape(f"backend '{name}' cannot run here: {report[name].reason}")):
        blas.copy(torch.ones(3), backend=name)


def test_missing_kernel_is_not_implemented():
    import kcourse.backend as backend_module

    with pytest.raises(NotImplementedError, match="the 'python' backend has no kernel for no_such_op"):
        backend_module.resolve("no_such_op", "python")
