"""The benchmark runner's bookkeeping (``benchmarks/run.py``), on the CPU: with interleaved rounds
every fraction is still the point's rate over its ceiling, and the speed-up over torch eager its
time over eager's, from the times the rounds kept."""
import importlib.util
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("kcourse_benchmark_run", RUN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rounds", [1, 3])
def test_rounds_keep_fractions_consistent(runner, tmp_path, rounds):
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
