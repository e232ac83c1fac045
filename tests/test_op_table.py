"""The README's op x backend table is generated (scripts/op_table.py); it must not go stale."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("op_table", ROOT / "scripts" / "op_table.py")
op_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(op_table)


def test_readme_table_is_current():
    assert op_table.readme_table() == op_table.table(), \
        "README.md's op table is stale: run `python scripts/op_table.py --write`"


def test_every_op_has_docs_and_reference():
    for op in op_table.OPS:
        assert (ROOT / "docs" / f"{op}.md").exists(), f"docs/{op}.md is missing"
        assert op_table.exports("python", op), f"the python reference has no {op}"


def test_verified_runs_only_name_existing_kernels():
    for name, run in op_table.load_verified().items():
        for op in op_table.OPS:
            for backend in run["results"].get(op, {}):
                assert op_table.exports(backend, op), f"{name} run claims {backend}/{op}, which has no kernel"


def test_a_partial_run_replaces_only_its_ops(tmp_path, monkeypatch):
    import json
    verified = tmp_path / "verified.json"
    full = {"meta": {"device": "NVIDIA H200", "date": "d0"},
            "results": {"gemm": {"triton": {"passed": 3, "failed": 0}}, "rope": {"triton": {"passed": 1, "failed": 1}}}}
    verified.write_text(json.dumps({"H200": full}))
    monkeypatch.setattr(op_table, "VERIFIED", verified)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"meta": {"device": "NVIDIA H200", "date": "d1"},
                               "results": {"rope": {"triton": {"passed": 2, "failed": 0}}}}))
    op_table.record([str(run)], partial=True)
    got = json.loads(verified.read_text())["H200"]
    assert got["results"]["gemm"] == full["results"]["gemm"] and got["meta"]["date"] == "d0"
    assert got["results"]["rope"] == {"triton": {"passed": 2, "failed": 0}}
    assert got["partial"] == [{"device": "NVIDIA H200", "date": "d1", "ops": ["rope"]}]
    op_table.record([str(run)])  # a full run replaces the whole entry
    assert json.loads(verified.read_text())["H200"]["results"] == {"rope": {"triton": {"passed": 2, "failed": 0}}}
