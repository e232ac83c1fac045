"""``kcourse.blas.tuning``: an override reaches the compile keys of the op it names (and only that
op), the planners key on the table (a plan made under an override is not reused after it, nor the
shipped plan under it), overrides nest and end with their block, and unknown ops or fields are refused.
Nothing compiles here: ``_compile.compile_only`` is replaced by a recorder (the compile tests check
that the keys build)."""
import pytest
import torch

from kcourse.blas import tuning

pytest.importorskip("cutlass", reason="the CuTe DSL is not installed (pip install -e '.[cute]')")

from kcourse.blas.cute import _compile, _rows, _softmax  # noqa: E402
from kcourse.blas.cute import attention, layer_norm, log_softmax, softmax  # noqa: E402
from _cute import recorded_kernels  # noqa: E402


@pytest.fixture
def keys(monkeypatch):
    """The (factory name, key) of every launch, recorded instead of compiled."""
    seen = recorded_kernels(monkeypatch)
    with _compile.compiling_only():
        yield seen


def row_plans(seen, factory):
    return [key[-1] for name, key in seen if name == factory]


def test_softmax_override_reaches_the_plans_and_ends(keys):
    x = torch.zeros(4, 8192, dtype=torch.bfloat16)

    def run(op=softmax.softmax, backward=softmax.softmax_backward):
        keys.clear()
        y, cache = op(x, -1)
        backward(x, cache, (True,), -1)
        return row_plans(keys, "_softmax_factory") + row_plans(keys, "_softmax_backward_factory")

    shipped = run()
    assert [(p.cluster, p.threads) for p in shipped] == [(1, 512), (1, 512)]
    with tuning.override("softmax", cluster=2) as table:
        assert table == tuning.launch("softmax") == _softmax.Launch(cluster=2)
        assert [p.cluster for p in run()] == [2, 2]
        with tuning.override("softmax", row_threads=256, backward_threads=256):  # on top of cluster=2
            assert [p.cluster for p in run()] == [2, 2]
        assert [p.cluster for p in run(log_softmax.log_softmax, log_softmax.log_softmax_backward)] == [1, 1]
    with tuning.override("softmax", row_threads=256, backward_threads=256):
        assert [(p.cluster, p.threads) for p in run()] == [(1, 256), (1, 256)]
    assert run() == shipped and tuning.launch("softmax") is _softmax.LAUNCH


def test_norm_backward_override(keys):
    x, w = torch.zeros(4, 2048, dtype=torch.float32), torch.zeros(2048, dtype=torch.float32)

    def backward_key():
        keys.clear()
        y, cache = layer_norm.layer_norm(x, w, w, 1e-5)
        layer_norm.layer_norm_backward(x, cache, (True, True, True), 1e-5)
        (key,) = [key for name, key in keys if name == "_norm_backward_factory"]
        return key[2].threads, key[-1]  # threads a CTA, prefetch

    assert backward_key() == (512, False)  # backward_launch: 512 threads, no prefetch in 32 bits
    with tuning.override("layer_norm", backward_threads=256, backward_prefetch=True):
        assert backward_key() == (256, True)
    with tuning.override("rms_norm", backward_threads=256):
        assert backward_key() == (512, False)


def test_attention_override(keys):
    q = torch.zeros(1, 2, 1000, 128, dtype=torch.bfloat16)

    def hopper_keys():
        keys.clear()
        out, cache = attention.attention(q, q, q, None, True, 0.1)
        attention.attention_backward(q, cache, (True, True, True), True, 0.1)
        return [key for name, key in keys if name.endswith("Sm90")]

    forward, backward = hopper_keys()
    assert forward[6] and backward[-1]  # the config at T = 1000: ping-pong, dK and dV by TMA stores
    with tuning.override("attention", pingpong=False, backward_tma_store=False):
        assert hopper_keys() == [forward[:6] + (False,) + forward[7:], backward[:-1] + (False,)]
    assert hopper_keys() == [forward, backward]


def test_unknown_op_or_field():
    with pytest.raises(KeyError, match="no launch table for 'gemm'"):
        tuning.launch("gemm")
    with pytest.raises(TypeError, match="clusters"):
        with tuning.override("softmax", clusters=2):
            pass
    assert tuning.launch("softmax") is _softmax.LAUNCH
