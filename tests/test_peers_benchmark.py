"""``benchmarks/peers.py`` on the CPU, at tiny sizes: every kcourse point gets its ratio to the best
peer at the same point, a peer that does not import is recorded as unavailable with the reason, a
wrong kernel is reported as WRONG and not timed, and the history takes the run's JSON."""
import dataclasses
import json
import shutil
import sys

import pytest

from _util import import_benchmarks

OPS = ("softmax", "cross_entropy", "layer_norm")


@pytest.fixture(scope="module")
def modules():
    return import_benchmarks("peers", "history")


@pytest.fixture(scope="module")
def cpu_run(modules, tmp_path_factory):
    peers, _ = modules
    out = tmp_path_factory.mktemp("peers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "quack", None)  # importing quack fails, installed or not
        results = peers.main(["--out", str(out), "--device", "cpu", "--quick", "--ops", ",".join(OPS),
                              "--backends", "pytorch"])
    return out, results


def test_ratio_to_the_best_peer(modules, cpu_run):
    peers, _ = modules
    out, results = cpu_run
    assert json.loads((out / "peers.json").read_text()) == results
    points = results["points"]
    ours = [p for p in points if not p.get("peer")]
    shapes = len(peers.COLUMNS["cpu", True])
    assert len(ours) == len(OPS) * 2 * shapes * 2  # dtypes x row lengths x directions
    assert {p["direction"] for p in ours} == {"fwd", "fwd+bwd"}
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
    assert not info["liger"]["available"]  # not installed here, or its kernels need CUDA
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
    assert all(r["baseline"] == "torch eager" for r in rows if not r.get("role"))
    assert {r["role"] for r in rows if r.get("role")} == {"peer"}
    committed = history.HISTORY.read_bytes()
    file = tmp_path / "history.jsonl"
    shutil.copy(history.HISTORY, file)
    before = len(history.load(file))
    assert history.add([out / "peers.json"], file) == len(rows)
    assert history.add([out / "peers.json"], file) == 0  # a run is added once
    assert len(history.load(file)) == before + len(rows)
    assert history.HISTORY.read_bytes() == committed
    mine = [r for r in history.load(file) if r["date"] == results["meta"]["date_utc"]]
    written = history.write_latest(mine, tmp_path / "latest")
    assert "Against the peers" in written[0].read_text()
