"""The backend switch.

Precedence, highest first: the call's ``backend=`` > the innermost ``with use_backend(name):``
> the ``KCOURSE_BACKEND`` environment variable > ``"pytorch"``.

The active backend lives in a ``ContextVar``, so ``use_backend`` is nestable and safe across
threads and asyncio tasks: each thread and each task sees its own innermost block. A thread started
inside a block does not inherit it (threads start with an empty context); run its target through
``contextvars.copy_context().run`` to hand it the block. torch.compile cannot read a ``ContextVar``:
while it traces, ``get_backend`` reads a thread-local copy of the same value instead, on which the
compiled code is guarded, so a compiled model called under another block recompiles.

A backend is a package ``kcourse.blas.<name>`` with one module per op; the module for op ``gemm``
exports a function ``gemm``. ``resolve`` is a lookup, never a fallback: an op a backend does not
implement is a ``NotImplementedError`` naming both, and a backend that cannot run on this machine
is a ``RuntimeError`` that says why and how to fix it.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

NAMES = ("python", "pytorch", "triton", "cute")
OPS = ("copy", "swap", "scal", "axpby", "dot", "gemv", "geru", "gemm",  # the BLAS ops, then the primitives
       "softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
       "linear", "linear_swiglu", "linear_cross_entropy", "gelu", "silu", "relu", "swiglu", "embedding", "rope", "attention")
DEFAULT = "pytorch"
ENV_VAR = "KCOURSE_BACKEND"

_active: contextvars.ContextVar[str | None] = contextvars.ContextVar("kcourse_backend", default=None)
_traced = threading.local()  # ``_traced.name``: the innermost block's backend, as torch.compile reads it


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str = ""  # why it cannot run here ("" when available)
    fix: str = ""  # how to make it run

    def __str__(self) -> str:
        if self.available:
            return f"{self.name}: available"
        return f"{self.name}: unavailable: {self.reason} (fix: {self.fix})"


def check_name(name: str) -> str:
    """``name`` if it is a backend name, else a ``TypeError`` (not a string) or ``ValueError``
    listing the valid ones."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string, one of {', '.join(NAMES)}; got {type(name).__name__}")
    if name not in NAMES:
        raise ValueError(f"unknown backend {name!r}; valid backends are {', '.join(NAMES)}")
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[str]:
    """Run the block with ``name`` as the default backend (nestable; thread- and task-safe)."""
    token = _active.set(check_name(name))
    outer = getattr(_traced, "name", None)
    _traced.name = name
    try:
        yield name
    finally:
        _traced.name = outer
        _active.reset(token)


def get_backend() -> str:
    """The backend an op called here without ``backend=`` would use."""
    name = getattr(_traced, "name", None) if torch.compiler.is_compiling() else _active.get()
    if name is not None:
        return name
    env = os.environ.get(ENV_VAR)
    if env:
        try:
            return check_name(env)
        except ValueError as e:
            raise ValueError(f"{ENV_VAR}={env!r}: {e}") from None
    return DEFAULT


def triton_interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _probe(name: str) -> BackendInfo:
    if name in ("python", "pytorch"):
        return BackendInfo(name, True)
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            return BackendInfo(name, False, "the triton package is not installed",
                               "pip install 'kcourse[triton]'")
        if not torch.cuda.is_available() and not triton_interpreting():
            return BackendInfo(name, False, "no CUDA GPU, and Triton's interpreter is off",
                               "run on a CUDA GPU, or export TRITON_INTERPRET=1 before starting Python")
        return BackendInfo(name, True)
    # cute
    if importlib.util.find_spec("cutlass") is None:
        return BackendInfo(name, False, "the CuTe DSL (nvidia-cutlass-dsl) is not installed",
                           "pip install 'kcourse[cute]'")
    if not torch.cuda.is_available():
        return BackendInfo(name, False, "no CUDA GPU: CuTe DSL kernels compile here but cannot run",
                           "run on an NVIDIA GPU of compute capability 8.0 or newer")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return BackendInfo(name, False, f"the GPU is sm_{major}{minor}; CuTe kernels need sm_80+",
                           "run on an Ampere or newer NVIDIA GPU")
    return BackendInfo(name, True)


def backends() -> dict[str, BackendInfo]:
    """Every backend with its availability here and, when unavailable, why and how to fix it: a
    ``{name: BackendInfo}`` dict that prints as a table (``python -m kcourse info`` shows it too)."""
    from ._info import BackendTable
    return BackendTable((name, _probe(name)) for name in NAMES)


@functools.lru_cache(maxsize=None)
def _available(name: str) -> BackendInfo:
    return _probe(name)


_RESOLVED: dict = {}  # (op, backend name) -> resolve's answer, once it has succeeded (nothing here changes after)


def backend_for(op: str, backend: str | None) -> str:
    """The backend a call of ``op`` runs on: ``backend``, else the active one. Eagerly it must run
    here and have a kernel for ``op`` (else a clear error now); under torch.compile the op's kernel
    lookup makes that check when the compiled code runs."""
    if torch.compiler.is_dynamo_compiling():  # traced code never reads _RESOLVED: a guard on it would recompile
        return get_backend() if backend is None else check_name(backend)
    if type(backend) is str and (op, backend) in _RESOLVED:  # the common case: one dict lookup
        return backend
    name = get_backend() if backend is None else check_name(backend)
    if not torch.compiler.is_compiling():
        resolve(op, name)
    return name


def resolve(op: str, backend: str | None = None) -> tuple[str, Callable]:
    """The backend name and its kernel function for ``op``: a lookup, never a fallback."""
    if type(backend) is str:
        hit = _RESOLVED.get((op, backend))
        if hit is not None:
            return hit
    name = check_name(backend) if backend is not None else get_backend()
    info = _available(name)
    if not info.available:
        raise RuntimeError(f"{op}: backend {name!r} cannot run here: {info.reason}; {info.fix}")
    found = _RESOLVED[(op, name)] = name, _kernel(name, op)
    return found


def module(name: str, op: str):
    """The module ``kcourse.blas.<name>.<op>`` (imported on first use)."""
    module_name = f"kcourse.blas.{name}.{op}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise NotImplementedError(f"{op}: the {name!r} backend has no kernel for {op} yet") from None


def has_kernel(name: str, op: str) -> bool:
    """Does the backend have a kernel file for ``op`` (``kcourse/blas/<name>/<op>.py``)? Nothing is imported."""
    return importlib.util.find_spec(f"kcourse.blas.{name}.{op}") is not None


@functools.lru_cache(maxsize=None)
def _kernel(name: str, op: str) -> Callable:
    return getattr(module(name, op), op)


@functools.lru_cache(maxsize=None)
def backward_kernel(name: str, op: str) -> Callable | None:
    """``<op>_backward`` of the backend's module, or None for a composite of differentiable ops."""
    return getattr(module(name, op), f"{op}_backward", None)


@functools.lru_cache(maxsize=None)
def autograd_kernel(name: str, op: str) -> Callable | None:
    """``<op>_autograd`` of the backend's module, or None. Where a backend has one, an eager call that
    wants a gradient runs it in place of the op's autograd formula: it returns the op's outputs
    recorded by ATen's autograd, a node per ATen kernel in C++ (the pytorch backend's ops are ATen's
    kernels), or None where those kernels do not meet the op contract (the formula runs then)."""
    return getattr(module(name, op), f"{op}_autograd", None) if op in OPS else None
