"""The cute attention kernels compile (for sm_90a where there is no GPU), as tests/test_cute_compile.py
does for the BLAS kernels: each case calls the cute ``attention`` and ``attention_backward`` on CPU
tensors inside ``_compile.compiling_only()``, so they pick their kernel variants exactly as on a GPU
(math mode from the dtype, padded head dim, causal, vector width from strides and alignment) and
compile them; nothing is launched. Whether the kernels compute the right thing is
tests/test_attention.py's job, on a GPU.

One check reads generated code: ``test_tf32_operand_a_registers`` follows, in the PTX of a one-warp
kernel, which accumulator registers reach the A operand of the TF32 MMAs of P V (the float32 path's
register reuse; a wrong mapping there made every float32 output O(1) wrong on the GPU while this
file still passed)."""
import re

import pytest
import torch

pytest.importorskip("cutlass", reason="the CuTe DSL is not installed (pip install -e '.[cute]')")

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Float32  # noqa: E402
from cutlass.cute.runtime import make_ptr  # noqa: E402

from kcourse.blas import tuning  # noqa: E402
from kcourse.blas.cute import _attention_bwd_sm90, _attention_fwd, _attention_fwd_sm90, _compile  # noqa: E402
from kcourse.blas.cute import attention as cute_attention  # noqa: E402
from kcourse.blas.cute.attention import attention, attention_backward  # noqa: E402
from _cute import compiled_kernels, fresh_plans  # noqa: E402

FACTORIES = ("_fwd_factory", "_delta_factory", "_dkdv_factory", "_dq_factory")
HOPPER = ("_AttentionFwdSm90", "_Preprocess", "_AttentionBwdSm90", "_Postprocess")


def heads(B, H, T, D, dtype, layout="contiguous"):
    """A CPU (B, H, T, D) tensor (its values are never read) laid out as asked."""
    if layout == "contiguous":
        return torch.zeros(B, H, T, D, dtype=dtype)
    if layout == "bthd":  # the (B, T, H, D) projection output seen through .transpose(1, 2): read in place
        return torch.zeros(B, T, H, D, dtype=dtype).transpose(1, 2)
    if layout == "strided":  # every other element along D: copied to a contiguous tensor first
        return torch.zeros(B, H, T, 2 * D, dtype=dtype)[..., ::2]
    if layout == "misaligned":  # the first element 4 bytes past a 16-byte boundary: 4-byte vectors
        skip = 4 // torch.empty(0, dtype=dtype).element_size()
        return torch.zeros(B * H * T * D + skip, dtype=dtype)[skip:].view(B, H, T, D)
    raise ValueError(layout)


def run(B, H, Hkv, Tq, Tk, D, dtype, causal, layout="contiguous", needs=(True, True, True)):
    q = heads(B, H, Tq, D, dtype, layout)
    k, v = heads(B, Hkv, Tk, D, dtype, layout), heads(B, Hkv, Tk, D, dtype, layout)
    with _compile.compiling_only():
        out, cache = attention(q, k, v, None, causal, D ** -0.5)
        grads = attention_backward(torch.zeros(out.shape, dtype=dtype), cache, needs, causal, D ** -0.5)
    assert out.shape == (B, H, Tq, D) and cache[4].shape == (B, H, Tq) and cache[4].dtype == torch.float32
    for g, t, n in zip(grads, (q, k, v), needs):
        assert (g is None) == (not n) and (g is None or g.shape == t.shape)
    return cache, grads


# (dtype, D, causal, shape (B, H, Hkv, Tq, Tk), layout): every head-dim class (Dp = 32, 64, 96, 128),
# both masks, grouped-query heads, Tq != Tk both ways, the three math modes, views read in place,
# copied, and narrower vectors
CASES = [
    (torch.bfloat16, 128, True, (2, 4, 2, 100, 90), "bthd"),
    (torch.float16, 128, False, (1, 2, 1, 33, 70), "contiguous"),
    (torch.float16, 64, False, (2, 4, 4, 70, 19), "contiguous"),
    (torch.bfloat16, 64, True, (1, 4, 1, 37, 37), "misaligned"),
    (torch.float16, 80, True, (1, 2, 2, 17, 29), "contiguous"),
    (torch.bfloat16, 16, False, (1, 4, 2, 33, 70), "strided"),
    (torch.float32, 32, True, (1, 4, 2, 37, 21), "misaligned"),
    pytest.param(torch.float32, 128, False, (2, 2, 1, 65, 40), "bthd", marks=pytest.mark.slow),  # ~25 s on a CPU
]


def no_hopper_kernels(monkeypatch):
    """Send every forward and backward to the mma.sync kernels (what a GPU before Hopper runs, and the
    backward under torch.use_deterministic_algorithms)."""
    monkeypatch.setattr(cute_attention, "sm90_supports", lambda *args: False)
    monkeypatch.setattr(cute_attention, "sm90_bwd_supports", lambda *args: False)
    fresh_plans(monkeypatch, cute_attention, "_forward_plan", "_backward_plan")


def kernel_cases():
    """(hopper, *case): every case on the Hopper path; on the mma.sync path the first case, the others
    -m slow (each compile takes 5-9 s on a CPU; the GPU run includes the slow ones)."""
    for hopper in (True, False):
        for i, case in enumerate(CASES):
            values, marks = (case.values, list(case.marks)) if hasattr(case, "values") else (case, [])
            if not hopper and i:
                marks.append(pytest.mark.slow)
            yield pytest.param(hopper, *values, marks=marks, id=f"{'sm90' if hopper else 'mma.sync'}-{values}")


@pytest.mark.parametrize("hopper, dtype, D, causal, shape, layout", list(kernel_cases()))
def test_attention_kernels_compile(monkeypatch, hopper, dtype, D, causal, shape, layout):
    if not hopper:
        no_hopper_kernels(monkeypatch)
    seen = compiled_kernels(monkeypatch)
    cache, grads = run(*shape, D, dtype, causal, layout)
    # the Hopper kernels take 16-bit D = 64 / 128 whose strides TMA can describe (not "misaligned")
    if hopper and dtype != torch.float32 and D in (64, 128) and layout != "misaligned":
        assert [name for name, _ in seen] == list(HOPPER), seen
        fwd = _attention_fwd_sm90.config(D, causal, shape[3])
        variant = ("persistent", "paired", "pingpong", "overlap", "q_stages", "k_stages", "v_stages", "tma_store",
                   "scheduled")
        assert seen[0][1] == (dtype, D, causal, 128, *(fwd[k] for k in variant))
        bwd = _attention_bwd_sm90.config(D, causal, shape[4])
        main = (dtype, D, causal, bwd["paired"], bwd["tma_store"])
        assert [key for _, key in seen[1:]] == [(dtype, D), main, (dtype, D)], seen
        if layout == "bthd":  # read in place, and the gradients written token-major, as q, k, v (heads_like)
            assert not cache[0].is_contiguous()
            assert all(g.transpose(1, 2).is_contiguous() and not g.is_contiguous() for g in grads), \
                [g.stride() for g in grads]
        return
    assert [name for name, _ in seen] == list(FACTORIES), seen
    Dp = -(-D // 32) * 32
    mode = "mma16" if dtype != torch.float32 else "3xtf32"
    fwd_key = seen[0][1]
    assert fwd_key[:4] == (dtype, mode, Dp, causal), fwd_key
    vec = fwd_key[4]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    assert vec == (4 if layout == "misaligned" else 16) // itemsize, vec
    assert [key for _, key in seen[2:]] == [(dtype, mode, Dp, causal, seen[2][1][4])] * 2
    if layout == "strided":  # the kernels read a contiguous copy, and the cache keeps it
        assert all(t.is_contiguous() for t in cache[:3])
    if layout == "bthd":  # read in place: the cache holds the views themselves
        assert not cache[0].is_contiguous()


# (dtype, D, causal, shape (B, H, Hkv, Tq, Tk)): kv_len's kernels, 16-bit and float32, both masks, a padded
# head dim and D = 128 (16-bit D = 128 is a Hopper case without kv_len); float32 with -m slow on the CPU
# (its 3xtf32 kernels compile without kv_len in test_attention_kernels_compile)
KV_LEN_CASES = [
    (torch.bfloat16, 128, True, (2, 4, 2, 1, 90)),
    (torch.float16, 48, False, (3, 2, 1, 5, 70)),
    pytest.param(torch.float32, 48, True, (2, 2, 2, 33, 40), marks=pytest.mark.slow),  # ~13 s on a CPU
    pytest.param(torch.float32, 128, False, (2, 2, 1, 1, 64), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("dtype, D, causal, shape", KV_LEN_CASES)
def test_kv_len_forward_compiles(monkeypatch, dtype, D, causal, shape):
    """A call with kv_len takes the mma.sync forward compiled for it (its key: the key without kv_len,
    ``True`` appended; the kv_len pointer int32, 4-byte aligned), never the Hopper kernel, and plans
    apart from the call without it; the backward takes ``needs`` with kv_len's entry (False)."""
    B, H, Hkv, Tq, Tk = shape
    q, k, v = heads(B, H, Tq, D, dtype), heads(B, Hkv, Tk, D, dtype), heads(B, Hkv, Tk, D, dtype)
    kv_len = torch.tensor([Tk - 3, 1, 0][:B], dtype=torch.int32)
    seen = compiled_kernels(monkeypatch)
    with _compile.compiling_only():
        out, cache = attention(q, k, v, kv_len, causal, D ** -0.5)
        assert [name for name, _ in seen] == ["_fwd_factory"], seen
        with_len = seen[0][1]
        seen.clear()
        attention(q, k, v, None, causal, D ** -0.5)  # the same operands without kv_len: a plan of its own
        without = seen[0][1]
        grads = attention_backward(torch.zeros(out.shape, dtype=dtype), cache, (True, True, True, False), causal,
                                   D ** -0.5)
    assert out.shape == (B, H, Tq, D) and cache[4].shape == (B, H, Tq) and cache[4].dtype == torch.float32
    assert all(g.shape == t.shape for g, t in zip(grads, (q, k, v)))
    Dp = -(-D // 32) * 32
    mode = "mma16" if dtype != torch.float32 else "3xtf32"
    assert with_len[:4] == (dtype, mode, Dp, causal) and with_len[-1] is True and len(with_len) == 6, with_len
    if seen[0][0] == "_fwd_factory":
        assert without == with_len[:5]
    else:  # 16-bit D = 128: the Hopper kernel without kv_len
        assert dtype != torch.float32 and D == 128 and seen[0][0] == "_AttentionFwdSm90", seen


def test_kv_len_never_takes_the_hopper_kernel(monkeypatch):
    """Even where ``sm90_supports`` says yes (patched to always: 16-bit D = 64 as on an H100), kv_len
    goes to the mma.sync forward; a kv_len pointer of another dtype is refused by the compiled kernel."""
    monkeypatch.setattr(cute_attention, "sm90_supports", lambda *args: True)
    monkeypatch.setattr(cute_attention, "attention_fwd_sm90", lambda *args, **kw: pytest.fail("sm90 kernel"))
    fresh_plans(monkeypatch, cute_attention, "_forward_plan")
    seen = compiled_kernels(monkeypatch)
    q = heads(2, 2, 20, 64, torch.float16)
    with _compile.compiling_only():
        attention(q, q, q, torch.tensor([7, 20], dtype=torch.int32), True, 0.125)
        assert [(name, key[-1]) for name, key in seen] == [("_fwd_factory", True)], seen
        plan = cute_attention._forward_plan(*(_compile.Operand.of(q),) * 3, True, True, 0.125,
                                            tuning.launch("attention"), *cute_attention._facts(q))
        assert not plan.sm90 and plan.key[-1] is True
        with pytest.raises(ValueError, match="pointer to Int32"):
            attention(q, q, q, torch.tensor([7, 20], dtype=torch.int64), True, 0.125)


def test_tf32_mode_and_partial_gradients(monkeypatch, tf32):
    seen = compiled_kernels(monkeypatch)
    run(1, 2, 1, 40, 33, 64, torch.float32, False, needs=(False, True, False))
    assert [name for name, _ in seen] == ["_fwd_factory", "_delta_factory", "_dkdv_factory"], seen
    assert seen[0][1][1] == "tf32"
    seen.clear()
    run(1, 2, 1, 40, 33, 64, torch.float32, False, needs=(True, False, False))
    assert [name for name, _ in seen] == ["_fwd_factory", "_delta_factory", "_dq_factory"], seen


def test_a_compiled_kernel_is_reused(monkeypatch):
    run(1, 2, 2, 20, 20, 64, torch.float16, True)
    before = dict(_compile.COMPILE_SECONDS)
    run(3, 6, 2, 300, 77, 64, torch.float16, True)  # other sizes of the same keys (Hopper kernels)
    assert _compile.COMPILE_SECONDS == before
    no_hopper_kernels(monkeypatch)
    run(1, 2, 2, 20, 20, 64, torch.float16, True)
    before = dict(_compile.COMPILE_SECONDS)
    run(3, 6, 2, 300, 77, 56, torch.float16, True)  # other sizes (and D) of the same mma.sync keys
    assert _compile.COMPILE_SECONDS == before


FORWARD_VARIANTS = [(False, False, False, False, False), (False, True, False, False, False),
                    (False, False, False, True, False), (True, False, False, False, False),
                    (True, True, True, False, False), (False, True, False, True, True),
                    (True, True, True, False, True), (True, False, False, False, True)]


# three K and V stages beside one Q buffer, or with the overlap's two Q buffers three of one of them
# (three of each exceed the shared memory at D = 128); each with the epilogue's TMA store where it fits
# (its out buffer takes a stage's 32 KB: two K and V stages beside the overlap, three V stages without)
# (each compiles for ~10 s on a CPU core: every other variant with two stages runs by default, the
# rest with -m slow, as the GPU runs do)
def _forward_variants():
    combos = ([(*v, 2, 2, s) for v in FORWARD_VARIANTS for s in (False, True)]
              + [(*v, 3, 3, False) for v in FORWARD_VARIANTS if not v[4]]
              + [(*v, 2, 3, True) for v in FORWARD_VARIANTS if not v[4]]
              + [(*v, k, 5 - k, False) for v in FORWARD_VARIANTS if v[4] for k in (2, 3)])
    quick = {(*v, 2, 2, False) for v in FORWARD_VARIANTS[::2]}
    return [pytest.param(*c, marks=() if c in quick else pytest.mark.slow) for c in combos]


@pytest.mark.parametrize("causal, persistent, paired, pingpong, overlap, k_stages, v_stages, tma_store",
                         _forward_variants())
def test_hopper_forward_variants_compile(causal, persistent, paired, pingpong, overlap, k_stages, v_stages,
                                         tma_store):
    """The variants ``config`` does not pick for these sizes still build (longer sequences or the
    benchmarks take them)."""
    q = torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 100)
    with _compile.compiling_only():
        launch = tuning.launch("attention", persistent=persistent, paired=paired, scheduled=False, pingpong=pingpong,
                               overlap=overlap, q_stages=2 if overlap else 1, k_stages=k_stages, v_stages=v_stages,
                               tma_store=tma_store)
        _attention_fwd_sm90.attention_fwd_sm90(q, q, q, out, lse, causal, 0.1, launch)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("overlap, tma_store", [(False, False), (True, True)])
def test_hopper_forward_scheduled_variants_compile(causal, overlap, tma_store):
    """The walk of a host-made table (``scheduled``) builds, and is refused with pairs."""
    q = torch.zeros(1, 2, 300, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 300)
    with _compile.compiling_only():
        launch = tuning.launch("attention", persistent=True, paired=False, scheduled=True, overlap=overlap,
                               q_stages=2 if overlap else 1, tma_store=tma_store)
        _attention_fwd_sm90.attention_fwd_sm90(q, q, q, out, lse, causal, 0.1, launch)
        with pytest.raises(ValueError, match="scheduled walk is of single tiles on a persistent grid"):
            _attention_fwd_sm90.attention_fwd_sm90(q, q, q, out, lse, causal, 0.1,
                                                   tuning.launch("attention", paired=True, scheduled=True))


def tile_costs(m_tiles, heads, Tk, causal):
    """What ``schedule`` weighs: each tile's key tiles (top-left causal mask) plus ``TILE_COST``."""
    blocks = [-(-(min((m_tiles - t % m_tiles) * 128, Tk)) // 128) if causal else -(-Tk // 128)
              for t in range(m_tiles * heads)]
    return [b + _attention_fwd_sm90.TILE_COST for b in blocks]


@pytest.mark.parametrize("m_tiles, heads, Tk, causal, grid",
                         [(8, 256, 1024, True, 132), (16, 128, 2048, True, 132), (64, 32, 8192, True, 132),
                          (7, 37, 880, True, 132), (9, 5, 1100, True, 23), (3, 2, 300, True, 132),
                          (5, 50, 333, True, 100), (9, 300, 1100, True, 132), (8, 256, 1024, False, 132),
                          (1, 1, 10, True, 1)])
def test_forward_schedule(m_tiles, heads, Tk, causal, grid):
    """Every tile exactly once; no CTA with more work than in the pairs' round-robin walk, which it
    keeps for all but the last two rounds; the busiest CTA within 4% of the mean (or one tile); at the
    runner's causal shapes (1024 pairs on 132 SMs: 7.76 rounds of equal pairs) within 1% of a perfect
    balance, where the pairs are 3% off."""
    walks = _attention_fwd_sm90.schedule(m_tiles, heads, Tk, causal, grid)
    assert len(walks) == grid
    assert sorted(t for w in walks for t in w) == list(range(m_tiles * heads))
    cost = tile_costs(m_tiles, heads, Tk, causal)
    pairs = [[hb * m_tiles + p] + ([hb * m_tiles + m_tiles - 1 - p] if 2 * p + 1 < m_tiles else [])
             for hb in range(heads) for p in range(-(-m_tiles // 2))]
    paired = [sum((pairs[u] for u in range(c, len(pairs), grid)), []) for c in range(grid)]
    load = [sum(cost[t] for t in w) for w in walks]
    assert max(load) <= max(sum(cost[t] for t in w) for w in paired)
    kept = max(len(pairs) // grid - 2, 0)  # rounds of pairs kept as they were
    for c, walk in enumerate(walks):
        first = sum((pairs[u] for u in range(c, kept * grid, grid)), [])
        assert walk[:len(first)] == first
    assert max(load) <= max(max(cost), 1.04 * sum(load) / grid)  # within 4% of the mean, or one tile
    if causal and heads * m_tiles == 2048:
        assert max(load) < 1.01 * sum(load) / grid
        assert max(sum(cost[t] for t in w) for w in paired) > 1.025 * sum(load) / grid


def test_forward_schedule_table():
    """The kernel's view: row c is CTA c's walk, then the tile count (the end) to the row's end; made
    once per key."""
    table = _attention_fwd_sm90.schedule_table(5, 50, 640, True, 100, torch.device("cpu"))
    assert table.dtype == torch.int32 and table.shape[0] == 100
    walks = _attention_fwd_sm90.schedule(5, 50, 640, True, 100)
    for row, walk in zip(table.tolist(), walks):
        assert row == walk + [250] * (table.shape[1] - len(walk))
    assert max(map(len, walks)) == table.shape[1] - 1
    assert _attention_fwd_sm90.schedule_table(5, 50, 640, True, 100, torch.device("cpu")) is table


def test_forward_schedule_table_under_capture(monkeypatch):
    """While a CUDA graph is captured no table is made (None: the caller walks pairs), and a table made
    before is kept for good: the graph may replay it after the cache has let it go."""
    fwd = _attention_fwd_sm90
    monkeypatch.setattr(fwd, "_schedules", {})
    monkeypatch.setattr(fwd, "_captured", {})
    monkeypatch.setattr(_compile, "PLANS", 1)
    cuda = torch.device("cuda", 0)
    key = (0, 4, 3, 512, True, 6)
    fwd._schedules[key] = table = torch.zeros(6, 3, dtype=torch.int32)  # as an eager call left it
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert fwd.schedule_table(4, 3, 512, True, 6, cuda) is table
    assert fwd.schedule_table(5, 3, 640, True, 6, cuda) is None and list(fwd._schedules) == [key]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    fwd.schedule_table(5, 3, 640, True, 6, torch.device("cpu"))  # a new key: the oldest goes (PLANS = 1)
    assert key not in fwd._schedules and fwd._captured == {key: table}
    assert fwd.schedule_table(4, 3, 512, True, 6, cuda) is table  # served from the captured, not remade


def test_hopper_forward_variant_too_large():
    """A variant whose buffers exceed an SM's shared memory is refused by name before it compiles."""
    q = torch.zeros(1, 2, 100, 128, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 100)
    with _compile.compiling_only(), pytest.raises(ValueError, match=r"q_stages=2, k_stages=2, v_stages=3, "
                                                                      r"tma_store=True needs 263168 bytes"):
        _attention_fwd_sm90.attention_fwd_sm90(q, q, q, out, lse, True, 0.1, tuning.launch(
            "attention", overlap=True, q_stages=2, v_stages=3, tma_store=True))


@pytest.mark.parametrize("D", [128, 64])
@pytest.mark.parametrize("tma_store", [False, True], ids=["direct", "tma_store"])
@pytest.mark.parametrize("causal, persistent, paired",
                         [(False, False, False), (False, True, False), (True, False, True), (True, True, True)])
def test_hopper_backward_variants_compile(causal, persistent, paired, tma_store, D):
    """The backward's variants (a persistent grid, paired key tiles; dK and dV stored from registers
    or through shared memory and TMA) build."""
    q = torch.zeros(1, 2, 300, D, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 300)
    with _compile.compiling_only():
        launch = tuning.launch("attention", backward_persistent=persistent, backward_paired=paired,
                               backward_tma_store=tma_store)
        _attention_bwd_sm90.attention_bwd_sm90(q, q, q, q, q, lse, torch.empty_like(q), torch.empty_like(q),
                                               torch.empty_like(q), causal, 0.1, launch)


def test_hopper_forward_config():
    """With the mask, a persistent grid walking ``schedule``'s table (pairs of query tiles, their tail
    balanced) up to 64 query tiles, one CTA per tile beyond; without it, single tiles on a persistent
    grid (measured); the backward pairs key tiles with the mask, up to 64."""
    config = _attention_fwd_sm90.config
    for D in (64, 128):
        # with the mask up to 64 query tiles, single tiles on a persistent grid walking ``schedule``'s table
        assert config(D, True, 8192)["scheduled"] and config(D, True, 8192)["persistent"]
        assert not config(D, True, 8192)["paired"]
        assert not config(D, True, 8193)["scheduled"] and not config(D, True, 8193)["persistent"]
        assert not config(D, False, 100)["scheduled"] and config(D, False, 100)["persistent"]
        assert not any(config(D, causal, T)["paired"] for causal in (True, False) for T in (100, 8192, 8193))
        backward = _attention_bwd_sm90.config
        assert backward(D, True, 8192) == {"persistent": True, "paired": True, "tma_store": False}
        # dK and dV through TMA stores: up to 32 / 16 key tiles (with / without the mask) at D = 128, 8 at 64
        stored = {128: (4096, 2048), 64: (1024, 1024)}[D]
        assert backward(D, True, stored[0])["tma_store"] and not backward(D, True, stored[0] + 1)["tma_store"]
        assert backward(D, False, stored[1])["tma_store"] and not backward(D, False, stored[1] + 1)["tma_store"]
        # the cross-tile overlap (two Q stages): D = 128 where a CTA runs several tiles, up to 1k without the mask
        assert config(D, True, 8192)["overlap"] == (D == 128) and not config(D, True, 8193)["overlap"]
        assert config(D, False, 1024)["overlap"] == (D == 128) and not config(D, False, 1025)["overlap"]
        assert all(c["q_stages"] == (2 if c["overlap"] else 1) for c in (config(D, True, 100), config(D, False, 100)))
        # the epilogue's TMA store: D = 128 up to 8k with the mask and 4k without, D = 64 up to 2k
        stored = {128: (8192, 4096), 64: (2048, 2048)}[D]
        assert config(D, True, stored[0])["tma_store"] and not config(D, True, stored[0] + 1)["tma_store"]
        assert config(D, False, stored[1])["tma_store"] and not config(D, False, stored[1] + 1)["tma_store"]
        # two K and V stages everywhere (three V stages measured no better beside the TMA store)
        assert all(c["k_stages"] == c["v_stages"] == 2 for c in (config(D, True, 100), config(D, False, 100),
                                                                  config(D, True, 8193), config(D, False, 8193)))
        assert backward(D, True, 8193) == {"persistent": False, "paired": False, "tma_store": False}
        assert backward(D, False, 100) == {"persistent": False, "paired": False, "tma_store": True}


def test_hopper_forward_strides():
    """What TMA is told: (batch, head, sequence) strides, multiples of 8 elements, extent-1 dims given a
    legal stride; None (the mma.sync kernel) for what TMA cannot read."""
    strides = _attention_fwd_sm90.tma_strides
    assert strides(torch.zeros(2, 3, 5, 64, dtype=torch.float16)) == (960, 320, 64)
    assert strides(torch.zeros(2, 5, 3, 64, dtype=torch.float16).transpose(1, 2)) == (960, 64, 192)
    assert strides(torch.zeros(1, 1, 1, 64, dtype=torch.float16)) == (64, 64, 64)
    assert strides(torch.zeros(1, 1, 1, 64, dtype=torch.float16).expand(1, 3, 1, 64)) is None  # heads share memory
    assert strides(torch.zeros(2, 3, 5, 68, dtype=torch.float16)[..., :64]) is None  # sequence stride 68
    assert strides(torch.zeros(2 * 3 * 5 * 64 + 1, dtype=torch.float16)[1:].view(2, 3, 5, 64)) is None  # 2 bytes off
    supports = _attention_fwd_sm90.supports
    q = torch.zeros(1, 2, 5, 128, dtype=torch.bfloat16)
    assert supports(q, q, q, 0.1)
    assert not supports(q, q, q, -0.1) and not supports(q, q, q, 0.0)  # the kernel needs scale > 0
    assert not supports(q.float(), q.float(), q.float(), 0.1)
    q96 = torch.zeros(1, 2, 5, 96, dtype=torch.bfloat16)
    assert not supports(q96, q96, q96, 0.1)


def test_empty_sequences_launch_nothing(monkeypatch):
    seen = compiled_kernels(monkeypatch)
    q, k = torch.zeros(1, 2, 5, 16), torch.zeros(1, 1, 0, 16)
    with _compile.compiling_only():
        out, cache = attention(q, k, k, None, True, 0.25)
        dq, dk, dv = attention_backward(torch.ones(out.shape), cache, (True, True, True), True, 0.25)
    assert not seen
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(dq, torch.zeros_like(q))
    assert torch.isneginf(cache[4]).all()


@pytest.mark.parametrize("D, dtype, message", [
    (160, torch.float16, r"attention: the cute kernels support head dims D from 1 to 128, "
                         r"got D = 160 \(q \(1, 2, 3, 160\)\)"),
    (7, torch.bfloat16, r"attention: the cute kernels need D \* itemsize to be a multiple of 4 bytes .*got D = 7 "
                        r"in bfloat16 \(q \(1, 2, 3, 7\)\)"),
])
def test_unsupported_head_dims(D, dtype, message):
    q = torch.zeros(1, 2, 3, D, dtype=dtype)
    with pytest.raises(ValueError, match=message):
        attention(q, q, q, None, False, 1.0)


# ----------------------------------------------------------------------------- TF32 A operand from registers

def operand_a_ptx(math_mode: str, dump_dir) -> str:
    """The PTX of one warp that loads an m16n8 accumulator from a row-major (16, 8) float32 tensor,
    turns it into an A operand with ``Tiles.as_operand_a`` (as P V, dS K... do) and multiplies it
    with ``Tiles.mma`` (one TF32 MMA, or three for 3xTF32)."""

    @cute.kernel
    def kernel(mC: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        t = _attention_fwd.Tiles.make(Float32, math_mode, 32, 64, 16, 4)
        atom = cute.make_tiled_mma(cute.nvgpu.warp.MmaTF32Op((16, 8, 8)), (1, 1, 1))
        thr = atom.get_slice(tidx)
        acc = cute.make_rmem_tensor(atom.partition_shape_C((16, 8)), Float32)
        cute.autovec_copy(thr.partition_C(mC), acc)
        b = cute.make_rmem_tensor(atom.partition_shape_B((8, 8)), Float32)
        cute.autovec_copy(thr.partition_B(mB), b)
        d = cute.make_rmem_tensor(atom.partition_shape_C((16, 8)), Float32)
        d.fill(0.0)
        t.mma(d, t.as_operand_a(acc)[None, None, 0], b[None, None, 0])
        cute.autovec_copy(d, thr.partition_C(mD))

    @cute.jit
    def host(pc: cute.Pointer, pb: cute.Pointer, pd: cute.Pointer, stream: cuda.CUstream):
        rows = cute.make_layout((16, 8), stride=(8, 1))
        kernel(cute.make_tensor(pc, rows), cute.make_tensor(pb, cute.make_layout((8, 8), stride=(8, 1))),
               cute.make_tensor(pd, rows)).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

    def ptr(address):
        return make_ptr(Float32, address, cute.AddressSpace.gmem, assumed_align=16)

    compiled = cute.compile(host, ptr(1 << 20), ptr(2 << 20), ptr(3 << 20), cuda.CUstream(0),
                            options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {dump_dir}")
    return compiled.__ptx__


def operand_a_sources(ptx: str) -> list:
    """For each TF32 mma.sync, its four A registers, each as the set of (base register, byte offset) of
    the global loads it is computed from (through the TF32 rounding and splitting: cvt, sub, mov)."""
    ptx = re.sub(r"//[^\n]*", "", ptx)
    loads, defs = {}, {}
    for m in re.finditer(r"ld\.global(?:\.v\d)?\.\w+\s+\{?([^};]*?)\}?\s*,\s*\[(%rd\d+)(?:\+(\d+))?\]\s*;", ptx):
        base, offset = m.group(2), int(m.group(3) or 0)
        for i, reg in enumerate(r.strip() for r in m.group(1).split(",")):
            loads[reg] = (base, offset + 4 * i)
    for m in re.finditer(r"(?:cvt\.rna\.tf32\.f32|sub\.f32|mov\.b32)\s+(%r\d+)\s*,\s*([^;]*);", ptx):
        defs[m.group(1)] = [s.strip() for s in m.group(2).split(",")]

    def sources(reg):
        if reg in loads:
            return {loads[reg]}
        return set().union(*(sources(s) for s in defs.get(reg, []) if s.startswith("%r")))

    mma = r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32\s*\{[^}]*\}\s*,\s*\{([^}]*)\}"
    return [[sources(r.strip()) for r in m.group(1).split(",")] for m in re.finditer(mma, ptx)]


@pytest.mark.parametrize("math_mode, mmas", [("tf32", 1), ("3xtf32", 3)])
def test_tf32_operand_a_registers(tmp_path, math_mode, mmas):
    """Lane (g, t) of the m16n8k8 TF32 MMA takes A values (row g, k t), (g + 8, t), (g, t + 4), (g + 8,
    t + 4) (PTX ISA); its accumulator holds (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). With
    k-slot t + 4j read as column 2t + j (the key permutation that ``Tiles.transposed`` applies to V, dO,
    Q and K), the A registers must be the elements (g, 2t), (g + 8, 2t), (g, 2t + 1), (g + 8, 2t + 1)
    of the loaded tile: byte offsets 0, 256, 4, 260 from the lane's first one (rows of 8 floats).
    The previous swapped-view fragment fed the MMA offsets 0, 4, 4, 256 (cute.gemm misreads a value
    mode with out-of-order strides)."""
    found = operand_a_sources(operand_a_ptx(math_mode, tmp_path))
    assert len(found) == mmas, found
    for a in found:
        assert all(len(s) == 1 for s in a), a
        (base, _), = a[0]
        assert [next(iter(s)) for s in a] == [(base, 0), (base, 256), (base, 4), (base, 260)], a


def test_hopper_backward_partial_gradients_and_strides(monkeypatch):
    """The Hopper backward computes dK and dV always and dQ's last kernel only when dq is wanted; a
    dout whose strides TMA cannot describe cannot reach it (autograd's dout is made contiguous first),
    and deterministic mode sends the backward to the mma.sync kernels."""
    seen = compiled_kernels(monkeypatch)
    run(1, 2, 1, 40, 33, 64, torch.bfloat16, False, needs=(False, True, False))
    assert [name for name, _ in seen] == ["_AttentionFwdSm90", "_Preprocess", "_AttentionBwdSm90"], seen
    q = torch.zeros(1, 2, 40, 64, dtype=torch.bfloat16)
    assert cute_attention.sm90_bwd_supports(q, q, q, q, 0.125)
    assert not cute_attention.sm90_bwd_supports(q, q, q, q.transpose(2, 3).contiguous().transpose(2, 3), 0.125)
    assert not cute_attention.sm90_bwd_supports(q, q, q, q.half(), 0.125)
    seen.clear()
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    run(1, 2, 1, 40, 33, 64, torch.bfloat16, True)
    assert [name for name, _ in seen][1:] == list(FACTORIES[1:]), seen
