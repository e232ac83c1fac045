"""The cute row kernels over a cluster of CTAs on the GPU (sm_90+), against the python reference.

- Forwards whose shares go through shared memory (``_rows.Plan.staged``: softmax, log_softmax,
  layer_norm, rms_norm over up to 16 CTAs, each copying its share by cp.async and reading it from
  there), forced on with ``tuning.override(op, staged=True)``: forward and gradients, every dtype,
  ragged last shares, 4-byte vectors, rows of non-finite values.
- The layer_norm and rms_norm backward of rows of 8192 < D <= 16 x 8192 columns (``_norm._backward_plan``:
  each CTA keeps its chunk of x and dy in registers, the row sums exchanged row after row through two
  stages of distributed-shared-memory slots, ``_rows.cluster_allreduce``'s ``use``): dx, dweight and
  dbias, every dtype; more rows than clusters (a CTA's exchanges cycle through both stages and both
  mbarrier phases), a ragged last chunk, a chunk of a few columns.

Each test checks that the plan it means to test is the one taken."""
import pytest
import torch

from kcourse import blas
from kcourse.blas import tuning
from _util import DTYPES, TOL, assert_close, randn, require_cute_clusters

pytestmark = pytest.mark.gpu

# 16 shares of 16384 (262144); ragged last shares (50000 over 7 CTAs of 8192, 200008 over 13 of 16384,
# 16392 over 2, the second of 8 columns); 4-byte vectors in 16 bits (40002: 2-element accesses);
# more rows than SMs (200 x 20008)
SHAPES = [(2, 262144), (3, 50000), (1, 200008), (4, 16392), (2, 40002), (200, 20008)]
OPS = ["softmax", "log_softmax", "layer_norm", "rms_norm"]


@pytest.fixture(autouse=True)
def cute_with_clusters():
    require_cute_clusters()


def call(op, backend, x, w, b):
    if op == "rms_norm":
        return blas.rms_norm(x, w, eps=1e-6, backend=backend)
    if op == "layer_norm":
        return blas.layer_norm(x, w, b, eps=1e-5, backend=backend)
    return getattr(blas, op)(x, -1, backend=backend)


def results(op, backend, x, w, b, dy):
    """The output and the gradients of x, weight and bias (the norms) pulled back from dy."""
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    y = call(op, backend, *leaves)
    used = leaves if op == "layer_norm" else leaves[:2] if op == "rms_norm" else leaves[:1]
    return [y.detach(), *torch.autograd.grad(y, used, dy)]


def staged_plans(seen):
    from kcourse.blas.cute import _rows

    return {p.staged for name, key in seen for p in key
            if isinstance(p, _rows.Plan) and name in ("_softmax_factory", "_norm_forward_factory")}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_staged_shares_match_the_reference(op, dtype, shape, monkeypatch):
    from _cute import compiled_kernels

    seen = compiled_kernels(monkeypatch)
    n = shape[-1]
    x, dy = randn(*shape, dtype=dtype).mul_(3).add_(1), randn(*shape, dtype=dtype)
    x[:, 5] = 20.0  # a large value in the first share: the shares' maxima and means differ
    w, b = randn(n, dtype=dtype), randn(n, dtype=dtype)
    with tuning.override(op, staged=True):
        got = results(op, "cute", x, w, b, dy)
    expected = results(op, "python", x, w, b, dy)
    for i, (a, e) in enumerate(zip(got, expected)):  # y; dx (softmax's through a sum over the row); dw, db
        assert_close(a, e, k=shape[0] if i > 1 else n if i == 1 and "softmax" in op else 1)
    assert staged_plans(seen) == {True}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_staged_shares_of_non_finite_rows(op, dtype):
    # a row of -inf; +inf in the last share of a row; NaN in the first share of another; a finite row
    x = randn(4, 50000, dtype=dtype)
    x[0] = -torch.inf
    x[1, 49990] = torch.inf
    x[2, 3] = torch.nan
    w, b = randn(50000, dtype=dtype), randn(50000, dtype=dtype)
    with tuning.override(op, staged=True):
        got = call(op, "cute", x, w, b)
    expected = call(op, "python", x, w, b)
    torch.testing.assert_close(got, expected, rtol=TOL[dtype][0], atol=TOL[dtype][1], equal_nan=True)


# float32 layer_norm of 8192 < D <= 131072 (its rule: a CTA of 256 threads per 8192 columns): the last
# CTA's 8 columns; 2 CTAs; 5, the last ragged, more rows than clusters; 8; 13, ragged; 16 (Hopper's most)
F32_LAYER_NORM_SHAPES = [(3, 8200), (5, 16384), (300, 40000), (2, 65536), (3, 98312), (140, 131072)]


@pytest.mark.parametrize("shape", F32_LAYER_NORM_SHAPES)
def test_float32_layer_norm_over_clusters_of_8192_columns(shape, monkeypatch):
    from _cute import compiled_kernels
    from kcourse.blas.cute import _rows

    seen = compiled_kernels(monkeypatch)
    n = shape[-1]
    x, dy = randn(*shape).mul_(3).add_(1), randn(*shape)
    x[:, 5] = 20.0  # a large value in the first CTA's share: the shares' means differ
    w, b = randn(n), randn(n)
    got = results("layer_norm", "cute", x, w, b, dy)
    expected = results("layer_norm", "python", x, w, b, dy)
    for i, (a, e) in enumerate(zip(got, expected)):  # y, dx, dw, db
        assert_close(a, e, k=shape[0] if i > 1 else 1)
    plans = {(p.cluster, p.threads) for name, key in seen for p in key
             if isinstance(p, _rows.Plan) and name == "_norm_forward_factory"}
    assert plans == {(-(-n // 8192), _rows.THREADS)}


# (rows, D): 3 CTAs a row, the last of 8 columns, 300 rows over 88 clusters; 8 CTAs, 64 rows over 33;
# 16 CTAs (Hopper's largest cluster); 3 CTAs, ragged, fewer rows than clusters; 700 rows over 88
BACKWARD_SHAPES = [(300, 16392), (64, 65536), (5, 131072), (33, 20000), (700, 24576)]


def gradients(op, backend, x, w, b, dy):
    """The gradients of ``results``: of x, weight and (layer_norm) bias."""
    return results(op, backend, x, w, b, dy)[1:]


@pytest.mark.parametrize("shape", BACKWARD_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_clustered_backward_matches_the_reference(op, dtype, shape, monkeypatch):
    from kcourse.blas.cute import _rows
    from _cute import compiled_kernels

    seen = compiled_kernels(monkeypatch)
    x, dy = randn(*shape, dtype=dtype).mul_(2).add_(1), randn(*shape, dtype=dtype)
    w, b = randn(shape[1], dtype=dtype), randn(shape[1], dtype=dtype)
    got = gradients(op, "cute", x, w, b, dy)
    expected = gradients(op, "python", x, w, b, dy)
    for i, (a, e) in enumerate(zip(got, expected)):  # dx; dweight, dbias: sums over the rows
        assert_close(a, e, k=shape[0] if i else 1)
    clusters = {p.cluster for name, key in seen for p in key
                if isinstance(p, _rows.Plan) and name == "_norm_backward_factory"}
    assert clusters == {-(-shape[1] // 8192)}


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_backward_cluster_off_sweeps_the_row(op, monkeypatch):
    from kcourse.blas.cute import _rows
    from _cute import compiled_kernels

    seen = compiled_kernels(monkeypatch)
    x, dy, w, b = randn(40, 20000), randn(40, 20000), randn(20000), randn(20000)
    with tuning.override(op, backward_cluster=False):
        got = gradients(op, "cute", x, w, b, dy)
    for i, (a, e) in enumerate(zip(got, gradients(op, "python", x, w, b, dy))):
        assert_close(a, e, k=40 if i else 1)  # dweight, dbias: sums over the 40 rows
    assert {(p.cluster, p.one_pass) for name, key in seen for p in key
            if isinstance(p, _rows.Plan) and name == "_norm_backward_factory"} == {(1, False)}
