"""``kcourse.blas.triton._launch.launch``: a compiled kernel is reused only for arguments that Triton
itself would give the same specialization (else a launch could run a kernel compiled for, say, a
16-aligned pointer or a stride of 1 on arguments that are not). Checked here against Triton's own
binder (``native_specialize_impl``), on any machine; the launches themselves run in every triton
test on a GPU (under the interpreter every launch goes through Triton)."""
import itertools

import pytest
import torch

pytest.importorskip("triton")
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from kcourse.blas.triton._launch import _specialization  # noqa: E402

INTS = [0, 1, 2, 3, 15, 16, 17, 32, 48, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 1, 2**32, 2**32 + 3,
        2**62, 2**63 - 1, 2**63, 2**64 - 16, -2**31, -2**31 - 1, -2**31 - 16, -2**40]
BUFFER = torch.zeros(256, dtype=torch.float32)
TENSORS = [BUFFER, BUFFER[1:], BUFFER[4:], BUFFER[8:], BUFFER.view(torch.bfloat16)[1:], BUFFER.view(torch.bfloat16)[8:],
           BUFFER.view(torch.int64), BUFFER.view(torch.int32)[3:], torch.nn.Parameter(BUFFER[4:].clone())]
TILE = torch.zeros(64, 64, dtype=torch.bfloat16)
DESCRIPTORS = [TensorDescriptor(TILE, [64, 64], [64, 1], block) for block in ([16, 32], [32, 16], [16, 32])] + [
    TensorDescriptor(TILE.float(), [64, 64], [64, 1], [16, 32])]
OTHERS = [None, True, False, 0.5, 1.0, -2.0, (1, 16, 3), (2, 16, 3), (16, 16), (1, 1)]
CONSTEXPRS = ["gelu", "none"]  # passed only as constexprs: Triton does not specialize them, we key on the value


def triton_key(a):
    return native_specialize_impl(BaseBackend, a, False, True, True)


@pytest.mark.parametrize("values", [INTS, TENSORS, DESCRIPTORS, OTHERS],
                         ids=["ints", "tensors", "descriptors", "others"])
def test_same_specialization_means_same_triton_key(values):
    """Equal ``_specialization`` implies Triton's key is equal (ours may be finer, never coarser)."""
    for a, b in itertools.combinations_with_replacement(values, 2):
        if _specialization(a) == _specialization(b):
            assert triton_key(a) == triton_key(b), (a, b)


def test_specialization_is_hashable_and_tells_kinds_apart():
    values = INTS + TENSORS + DESCRIPTORS + OTHERS + CONSTEXPRS
    keys = [_specialization(v) for v in values]
    assert len({hash(k) for k in keys}) > 1
    assert _specialization(1) != _specialization(True) and _specialization(0) != _specialization(None)
    assert _specialization(1.0) != _specialization(1) and _specialization(16) != _specialization(32 + 1)
    assert _specialization("gelu") != _specialization("none")


def test_gemm_descriptors_copied_from_a_template_equal_triton_s():
    """The TMA gemm's descriptors: one validated per shape, strides and dtype, then copied with their
    own base. A copy equals the descriptor Triton would make, field for field; a misaligned base is
    validated afresh (and refused by Triton); the template holds no tensor."""
    from kcourse.blas.triton import _gemm_tma

    buffer = torch.zeros(4, 64, 128, dtype=torch.bfloat16)
    for x, batched in [(buffer, True), (buffer[1:3], True), (buffer[:1], False), (buffer[:, :, 64:], True)]:
        for _ in range(2):  # the first call makes the template, the second copies it
            made = _gemm_tma._descriptor(x, batched)
            view = x if batched else x[0]
            expected = TensorDescriptor(view, list(view.shape), list(view.stride()), [1] * view.dim())
            assert type(made) is TensorDescriptor and vars(made).keys() == vars(expected).keys()
            assert made.base.data_ptr() == view.data_ptr() and made.base.shape == view.shape
            assert {k: v for k, v in vars(made).items() if k != "base"} == \
                {k: v for k, v in vars(expected).items() if k != "base"}
    assert all(t.base is None for t in _gemm_tma._DESCRIPTORS.values())
    odd = torch.zeros(64 * 128 + 1, dtype=torch.bfloat16)[1:].view(1, 64, 128)  # 2 bytes past alignment
    _gemm_tma._descriptor(torch.zeros(1, 64, 128, dtype=torch.bfloat16), True)  # (its template)
    with pytest.raises(AssertionError, match="aligned"):
        _gemm_tma._descriptor(odd, True)


def test_an_autotuning_pick_is_kept_for_the_next_process(monkeypatch, tmp_path):
    # the first call times the configs and keeps the pick in Triton's cache directory; a new process
    # (here: the in-memory picks and the autotuner's own cache emptied) reads it and runs no autotuner
    from kcourse.blas.triton import _launch
    from kcourse.blas.triton.gemv import gemv, gemv_kernel

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_launch, "KEEP_PICKS", True)
    if not torch.cuda.is_available():
        monkeypatch.setattr(_launch, "_device_signature", lambda: "the interpreter")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tuned = []
    real_run = gemv_kernel.run
    monkeypatch.setattr(gemv_kernel, "run", lambda *a, **k: tuned.append(1) or real_run(*a, **k))
    A, x = torch.randn(37, 20, device=device), torch.randn(20, device=device)

    def new_process():
        monkeypatch.setattr(_launch, "_PICKED", {})
        monkeypatch.setattr(gemv_kernel, "cache", {})
        out = torch.empty(37, device=device)
        gemv(A, x, None, 1.0, 0.0, out)
        torch.testing.assert_close(out, A @ x, rtol=1e-5, atol=1e-5)
        return out

    new_process()
    assert len(tuned) == 1 and list(tmp_path.rglob("*.kcourse-pick.json"))
    new_process()
    assert len(tuned) == 1  # the kept pick, not the autotuner
    (path,) = tmp_path.rglob("*.kcourse-pick.json")
    path.write_text('{"index": 0, "config": "another list of configs"}')  # not what it names now: tune again
    new_process()
    assert len(tuned) == 2


def _descriptor_fields(d):
    """A descriptor as the launcher reads it: its base's address, and every other field."""
    return None if d is None else (d.base.data_ptr(), {k: v for k, v in vars(d).items() if k != "base"})


@pytest.mark.parametrize("layout", ["linear", "a_transposed", "b_shared_by_batch", "bias_gated_pair", "split"])
def test_gemm_s_kept_launch_passes_what_the_full_path_does(monkeypatch, layout):
    """The TMA gemm keeps each argument signature's launch (``_gemm_tma.Kept``: the compiled kernel,
    descriptor templates, grid, sizes): a later gemm call with new tensors of that signature hands the
    kernel exactly the arguments, grid included, that the full path (descriptors validated, the
    autotuner's pick and its pre_hook) hands it for them. A product split in K is not kept."""
    from kcourse.blas.triton import _gemm_tma, gemm

    config = _gemm_tma.CONFIGS[0]
    full_path = []

    class Recorder:  # stands for the compiled kernel's Again
        def __init__(self, kwargs):
            self.kwargs, self.calls = kwargs, []

        def __call__(self, grid, *args):
            self.calls.append((grid, args))

    def launch_tuned(kernel, grid, key, *args, **kwargs):  # the autotuner picked ``config``
        meta = {**kwargs, **config.all_kwargs()}
        config.pre_hook({**dict(zip(kernel.arg_names, args)), **meta})
        full_path.append((grid(meta), args))
        return Recorder(meta)

    monkeypatch.setattr(_gemm_tma, "launch_tuned", launch_tuned)
    monkeypatch.setattr(_gemm_tma, "KEPT", {})
    monkeypatch.setattr(gemm, "INTERPRET", False)  # (the path of a GPU, with CPU tensors)
    monkeypatch.setattr(gemm, "tma_plan", _gemm_tma.tma_layouts)
    monkeypatch.setattr(_gemm_tma, "launch", lambda *a, **k: None)  # (split K's sum kernel)
    bf16 = dict(dtype=torch.bfloat16)
    M, K, N = (64, 2048, 64) if layout == "split" else (96, 64, 80)

    def operands():
        pair = layout == "bias_gated_pair"
        if layout == "a_transposed":
            A = torch.randn(2, K, M, **bf16).mT
        elif layout == "b_shared_by_batch":
            A = torch.randn(3, M, K, **bf16)
        else:
            A = torch.randn(M, K, **bf16)
        B = torch.randn(N, K, **bf16).mT  # a Linear's weight, transposed
        if A.dim() == 3:
            B = B.expand(A.shape[0], K, N) if layout == "b_shared_by_batch" else torch.randn(A.shape[0], K, N, **bf16)
        out = torch.empty(*A.shape[:-1], N, **bf16)
        C = torch.randn(N, **bf16).expand(M, N) if pair else None
        return dict(A=A, B=B, C=C, alpha=1.0, beta=1.0 if pair else 0.0, out=out, activation="silu" if pair else "none",
                    z=torch.empty_like(out) if pair else None, B2=torch.randn(N, K, **bf16).mT if pair else None,
                    C2=torch.randn(N, **bf16).expand(M, N) if pair else None, z2=torch.empty_like(out) if pair else None)

    gemm.gemm(**operands())  # the full path, which keeps the launch
    if layout == "split":
        assert not _gemm_tma.KEPT
        return
    (kept,) = _gemm_tma.KEPT.values()
    second = operands()
    gemm.gemm(**second)  # the kept launch
    (grid, args), = kept.again.calls
    assert len(full_path) == 1
    monkeypatch.setattr(_gemm_tma, "KEPT", {})
    gemm.gemm(**second)  # the full path on the same tensors
    expected_grid, expected = full_path[-1]
    assert grid == expected_grid and len(args) == len(expected)
    for got, want in zip(args, expected):
        if isinstance(want, TensorDescriptor):
            assert _descriptor_fields(got) == _descriptor_fields(want)
        elif isinstance(want, torch.Tensor):
            assert got.data_ptr() == want.data_ptr() and got.dtype == want.dtype
        else:
            assert type(got) is type(want) and got == want


def test_gemm_signature_tells_apart_what_a_kept_launch_fixes():
    from kcourse.blas.triton import _gemm_tma

    A, B, out = torch.zeros(8, 16, dtype=torch.bfloat16), torch.zeros(16, 24, dtype=torch.bfloat16), \
        torch.zeros(8, 24, dtype=torch.bfloat16)
    bias = torch.zeros(24, dtype=torch.bfloat16)

    def sig(**changes):
        args = dict(A=A, B=B, C=None, alpha=1.0, beta=0.0, out=out, activation="none", z=None, B2=None, C2=None,
                    z2=None)
        return _gemm_tma.signature(**{**args, **changes})

    base = sig()
    assert sig() == base
    variants = [sig(A=A.T.contiguous().T), sig(A=torch.zeros(8, 17, dtype=torch.bfloat16)[:, 1:]),
                sig(A=A.half(), B=B.half(), out=out.half()), sig(C=bias.expand(8, 24), beta=1.0),
                sig(C=torch.zeros(8, 24, dtype=torch.bfloat16), beta=1.0), sig(alpha=1), sig(alpha=2),
                sig(activation="gelu"), sig(z=torch.zeros(8, 24, dtype=torch.bfloat16))]
    assert len({base, *variants}) == len(variants) + 1


def test_attention_tunes_once_per_doubling_of_the_lengths(monkeypatch):
    # decoding grows the key length by one each step: the tile choice is kept per power-of-2 class,
    # so the autotuner runs at the first length of a class and the others take its pick
    from kcourse.blas.triton import _launch
    from kcourse.blas.triton import attention as triton_attention

    monkeypatch.setattr(_launch, "_PICKED", {})
    monkeypatch.setattr(_launch, "KEEP_PICKS", False)
    kernel = triton_attention.attention_fwd_kernel
    monkeypatch.setattr(kernel, "cache", {})
    tuned = []
    real_run = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **k: tuned.append(1) or real_run(*a, **k))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    q = torch.randn(1, 2, 1, 16, device=device)
    for Tk, runs in [(9, 1), (13, 1), (16, 1), (17, 2), (31, 2)]:
        k, v = torch.randn(2, 1, 2, Tk, 16, device=device).unbind(0)
        out, _ = triton_attention.attention(q, k, v, None, False, 0.25)
        torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25),
                                   rtol=1e-4, atol=1e-4)
        assert len(tuned) == runs, (Tk, len(tuned))


def test_float32_to_bfloat16_rounds_to_nearest_even():
    """A float32 -> bfloat16 cast in a kernel, explicit or by a store, rounds as torch does (to
    nearest, ties to even): on a GPU natively, under the interpreter through ``_launch``'s fix of its
    truncating cast. Ties both ways, values just past a tie, subnormals, overflow, inf and NaN."""
    import triton
    import triton.language as tl

    from _util import DEVICE
    import kcourse.blas.triton._launch  # noqa: F401  (the interpreter's fix)

    @triton.jit
    def cast(x_ptr, y_ptr, z_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        tl.store(y_ptr + i, x.to(tl.bfloat16))
        tl.store(z_ptr + i, x)

    ulp = 2.0 ** -7  # bfloat16's spacing in [1, 2)
    special = [1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2**-20, -(1 + 3 * ulp / 2), -5.4296875, 3.3895e38,
               -3.4e38, 1e-40, -9.2e-41, 1e-45, 0.0, -0.0, float("inf"), float("-inf"), float("nan")]
    x = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 100
    x[:len(special)] = torch.tensor(special)
    x = x.to(DEVICE)
    y, z = (torch.empty(64, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    cast[(1,)](x, y, z, N=64)
    want = x.to(torch.bfloat16)
    for got in (y, z):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~want.isnan()], want[~want.isnan()]), (x, got, want)
