"""What the training, scaling and decode benchmarks share: a file of the repository loaded as a
module, the backends a run can use, and where and with what a run ran."""
from __future__ import annotations

import datetime
import functools
import importlib.util
import os
import platform
import subprocess
from pathlib import Path

import torch

import kcourse

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def load(path: str):
    """The Python file at ``path`` (relative to the repository root) as a module, loaded once:
    ``tests/torch_reference.py`` (the torch.nn twin of kcourse.modules), ``examples/train_gpt.py``."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def usable_backends(names: list[str], cuda: bool) -> tuple[list[str], dict[str, str]]:
    """The backends of ``names`` that a benchmark runs here, in order, and the others with the reason
    (python is too slow on CUDA; one unavailable here says why); an unknown name is an error."""
    usable, skipped = [], {}
    info = kcourse.backends()
    for b in names:
        if b not in info:
            raise SystemExit(f"unknown backend {b!r}; valid: {', '.join(info)}")
        if cuda and b == "python":
            skipped[b] = "too slow for this benchmark on CUDA"
        elif not info[b].available:
            skipped[b] = f"{info[b].reason} (fix: {info[b].fix})"
        else:
            usable.append(b)
    return usable, skipped


def git(*args: str) -> str | None:
    """The output of ``git *args`` in the repository, or None where git or the repository is missing."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment(device: str) -> dict:
    """Where, when and with what a run ran: the device's name, the UTC date, the versions of torch,
    triton (and transformers where installed), CUDA and Python, and the git commit (``git_dirty``:
    files of kcourse/ changed since), or the one ``KCOURSE_GIT_COMMIT`` names."""
    versions = {}
    for module in ("triton", "transformers"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    # KCOURSE_GIT_COMMIT (a full hash) names the version where the checkout's own git does not: a copy
    # of a working tree whose .git is of another commit (the GPU machine's); the tree is then taken as clean
    commit = os.environ.get("KCOURSE_GIT_COMMIT")
    changes = "" if commit else git("status", "--porcelain", "--untracked-files=no", "--", "kcourse")
    commit = commit or git("rev-parse", "HEAD")
    cuda = torch.device(device).type == "cuda"
    return {"device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "torch": torch.__version__, **versions, "cuda": torch.version.cuda, "python": platform.python_version(),
            "git_commit": commit, "git_dirty": None if changes is None else bool(changes)}
