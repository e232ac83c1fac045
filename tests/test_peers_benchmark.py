"""``benchmarks/peers.py`` on the CPU, at tiny sizes: every kcourse point gets its ratio to the best
peer at the same point, a peer that does not import is recorded as unavailable with the reason, a
wrong kernel is reported as WRONG and not timed, quack's and Liger's calls plug into the benchmark
(here through stand-ins of the two libraries: neither runs on a CPU), and the history takes the run's
JSON."""
import dataclasses
import json
import shutil
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from _util import import_benchmarks

OPS = ("softmax", "cross_entropy", "layer_norm", "swiglu", "rope", "embedding", "gemm")


@pytest.fixture(scope="module")
def modules():
    return import_benchmarks("peers", "history")


@pytest.fixture(scope="module")
def cpu_run(modules, tmp_path_factory):
    peers, _ = modules
    out = tmp_path_factory.mktemp("peers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "quack", None)  # importing quack or liger fails, installed or not
        mp.setitem(sys.modules, "liger_kernel", None)
        results = peers.main(["--out", str(out), "--device", "cpu", "--quick", "--ops", ",".join(OPS),
                              "--backends", "pytorch"])
    return out, results


def test_ratio_to_the_best_peer(modules, cpu_run):
    peers, _ = modules
    out, results = cpu_run
    assert json.loads((out / "peers.json").read_text()) == results
    points = results["points"]
    ours = [p for p in points if not p.get("peer")]
    dtypes = [torch.bfloat16, torch.float32]
    assert len(ours) == 2 * sum(len(peers.dtypes_of(op, dtypes)) * len(peers.SIZES[op]["cpu", True])
                                for op in OPS)  # directions x dtypes x sizes
    assert {p["direction"] for p in ours} == {"fwd", "fwd+bwd"}
    assert all((p["tflops"] is not None) == (p["op"] == "gemm") for p in points)  # gemm: TFLOP/s, the rest GB/s
    for p in points:
        assert p["status"] == "ok" and p["checked"], p
        assert p["best_peer"] == "torch eager" and p["ceiling_name"] == "best peer"
        assert p["ratio"] == pytest.approx(p["best_peer_ms"] / p["ms"])
    assert all(p["ratio"] == 1.0 for p in points if p.get("peer"))  # the only peer that runs here
    assert all(p["target_ratio"] == peers.TARGET for p in ours)
    summary = (out / "peers.md").read_text()
    assert "## Targets" in summary and all(f"## {op}" in summary for op in OPS)
    assert all((out / f"peers_{op}.png").exists() for op in OPS)


def test_unavailable_peers_are_recorded(cpu_run):
    _, results = cpu_run
    info = results["peers"]
    assert info["torch eager"]["available"]
    assert not info["quack"]["available"] and info["quack"]["reason"].startswith("import failed")
    assert not info["liger"]["available"] and info["liger"]["reason"].startswith("import failed")
    assert not info["torch.compile"]["available"] and "--device cpu" in info["torch.compile"]["reason"]
    ran = {p["backend"] for p in results["points"] if p.get("peer")}
    assert ran == {"torch eager"}


def test_a_wrong_kernel_is_reported_not_timed(modules, tmp_path, monkeypatch):
    peers, _ = modules
    op = peers.OPS["softmax"]
    monkeypatch.setitem(peers.OPS, "softmax", dataclasses.replace(op, run=lambda t, b: op.run(t, b) * 1.5))
    results = peers.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--ops", "softmax",
                          "--dtypes", "float32", "--backends", "pytorch", "--peers", "torch eager"])
    ours = [p for p in results["points"] if not p.get("peer")]
    assert ours and all(p["status"] == "ok" and not p["checked"] for p in ours)
    assert all(p["ms"] is None and p["ratio"] is None for p in ours)  # not timed
    assert all(p["checked"] and p["ms"] for p in results["points"] if p.get("peer"))
    assert [v["met"] for v in peers.verdicts(results["points"])] == [False]
    summary = (tmp_path / "peers.md").read_text()
    assert "WRONG" in summary and "| softmax | pytorch | missed |" in summary


def test_history_takes_the_json(modules, cpu_run, tmp_path):
    _, history = modules
    out, results = cpu_run
    rows = history.rows_from_file(out / "peers.json")
    assert len(rows) == sum(p["status"] == "ok" and p["checked"] for p in results["points"])
    assert all(r["mode"] == "peers" and r["ceiling"] == "best peer" and r["fraction"] > 0 for r in rows)
    assert all(r["unit"] == ("TFLOP/s" if r["op"] == "gemm" else "GB/s") and r["rate"] > 0 for r in rows)
    assert all(r["baseline"] == "torch eager" for r in rows if not r.get("role"))
    assert {r["role"] for r in rows if r.get("role")} == {"peer"}
    committed = history.HISTORY.read_bytes()
    file = tmp_path / history.HISTORY.name
    shutil.copy(history.HISTORY, file)
    before = len(history.load(file))
    assert history.add([out / "peers.json"], file) == len(rows)
    assert history.add([out / "peers.json"], file) == 0  # a run is added once
    assert len(history.load(file)) == before + len(rows)
    assert history.HISTORY.read_bytes() == committed
    mine = [r for r in history.load(file) if r["date"] == results["meta"]["date_utc"]]
    written = history.write_latest(mine, tmp_path / "latest")
    page = written[0].read_text()
    assert "Against the peers" in page and all(f"| {op} | fwd+bwd |" in page for op in OPS)


def test_ops_and_groups(modules, tmp_path):
    peers, _ = modules
    ops = lambda *more: peers.parse_args(["--out", str(tmp_path), "--device", "cpu", *more]).ops  # noqa: E731
    assert ops() == list(peers.ROW_OPS)
    assert ops("--ops", "more,softmax,rope") == [*peers.MORE_OPS, "softmax"]
    assert ops("--ops", "all") == list(peers.OPERATIONS)
    with pytest.raises(SystemExit):
        ops("--ops", "geglu")  # Liger has one; kcourse has no gelu(gate) * up to race it


def rotated(x, cos, sin):
    """``x`` (B, T, H, D) rotated in place by the angles of ``cos`` and ``sin`` (T, D), as Liger's kernel does."""
    peers, = import_benchmarks("peers")
    return x.copy_(peers.rope_reference((x.transpose(1, 2), cos, sin)).transpose(1, 2))


class SiLUMul(torch.autograd.Function):
    """Liger's LigerSiLUMulFunction as it behaves: its backward writes dgate and dup into gate and up."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        da, db = dc * b * sig * (1 + a * (1 - sig)), dc * F.silu(a)
        return a.copy_(da), b.copy_(db)


class Embedding(torch.autograd.Function):
    """Liger's LigerEmbeddingFunction: (embeddings, indices), the table first."""

    @staticmethod
    def forward(ctx, weight, indices):
        ctx.save_for_backward(indices)
        ctx.table = weight.shape
        return weight[indices]

    @staticmethod
    def backward(ctx, dy):
        indices, = ctx.saved_tensors
        return dy.new_zeros(ctx.table).index_add_(0, indices, dy), None


def rope_kernels(sign):
    """Liger's rope_forward (sign 1) or rope_backward (-1): q and k (B, H, T, D) copied into (B, T, H, D)
    unless laid out so, rotated there in place, returned as (B, H, T, D)."""
    def rope(q, k, cos, sin):
        q, k = (rotated(t.transpose(1, 2).contiguous(), cos, sign * sin).transpose(1, 2) for t in (q, k))
        return (q, k, cos[None], sin[None]) if sign > 0 else (q, k)
    return rope


def apply_rotary_emb(x, cos, sin):
    """quack's: x (B, T, H, D) and the first halves (T, D/2) of the tables, out of place."""
    assert cos.shape == sin.shape == (x.shape[1], x.shape[3] // 2), (x.shape, cos.shape)
    return rotated(x.clone(), torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1))


def stand_ins() -> dict:
    """Modules named as quack's and Liger's, holding what peers.py imports from them; the new ops'
    calls behave as the libraries' do (layouts, argument order, writes into their inputs), in torch."""
    liger = dict(LigerSiLUMulFunction=SiLUMul, LigerEmbeddingFunction=Embedding, rope_forward=rope_kernels(1),
                 rope_backward=rope_kernels(-1))
    for name in ("LigerCrossEntropyFunction", "LigerLayerNormFunction", "LigerRMSNormFunction", "LigerSoftmaxFunction"):
        liger[name] = None
    quack = {"quack.linear": dict(linear_func=lambda x, weight: x @ weight.T),
             "quack.rotary": dict(apply_rotary_emb=apply_rotary_emb), "quack.softmax": dict(softmax=None),
             "quack.cross_entropy": dict(cross_entropy=None),
             "quack.rmsnorm": dict(rmsnorm=None, layernorm_fwd=None, layernorm_bwd=None)}
    modules = {"liger_kernel": {}, "liger_kernel.ops": liger, "quack": {}, **quack}
    return {name: types.SimpleNamespace(**attributes) for name, attributes in modules.items()}


def test_quack_and_liger_calls_of_the_new_ops(modules, tmp_path, monkeypatch):
    """Every new op's quack and Liger call, through stand-ins: its results pass the check, and where
    the library writes into its inputs or into grad_out (Liger's swiglu and rope), the backends
    measured after it still get the shared ones unchanged."""
    peers, _ = modules
    for name, module in stand_ins().items():
        monkeypatch.setitem(sys.modules, name, module)
    for name in ("quack", "liger"):
        monkeypatch.setitem(peers.PEERS, name, dataclasses.replace(peers.PEERS[name], cuda_only=False))
    results = peers.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--ops", "more,gemm",
                          "--backends", "pytorch", "--peers", "quack,liger"])
    assert all(results["peers"][name]["available"] for name in ("quack", "liger"))
    ran = {(p["op"], p["backend"]) for p in results["points"] if p["status"] == "ok"}
    assert ran == {("swiglu", "liger"), ("rope", "liger"), ("embedding", "liger"), ("rope", "quack"),
                   ("gemm", "quack"), *((op, "pytorch") for op in (*peers.MORE_OPS, "gemm"))}
    for p in results["points"]:
        assert p["checked"] or p["status"] == "not implemented", p


def test_graphed_runs_are_their_own_rows(modules, cpu_run, tmp_path):
    # --graphed times CUDA-graph replays: its rows are mode "peers graphed", apart from the eager ones
    peers, history = modules
    with pytest.raises(SystemExit):
        peers.parse_args(["--out", str(tmp_path), "--device", "cpu", "--graphed"])
    out, results = cpu_run
    graphed = dict(results, meta=dict(results["meta"], graphed=True, date_utc="2000-01-01 00:00:00"))
    (tmp_path / "peers.json").write_text(json.dumps(graphed))
    eager, replayed = history.rows_from_file(out / "peers.json"), history.rows_from_file(tmp_path / "peers.json")
    assert len(replayed) == len(eager) > 0
    assert {r["mode"] for r in replayed} == {"peers graphed"} and {r["mode"] for r in eager} == {"peers"}
    ranges = history.peer_ranges(eager + replayed)
    assert {r["mode"] for r in ranges} == {"peers", "peers graphed"}
    assert len(ranges) == 2 * len(history.peer_ranges(eager))


def test_embedding_ids_follow_text(modules):
    # token ids as text's are: in range, a few frequent ids (the Zipf-Mandelbrot law), scattered
    peers, _ = modules
    torch.manual_seed(0)
    ids = peers.token_ids(16384, 50304, "cpu")
    assert ids.shape == (16384,) and ids.dtype == torch.int64 and 0 <= ids.min() and ids.max() < 50304
    counts = torch.bincount(ids, minlength=50304)
    assert 0.01 < counts.max() / 16384 < 0.06  # the commonest id: a few percent, as "the" or "," in English
    assert 3000 < (counts > 0).sum() < 10000  # thousands of distinct ids, far fewer than uniform draws give
    assert counts.argmax() not in (0, 1)  # the frequent ids are not the table's first rows
