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
