"""Every cute kernel of the row-wise primitives compiles (for sm_90a where there is no GPU): softmax,
log_softmax, cross_entropy, layer_norm and rms_norm, forward and backward. As in
``test_cute_compile.py``, each case calls the cute op on CPU tensors inside
``_compile.compiling_only()``, so the op picks its kernel variant exactly as on a GPU (vector width
from alignment and strides, rows kept in registers or swept in chunks, which operands exist) and
compiles it; nothing is launched. Whether the kernels compute the right thing is the op test
files' job, on a GPU."""
import importlib

import pytest
import torch

pytest.importorskip("cutlass", reason="the CuTe DSL is not installed (pip install -e '.[cute]')")

from kcourse.blas import tuning  # noqa: E402
from kcourse.blas.cute import _compile, _reduce, _rows  # noqa: E402
from _cute import compiled_kernels, recorded_kernels, t  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (dtype, layout): every dtype contiguous (128-bit accesses), and each other layout (scalar or
# narrower accesses through dynamic strides) in one dtype, to keep the file under a minute
# On the CPU, float32 and float16 contiguous run with -m slow: each compiles bfloat16's contiguous
# kernels with another element type (and vector width), and each dtype keeps another layout
COMBOS = [(dtype, "contiguous") for dtype in DTYPES] + [
    (torch.float32, "transposed"), (torch.bfloat16, "strided"), (torch.float16, "misaligned")]
COMBO_IDS = [f"{str(d).removeprefix('torch.')}-{layout}" for d, layout in COMBOS]
COMBOS = [pytest.param(*c, marks=pytest.mark.slow) if c[1] == "contiguous" and c[0] != torch.bfloat16 else c
          for c in COMBOS]


def op_functions(op):
    module = importlib.import_module(f"kcourse.blas.cute.{op}")
    return getattr(module, op), getattr(module, f"{op}_backward")


def plans(seen, factory):
    """The ``_rows.Plan`` in the keys of ``factory``'s kernels."""
    from kcourse.blas.cute._rows import Plan

    return [k for name, key in seen if name == factory for k in key if isinstance(k, Plan)]


# ----------------------------------------------------------------------------- softmax, log_softmax

# (shape, dim): short odd rows (a row per thread), a column softmax (rows adjacent in memory: threads
# across rows), the middle dim of a 3-D tensor (2 row dims), rows of 1024 (128-bit accesses when
# aligned); the other layouts than contiguous take the first two only (compile time)
SOFTMAX_CASES = [((1000, 7), -1), ((100, 300), 0), ((4, 7, 13), 1), ((33, 1024), -1)]


@pytest.mark.parametrize("dtype, layout", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_kernels_compile(monkeypatch, op, dtype, layout):
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions(op)
    with _compile.compiling_only():
        for shape, dim in SOFTMAX_CASES if layout == "contiguous" else SOFTMAX_CASES[:2]:
            x = t(*shape, dtype=dtype, layout=layout)
            y, cache = forward(x, dim)
            assert y.shape == x.shape and cache[0] is y
            (dx,) = backward(t(*shape, dtype=dtype), cache, (True,), dim)
            assert dx.shape == x.shape
    assert {name for name, _ in seen} == {"_softmax_factory", "_softmax_backward_factory"}
    vecs = {p.vec for p in plans(seen, "_softmax_factory")}
    if layout == "contiguous":  # aligned rows of 1024 elements: 128-bit accesses; columns: threads across rows
        assert max(vecs) == 16 // x.element_size()
        assert any(p.across for p in plans(seen, "_softmax_backward_factory"))
    # the backward's CTAs over rows kept in registers have 512 threads, the others (and the forward's of
    # rows that do not fill a CTA: test_forward_rows_spread_over_512_threads) 256
    for p in plans(seen, "_softmax_backward_factory"):
        assert p.threads == (512 if p.one_pass and not p.across and p.vpt * p.vec <= _rows.VALUES else 256)
    assert {p.threads for p in plans(seen, "_softmax_factory")} == {256}


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm"])
def test_forward_rows_spread_over_512_threads(monkeypatch, op):
    # a forward row kept in registers that exactly fills a 256-thread CTA with vector accesses (8192
    # elements, 16 and 32 bits) is spread over 512 threads, half the vectors a thread (_rows.spread_row);
    # other rows keep their plans: 16384 (64 elements a thread), 5000 (the chunk not full), 3001 (scalar
    # accesses), 4096 (two rows a CTA), 20000 (swept or clustered)
    seen = compiled_kernels(monkeypatch)
    forward = op_functions(op)[0]
    with _compile.compiling_only():
        for dtype in (torch.float32, torch.bfloat16):
            for d in (8192, 16384, 5000, 3001, 4096, 20000):
                x, w = t(3, d, dtype=dtype), t(d, dtype=dtype)
                forward(x, -1) if op == "softmax" else forward(x, w, w, eps=1e-5) if op == "layer_norm" else \
                    forward(x, w, eps=1e-5)
    factory = "_softmax_factory" if op == "softmax" else "_norm_forward_factory"
    got = [(p.tpr, p.threads) for p in plans(seen, factory)]  # (threads a row, threads a CTA)
    assert got == [(512, 512), (256, 256), (256, 256), (256, 256), (128, 256), (256, 256)] * 2, got


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_long_rows_compile(monkeypatch, op, dtype):
    # rows longer than MAX_ONE_PASS: the two-sweep kernels (online logsumexp, then the output), a
    # CTA per row (test_cluster_rows_compile: a few long rows over a cluster of CTAs)
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions(op)
    with tuning.override(op, cluster=1), _compile.compiling_only():
        for x, dim in ((t(2, 20000, dtype=dtype), -1), (t(2, 20001, dtype=dtype), -1), (t(300, 5, dtype=dtype), 0)):
            y, cache = forward(x, dim)
            backward(t(*x.shape, dtype=dtype), cache, (True,), dim)
    assert {p.one_pass for p in plans(seen, "_softmax_factory")} == {False}
    assert {(p.vec, p.across) for p in plans(seen, "_softmax_backward_factory")} == {
        (1, False), (16 // x.element_size(), False), (1, True)}


def test_softmax_permuted_and_many_dims_compile(monkeypatch):
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions("softmax")
    with _compile.compiling_only():
        x = torch.zeros(3, 4, 5, 6).permute(2, 0, 3, 1)  # dense, permuted: rows addressed in place
        for dim in range(4):
            forward(x, dim)
        forward(torch.zeros(1, 37).expand(5, 37), 0)  # a broadcast row (stride 0)
        forward(torch.zeros(6, 7, 8, 9)[::2, ::2, ::2], -1)  # 3 row dims that do not merge
        forward(torch.zeros(4, 5, 6, 7, 8)[::2, ::2, ::2, ::2], -1)  # 4
        x = torch.zeros(2, 3, 4, 5, 6, 7).permute(5, 3, 1, 0, 2, 4)  # 5 row dims that do not merge: copied
        y, cache = forward(x, 2)
        backward(torch.zeros(x.shape), cache, (True,), 2)
    assert {key[2] for name, key in seen if name == "_softmax_factory"} == {1, 2, 3, 4}  # merged row dims
    assert backward(torch.zeros(3, 8), (torch.zeros(3, 8),), (False,), 1) == (None,)


# ----------------------------------------------------------------------------- cross_entropy

CE_SHAPES = [(1, 1), (7, 13), (33, 1000), (4, 40000)]  # the last: a vocabulary swept in chunks


@pytest.mark.parametrize("dtype, layout", COMBOS, ids=COMBO_IDS)
def test_cross_entropy_kernels_compile(monkeypatch, dtype, layout):
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions("cross_entropy")
    with _compile.compiling_only():
        for N, V in CE_SHAPES if layout == "contiguous" else CE_SHAPES[1:3]:
            logits = t(N, V, dtype=dtype, layout=layout)
            targets, reductions = [torch.zeros(N, dtype=torch.int64)], ["mean"]
            if (N, V) == (7, 13):  # int32 class indices (strided) and every reduction
                targets.append(torch.zeros(2 * N, dtype=torch.int32)[::2])
                reductions += ["sum", "none"]
            for target in targets:
                for reduction in reductions:
                    loss, cache = forward(logits, target, ignore_index=-100, reduction=reduction)
                    assert loss.shape == ((N,) if reduction == "none" else ())
                    assert cache[2].dtype == torch.float32 and cache[2].shape == (N,)
                    dx, none = backward(torch.zeros(loss.shape, dtype=dtype), cache, (True, False),
                                        ignore_index=-100, reduction=reduction)
                    assert dx.shape == logits.shape and none is None
    assert {name for name, _ in seen} == {"_cross_entropy_factory", "_valid_sum_factory",
                                          "_cross_entropy_backward_factory"}
    assert len(plans(seen, "_cross_entropy_factory")) > 0


def test_cross_entropy_huge_vocabulary_compiles(monkeypatch):
    # V = 256000: the row is never materialized; chunks of 64 elements per thread, 128-bit loads;
    # a CTA per row (test_cluster_rows_compile: a cluster of CTAs per row)
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions("cross_entropy")
    with tuning.override("cross_entropy", cluster=1), _compile.compiling_only():
        logits, target = t(2, 256000, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int64)
        loss, cache = forward(logits, target, ignore_index=-100, reduction="mean")
        backward(torch.zeros((), dtype=torch.bfloat16), cache, (True, False), ignore_index=-100, reduction="mean")
        forward(t(0, 5, dtype=torch.float32), torch.zeros(0, dtype=torch.int64), ignore_index=-100, reduction="mean")
    (p,) = set(plans(seen, "_cross_entropy_factory"))
    assert (p.vec, p.tpr, p.one_pass) == (8, 256, False) and p.vec * p.vpt == 64


# ----------------------------------------------------------------------------- a cluster of CTAs per row

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cross_entropy"])
def test_cluster_rows_compile(monkeypatch, op, dtype):
    # a few long rows, each spread over a cluster of CTAs (split_rows): shares kept in registers
    # (3 x 50000), swept in chunks (2 x 262144, 2 x 300000), scalar accesses (2 x 20001)
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions(op)
    with _compile.compiling_only():
        for N, V in [(3, 50000), (2, 262144), (2, 300000), (2, 20001)]:
            x = t(N, V, dtype=dtype)
            if op == "cross_entropy":
                loss, cache = forward(x, torch.zeros(N, dtype=torch.int64), ignore_index=-100, reduction="none")
                backward(t(N, dtype=dtype), cache, (True, False), ignore_index=-100, reduction="none")
            else:
                y, cache = forward(x, -1)
                backward(t(N, V, dtype=dtype), cache, (True,), -1)
    factory = "_cross_entropy_factory" if op == "cross_entropy" else "_softmax_factory"
    forward_plans = plans(seen, factory)
    assert {p.one_pass for p in forward_plans} == {True, False} and {p.vec for p in forward_plans} > {1}
    most = _rows.CLUSTER_MAX_SM90 if op != "cross_entropy" else _rows.CLUSTER_MAX
    assert all(1 < p.cluster <= most and p.tpr == p.threads == _rows.THREADS for p in forward_plans)
    assert all(p.cluster > 1 for p in plans(seen, factory.replace("_factory", "_backward_factory")))


def test_clusters_of_16_and_staged_shares_where_measured(monkeypatch):
    # Hopper's clusters of 16 CTAs a row (split_rows's ``most``) where experiments/cluster_16.py measured
    # them faster (H200): float32 softmax forwards and every softmax backward whose rows need more than 8
    # shares; the 16-bit forwards' shares staged in shared memory (``stage``), over up to 16; elsewhere at
    # most 8. The plans alone, nothing compiled.
    seen = recorded_kernels(monkeypatch)

    def clusters(call):
        """{factory: (cluster, one_pass, threads, staged)} of the kernels ``call`` launches."""
        seen.clear()
        with _compile.compiling_only():
            call()
        return {name: (p.cluster, p.one_pass, p.threads, p.staged) for name, key in seen for p in key
                if isinstance(p, _rows.Plan)}

    softmax, softmax_backward = op_functions("softmax")

    def softmax_both(dtype):
        y, cache = softmax(torch.zeros(4, 262144, dtype=dtype), -1)
        softmax_backward(torch.zeros(4, 262144, dtype=dtype), cache, (True,), -1)

    # forward: float32 in 16 shares of 16384, each kept in registers (read once), bf16 in 16 staged ones;
    # backward: 16 shares kept in registers
    backward = (16, True, _rows.THREADS, False)
    assert clusters(lambda: softmax_both(torch.float32)) == {"_softmax_factory": (16, True, _rows.THREADS, False),
                                                             "_softmax_backward_factory": backward}
    assert clusters(lambda: softmax_both(torch.bfloat16)) == {"_softmax_factory": (16, True, _rows.THREADS, True),
                                                              "_softmax_backward_factory": backward}
    rms_norm = op_functions("rms_norm")[0]

    def norm(rows, dtype, cols=262144):
        return clusters(lambda: rms_norm(torch.zeros(rows, cols, dtype=dtype), None, eps=1e-6))["_norm_forward_factory"]

    staged = (16, True, _rows.THREADS, True)
    assert norm(64, torch.bfloat16) == norm(_reduce.DEFAULT_SMS + 1, torch.bfloat16) == staged  # 16-bit: staged
    assert norm(4096, torch.bfloat16, 32768) == (2, True, _rows.THREADS, True)  # every row past 16384
    assert norm(64, torch.float32) == (8, True, _rows.SHARE_THREADS, False)  # float32: 8 wide CTAs keep their shares
    with tuning.override("rms_norm", staged=False):  # unstaged 16-bit rows: 16 kept shares for a few rows only
        assert norm(64, torch.bfloat16) == (16, True, _rows.THREADS, False)
        assert norm(_reduce.DEFAULT_SMS + 1, torch.bfloat16)[:2] == (1, False)  # else a CTA sweeps a row
    # float32 layer_norm of 8192 < D <= 131072: a CTA of 256 threads per 8192 columns (the last one ragged),
    # up to 16; past that, 8 wide CTAs
    layer_norm = op_functions("layer_norm")[0]
    for cols, ctas in ((8200, 2), (16384, 2), (40000, 5), (65536, 8), (98312, 13), (131072, 16)):
        x = torch.zeros(4096, cols)
        got = clusters(lambda: layer_norm(x, None, None, eps=1e-5))["_norm_forward_factory"]
        assert got == (ctas, True, _rows.THREADS, False), (cols, got)
    x = torch.zeros(1024, 262144)
    assert clusters(lambda: layer_norm(x, None, None, eps=1e-5))["_norm_forward_factory"] == \
        (8, True, _rows.SHARE_THREADS, False)
    x = torch.zeros(4096, 8192)  # one CTA keeps the row
    assert clusters(lambda: layer_norm(x, None, None, eps=1e-5))["_norm_forward_factory"][0] == 1
    x = torch.zeros(8, 32768)  # few rows past 16384: split_rows's fill (132 SMs // 8 rows, at most 8) if more
    assert clusters(lambda: layer_norm(x, None, None, eps=1e-5))["_norm_forward_factory"] == \
        (8, True, _rows.THREADS, False)
    x = torch.zeros(8, 16384)  # ... and up to 16384, where one CTA kept the row, 2
    assert clusters(lambda: layer_norm(x, None, None, eps=1e-5))["_norm_forward_factory"][0] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_norm_backward_over_a_cluster_where_it_applies(monkeypatch, dtype):
    # the norm backward with dx: rows of 8192 < D <= 16 x 8192 over ceil(D / 8192) CTAs of one 8192-column
    # chunk each (vector accesses); longer rows, scalar accesses, no dx, or Launch.backward_cluster=False:
    # swept by one CTA a row. The plans alone, nothing compiled.
    seen = recorded_kernels(monkeypatch)
    rms_norm, rms_norm_backward = op_functions("rms_norm")

    def backward(d, needs=(True, True), layout="contiguous", rows=3):
        seen.clear()
        with _compile.compiling_only():
            y, cache = rms_norm(t(rows, d, dtype=dtype, layout=layout), t(d, dtype=dtype), eps=1e-6)
            rms_norm_backward(t(rows, d, dtype=dtype), cache, needs, eps=1e-6)
        (p,) = {p for name, key in seen if name == "_norm_backward_factory" for p in key if isinstance(p, _rows.Plan)}
        return p.cluster, p.one_pass, p.chunk, p.threads

    assert backward(8192)[:2] == (1, True)  # kept on chip by one CTA
    assert backward(8200) == (2, True, 8192, _rows.THREADS)  # the second CTA takes 8 columns
    assert backward(131072) == (16, True, 8192, _rows.THREADS)  # Hopper's largest cluster
    assert backward(131080)[:2] == (1, False)  # more than 16 chunks: swept
    assert backward(20000, needs=(False, True))[:2] == (1, False)  # no dx: no row sums to exchange
    assert backward(20001)[:2] == (1, False)  # scalar accesses
    with tuning.override("rms_norm", backward_cluster=False):
        assert backward(20000)[:2] == (1, False)


def test_cross_entropy_backward_splits_many_long_rows(monkeypatch):
    # rows enough for every SM: the forward keeps a CTA per row (swept in chunks), the backward
    # shares each row of 20000 among 3 CTAs of one chunk each (cross_entropy.BACKWARD_SHARE)
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions("cross_entropy")
    with _compile.compiling_only():
        loss, cache = forward(t(300, 20000, dtype=torch.bfloat16), torch.zeros(300, dtype=torch.int64),
                              ignore_index=-100, reduction="sum")
        backward(torch.zeros((), dtype=torch.bfloat16), cache, (True, False), ignore_index=-100, reduction="sum")
    (fwd,), (bwd,) = set(plans(seen, "_cross_entropy_factory")), set(plans(seen, "_cross_entropy_backward_factory"))
    assert (fwd.cluster, fwd.one_pass) == (1, False) and (bwd.cluster, bwd.one_pass, bwd.chunk) == (3, True, 8192)


# ----------------------------------------------------------------------------- layer_norm, rms_norm

# rows kept on chip; 12000: a backward over a cluster of 2 CTAs (contiguous: vector accesses; else chunked);
# 20000: a forward over a cluster of 5 CTAs (two rows: SMs to fill), a backward over 3; 262144: in float32 a
# forward over a cluster of 8 CTAs of 512 threads, in 16 bits 16 staged shares, a chunked backward; 300000
# swept in chunks by one CTA in every dtype. Other layouts than contiguous: the first and the fourth only
# (compile time)
NORM_SHAPES = [(7, 33), (3, 5, 1000), (2, 12000), (2, 20000), (2, 262144), (2, 300000)]


@pytest.mark.parametrize("dtype, layout", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_kernels_compile(monkeypatch, op, dtype, layout):
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions(op)
    with _compile.compiling_only():
        for shape in NORM_SHAPES if layout == "contiguous" else NORM_SHAPES[:4:3]:
            x = t(*shape, dtype=dtype, layout=layout)
            d = shape[-1]
            w, b = t(d, dtype=dtype), t(d, dtype=dtype)
            if op == "layer_norm":
                y, cache = forward(x, w, b, eps=1e-5)
                assert cache[2].dtype == cache[3].dtype == torch.float32
            else:
                y, cache = forward(x, w, eps=1e-6)
                assert cache[2].dtype == torch.float32
            assert y.shape == x.shape and y.is_contiguous()
            grads = backward(t(*shape, dtype=dtype), cache, (True,) * (3 if op == "layer_norm" else 2), eps=1e-5)
            assert grads[0].shape == x.shape and all(g.shape == (d,) for g in grads[1:])
    names = {name for name, _ in seen}
    assert names == {"_norm_forward_factory", "_norm_backward_factory", "_column_sum_factory"}
    # rows kept on chip (one pass, by one CTA or a cluster), and swept; misaligned (4-byte accesses) has no
    # row the cluster backward leaves to the sweep
    assert {p.one_pass for p in plans(seen, "_norm_backward_factory")} == {True} | ({False} if layout != "misaligned"
                                                                                  else set())
    forward_plans = set(plans(seen, "_norm_forward_factory"))
    clustered = {(p.cluster, p.threads) for p in forward_plans if p.cluster > 1}
    assert all(p.one_pass for p in forward_plans if p.cluster > 1)
    if layout == "contiguous":
        long = {(8, _rows.SHARE_THREADS)} if dtype == torch.float32 else {(16, _rows.THREADS)}
        assert clustered == {(5, _rows.THREADS)} | long
        assert any(not p.one_pass and p.cluster == 1 for p in forward_plans)
        backward_plans = plans(seen, "_norm_backward_factory")
        assert {p.cluster for p in backward_plans if p.one_pass and p.cluster > 1} == {2, 3}
    else:
        assert clustered == {(5, _rows.THREADS)}


# (op, dtype, D, threads a CTA, prefetch) of the backward for rows kept on chip (_norm.backward_launch)
LAUNCHES = [("layer_norm", torch.bfloat16, 8192, 256, True),  # a row across 256 threads, 16-byte accesses
            ("layer_norm", torch.float16, 4098, 256, True),  # 4-byte accesses (the narrowest cp.async)
            ("layer_norm", torch.bfloat16, 3001, 256, False),  # 2-byte accesses: loaded, not staged
            ("layer_norm", torch.bfloat16, 4096, 512, False),  # a row across 128 threads
            ("layer_norm", torch.float32, 8192, 512, False), ("rms_norm", torch.bfloat16, 8192, 512, False)]


@pytest.mark.parametrize("op, dtype, d, threads, prefetch", LAUNCHES)
def test_norm_backward_launch_compiles(monkeypatch, op, dtype, d, threads, prefetch):
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions(op)
    x, w = t(5, d, dtype=dtype), t(d, dtype=dtype)
    with _compile.compiling_only():
        cache = forward(x, w, w, eps=1e-5)[1] if op == "layer_norm" else forward(x, w, eps=1e-5)[1]
        backward(t(5, d, dtype=dtype), cache, (True,) * (3 if op == "layer_norm" else 2), eps=1e-5)
    (key,) = [key for name, key in seen if name == "_norm_backward_factory"]
    plan_ = key[2]
    assert plan_.one_pass and plan_.threads == threads and plan_.rows == threads // plan_.tpr
    assert key[-1] is prefetch


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_optional_operands_compile(monkeypatch, op):
    # a missing weight or bias, and every subset of the gradients, compile into their own kernels
    seen = compiled_kernels(monkeypatch)
    forward, backward = op_functions(op)
    x, dy, w = t(7, 33, dtype=torch.float32), t(7, 33, dtype=torch.float32), t(33, dtype=torch.float32)
    with _compile.compiling_only():
        if op == "layer_norm":
            for weight, bias in [(w, None), (None, w), (None, None)]:
                y, cache = forward(x, weight, bias, eps=1e-5)
                backward(dy, cache, (True, weight is not None, bias is not None), eps=1e-5)
            y, cache = forward(x, w, w, eps=1e-5)
            for needs in [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]:
                grads = backward(dy, cache, needs, eps=1e-5)
                assert [g is not None for g in grads] == list(needs)
            y, cache = forward(t(0, 33, dtype=torch.float32), w, w, eps=1e-5)  # no rows: zero gradients
            assert all(torch.equal(g, torch.zeros(33)) for g in backward(t(0, 33, dtype=torch.float32), cache,
                                                                        (True, True, True), eps=1e-5)[1:])
        else:
            y, cache = forward(x, None, eps=1e-6)
            backward(dy, cache, (True, False), eps=1e-6)
            y, cache = forward(x, w, eps=1e-6)
            for needs in [(True, False), (False, True)]:
                grads = backward(dy, cache, needs, eps=1e-6)
                assert len(grads) == 2 and [g is not None for g in grads] == list(needs)
    flags = {key[3:] for name, key in seen if name == "_norm_backward_factory"}
    assert len(flags) >= 3
