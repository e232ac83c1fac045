"""``python -m kcourse``: what runs here, the benchmark runner, the GPT example.

    python -m kcourse info                         # backends (and why one cannot run), devices, versions
    python -m kcourse bench --out DIR [args ...]   # benchmarks/run.py (source checkout only)
    python -m kcourse train [args ...]             # examples/train_gpt.py (source checkout only)

``bench`` and ``train`` pass every further argument on; ``--help`` after them shows theirs.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the source checkout, when kcourse is installed with -e
USAGE = __doc__.split("\n\n")[1]


def _checkout_file(relative: str, what: str) -> Path | None:
    path = ROOT / relative
    if path.is_file():
        return path
    print(f"kcourse {what}: {relative} is not here ({ROOT}); it ships with the source checkout only:\n"
          "    git clone <kcourse repository> && cd kcourse && pip install -e '.[triton,cute,dev]'",
          file=sys.stderr)
    return None


def bench(argv: list[str]) -> int:
    if _checkout_file("benchmarks/run.py", "bench") is None:
        return 2
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a package of the checkout, not of the installed kcourse
    from benchmarks import run
    run.main(argv)
    return 0


def train(argv: list[str]) -> int:
    path = _checkout_file("examples/train_gpt.py", "train")
    if path is None:
        return 2
    saved, sys.argv = sys.argv, [str(path), *argv]  # the example parses sys.argv, as when run as a script
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "info":
        from ._info import report
        print(report())
        return 0
    if command == "bench":
        return bench(rest)
    if command == "train":
        return train(rest)
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
