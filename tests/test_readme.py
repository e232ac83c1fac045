"""Every ```python block of README.md runs as written (each in a fresh namespace, in order).
Blocks fenced ```python gpu need CUDA and are skipped without it."""
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python( gpu)?\n(.*?)^```$", README.read_text(), re.M | re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("gpu, code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(gpu, code, monkeypatch):
    if gpu and not torch.cuda.is_available():
        pytest.skip("a ```python gpu block: needs CUDA")
    monkeypatch.delenv("KCOURSE_BACKEND", raising=False)  # the blocks describe the default
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
