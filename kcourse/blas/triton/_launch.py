"""What the Triton kernels share: the interpreter switch, int64 indices, n-D strided indexing, and
the launch (``launch``, ``launch_tuned``: the compiled kernel called directly once it exists, an
autotuner's pick reused and kept on disk for the next process; ``compiling_only``: compile every
kernel for a GPU without one). Under the interpreter two of its defects are fixed at import: a loop
bound under NumPy >= 2.4, and its float32 -> bfloat16 cast, which truncates where a GPU rounds.

Elementwise ops (copy, swap, scal, axpby) take same-shape tensors whose strides may all differ.
``strided_layout`` (``kcourse.blas._layout``, shared with the cute backend) rewrites their common
index space as at most ``MAX_DIMS`` dims, and a kernel maps each flat index to an operand's memory
offset with ``strided_offsets``. When every operand is laid out the same dense way (all
contiguous, say) the layout is one dim of stride 1; Triton compiles integer arguments equal to 1
as constants, so the kernel becomes a plain, vectorized 1-D sweep.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from ...backend import triton_interpreting
from .. import _host
from .._layout import MAX_DIMS, strided_layout  # noqa: F401  (the triton kernels import them from here)

INTERPRET_SMS = 4  # the SM count off a GPU (the interpreter)
INTERPRET = triton_interpreting()  # True: kernels run on the CPU through Triton's interpreter
BLOCK = 4096  # elements per program in the memory-bound kernels: 16 per thread with 8 warps
NUM_WARPS = 8


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host's grid arithmetic: ``triton.cdiv`` is a constexpr function, whose
    wrapper costs the host ~2 us a call (hundreds of calls a training step)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of 2 >= n (0 for 0), as ``triton.next_power_of_2``, without its wrapper."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (``_host.sm_count``); the CPU interpreter counts as
    ``INTERPRET_SMS`` (several programs, so the CPU tests cover the kernels' multi-program paths)."""
    return _host.sm_count(device, off_gpu=INTERPRET_SMS)


@functools.lru_cache(maxsize=None)
def is_hopper(index: int | None) -> bool:
    """Whether CUDA device ``index`` is a Hopper GPU (sm_90), where the TMA kernels' configs were tuned."""
    return torch.cuda.get_device_capability(index)[0] == 9


# Triton's interpreter runs a tl.reduce with a Python combine function one element pair at a time
# (seconds for a test-sized tile): there, sum_pair is two tl.sum calls.
_FUSED_SUMS = tl.constexpr(not INTERPRET)


@triton.jit
def _add_pair(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def sum_pair(a, b, axis: tl.constexpr):
    """``(sum(a, axis), sum(b, axis))`` in one two-operand reduction: one pass of shuffles and one
    block barrier for both (two barriers as two sums)."""
    if _FUSED_SUMS:
        return tl.reduce((a, b), axis, _add_pair)
    else:
        return tl.sum(a, axis), tl.sum(b, axis)


# launch options of a kernel with a tl.device_assert: debug mode compiles the assert in, and nothing
# else with sanitize_overflow off (the interpreter ignores them: there the host has checked already)
CHECKED = {"debug": True, "sanitize_overflow": False}


@triton.jit
def block_indices(BLOCK: tl.constexpr):
    """This program's BLOCK consecutive indices, in int64 so that huge tensors cannot overflow."""
    return tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def strided_offsets(i, shape, strides):
    """Memory offsets (in elements) of the row-major flat indices ``i`` over ``shape`` in a tensor
    with ``strides``: peel off one coordinate per dim, innermost first, and weight it by its stride."""
    offsets = tl.zeros_like(i)
    for d in tl.static_range(len(shape) - 1, 0, -1):
        offsets += (i % shape[d]) * strides[d]
        i = i // shape[d]
    return offsets + i * strides[0]


def launch_elementwise(op: str, kernel, tensors, *scalars, **constexprs) -> None:
    """Run ``kernel(*tensors, numel, shape, *strides, *scalars, BLOCK, **constexprs)`` over the
    same-shape ``tensors``, one program per BLOCK elements. A ``None`` tensor (an operand the kernel
    must not read) is passed as ``None``, with ``None`` strides."""
    present = [t for t in tensors if t is not None]
    numel = present[0].numel()
    if all(t.is_contiguous() for t in present):  # the common case, and what strided_layout would return
        shape, strides = (numel,), [(1,)] * len(present)
    else:
        shape, strides = strided_layout(op, *present)
    present_strides = iter(strides)
    strides = [next(present_strides) if t is not None else None for t in tensors]
    launch(kernel, (cdiv(numel, BLOCK),), *tensors, numel, shape, *strides, *scalars, BLOCK=BLOCK,
           num_warps=NUM_WARPS, **constexprs)


_PICKED: dict = {}  # (autotuned kernel, caller's key) -> (config its autotuner picked, the config's arguments)
KEEP_PICKS = not INTERPRET  # picks are kept on disk on a GPU (the interpreter's timings mean nothing)


def launch_tuned(kernel, grid, key, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` for an autotuned ``kernel``: through its autotuner the first
    time ``key`` is seen (unless an earlier process's pick is on disk, ``_stored_pick``), then
    through ``launch`` with the config picked then (running the config's pre_hook as the autotuner
    would).

    The autotuner's dispatch (its key rebuilt from the arguments, dicts of every argument merged for
    the pre_hook and the launch) is host time on every call, and a short kernel does not hide host
    time: see kcourse/blas/triton/attention.py. ``key`` must determine the autotuner's pick, that is
    hold its key arguments and the dtypes of the tensor arguments (or more); ``grid(meta)`` maps the
    launch's keyword arguments (the config's among them) to the grid. Returns ``launch``'s answer
    (the picked config's ``Again``, without its pre_hook), or None."""
    if _compile_only[0]:  # its first config (the autotuner would time them on a GPU)
        picked = kernel.configs[0], kernel.configs[0].all_kwargs()
    else:
        picked = _PICKED.get((kernel, key))
        if picked is None:
            config = _stored_pick(kernel, key)
            if config is None:
                kernel[grid](*args, **kwargs)
                config = kernel.best_config
                _store_pick(kernel, key, config)
                _PICKED[(kernel, key)] = config, config.all_kwargs()
                return None
            picked = _PICKED[(kernel, key)] = config, config.all_kwargs()
    config, tuned = picked
    meta = {**kwargs, **tuned}
    if config.pre_hook is not None:
        config.pre_hook({**dict(zip(kernel.arg_names, args)), **meta})
    return launch(kernel.fn, grid(meta) if callable(grid) else grid, *args, **meta)


# ----------------------------------------------------------------------------- picks kept on disk
# Triton's own ``autotune(cache_results=True)`` keeps no pick of a config with a pre_hook (it cannot
# serialize the hook), and the TMA gemm's and attention's configs all have one (it sets the
# descriptors' block shapes): each new process timed every config again, ~10 s before a GPT-2 step.
# Here the pick is kept as its position in the autotuner's list of configs, beside Triton's compiled
# kernels in its cache directory (``~/.triton/cache`` or ``TRITON_CACHE_DIR``, written atomically by
# Triton's cache manager, so torchrun's ranks may fill it at once).

def _device_signature() -> str:
    device = torch.cuda.current_device()
    return f"{torch.cuda.get_device_name(device)} sm_{''.join(map(str, torch.cuda.get_device_capability(device)))}"


def _pick_place(kernel, key):
    """``(Triton's cache manager, file name)`` of ``kernel``'s pick at ``key``, keyed by the kernel's
    source (Triton's own hash of it and what it calls), its configs, ``key``, the GPU and Triton's
    version and settings; None where picks are not kept."""
    if not KEEP_PICKS:
        return None
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_manager, triton_key

    fn = kernel.fn
    while not hasattr(fn, "cache_key") and hasattr(fn, "fn"):  # through heuristics to the jitted function
        fn = fn.fn
    source = fn.cache_key if hasattr(fn, "cache_key") else inspect.getsource(fn)  # (the interpreter's: its source)
    text = repr((triton_key(), source, sorted(get_cache_invalidating_env_vars().items()),
                 [str(c) for c in kernel.configs], key, _device_signature()))
    return get_cache_manager(hashlib.sha256(text.encode()).hexdigest()), f"{fn.__name__[:150]}.kcourse-pick.json"


def _stored_pick(kernel, key):
    """The config an earlier process picked for ``kernel`` at ``key``, or None."""
    place = _pick_place(kernel, key)
    path = place and place[0].get_file(place[1])
    if not path:
        return None
    try:
        with open(path) as f:
            stored = json.load(f)
        config = kernel.configs[stored["index"]]
    except (OSError, ValueError, KeyError, IndexError, TypeError):  # a damaged file: tune again
        return None
    return config if str(config) == stored["config"] else None


def _store_pick(kernel, key, config) -> None:
    place = _pick_place(kernel, key)
    if place is not None and config in kernel.configs:
        place[0].put(json.dumps({"index": kernel.configs.index(config), "config": str(config)}), place[1],
                     binary=False)


# (id of a jitted function, device, the arguments' specialization, keywords) -> (it, ``Again`` of its compiled kernel)
_COMPILED: dict = {}


def _specialization(a):
    """What Triton specializes a kernel argument on (``triton.runtime.jit``'s binder, which
    ``tests/test_triton_launch.py`` checks this against): a tensor's dtype and 16-byte alignment; an
    int's width, its divisibility by 16 and whether it is 1; a descriptor's dtype and block shape; a
    float, a bool, None or a constexpr value (a string) by kind or value; a tuple element by element."""
    kind = type(a)
    if kind is int:
        return -2**31 <= a < 2**31, a >= 2**63, "1" if a == 1 else "D" if a % 16 == 0 else ""  # as Triton's
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return a.dtype, a.data_ptr() % 16 == 0
    if kind is float:
        return float
    if kind is tuple:
        return tuple(map(_specialization, a))
    if kind is TensorDescriptor:
        return a.base.dtype, tuple(a.block_shape), a.padding
    if isinstance(a, torch.Tensor):  # a subclass
        return a.dtype, a.data_ptr() % 16 == 0
    return kind, a  # None, a bool, a string (a constexpr): by value


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` (a jitted function, or one under ``triton.heuristics``), with
    the launch going straight to the compiled kernel once one is compiled for these arguments.

    Triton's ``JITFunction.run`` binds the arguments, computes the specialization key and hashes it,
    checks the globals the kernel read and builds launch metadata on every call: tens of microseconds
    of host time, for each of the hundreds of kernels of a training step. Here the first launch of a
    specialization goes through Triton (compiling or loading from its cache) and its compiled
    kernel is kept, as an ``Again``, under ``_specialization`` of the arguments (what Triton's key
    depends on) and the keyword arguments (constexprs and launch options); a later launch calls its
    launcher directly, as ``JITFunction.run`` does. Under the interpreter, or with a launch hook
    installed (a profiler such as proton), every launch goes through Triton.

    Returns the ``Again`` that launched, or None where Triton launched: a caller whose own key fixes
    the specialization keeps it and calls it next time, skipping even this function's key."""
    if isinstance(kernel, triton.runtime.Autotuner):  # (``launch_tuned`` reuses an autotuner's pick)
        kernel[grid](*args, **kwargs)
        return None
    if isinstance(kernel, triton.runtime.Heuristics):  # its values, as Heuristics.run computes them
        for name, heuristic in kernel.values.items():
            kwargs[name] = heuristic({**dict(zip(kernel.arg_names, args)), **kwargs})
        kernel = kernel.fn
    if _through_triton():
        if _compile_only[0]:
            _compile_only[1].append(kernel.warmup(*args, grid=grid, **kwargs))
        else:
            kernel[grid](*args, **kwargs)
        return None
    device = torch.cuda.current_device()
    # keyed by the kernel's id, not the kernel: a JITFunction hashes its source hash under a lock
    key = (id(kernel), device, tuple(map(_specialization, args)), tuple(kwargs.items()))
    kept = _COMPILED.get(key)
    if kept is None or kept[0] is not kernel:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None:  # (Triton returns None where it did not compile here and now)
            _COMPILED[key] = kernel, Again(kernel, compiled, len(args), kwargs, device)
        return None
    again = kept[1]
    again(grid, *args)
    return again


class Again:
    """One compiled kernel, launched again: ``again(grid, *args)`` runs it on positional ``args`` that
    Triton specializes as those of the launch that compiled it (the caller's key guarantees it;
    nothing here checks) with that launch's keyword arguments. ``grid``: a tuple, or a function of
    the parameters by name."""

    __slots__ = ("kernel", "kwargs", "tail", "names", "run", "function", "metadata", "stream", "device")

    def __init__(self, kernel, compiled, positional: int, kwargs: dict, device: int):
        names, defaults = _parameters(kernel)
        self.kernel, self.kwargs, self.names, self.device = kernel, kwargs, names, device
        # the parameters after the positional ones, from the keywords (in the key) or their defaults
        self.tail = tuple(kwargs[n] if n in kwargs else defaults[n] for n in names[positional:])
        self.run, self.function, self.metadata = compiled.run, compiled.function, compiled.packed_metadata
        self.stream = driver.active.get_current_stream

    def __call__(self, grid, *args):
        if _through_triton():  # (a hook installed since, or compile-only)
            launch(self.kernel, grid, *args, **self.kwargs)
            return
        full = args + self.tail  # every parameter, in order
        if callable(grid):
            grid = grid(dict(zip(self.names, full)))
        self.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 self.stream(self.device), self.function, self.metadata, None, None, None, *full)


def _through_triton() -> bool:
    """Does every launch go through Triton now? Under the interpreter, within ``compiling_only``, and
    with a launch hook installed."""
    return INTERPRET or _compile_only[0] or _hooked(knobs.runtime.launch_enter_hook) or \
        _hooked(knobs.runtime.launch_exit_hook)


_compile_only: list = [False, []]  # inside ``compiling_only``: True, and the kernels compiled so far


@contextlib.contextmanager
def compiling_only(arch: int = 90):
    """Within this block every launch compiles its kernel for an sm_``arch`` GPU and launches
    nothing, on any machine (no GPU needed, the interpreter off): how CI checks that every triton
    kernel builds, with each Triton version the project supports. An op called on CPU tensors
    runs its host code as on a GPU, picks its kernels (an autotuned one with its first config)
    and returns outputs that were never written. Yields the list of the compiled kernels."""
    if INTERPRET:
        raise RuntimeError("compiling_only: Triton's interpreter is on (TRITON_INTERPRET=1); it compiles nothing")
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver

    class CompilerOnly(CudaDriver):  # the CUDA driver's compiler side, with no device behind it
        def __init__(self):
            pass

        def get_current_target(self):
            return GPUTarget("cuda", arch, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    try:
        active = driver.active
    except RuntimeError:  # no GPU: no driver is active
        active = None
    outer = _compile_only[:]
    driver.set_active(CompilerOnly())
    _compile_only[:] = [True, []]
    try:
        yield _compile_only[1]
    finally:
        driver.set_active(active)
        _compile_only[:] = outer


def _hooked(hook) -> bool:
    """Is a launch hook installed? (Triton >= 3.5 keeps a chain of them, empty by default.)"""
    return hook is not None and bool(getattr(hook, "calls", True))


def _parameters(kernel) -> tuple[list[str], dict]:
    """A jitted function's parameter names, in order, and their defaults."""
    params = inspect.signature(kernel.fn).parameters
    return list(params), {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}


def _fix_interpreter_for_numpy_2_4() -> None:
    # Triton 3.6's interpreter turns a scalar into a Python int with int(array of one element),
    # which NumPy >= 2.4 refuses, so every loop with a runtime bound fails (triton#9171, fixed
    # upstream by triton#9172). Same patch: take the element out first.
    from triton.runtime import interpreter
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "kcourse_fixed", False):
        return

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched.kcourse_fixed = True
    interpreter._patch_lang_tensor = patched


def _fix_interpreter_bf16_rounding() -> None:
    # Triton's interpreter (3.6 and 3.9) casts float32 to bfloat16 by dropping the low 16 bits (round
    # toward zero), where a GPU rounds to nearest, ties to even: a bfloat16 result computed in float32
    # would differ from the GPU's by up to an ulp, and a norm's h = x + residual, rounded and then
    # normalized, by more. The cast here rounds as the GPU does (NaN stays NaN, overflow gives inf).
    import numpy as np
    from triton.runtime import interpreter
    builder = getattr(interpreter, "InterpreterBuilder", None)
    cast = getattr(builder, "cast_impl", None)
    if cast is None or getattr(cast, "kcourse_fixed", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast(self, src, dst_type)
        bits = np.asarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest, ties to even
        quiet = (bits >> 16) | 0x40  # a NaN keeps its sign and stays a NaN
        out = np.where(np.isnan(src.data), quiet, rounded).astype(np.uint16)
        return interpreter.TensorHandle(out, dst_type.scalar)

    cast_impl.kcourse_fixed = True
    builder.cast_impl = cast_impl


if INTERPRET:
    _fix_interpreter_for_numpy_2_4()
    _fix_interpreter_bf16_rounding()
