"""benchmarks/gpt.py: its FLOP count (MFU's numerator) by hand, and a CPU smoke run of a tiny model."""
import argparse

import pytest
import torch

from benchmarks import gpt
from kcourse.modules import GPT


def test_flops_per_token_of_gpt2_124m():
    """6 per matmul weight (12 d^2 per layer, the tied 50304 x 768 head once) + 12 L d T."""
    c = gpt.config(argparse.Namespace(tiny=False, arch="gpt2"))
    with torch.device("meta"):
        model = GPT(c)
    L, d, V, T = 12, 768, 50304, 1024
    assert gpt.flops_per_token(model, c) == 6 * (12 * d * d * L + V * d) + 12 * L * d * T  # 854,654,976


def test_flops_per_token_counts_an_untied_head_once():
    c = gpt.config(argparse.Namespace(tiny=True, arch="llama"))
    with torch.device("meta"):
        model = GPT(c)
    head = c.vocab_size * c.n_embd
    blocks = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("h."))
    assert "lm_head.weight" in dict(model.named_parameters())
    assert gpt.flops_per_token(model, c) == 6 * (blocks + head) + 12 * c.n_layer * c.n_embd * c.block_size


def test_tiny_run_on_cpu(tmp_path):
    result = gpt.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--backends", "python",
                       "--variants", "python:eager", "--steps", "2", "--warmup", "1"])
    runs = result["variants"]
    assert set(runs) == {"torch.nn:eager", "python:eager"}
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in runs.values())  # no peak known for a CPU
    assert result["meta"]["flops_per_token"] > 0 and (tmp_path / "gpt.json").exists()


@pytest.mark.slow  # 15 s of new processes on 2 cores; the GPU runs of benchmarks.gpt --cold-start exercise it too
def test_cold_start_runs_each_model_in_a_new_process(tmp_path):
    """--cold-start: each model's first eager step, measured by a second process of the script."""
    result = gpt.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--backends", "python",
                       "--variants", "python:eager", "--steps", "1", "--warmup", "1", "--cold-start"])
    cold = result["cold_start"]
    assert set(cold) == {"python", "torch.nn"}, cold
    assert all(0 < r["first_step_s"] < r["process_s"] for r in cold.values()), cold


def test_ab_medians_per_side_and_speedup():
    from benchmarks import ab

    runs = [{"side": side, "variants": {"triton:eager": {"step_ms": ms}, "bad:eager": {"error": "x"}}}
            for side, ms in [("base", 60.0), ("new", 40.0), ("base", 66.0), ("new", 44.0), ("base", 70.0), ("new", 50.0)]]
    table = ab.summarize(runs)
    assert set(table) == {"triton:eager"}  # a failed variant has no step time
    row = table["triton:eager"]
    assert row["base"] == [60.0, 66.0, 70.0] and row["base_median_ms"] == 66.0 and row["new_median_ms"] == 44.0
    assert row["speedup"] == 1.5


@pytest.mark.slow  # 15 s of new processes on 2 cores; every benchmarks.ab run on the GPU exercises it too
def test_ab_runs_both_checkouts_in_turns(tmp_path):
    """The base is a checkout (here: this tree itself); each side's gpt.json is kept, rounds in turns."""
    from pathlib import Path

    from benchmarks import ab

    table = ab.main(["--out", str(tmp_path), "--base", str(Path(ab.__file__).parents[1]), "--rounds", "1", "--",
                     "--tiny", "--device", "cpu", "--backends", "python", "--variants", "python:eager",
                     "--no-baselines", "--steps", "2", "--warmup", "1"])
    assert set(table) == {"python:eager"} and table["python:eager"]["speedup"] > 0
    assert (tmp_path / "base1" / "gpt.json").exists() and (tmp_path / "new1" / "gpt.json").exists()
    import json
    assert [r["side"] for r in json.loads((tmp_path / "ab.json").read_text())["runs"]] == ["base", "new"]

    # in the history the base's rows are kept (role ab-base) but never the latest: the new run's are,
    # even when the base ran last, and so is a base run added by itself with --ab-base
    from benchmarks import history
    file = tmp_path / "history.jsonl"
    ab_json = json.loads((tmp_path / "ab.json").read_text())
    base, new = ab_json["runs"]
    base["meta"]["date_utc"] = "2999-01-01 00:00:00"  # (as if the base ran last)
    (tmp_path / "ab.json").write_text(json.dumps(ab_json))
    assert history.add([tmp_path / "ab.json"], file) == 2
    rows = history.load(file)
    assert sorted(str(r.get("role")) for r in rows) == ["None", "ab-base"]
    (latest,) = history.latest(rows)["cpu"]
    assert latest["date"] == new["meta"]["date_utc"] and latest.get("role") is None
    alone = json.loads((tmp_path / "base1" / "gpt.json").read_text())
    alone["meta"]["date_utc"] = "2999-01-02 00:00:00"  # a base run by itself, later still
    (tmp_path / "alone.json").write_text(json.dumps(alone))
    assert history.add([tmp_path / "alone.json"], file, ab_base=True) == 1
    (latest,) = history.latest(history.load(file))["cpu"]
    assert latest["date"] == new["meta"]["date_utc"]
