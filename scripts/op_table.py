"""The README's op x backend table, generated from what the backends export and what the tests verified.

    python scripts/op_table.py                      # print the table
    python scripts/op_table.py --write              # rewrite it in README.md
    KCOURSE_RECORD=run.json pytest                  # a test run that records (op, backend) outcomes
    python scripts/op_table.py record run.json [more.json ...]   # fold that run (its parts) into docs/verified.json
    python scripts/op_table.py record --partial run.json         # a run of some ops' tests: only those (op, backend) replaced

A cell names each device class on which the op's tests passed on that backend ("CPU", "H100", ...);
"untested" means the kernel exists but no recorded run verified it; "—" means no kernel.
tests/test_op_table.py fails when README.md's table differs from what this prints.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("python", "pytorch", "triton", "cute")
sys.path.insert(0, str(ROOT))
from kcourse.backend import OPS  # noqa: E402
VERIFIED = ROOT / "docs" / "verified.json"
README = ROOT / "README.md"
START, END = "<!-- op-table:start -->", "<!-- op-table:end -->"


def exports(backend: str, op: str) -> bool:
    """Does ``kcourse/blas/<backend>/<op>.py`` define ``op``, by ``def op(`` or as a module-level
    name assigned (``op, op_backward = _host.op_ops(...)``)? (read, not imported)"""
    path = ROOT / "kcourse" / "blas" / backend / f"{op}.py"
    pattern = rf"^(def {op}\(|{op}\b[\w, ]* = )"
    return path.exists() and re.search(pattern, path.read_text(), re.M) is not None


def device_class(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; 'cpu (triton interpreter)' -> 'CPU'."""
    if device.startswith("cpu"):
        return "CPU"
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", device)
    return match.group(1) if match else device


def load_verified() -> dict:
    return json.loads(VERIFIED.read_text()) if VERIFIED.exists() else {}


def record(run_paths: list[str], partial: bool = False) -> None:
    """Fold one recorded test run into docs/verified.json (keyed by device class). A run recorded in
    parts (several pytest invocations on one machine) is summed. ``partial``: the run tested some ops
    only; their results replace those of the device's last full run, which is otherwise kept (the
    partial run's date and versions listed under "partial"): each (op, backend) it ran, the others
    of those ops (a backend not available there) kept."""
    parts = [json.loads(Path(p).read_text()) for p in run_paths]
    run = {"meta": parts[0]["meta"], "results": {}}
    for part in parts:
        if device_class(part["meta"]["device"]) != device_class(run["meta"]["device"]):
            raise SystemExit(f"record: {run_paths} were recorded on different devices")
        for op, by_backend in part["results"].items():
            for backend, counts in by_backend.items():
                total = run["results"].setdefault(op, {}).setdefault(backend, {"passed": 0, "failed": 0})
                for outcome in total:
                    total[outcome] += counts[outcome]
    verified = load_verified()
    device = device_class(run["meta"]["device"])
    if partial and device in verified:
        entry = verified[device]
        for op, by_backend in run["results"].items():
            entry["results"].setdefault(op, {}).update(by_backend)
        entry.setdefault("partial", []).append({**run["meta"], "ops": sorted(run["results"])})
        VERIFIED.write_text(json.dumps(verified, indent=1, sort_keys=True) + "\n")
        return
    if "fuzz" in verified.get(device, {}):  # the large fuzz budget's runs (tests/test_fuzz.py), kept
        run["fuzz"] = verified[device]["fuzz"]
    verified[device] = run
    VERIFIED.write_text(json.dumps(verified, indent=1, sort_keys=True) + "\n")


def cell(op: str, backend: str, verified: dict) -> str:
    if not exports(backend, op):
        return "—"
    where = [name for name, run in sorted(verified.items())
             if (c := run["results"].get(op, {}).get(backend)) and c["passed"] and not c["failed"]]
    return " · ".join(f"✓ {name}" for name in where) or "untested"


def table() -> str:
    verified = load_verified()
    lines = ["| op | " + " | ".join(BACKENDS) + " |", "|---" * (len(BACKENDS) + 1) + "|"]
    for op in OPS:
        lines.append(f"| [{op}](docs/{op}.md) | " + " | ".join(cell(op, b, verified) for b in BACKENDS) + " |")
    runs = "; ".join(f"{name}: {run['meta']['device']}, {run['meta']['date']}, torch {run['meta']['torch']}, "
                     f"triton {run['meta'].get('triton', '-')}"
                     + "".join(f" ({', '.join(p['ops'])}: {p['date']})" for p in run.get("partial", []))
                     for name, run in sorted(verified.items()))
    lines.append("")
    lines.append(f"Verified runs: {runs or 'none recorded'}.")
    fuzzed = "; ".join(f"{name}: " + ", ".join(
        f"{f['examples']} examples per op on {', '.join(f['backends'])}"
        + (f" ({', '.join(f['ops'])})" if f.get("some_ops") else "")
        + f", {f['mismatches']} mismatches ({f['date']}, {f['commit']})" for f in run["fuzz"])
        for name, run in sorted(verified.items()) if "fuzz" in run)
    if fuzzed:
        lines.append(f"Property fuzzing (tests/test_fuzz.py, KCOURSE_FUZZ_EXAMPLES): {fuzzed}.")
    return "\n".join(lines)


def readme_table() -> str:
    text = README.read_text()
    return text[text.index(START) + len(START):text.index(END)].strip()


def write() -> None:
    text = README.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    README.write_text(f"{head}{START}\n{table()}\n{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=["print", "record"], default="print")
    parser.add_argument("run", nargs="*", help="with record: the KCOURSE_RECORD file(s) of a test run")
    parser.add_argument("--write", action="store_true", help="rewrite the table in README.md")
    parser.add_argument("--partial", action="store_true", help="with record: a run of some ops' tests only")
    args = parser.parse_intermixed_args(argv)
    if args.command == "record":
        record(args.run, args.partial)
    if args.write or args.command == "record":
        write()
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
