"""Compiled cute kernels kept on disk between processes.

``cute.compile`` compiles every kernel afresh in each process (the CuTe DSL's own file cache is not
used by it): a GPT-2 training step's kernels take ~20 s before the first step. So a kernel, once
compiled on a GPU, is written as an object file (``JitCompiledFunction.dump_to_object``: its host
code and cubin) and the next process that needs the same kernel loads it
(``cutlass.runtime.load_module``) instead of compiling it.

- Where: ``$KCOURSE_CACHE_DIR/cute`` (``KCOURSE_CACHE_DIR=0``: nothing kept), else
  ``$XDG_CACHE_HOME/kcourse/cute`` or ``~/.cache/kcourse/cute``.
- What a file is keyed by (``name``): the factory, its key (each named faithfully, ``identity``;
  a kernel whose factory or key cannot be is compiled in every process), the kinds of the arguments it was
  compiled for, the target GPU, the CuTe DSL's version and ``CUTE_DSL_*`` settings, and the source
  of every module of ``kcourse.blas``. Any edit to kcourse's kernels or their host code makes the old files
  unreachable: stale files are never used.
- Many processes at once (torchrun ranks): a file is written under a temporary name and renamed
  into place, so a reader sees a whole file or none. A file that fails to load is compiled again.
- Only a process on a GPU writes files; ``_compile.compiling_only`` (CI without a GPU) writes and
  reads none.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import tempfile
import warnings
from pathlib import Path

import torch


def directory() -> Path | None:
    """The cache directory, or None where ``KCOURSE_CACHE_DIR`` turns the cache off ("" or "0")."""
    chosen = os.environ.get("KCOURSE_CACHE_DIR")
    if chosen is not None:
        return None if chosen in ("", "0") else Path(chosen) / "cute"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kcourse" / "cute"


@functools.cache
def _sources() -> str:
    """A digest of every ``kcourse/blas`` source file, the CuTe DSL's version and its compile settings
    from the environment (``CUTE_DSL_*``)."""
    import cutlass

    root = Path(__file__).resolve().parents[1]  # kcourse/blas
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("CUTE_DSL"))
    digest = hashlib.sha256(repr((getattr(cutlass, "__version__", ""), settings)).encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _kind(slot) -> tuple:
    """What a launcher slot fixes at compile time: its kind, a pointer's element type and alignment,
    a number's type."""
    return (type(slot).__name__, repr(getattr(slot, "dtype", None)), getattr(slot, "align", None),
            repr(getattr(slot, "type", None)))


def name(factory, key: tuple, slots: list, target: str) -> str | None:
    """The file name of a kernel (and its symbols' prefix in the object file), or None where the
    factory or its key cannot be named faithfully (``identity``): such a kernel is not kept."""
    try:
        text = repr((identity(factory), identity(key), [_kind(s) for s in slots], target, _sources()))
    except Unnamed:
        return None
    return "kcourse_" + hashlib.sha256(text.encode()).hexdigest()[:40]


class Unnamed(Exception):
    """A value with no faithful name (a closure, a lambda, an object without an ``identity``)."""


def identity(value) -> str:
    """A text that names ``value`` faithfully within one version of kcourse's sources (which the
    file name includes): two values that compile differently never share it. ``repr`` is not that: a
    dataclass may leave fields out of it, and a closure's qualified name does not say what it
    captured. Numbers, strings, dtypes, enums; module-level functions and classes by their qualified
    names; tuples, named tuples, lists and dataclasses field by field; an object that names itself
    (``disk_identity``); anything else raises ``Unnamed``."""
    if value is None or type(value) in (bool, int, float, str, torch.dtype) or isinstance(value, enum.Enum):
        return repr(value)
    if type(value) in (tuple, list):
        return "(" + ", ".join(identity(v) for v in value) + ",)"
    own = getattr(value, "disk_identity", None)
    if isinstance(own, str):
        return f"{type(value).__module__}.{type(value).__qualname__}:{own}"
    if isinstance(value, type) or inspect.isfunction(value) or inspect.isbuiltin(value):
        qualname = getattr(value, "__qualname__", "<locals>")
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise Unnamed(qualname)
        return f"{value.__module__}.{qualname}"
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):  # a named tuple
        return f"{identity(type(value))}{identity(tuple(value))}"
    if dataclasses.is_dataclass(value):
        fields = ", ".join(f"{f.name}={identity(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{identity(type(value))}({fields})"
    raise Unnamed(type(value).__qualname__)


def load(prefix: str):
    """The compiled function kept under ``prefix``, or None (not kept, or not loadable)."""
    where = directory()
    path = None if where is None else where / f"{prefix}.o"
    if path is None or not path.is_file():
        return None
    try:
        from cutlass import runtime

        return getattr(runtime.load_module(str(path)), prefix)
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: compile instead
        warnings.warn(f"kcourse: the cute kernel {path} did not load ({type(e).__name__}: {e}); compiling it",
                      stacklevel=3)
        return None


_UNWRITABLE: list = []  # the error that stopped this process from keeping kernels, once there is one


def keep(compiled, prefix: str) -> None:
    """Write ``compiled`` under ``prefix`` (atomically); after a failure, warn once and keep nothing more."""
    where = directory()
    if where is None or _UNWRITABLE:
        return
    temporary = None
    try:
        data = compiled.dump_to_object(prefix)
        where.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=where, prefix=f".{prefix}.", suffix=".tmp")
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(temporary, where / f"{prefix}.o")
    except Exception as e:  # noqa: BLE001 - the cache is an optimization: the kernel is compiled and runs
        _UNWRITABLE.append(e)
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
        warnings.warn(f"kcourse: compiled cute kernels are not kept on disk in {where} "
                      f"({type(e).__name__}: {e}); each process compiles them", stacklevel=3)
