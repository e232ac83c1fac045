"""The cute layer_norm and rms_norm backward of rows of 8192 < D <= 16 x 8192 columns over a cluster of
CTAs (``_norm._backward_plan``: each CTA keeps its chunk of x and dy in registers, the row sums exchanged
row after row through two stages of distributed-shared-memory slots, ``_rows.cluster_allreduce``'s
``use``), against the python reference: dx, dweight and dbias, every dtype; more rows than clusters (a
CTA's exchanges cycle through both stages and both mbarrier phases), a ragged last chunk, a chunk of a
few columns; the clustered plan is checked to be the one taken. On a GPU with clusters (sm_90+)."""
import pytest
import torch

from kcourse import blas
from kcourse.blas import tuning
from _util import DTYPES, assert_close, randn, require_cute_clusters

pytestmark = pytest.mark.gpu

# (rows, D): 3 CTAs a row, the last of 8 columns, 300 rows over 88 clusters; 8 CTAs, 64 rows over 33;
# 16 CTAs (Hopper's largest cluster); 3 CTAs, ragged, fewer rows than clusters; 700 rows over 88
SHAPES = [(300, 16392), (64, 65536), (5, 131072), (33, 20000), (700, 24576)]


@pytest.fixture(autouse=True)
def cute_with_clusters():
    require_cute_clusters()


def gradients(op, backend, x, w, b, dy):
    leaves = [t.detach().requires_grad_() for t in ((x, w, b) if op == "layer_norm" else (x, w))]
    y = blas.layer_norm(*leaves, eps=1e-5, backend=backend) if op == "layer_norm" else \
        blas.rms_norm(*leaves, eps=1e-6, backend=backend)
    return torch.autograd.grad(y, leaves, dy)


@pytest.mark.parametrize("shape", SHAPES)
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
    for a, e in zip(got, gradients(op, "python", x, w, b, dy)):
        assert_close(a, e, k=40)
    assert {(p.cluster, p.one_pass) for name, key in seen for p in key
            if isinstance(p, _rows.Plan) and name == "_norm_backward_factory"} == {(1, False)}
