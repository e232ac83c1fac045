"""benchmarks/fused.py runs end to end on the CPU (each fused op at a tiny shape) and its rows reach the history."""
import json

from benchmarks import fused, history


def test_fused_benchmark_smoke(tmp_path):
    result = fused.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--backends", "python,pytorch",
                         "--compiler", "aot_eager"])
    rows = result["fused"]
    assert [r["op"] for r in rows[::6]] == list(fused.OPS)
    for i in range(0, len(rows), 6):
        assert [r["variant"] for r in rows[i:i + 6]] == ["python:fused", "python:unfused", "pytorch:fused",
                                                         "pytorch:unfused", "torch:eager", "torch:compile"]
    assert all(r["ms"] > 0 for r in rows), [r for r in rows if "ms" not in r]
    assert all("ratio_time" in r for r in rows if r["variant"].endswith(":fused"))
    assert json.loads((tmp_path / "fused.json").read_text()) == result
    got = history.rows_from_file(tmp_path / "fused.json")
    assert {r["mode"] for r in got} == {"fused", "unfused", "eager", "compile"}
    assert {r["op"] for r in got} == set(fused.OPS) and all(r["ms"] > 0 for r in got)


def test_fused_and_unfused_agree():
    """Each op's fused form, unfused composition and torch function compute the same (tiny shape, float64)."""
    import torch

    for name, op in fused.OPS.items():
        inputs = [t.double() if t.is_floating_point() else t for t in op.inputs(op.tiny, torch.Generator().manual_seed(0))]
        expected = op.torch(*inputs)
        for f in (op.fused("python"), op.unfused("python")):
            got = f(*inputs)
            for a, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple)
                            else (expected,)):
                torch.testing.assert_close(a, e, msg=name)
