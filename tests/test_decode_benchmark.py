"""benchmarks/decode.py's CPU smoke test: tiny GPT-2 and Llama-like models on the python backend
against transformers' generate (static cache and the default one), a row per (arch, batch, variant)
with prefill time, decode tokens/s and greedy tokens that match transformers'; the rows go into the
history as gpt_decode."""

import pytest

from _util import import_benchmarks

pytest.importorskip("transformers", reason="transformers is a dev dependency")


def test_tiny_decode_benchmark_on_the_cpu(tmp_path):
    decode, history = import_benchmarks("decode", "history")
    results = decode.main(["--out", str(tmp_path), "--tiny", "--device", "cpu", "--backends", "python",
                           "--batches", "1,3", "--repeats", "1", "--variants", "static,eager"])
    runs = results["decode"]
    assert [(r["arch"], r["batch"], r["variant"]) for r in runs] == [
        (arch, batch, variant) for arch in ("gpt2", "llama") for batch in (1, 3)
        for variant in ("transformers:static", "python:eager")]
    for r in runs:
        assert "error" not in r, r
        assert r["tokens_match"] and r["matched"] >= 1, r
        assert r["prefill_ms"] > 0 and r["decode_tokens_per_s"] > 0
    assert all(r["baseline"] == "transformers:static" and r["ratio"] > 0 for r in runs if r["model"] == "python")
    rows = history.rows_from_file(tmp_path / "decode.json")
    assert len(rows) == len(runs) and {r["op"] for r in rows} == {"gpt_decode"}
    assert "GPT decode" in history.device_markdown("cpu", rows)
