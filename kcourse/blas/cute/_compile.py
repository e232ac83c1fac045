"""What the CuTe kernels share: the compile cache, the launcher, the arguments, the stream and the target.

How a cute op runs
------------------
Each op module has a *factory*: a Python function that takes a *key* (everything the kernel bakes
in: dtypes, rank, which strides are 1, vector width, tile sizes -- never the sizes themselves) and
returns a ``@cute.jit`` host function specialised for it (the key's values are Python constants in
the closure, so they are compile-time constants in the DSL). The host function takes only runtime
arguments and builds its tensors inside with ``cute.make_tensor(pointer, layout)``:

- ``pointer(t, align)``: a tensor's address, element type and the alignment (bytes) the kernel may
  assume. The alignment is compiled in, so it must follow from the key.
- Python ints and floats: sizes, strides, scalars. Each is typed by the host function's annotation
  (``Int32``, ``Int64``, ``Float32``); where there is none (a ``*args`` parameter) an int is an
  ``Int64`` (sizes and strides may pass 2^31) and a float a ``Float32``.
- ``stream(device)``: the current torch CUDA stream.
- ``None``: an optional operand left out (beta == 0). The kernel is compiled without it, so which
  arguments are None must follow from the key too.

``launch(factory, key, *args)`` gets the ``Kernel`` of ``factory(*key)`` from ``compile_only``, which
compiles it once per (factory, key, target) -- on a GPU, loads it where an earlier process compiled
it (``_disk``) -- and calls it. Without a GPU every kernel still compiles
(for ``sm_90a``): inside ``with compiling_only():`` an op called on CPU tensors compiles every kernel
it would launch and launches none (its outputs are left unwritten), which is how CI checks that
every kernel builds.

Why a Kernel, and not the DSL's ``compiled(*args)``
---------------------------------------------------
A compiled host function is a C function taking one array: for each runtime argument, a pointer to
its value (the 8-byte address for a pointer, the 4 or 8 bytes of a number, the ``CUstream`` handle).
Calling it the DSL's way, ``compiled(*args)`` with ``cute.Pointer`` and ``Int64``/``Float32``
objects, rebuilds all of that on every call: a ``make_ptr`` object per tensor (about 1.5 us), a DSL
number per scalar (0.7 us), then generic marshalling of every argument (3 us and up) -- tens of
microseconds for a kernel that may run for five. A ``Kernel`` does that work once, when it is
compiled: it allocates a *block* of 8-byte slots, one per runtime argument, and the array of their
addresses. A call writes the raw values into the slots with one ``struct.pack_into`` and hands the
unchanged addresses to ``compiled.run_compiled_program``, which calls the C function; on the way it
checks each pointer against the alignment and element type the kernel was compiled for. Before its
first use the Kernel checks, byte for byte, that its block holds what the DSL's own marshalling
(``compiled.generate_execution_args``) makes of the same arguments, so a DSL version that passes
arguments differently fails loudly at compile time instead of launching with wrong values.

The C call itself skips the DSL's per-call work too. ``run_compiled_program`` takes a lock, copies
every address into a fresh array of C pointers (about 0.1 us per argument) and calls the C
function through its executor. The addresses never change, so after the first launch (made the
DSL's way: it loads the module onto the GPU) a Kernel keeps its own copy of the array that the
executor built and calls the executor's C function on it directly, checking the CUDA status it
writes as the executor does (``_direct_call``); where a DSL version's executor does not look as
expected, every launch stays the DSL's way.

The host time per call of an op
-------------------------------
An op's Python is the rest of its host time: working out its key and launch numbers from its
operands' dtypes, shapes, strides and alignments, allocating, making pointers. Those decisions
depend only on a few hashable facts, so ops compute them once per distinct set of facts
(``plan_cache``) and spend a call on reading the facts, one dictionary look-up and the launch.
The planning code of attention, the row-wise ops and the norms runs on ``Operand`` stand-ins
(``Operand.of(t)``: shape, strides, dtype, address modulo 16, with the tensor methods planning
calls), so one function decides for a tensor and for its stand-in; gemm and the level-2 ops plan on
``View`` tuples. A plan must not depend on anything outside its arguments: an op's launch table
(``kcourse.blas.tuning``) is passed in as an argument, and a test that patches a decision function
gives the planner a fresh cache (``tests/_cute.py: fresh_plans``). At T = 1k a cute attention
forward spends ~30 us of host time in its backend function this way (~48 when it planned every
call), the C call being ~5 of them.
Scratch memory that a launch's kernels hand to each other (partial sums) is kept per kernel and
stream (``workspace``) rather than allocated on every call.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import operator
import struct
import threading
import time
import warnings
from typing import NamedTuple

import torch

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.runtime import make_ptr

from .. import _cache
from . import _disk

DTYPES = {torch.float32: cutlass.Float32, torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16,
          torch.int64: cutlass.Int64, torch.int32: cutlass.Int32}
PLANS = 1024  # plans an op remembers (distinct dtype / shape / stride / alignment combinations)
COMPILE_SECONDS: dict[tuple, float] = {}  # (factory name, key, target) -> seconds its first call spent compiling
LOAD_SECONDS: dict[tuple, float] = {}  # the same, for a kernel loaded from disk (``_disk``) instead
_kernels: dict[tuple, Kernel] = {}  # (factory, key, target) -> its Kernel
_compile_only = False
_CPU_TARGET = "sm_90a"  # what kernels compile for where there is no GPU


# ----------------------------------------------------------------------------- errors inside a kernel

def index_error(op: str, name: str, position, value, bound) -> None:
    """Inside a kernel, for an index ``name[position] = value`` outside [0, ``bound``): print it and
    stop the whole grid (``trap``). The launch then fails at the next synchronization ("unspecified
    launch failure", the CUDA context lost, as after a device assert) with the message on stdout.
    A compare and a branch on an index the kernel loads anyway: no extra launch, no extra traffic.
    (The DSL's ``cf.assert`` is dropped by its compiler, so this is the device assert.)"""
    cute.printf(f"kcourse {op}: {name}[%lld] = %lld is out of range [0, %lld)\n",
                Int64(position), Int64(value), Int64(bound))
    llvm.intr_trap()


# ----------------------------------------------------------------------------- the machine

@functools.cache
def _has_gpu() -> bool:
    return torch.cuda.is_available()


@functools.cache
def _arch(device_index: int) -> str:
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _current_device() -> int:
    """``torch.cuda.current_device()`` without its Python wrapper, whose check that CUDA is
    initialized costs more than the query (the C function initializes CUDA itself); asked on
    every launch."""
    return torch._C._cuda_getDevice()


def target() -> str:
    """The GPU architecture kernels compile for: the current device's (``sm_90a`` on an H100), else sm_90a."""
    return _arch(_current_device()) if _has_gpu() else _CPU_TARGET


def stream(device: torch.device | None = None) -> cuda.CUstream:
    """The current torch CUDA stream of ``device`` (None: the current device) as a ``CUstream``; the
    null stream where there is no GPU or ``device`` is the CPU (compiling only)."""
    if not _has_gpu() or (device is not None and device.type != "cuda"):
        return cuda.CUstream(0)
    index = _current_device() if device is None or device.index is None else device.index
    # the handle as an int, as torch's generated code gets it; torch.cuda.current_stream() would
    # first build a torch Stream object, several times the cost
    return cuda.CUstream(torch._C._cuda_getCurrentRawStream(index))


def stream_of(t: torch.Tensor) -> cuda.CUstream:
    """``stream(t.device)``, read off the tensor (``t.device`` builds a device object, and its
    ``type`` a string: half of that function's time)."""
    if not t.is_cuda:
        return cuda.CUstream(0)
    return cuda.CUstream(torch._C._cuda_getCurrentRawStream(t.get_device()))


# ----------------------------------------------------------------------------- arguments

class PointerArg(NamedTuple):
    """A ``cute.Pointer`` argument as a launch passes it: a global-memory address, the element type
    and the alignment in bytes the kernel may assume (a cheap tuple; ``make_ptr`` happens once, at
    compile time)."""

    address: int
    dtype: type
    align: int


def pointer(t: torch.Tensor, align: int, offset: int = 0) -> PointerArg:
    """A pointer ``offset`` elements past ``t``'s first element (in memory: a sub-view's start
    without making the view), promising ``align`` bytes of alignment, which every launch checks."""
    address = t.data_ptr()
    if offset:
        address += offset * t.element_size()
    return PointerArg(address, DTYPES[t.dtype], align)


# ----------------------------------------------------------------------------- plans

def plan_cache(planner):
    """``planner`` memoized on its arguments (at most ``PLANS`` of them, least recently used out).

    A *plan* is what an op works out on the host before a launch: the kernel's key, the vector
    widths, the grid, the numbers it passes. It is a pure function of a few hashable facts about
    the operands -- dtypes, shapes, strides, each address modulo 16 (no kernel assumes more
    alignment than 16 bytes), the device -- so an op reads those facts on each call and looks its
    plan up. A planner that raises (an operand the kernel cannot take) is not memoized: it raises
    again on the next call."""
    return functools.lru_cache(maxsize=PLANS)(planner)


class View(NamedTuple):
    """What a plan may depend on of a tensor: its shape, its strides and its address modulo 16."""

    shape: tuple
    stride: tuple
    misalignment: int

    @classmethod
    def of(cls, t: torch.Tensor) -> View:
        return cls(tuple(t.shape), t.stride(), t.data_ptr() % 16)


class Operand(NamedTuple):
    """A tensor as a plan sees it -- shape, strides, dtype, address modulo 16 -- with the tensor
    methods that planning code calls (``shape``, ``dtype``, ``stride()``, ``data_ptr()``,
    ``element_size()``, ``contiguous()``), so that one function decides for a tensor and for its
    hashable stand-in: an op plans on ``Operand.of(t)`` under ``plan_cache`` and launches on ``t``.
    ``data_ptr()`` is the address modulo 16, which answers every alignment question a plan asks;
    ``contiguous()`` is the stand-in of ``t.contiguous()`` (a new allocation is 16-byte aligned)."""

    shape: torch.Size
    strides: tuple
    dtype: torch.dtype
    misalignment: int

    @classmethod
    def of(cls, t: torch.Tensor) -> Operand:
        return cls(t.shape, t.stride(), t.dtype, t.data_ptr() % 16)

    def stride(self, dim: int | None = None):
        return self.strides if dim is None else self.strides[dim]

    def data_ptr(self) -> int:
        return self.misalignment

    def element_size(self) -> int:
        return self.dtype.itemsize

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return functools.reduce(operator.mul, self.shape, 1)

    def is_contiguous(self) -> bool:
        """As torch answers it: row-major strides, those of dims of extent 1 not counted (and an
        empty tensor is contiguous)."""
        if 0 in self.shape:
            return True
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def contiguous(self) -> Operand:
        return self if self.is_contiguous() else Operand.new(self.shape, self.dtype)

    @classmethod
    def new(cls, shape: tuple, dtype: torch.dtype) -> Operand:
        """The stand-in of ``torch.empty(shape, dtype=dtype)``: row-major, 16-byte aligned."""
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * max(shape[i + 1], 1)  # as torch.empty's
        return cls(torch.Size(shape), tuple(strides), dtype, 0)


# ----------------------------------------------------------------------------- workspaces

_workspaces: dict[tuple, torch.Tensor] = {}  # (owner, device index, stream handle) -> its workspace


def workspace(owner: tuple, like: torch.Tensor, numel: int) -> torch.Tensor:
    """A float32 tensor of at least ``numel`` elements on ``like``'s device, for the partial sums
    that one launch of ``owner`` -- a kernel's ``(factory, key)`` -- writes and reads back: the
    same tensor on every call on the same stream, instead of a ``torch.empty`` per call.

    Why that is safe: a launch's kernels are all enqueued by one call of the host function, under
    its Kernel's lock, and run in stream order, so two launches of one kernel on one stream never
    overlap, even from two threads. Another stream, device or kernel has a workspace of its own.
    A workspace that grows is replaced; the old one goes back to torch's allocator, which reuses
    it only in the order of the stream it was made on (this one).

    What it does not cover is a CUDA graph: a captured launch may be replayed alongside another
    graph or eager calls. So while the current stream is capturing or a cudagraph tree warms up
    (``_cache.keepable``) -- or when ``like`` is not on the current device, the one whose capture
    status torch reports -- the workspace is a fresh tensor (from the graph's own memory pool), as a
    ``torch.empty`` would be. Nor
    a stream destroyed with work pending whose handle a new stream gets (torch never destroys its
    own streams). Keep the tensor referenced until the launch has been made."""
    device = like.get_device()
    if not like.is_cuda or device != _current_device() or not _cache.keepable(like.device):
        return like.new_empty(numel, dtype=torch.float32)
    where = (owner, device, torch._C._cuda_getCurrentRawStream(device))
    buffer = _workspaces.get(where)
    if buffer is None or buffer.numel() < numel:
        buffer = _workspaces[where] = like.new_empty(numel, dtype=torch.float32)
    return buffer


# How each kind of argument is passed. A slot kind knows its struct format (8 bytes in all), whether
# the C function gets it (``passed``), the DSL value to compile with, the value its slot holds on a
# call (``c_value``), and a distinctive value for the check against the DSL's marshalling (``probe``).

class _Absent:
    """A ``None`` argument: compiled away, it has no C argument (its slot holds 0 and is not passed)."""

    fmt, passed = "Q", False

    def compile_value(self, arg):
        return None

    def c_value(self, arg) -> int:
        if arg is not None:
            raise ValueError(f"the kernel was compiled for None here, and got {arg!r}")
        return 0

    def probe(self, arg, i):
        return None


class _Pointer:
    """A ``cute.Pointer`` argument: its slot holds the address."""

    fmt, passed = "Q", True

    def __init__(self, arg: PointerArg):
        self.dtype, self.align = arg.dtype, arg.align

    def compile_value(self, arg: PointerArg):
        return make_ptr(arg.dtype, arg.address, cute.AddressSpace.gmem, assumed_align=arg.align)

    def c_value(self, arg: PointerArg) -> int:
        # the kernel was compiled assuming this element type and alignment: check, never assume
        if type(arg) is not PointerArg or arg.dtype is not self.dtype or arg.address % self.align:
            raise ValueError(f"the kernel was compiled for a {self.align}-byte aligned pointer to "
                             f"{self.dtype.__name__}, and got {arg!r}")
        return arg.address

    def probe(self, arg: PointerArg, i: int) -> PointerArg:
        return arg


class _Stream:
    """A ``cuda.CUstream`` argument: its slot holds the stream handle."""

    fmt, passed = "Q", True

    def compile_value(self, arg: cuda.CUstream) -> cuda.CUstream:
        return arg

    def c_value(self, arg: cuda.CUstream) -> int:
        return int(arg)

    def probe(self, arg, i: int) -> cuda.CUstream:
        return cuda.CUstream(0x0123456789ABCDEF + i)


def _float32(arg) -> float:
    """A Python or DSL number rounded to float32 as the DSL does it (a C cast: +-inf beyond the
    range, where struct would raise)."""
    return ctypes.c_float(arg.value if isinstance(arg, cutlass.Numeric) else arg).value


class _Number:
    """An ``Int32``, ``Int64`` or ``Float32`` argument: its slot holds the number (4-byte ones
    followed by 4 zero bytes)."""

    # type -> (struct format, the number from a Python or DSL number: operator.index takes an int
    # and an Int32 alike)
    FORMATS = {Int32: ("i4x", operator.index), Int64: ("q", operator.index), Float32: ("f4x", _float32)}
    passed = True

    def __init__(self, dsl_type):
        if dsl_type not in self.FORMATS:
            raise TypeError(f"launch: a {dsl_type.__name__} argument; only Int32, Int64 and Float32 are supported")
        self.type = dsl_type
        self.fmt, self.c_value = self.FORMATS[dsl_type]

    def compile_value(self, arg):
        return self.type(arg.value if isinstance(arg, cutlass.Numeric) else arg)

    def probe(self, arg, i: int):
        # negative, so that the high 4 bytes of an 8-byte integer are not 0 and a C type of the
        # wrong width shows; distinct per argument, so that a misplaced one shows
        return -(i + 1.5) if self.type is Float32 else -(i + 2)


def _slot(arg, annotation):
    """How ``arg``, passed for a parameter with this annotation (None: unannotated), is passed."""
    if arg is None:
        return _Absent()
    if isinstance(arg, PointerArg):
        return _Pointer(arg)
    if isinstance(arg, cuda.CUstream):
        return _Stream()
    if isinstance(annotation, type) and issubclass(annotation, cutlass.Numeric):
        return _Number(annotation)
    if isinstance(arg, cutlass.Numeric):
        return _Number(type(arg))
    if isinstance(arg, float):
        return _Number(Float32)
    if isinstance(arg, int):
        return _Number(Int64)
    raise TypeError(f"launch: cannot pass {arg!r} to a kernel")


# ----------------------------------------------------------------------------- the launcher

class Kernel:
    """``factory(*key)`` compiled for this machine's target, and the block of C arguments it is
    called with (see the module doc)."""

    def __init__(self, factory, key: tuple, args: tuple):
        host = factory(*key)
        self.name = f"{factory.__name__}{key}"
        params = inspect.signature(host, eval_str=True).parameters.values()
        annotations = [None if p.annotation is p.empty else p.annotation
                       for p in params if p.kind is not p.VAR_POSITIONAL]  # positions past these: *args
        self._slots = [_slot(arg, annotations[i] if i < len(annotations) else None) for i, arg in enumerate(args)]
        self._c_values = [slot.c_value for slot in self._slots]  # argument -> what its slot holds

        # The block: slot i is bytes [8i, 8i + 8); the C function gets the addresses of the slots
        # of the arguments that are not None.
        self._format = struct.Struct("=" + "".join(slot.fmt for slot in self._slots))  # native order, no padding
        self._block = ctypes.create_string_buffer(self._format.size)
        base = ctypes.addressof(self._block)
        self._addresses = [ctypes.c_void_p(base + 8 * i) for i, slot in enumerate(self._slots) if slot.passed]
        # The fast fill (``_fill``): the arguments that struct cannot pack as they are.
        self._pointers = [(i, slot.dtype, slot.align) for i, slot in enumerate(self._slots)
                          if isinstance(slot, _Pointer)]
        self._absent = [i for i, slot in enumerate(self._slots) if isinstance(slot, _Absent)]
        self._streams = [i for i, slot in enumerate(self._slots) if isinstance(slot, _Stream)]
        self._run = self._first_run  # the C call on the block's addresses
        # One call at a time fills the block and launches from it: the C call releases the GIL, and
        # another thread must not rewrite the block while the host function reads it.
        self._lock = threading.Lock()

        start = time.perf_counter()
        # on a GPU, a kernel an earlier process compiled is loaded from disk (``_disk``), if the DSL
        # passes it the arguments as it did when it was compiled
        kept = None if _compile_only else _disk.name(factory, key, self._slots, target())
        self.compiled = _disk.load(kept) if kept else None
        if self.compiled is not None:
            try:
                self._check_marshalling(args)
                LOAD_SECONDS[(factory.__name__, key, target())] = time.perf_counter() - start
                return
            except Exception as e:  # noqa: BLE001 - compiled afresh below, and checked again
                warnings.warn(f"kcourse: the kept cute kernel {self.name} takes its arguments otherwise "
                              f"({type(e).__name__}: {e}); compiling it", stacklevel=2)
        compile_args = [slot.compile_value(arg) for slot, arg in zip(self._slots, args)]
        self.compiled = cute.compile(host, *compile_args, options=f"--gpu-arch {target()}")
        COMPILE_SECONDS[(factory.__name__, key, target())] = time.perf_counter() - start
        self._check_marshalling(args)
        if kept:
            _disk.keep(self.compiled, kept)

    def __call__(self, *args) -> None:
        """Launch on ``args`` (the same kinds of arguments, in the same places, as at compile time)."""
        with self._lock:
            self._fill(args)
            self._run()

    def check(self, args: tuple) -> None:
        """Raise as a launch on ``args`` would, without launching."""
        with self._lock:
            self._fill(args)

    def _fill(self, args: tuple) -> None:
        """Write the C values of ``args`` into the block.

        The fast way: struct converts and range-checks numbers itself (an int through its
        ``__index__``, a float rounded to float32 as a C cast rounds it), so only the pointers (after
        their check), the Nones and the streams are replaced first. Anything it cannot take -- a
        wrong argument, or a float beyond float32's range, which struct refuses where a C cast
        gives inf -- goes the exact way, slot by slot, which converts it or raises."""
        values = list(args)
        try:
            for i, dtype, align in self._pointers:
                arg = values[i]
                if type(arg) is not PointerArg or arg.dtype is not dtype or arg.address % align:
                    raise ValueError
                values[i] = arg.address
            for i in self._absent:
                if values[i] is not None:
                    raise ValueError
                values[i] = 0
            for i in self._streams:
                values[i] = int(values[i])
            self._format.pack_into(self._block, 0, *values)
        except Exception:  # the exact way says what is wrong
            self._fill_exactly(args)

    def _fill_exactly(self, args: tuple) -> None:
        """Write the C values of ``args`` into the block, each converted by its slot."""
        if len(args) != len(self._slots):
            raise TypeError(f"{self.name}: {len(args)} arguments, compiled for {len(self._slots)}")
        try:
            self._format.pack_into(self._block, 0, *[c_value(arg) for c_value, arg in zip(self._c_values, args)])
        except (ValueError, struct.error) as e:  # struct.error: a number outside its type's range
            raise ValueError(f"{self.name}: {e}; arguments {args}") from None

    def _first_run(self) -> None:
        """The first launch, the DSL's way (which loads the module onto the GPU); from then on the
        direct call where this DSL version allows it."""
        self._dsl_run()
        self._run = _direct_call(self.compiled, self._addresses) or self._dsl_run

    def _dsl_run(self) -> None:
        self.compiled.run_compiled_program(self._addresses)

    def _check_marshalling(self, args: tuple) -> None:
        """Check that the block holds byte for byte the C arguments that the DSL's own marshalling
        (what ``compiled(*args)`` would pass) makes of the same values: the argument values are
        replaced by distinctive ones (a non-null stream, negative numbers), so that every slot's
        place, width and encoding are tested, and 8 bytes are compared per slot."""
        probes = [slot.probe(arg, i) for i, (slot, arg) in enumerate(zip(self._slots, args))]
        # the DSL's addresses point into these objects: they must outlive the comparison
        dsl_args = [slot.compile_value(probe) for slot, probe in zip(self._slots, probes)]
        dsl_addresses, _adapted = self.compiled.generate_execution_args(*dsl_args)
        self._fill(probes)
        ours = [ctypes.string_at(address, 8) for address in self._addresses]
        dsl = [ctypes.string_at(address, 8) for address in dsl_addresses]
        if ours != dsl:
            raise RuntimeError(f"{self.name}: the DSL passes these arguments as {len(dsl)} C values "
                               f"{[d.hex() for d in dsl]}, _compile.Kernel as {len(ours)} values "
                               f"{[o.hex() for o in ours]}; this DSL version needs _compile.Kernel updated")


def _direct_call(compiled, addresses: list):
    """A function of no arguments that calls ``compiled``'s C function on ``addresses`` as the DSL's
    executor does (``JitExecutor.run_compiled_program``: an array of the addresses followed by the
    executor's own extra arguments -- the address of the CUDA status the C function writes --, the
    call, then the status checked), with the array built once instead of on every call. None
    where there is no executor yet (no launch has run) or it is not as this function knows it."""
    try:
        executor = compiled._default_executor  # made by the first run_compiled_program
        c_function, status = executor.capi_func, executor.cuda_result
        count = len(addresses) + executor._num_extra_args
        packed = executor._get_invoke_packed_args(list(addresses))[:count]  # the executor's own array
        from cutlass.base_dsl.runtime import cuda as dsl_cuda
        error_type = dsl_cuda.cudart.cudaError_t
    except Exception:  # another DSL version: stay with run_compiled_program
        return None
    packed = (ctypes.c_void_p * count)(*packed)

    def direct_call() -> None:
        c_function(packed)
        if status is not None and status.value:  # the executor raises the same error
            raise dsl_cuda.create_cuda_runtime_error(status.value, error_type)

    direct_call.executor = executor  # keeps the loaded module that c_function lives in
    return direct_call


def compile_only(factory, key: tuple, *args) -> Kernel:
    """The ``Kernel`` of ``factory(*key)`` for these kinds of arguments, compiled on its first use
    (cached per target); nothing runs."""
    where = (factory, key, target())
    kernel = _kernels.get(where)
    if kernel is None:
        kernel = _kernels[where] = Kernel(factory, key, args)
    return kernel


def launch(factory, key: tuple, *args) -> None:
    """Run ``factory(*key)`` on ``args``, compiling it on its first use."""
    kernel = compile_only(factory, key, *args)
    if _compile_only:  # still check the arguments against the compiled kernel: a key that misses
        kernel.check(args)  # something compiled in (a pointer's dtype, say) fails on a CPU too
    else:
        kernel(*args)


@contextlib.contextmanager
def compiling_only():
    """Within this block ``launch`` compiles and does not run: how kernels are checked without a GPU."""
    global _compile_only
    previous, _compile_only = _compile_only, True
    try:
        yield
    finally:
        _compile_only = previous
