"""kcourse/blas/cute/_disk.py, the compiled cute kernels kept between processes: where they live,
what names them, that a file is written whole or not at all and that a file that does not load is
compiled instead. Writing and loading real kernels needs a GPU (the DSL links them against the CUDA
runtime): here the DSL's two calls are stand-ins; benchmarks/experiments/cute_aot.py checks a
training step through loaded kernels on a GPU."""
import os

import pytest
import torch

pytest.importorskip("cutlass", reason="the CuTe DSL is not installed (pip install -e '.[cute]')")

from kcourse.blas.cute import _compile, _disk  # noqa: E402


class Compiled:
    """Stands in for a JitCompiledFunction: its object file is some bytes."""

    def __init__(self, data=b"\x7fELF object", error=None):
        self.data, self.error = data, error

    def dump_to_object(self, prefix):
        if self.error:
            raise self.error
        return self.data + prefix.encode()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KCOURSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_disk, "_UNWRITABLE", [])
    return tmp_path / "cute"


def test_where(monkeypatch, tmp_path):
    monkeypatch.setenv("KCOURSE_CACHE_DIR", str(tmp_path))
    assert _disk.directory() == tmp_path / "cute"
    for off in ("", "0"):
        monkeypatch.setenv("KCOURSE_CACHE_DIR", off)
        assert _disk.directory() is None
    monkeypatch.delenv("KCOURSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _disk.directory() == tmp_path / "xdg" / "kcourse" / "cute"


def factory():
    """A module-level kernel factory, as kcourse's are."""


def test_the_name_covers_everything_the_kernel_depends_on():
    pointer = _compile._Pointer(_compile.PointerArg(0, _compile.DTYPES[torch.bfloat16], 16))
    slots = [pointer, _compile._Number(_compile.Int64), _compile._Absent(), _compile._Stream()]
    name = _disk.name(factory, ("copy", 4), slots, "sm_90a")
    assert name == _disk.name(factory, ("copy", 4), slots, "sm_90a") and name.startswith("kcourse_")
    other_pointer = _compile._Pointer(_compile.PointerArg(0, _compile.DTYPES[torch.float16], 16))
    others = [_disk.name(factory, ("copy", 8), slots, "sm_90a"),                 # the key
              _disk.name(factory, ("copy", 4), slots[:2], "sm_90a"),             # the arguments
              _disk.name(factory, ("copy", 4), [other_pointer, *slots[1:]], "sm_90a"),  # a pointer's type
              _disk.name(factory, ("copy", 4), slots, "sm_100a"),                # the target
              _disk.name(test_where, ("copy", 4), slots, "sm_90a")]              # the factory
    assert len({name, *others}) == 6

    def closure():
        def factory():
            pass
        return factory
    assert _disk.name(closure(), ("copy", 4), slots, "sm_90a") is None  # what it captured is not in its name


def test_keep_writes_whole_files_and_load_reads_them(cache, monkeypatch):
    _disk.keep(Compiled(), "kcourse_a")
    assert sorted(os.listdir(cache)) == ["kcourse_a.o"]  # no temporary left behind
    assert (cache / "kcourse_a.o").read_bytes() == b"\x7fELF objectkcourse_a"
    loaded = []

    class Module:
        def __init__(self, path):
            loaded.append(path)
            self.kcourse_a = "the function"

    from cutlass import runtime
    monkeypatch.setattr(runtime, "load_module", Module)
    assert _disk.load("kcourse_a") == "the function" and loaded == [str(cache / "kcourse_a.o")]
    assert _disk.load("kcourse_b") is None  # not kept: compile


def test_a_file_that_does_not_load_is_compiled_instead(cache, monkeypatch):
    _disk.keep(Compiled(), "kcourse_a")

    def broken(path):
        raise RuntimeError("not an object file")

    from cutlass import runtime
    monkeypatch.setattr(runtime, "load_module", broken)
    with pytest.warns(UserWarning, match="did not load"):
        assert _disk.load("kcourse_a") is None


def test_a_failing_write_warns_once_and_keeps_nothing(cache):
    with pytest.warns(UserWarning, match="not kept on disk"):
        _disk.keep(Compiled(error=RuntimeError("no CUDA runtime")), "kcourse_a")
    _disk.keep(Compiled(), "kcourse_b")  # nothing more this process: no second warning, no file
    assert not cache.exists() or os.listdir(cache) == []


def test_compile_only_runs_use_no_disk(cache, monkeypatch):
    """CI's compile-only kernels are neither written nor read."""
    from kcourse.blas.cute import copy as cute_copy

    monkeypatch.setattr(_compile, "_kernels", {})  # so the kernel is made here, not found in memory
    asked = []
    monkeypatch.setattr(_disk, "name", lambda *a: asked.append(a) or "kcourse_x")
    x = torch.zeros(37, 41)
    with _compile.compiling_only():
        cute_copy.copy(x, torch.empty_like(x))
    assert len(_compile._kernels) == 1 and not asked and not cache.exists()


def test_a_kept_kernel_the_dsl_passes_arguments_to_otherwise_is_compiled_again(cache, monkeypatch):
    """A loaded kernel goes through the same byte-for-byte check of its arguments as a compiled one;
    one that fails it (here a stand-in with no marshalling at all) is replaced by a fresh compile."""
    from kcourse.blas.cute import copy as cute_copy

    asked = []
    real = _compile.compile_only
    monkeypatch.setattr(_compile, "compile_only",
                        lambda f, key, *args: asked.append((f, key, args)) or real(f, key, *args))
    x = torch.zeros(37, 41)
    with _compile.compiling_only():
        cute_copy.copy(x, torch.empty_like(x))
    factory, key, args = asked[0]
    monkeypatch.setattr(_compile, "_compile_only", False)  # as on a GPU: the disk is asked first
    monkeypatch.setattr(_compile, "target", lambda: "sm_90a")
    monkeypatch.setattr(_disk, "load", lambda prefix: object())
    kept = []
    monkeypatch.setattr(_disk, "keep", lambda compiled, prefix: kept.append(prefix))
    with pytest.warns(UserWarning, match="takes its arguments otherwise"):
        kernel = _compile.Kernel(factory, key, args)
    assert type(kernel.compiled).__name__ != "object" and len(kept) == 1  # compiled, then kept
    kernel.check(args)


class Unlaunched:
    """Stands in for a compiled Kernel: the test needs only what was asked for."""

    def check(self, args):
        pass


def test_every_kernel_is_named_apart(monkeypatch):
    # Two kernels that compile differently never share a file: ops that differ only in their math (gelu
    # exact or tanh, swiglu's backward variants) or in a tuning plan get names of their own, and none
    # of the kernels a training step uses goes unnamed (which would compile it in every process).
    from kcourse.blas.cute import attention, gelu, layer_norm, linear_cross_entropy, softmax, swiglu
    from kcourse.blas.cute.gemm import gemm

    asked = []
    monkeypatch.setattr(_compile, "compile_only", lambda factory, key, *args: asked.append((factory, key)) or
                        Unlaunched())
    x, dy = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    w, b = torch.ones(64, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.bfloat16)
    with _compile.compiling_only():
        for mode in ("none", "tanh"):
            gelu.gelu_backward(dy, gelu.gelu(x, mode)[1], (True,), mode)
        for needs in ((True, True), (True, False), (False, True)):
            swiglu.swiglu_backward(dy, swiglu.swiglu(x, x)[1], needs)
        out, cache = layer_norm.layer_norm(x, w, b, 1e-5)
        layer_norm.layer_norm_backward(dy, cache, (True, True, True), 1e-5)
        softmax.softmax(x, 1)
        gemm(x, x.T, None, 1.0, 0.0, torch.zeros(8, 8, dtype=torch.bfloat16))
        q = torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16)
        attention.attention(q, q, q, None, True, 0.125)
        linear_cross_entropy.linear_cross_entropy(x, torch.zeros(96, 64, dtype=torch.bfloat16),
                                                  torch.zeros(8, dtype=torch.long), None, -100, "mean", True, False)
    slots = [_compile._slot(0, None)]
    names = {}
    for factory, key in asked:
        name = _disk.name(factory, key, slots, "sm_90a")
        assert name is not None, (factory, key)
        names.setdefault(name, []).append((factory, key))
    for name, same in names.items():  # one kernel asked for again is fine; two different ones are not
        first = same[0]
        assert all(f is first[0] and k == first[1] for f, k in same), same
    assert len(names) >= 14, names


def test_identity_refuses_what_it_cannot_name():
    def local():
        pass

    for value in (local, lambda: 0, object(), (1, local)):
        with pytest.raises(_disk.Unnamed):
            _disk.identity(value)
    assert _disk.identity((torch.float16, 3, "a", None)) == _disk.identity((torch.float16, 3, "a", None))
    assert _disk.identity((torch.float16,)) != _disk.identity((torch.bfloat16,))
