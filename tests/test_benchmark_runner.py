"""The benchmark runner's bookkeeping (``benchmarks/run.py``) and its history (``benchmarks/history.py``),
on the CPU: with interleaved rounds every fraction is still the point's rate over its ceiling, and the
speed-up over torch eager its time over eager's; a run's JSON becomes history rows once; the README's
performance table is what the history says."""
import json
from pathlib import Path

import pytest

from _util import import_benchmarks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return import_benchmarks("run", "history")


@pytest.fixture(scope="module")
def cpu_run(bench, tmp_path_factory):
    runner, _ = bench
    out = tmp_path_factory.mktemp("bench")
    return out, runner.main(["--out", str(out), "--device", "cpu", "--quick", "--ops", "copy,gemm,softmax",
                             "--backends", "pytorch", "--rounds", "3"])


@pytest.mark.parametrize("rounds", [1, 3])
def test_rounds_keep_fractions_consistent(bench, tmp_path, rounds):
    runner, _ = bench
    results = runner.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--ops", "copy,gemm,softmax",
                           "--backends", "pytorch", "--rounds", str(rounds)])
    assert results["meta"]["rounds"] == rounds
    points = results["points"]
    assert points and all(p["status"] == "ok" and p["checked"] for p in points), points
    copy_gbs = results["meta"]["copy_gbs"]
    for p in points:
        same = [q for q in points if (q["op"], q["dtype"], q["size"], q["direction"]) ==
                (p["op"], p["dtype"], p["size"], p["direction"])]
        ref = next((q for q in same if q.get("ceiling_point") or q.get("eager_point")), None)
        if p["op"] == "gemm":  # a FLOP/s op: the fraction of torch.matmul's rate in the same run
            assert p["fraction"] == pytest.approx(p["tflops"] / ref["tflops"])
        else:  # memory bound: the fraction of copy bandwidth
            assert p["fraction"] == pytest.approx(p["gbs"] / copy_gbs)
        if p["op"] == "softmax" and p is not ref:  # and the speed-up over torch eager
            assert p["speedup_vs_eager"] == pytest.approx(ref["ms"] / p["ms"])


def test_history_rows_of_a_run(bench, cpu_run, tmp_path):
    _, history = bench
    out, results = cpu_run
    rows = history.rows_from_file(out / "results.json")
    fields = {"op", "backend", "shape", "dtype", "direction", "ms", "device", "date", "versions"}
    assert rows and all(fields <= set(r) for r in rows)
    assert len(rows) == sum(p["status"] == "ok" and p["checked"] for p in results["points"])
    softmax = [r for r in rows if r["op"] == "softmax" and not r.get("role")]
    assert softmax and all(r["baseline"] == "F.softmax" and r["ratio"] > 0 for r in softmax)
    file = tmp_path / "history.jsonl"
    assert history.add([out / "results.json"], file) == len(rows)
    assert history.add([out / "results.json"], file) == 0  # a run is added once
    assert history.load(file) == sorted(rows, key=lambda r: r["date"])  # each point with its run's versions
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    runs = [line for line in lines if isinstance(line, dict)]
    assert [line["run"]["date"] for line in runs] == [rows[0]["date"]]  # once per run
    assert all(isinstance(line, list) and len(line) == len(runs[0]["columns"]) for line in lines[1:])
    written = history.write_latest(history.load(file), tmp_path / "latest")
    assert (tmp_path / "latest" / "cpu.md") in written


def test_history_file_parses(bench):
    _, history = bench
    lines = history.read_lines()  # the committed history, decompressed
    assert "run" in json.loads(lines[0])  # every point follows the run line it belongs to
    for number, line in enumerate(lines, 1):
        row = json.loads(line)
        if isinstance(row, dict):
            assert {"device", "date", "versions"} <= set(row["run"]), number
            names = set(row["same"]) | set(row["columns"])
            assert not set(row["same"]) & set(row["columns"]), number
            assert {"op", "backend", "shape", "dtype", "direction"} <= names, number
            width = len(row["columns"])
        else:
            assert isinstance(row, list) and len(row) == width, number
    rows = history.load()
    for row in rows:
        measured = "first_step_s" if row.get("mode") == "cold start" else "ms"  # (a first step: no step time)
        assert {"op", "backend", "shape", "dtype", "direction", measured} <= set(row)
    assert all(r["device"] and r["date"] for r in rows)


def test_readme_performance_table_is_current(bench):
    _, history = bench
    assert history.readme_section() == history.readme_table(history.load()), \
        "README.md's performance table is stale: run `python -m benchmarks.history readme`"


def test_index_check_rows(bench, tmp_path):
    """benchmarks/index_check.py: a row per (op, backend) with the op's time and its check's share."""
    index_check, = import_benchmarks("index_check")
    result = index_check.main(["--out", str(tmp_path), "--device", "cpu", "--tokens", "16", "--vocab", "64",
                               "--dim", "8", "--backends", "python,pytorch"])
    rows = {(r["op"], r["backend"]): r for r in result["rows"]}
    assert set(rows) == {(op, b) for op in ("embedding", "cross_entropy") for b in ("python", "pytorch")}
    assert rows[("embedding", "pytorch")]["check_ms"] is None  # F.embedding's kernel asserts itself
    for r in rows.values():
        assert r["op_ms"] > 0
        assert r["check_ms"] is None or r["fraction"] == r["check_ms"] / r["op_ms"]
    assert json.loads((tmp_path / "index_check.json").read_text()) == result
    _, history = bench
    recorded = history.rows_from_file(tmp_path / "index_check.json")  # what `history add` keeps of it
    assert {(r["op"], r["backend"], r["mode"]) for r in recorded} == {(op, b, "index check") for op, b in rows}
    assert all(r["ms"] > 0 and r["shape"] == "16x64x8" for r in recorded)


def test_environment_takes_the_commit_it_is_given(monkeypatch):
    """KCOURSE_GIT_COMMIT names the version where the checkout's .git is of another (a copied tree)."""
    from benchmarks import common
    monkeypatch.setenv("KCOURSE_GIT_COMMIT", "f" * 40)
    meta = common.environment("cpu")
    assert meta["git_commit"] == "f" * 40 and meta["git_dirty"] is False


def test_host_rows(tmp_path):
    """benchmarks/host.py: a row per op, direction and backend, each a positive time beside torch's,
    the model's linear (with its GELU) and residual add + norm among them."""
    host, = import_benchmarks("host")
    result = host.main(["--out", str(tmp_path), "--device", "cpu", "--backends", "pytorch", "--calls", "2",
                        "--rounds", "1"])
    ops = set(host.cases("cpu"))
    assert {"linear", "add_layer_norm"} <= ops
    assert {(r["op"], r["direction"]) for r in result["rows"]} == {(op, d) for op in ops for d in ("fwd", "fwd+bwd")}
    assert all(r["us_per_call"] > 0 and r["torch_us_per_call"] > 0 for r in result["rows"]), result["rows"]
    assert json.loads((tmp_path / "host.json").read_text()) == result
    # its history rows carry the run's time of day, so two runs of one day are both kept
    from benchmarks import history
    rows = history.rows_from_host(result)
    assert len(rows) == len(result["rows"]) and all(len(r["date"]) == len("2026-11-30 12:00:00") for r in rows)


def test_readme_training_ratios_are_each_mode_s_newest_day():
    from benchmarks import history

    def row(date, shape, ratio, backend="triton", mode="eager"):
        return {"op": "gpt_train", "backend": backend, "mode": mode, "shape": shape, "dtype": "bfloat16",
                "direction": mode, "date": date, "ratio": ratio, "baseline": "torch.nn:eager", "device": "H200"}

    rows = [row("2026-11-27T10:00:00", "B8", 0.22), row("2026-11-28T10:00:00", "B16", 0.88),
            row("2026-11-28T11:00:00", "B8 other", 0.80), row("2026-11-27T10:00:00", "B8", 0.50, backend="cute")]
    table = history.readme_table(rows)
    assert "triton 0.80–0.88" in table and "0.22" not in table  # the older day's ratio is gone
    assert "cute 0.50" in table  # a backend's newest day stands even when it is older than another's


def test_readme_training_ratio_survives_a_later_run_without_baseline():
    # benchmarks/ab.py's new side runs without the torch.nn baseline (no ratio): the README keeps the
    # newest measured ratio rather than an older day's
    from benchmarks import history

    def row(date, shape, ratio, role=None):
        return {"op": "gpt_train", "backend": "triton", "mode": "eager", "shape": shape, "dtype": "bfloat16",
                "direction": "eager", "date": date, "ratio": ratio, "baseline": "torch.nn:eager", "device": "H200",
                "role": role}

    rows = [row("2026-11-27T10:00:00", "B8", 0.22), row("2026-11-29T10:00:00", "B16", 0.80),
            row("2026-11-29T11:00:00", "B16", None), row("2026-11-29T11:00:00", "B16", None, role="ab-base")]
    table = history.readme_table(rows)
    assert "triton 0.80" in table and "0.22" not in table
