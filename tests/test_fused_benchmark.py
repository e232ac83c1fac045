"""benchmarks/fused.py runs end to end on the CPU (a tiny shape) and its rows reach the history."""
import json

from benchmarks import fused, history


def test_fused_benchmark_smoke(tmp_path):
    result = fused.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--backends", "python,pytorch",
                         "--compiler", "aot_eager"])
    names = [r["variant"] for r in result["fused"]]
    assert names == ["python:fused", "python:unfused", "pytorch:fused", "pytorch:unfused", "torch:eager",
                     "torch:compile"]
    assert all(r["ms"] > 0 for r in result["fused"]), result["fused"]
    assert all("ratio_time" in r for r in result["fused"] if r["variant"].endswith(":fused"))
    assert json.loads((tmp_path / "fused.json").read_text()) == result
    rows = history.rows_from_file(tmp_path / "fused.json")
    assert {r["mode"] for r in rows} == {"fused", "unfused", "eager", "compile"}
    assert all(r["op"] == "linear_cross_entropy" and r["ms"] > 0 for r in rows)
