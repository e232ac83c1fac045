"""``python -m kcourse`` (info, bench, train) and ``kcourse.backends()`` printed as a table."""
import subprocess
import sys

import pytest

import kcourse
from kcourse import __main__ as cli
from kcourse.backend import NAMES


def test_backends_is_the_dict_it_was_and_prints_as_a_table():
    info = kcourse.backends()
    assert isinstance(info, dict) and list(info) == list(NAMES)
    assert all(isinstance(v, kcourse.BackendInfo) and v.name == k for k, v in info.items())
    lines = str(info).splitlines()
    assert lines[0].split() == ["backend", "available", "why", "not", "/", "how", "to", "fix"]
    assert repr(info) == str(info)
    for name, row in zip(NAMES, lines[2:]):
        assert row.split()[:2] == [name, "yes" if info[name].available else "no"]
        if not info[name].available:  # the reason and the fix, on the backend's row
            assert info[name].reason in row and info[name].fix in row


def test_info_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "kcourse", "info"], capture_output=True, text=True, check=True).stdout
    for word in (*NAMES, "default backend here", "torch", "triton", "nvidia-cutlass-dsl", "cpu"):
        assert word in out


def test_usage_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert "python -m kcourse info" in capsys.readouterr().out
    assert cli.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err


def test_bench_passes_its_arguments_to_the_runner(tmp_path):
    assert cli.main(["bench", "--out", str(tmp_path), "--device", "cpu", "--quick", "--ops", "copy",
                     "--backends", "pytorch"]) == 0
    assert (tmp_path / "results.json").exists() and (tmp_path / "summary.md").exists()


def test_bench_and_train_outside_a_checkout(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    assert cli.main(["bench", "--out", str(tmp_path)]) == 2
    assert "benchmarks/run.py is not here" in capsys.readouterr().err
    assert cli.main(["train"]) == 2
    assert "examples/train_gpt.py is not here" in capsys.readouterr().err


def test_train_passes_its_arguments_to_the_example(capsys):
    argv = list(sys.argv)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--help"])
    assert exit_.value.code == 0
    assert "--backend" in capsys.readouterr().out
    assert sys.argv == argv  # restored: a later argparse user in the process (CuTe DSL's) must not see --help
