"""The benchmark history: one append-only, gzip-compressed JSONL file of every measurement, and the
latest per device.

    python -m benchmarks.history add OUT/results.json [more.json ...]   # append a run (benchmarks/run.py's JSON)
    python -m benchmarks.history add OUT/gpt.json                        # or a training run (benchmarks/gpt.py's JSON)
    python -m benchmarks.history add OUT/host.json                       # or host time per call (benchmarks/host.py)
    python -m benchmarks.history add OUT/scaling.json                    # or 1 vs N GPUs (benchmarks/scaling.py)
    python -m benchmarks.history add OUT/decode.json                     # or decode tokens/s (benchmarks/decode.py)
    python -m benchmarks.history add OUT/peers.json                      # or against the peers (benchmarks/peers.py)
    python -m benchmarks.history add OUT/ab.json                         # or two versions on one host (benchmarks/ab.py)
    python -m benchmarks.history add OUT/index_check.json                # or the index checks' cost (benchmarks/index_check.py)
    python -m benchmarks.history latest                                  # rewrite latest/<device>.md + .png
    python -m benchmarks.history readme                                  # rewrite README.md's performance table

``benchmarks/results/history.jsonl.gz`` (read it with ``zcat``; each ``add`` appends one gzip member,
which gzip reads as part of one stream) holds one JSON object a line: for each run, first a run line
``{"run": {"device", "date", "versions", "commit"}, "same": {...}, "columns": [...]}`` (where, when
and with what it ran; the fields every point of the run shares; the names of the others), then one
JSON array a measured point, its values in ``columns``' order (null: absent), which ``load`` returns
as a dict with the shared fields and the device, date, versions and commit of the run line above it.
The fields:

    op, backend, shape, dtype, direction   what was timed (``backend`` is torch's own op for a reference row)
    ms                                     median milliseconds of one call
    rate, unit                             GB/s of the minimal traffic or TFLOP/s (tokens/s for training and decode)
    fraction, ceiling                      rate over the ceiling measured in the same run, and its name
                                           (``copy_ bandwidth``, ``torch.matmul``, ``F.sdpa``); against the
                                           peers (mode ``peers``): the best peer's ms over ours, ``best peer``
    goal                                   the fraction the point must reach (target points only)
    baseline, ratio                        torch's eager op (or torch.nn for training; the fastest peer at the
                                           point for mode ``peers``) and its time over ours
    role                                   ``ceiling`` or ``eager`` on torch's own rows, ``peer`` on a peer's
                                           (torch eager, torch.compile, quack, liger), absent on ours;
                                           ``ab-base``: a run of an older version beside a newer one on
                                           one host (benchmarks/ab.py, or ``add --ab-base``), never "latest"
    device, date, versions, commit         where, when (UTC) and with what it ran; ``commit`` ends in
                                           ``+dirty`` when kcourse/ had uncommitted changes
    mode                                   training: ``eager``, ``compile``, ``autocast``, ``graphed`` ...;
                                           ``host`` for host time per call (benchmarks/host.py);
                                           ``x1``, ``ddp x2``, ``autocast fsdp x2`` ... over GPUs; decode (op
                                           ``gpt_decode``, direction ``decode``, ms a decode step): ``eager``,
                                           ``static``, ... (benchmarks/decode.py); ``peers`` for kcourse against
                                           the libraries a user would pick instead (benchmarks/peers.py),
                                           ``peers graphed`` for the same timed as CUDA-graph replays
                                           ``cold start``: the first eager step of a new process, with the
                                           compiled kernels and tuning picks of an earlier one on disk
                                           (``first_step_s``; ``process_s`` the whole process; benchmarks/gpt.py
                                           --cold-start)
    check_ms, check_share, how             index checks (mode ``index check``, benchmarks/index_check.py): the
                                           check's time, its share of the op's ``ms``, and which check
    gpus, efficiency, peak_gib             scaling runs (benchmarks/scaling.py): processes, tokens/s per
                                           GPU over the model's 1-GPU run, peak memory per GPU (and
                                           ``host_ms``: the slowest rank's median time to issue a step)

Only points that ran and passed their correctness check are recorded. A run is identified by its
(device, date): adding it twice adds nothing. ``latest`` keeps, per device, the newest row of each
(op, backend, shape, dtype, direction, mode) and writes ``latest/<device>.md`` (the target points
and training throughput) and ``latest/<device>.png`` (fraction of the ceiling at the target points).
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.summarize import shape_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HISTORY = RESULTS / "history.jsonl.gz"
LATEST = RESULTS / "latest"
README = ROOT / "README.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
KEY = ("op", "backend", "shape", "dtype", "direction", "mode")


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H200' -> 'h200', 'CPU (x86_64)' -> 'cpu'."""
    if name.lower().startswith("cpu"):
        return "cpu"
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name)
    return (match.group(1) if match else re.sub(r"\W+", "-", name)).lower()


def _round(x, digits=4):
    return None if x is None else float(f"{x:.{digits}g}")


def _clean(row: dict) -> dict:
    return {k: v for k, v in row.items() if v is not None and v is not False}


# ----------------------------------------------------------------------------- reading runs


def _commit(meta: dict) -> str | None:
    """The run's commit, ``+dirty`` when tracked files had changed."""
    commit = meta.get("git_commit")
    return commit + "+dirty" if commit and meta.get("git_dirty") else commit


def rows_from_bench(results: dict) -> list[dict]:
    """The rows of one ``benchmarks/run.py`` results.json: every point that ran and was checked."""
    meta = results["meta"]
    commit = _commit(meta)
    common = dict(device=meta["device_name"], date=meta["date_utc"], commit=commit,
                  versions={k: meta[k] for k in ("torch", "triton", "cuda", "python") if meta.get(k)})
    eager_name = {(p["op"], p["dtype"], tuple(p["shape"]), p.get("causal"), p.get("direction", "fwd")): p["backend"]
                  for p in results["points"] if p.get("eager_point")}
    rows = []
    for p in results["points"]:
        if p["status"] != "ok" or not p.get("checked") or p.get("ms") is None:
            continue
        direction = p.get("direction", "fwd")
        tflops = p.get("tflops")
        role = "ceiling" if p.get("ceiling_point") else "eager" if p.get("eager_point") else None
        rows.append(_clean(dict(
            op=p["op"], backend=p["backend"], shape=shape_text(p), dtype=p["dtype"], direction=direction,
            ms=_round(p["ms"]), rate=_round(tflops if tflops is not None else p.get("gbs")),
            unit="TFLOP/s" if tflops is not None else "GB/s", fraction=_round(p.get("fraction")),
            ceiling=p.get("ceiling_name"),
            goal=p.get("target_fraction") if p.get("target") and not role else None,
            baseline=eager_name.get((p["op"], p["dtype"], tuple(p["shape"]), p.get("causal"), direction))
            if p.get("speedup_vs_eager") is not None else None,
            ratio=_round(p.get("speedup_vs_eager")), role=role, **common)))
    return rows


def rows_from_gpt(results: dict) -> list[dict]:
    """The rows of one ``benchmarks/gpt.py`` gpt.json: tokens/s of a training step, each model
    beside torch.nn's eager step."""
    meta = results["meta"]
    shape = f"{meta['arch']} {meta['parameters'] / 1e6:.1f}M B{meta['batch']} T{meta['block_size']}"
    reference = results.get("torch.nn", {}).get("step_ms")
    rows = []
    for name, run in results.items():
        if not isinstance(run, dict) or "tokens_per_s" not in run:
            continue
        mode = "graphed" if name.endswith(" graphed") else "eager"
        model = name.removesuffix(" graphed")
        backend = model.split("/", 1)[1] if model.startswith("kcourse/") else model
        rows.append(_clean(dict(
            op="gpt_train", backend=backend, shape=shape, dtype=meta["dtype"], direction="train", mode=mode,
            ms=_round(run["step_ms"]), rate=_round(run["tokens_per_s"]), unit="tokens/s",
            baseline="torch.nn eager" if reference else None,
            ratio=_round(reference / run["step_ms"]) if reference else None,
            role="baseline" if model == "torch.nn" else None,
            device=meta["device"], date=meta["date_utc"],
            versions={"torch": meta["torch"], **({"triton": meta["triton"]} if meta.get("triton") else {})},
            commit=meta.get("git_commit"))))
    return rows


def rows_from_variants(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/gpt.py`` gpt.json with named variants (``MODEL:MODE``): tokens/s
    of a training step, each against its own torch.nn baseline (eager, compile or autocast)."""
    meta = results["meta"]
    shape = f"{meta['arch']} {meta['parameters'] / 1e6:.1f}M B{meta['batch']} T{meta['block_size']}"
    commit = _commit(meta)
    rows = []
    for name, run in results["variants"].items():
        if "tokens_per_s" not in run:
            continue
        model, mode = name.split(":", 1)
        rows.append(_clean(dict(
            op="gpt_train", backend=model, shape=shape, dtype=meta["dtype"], direction="train", mode=mode,
            ms=_round(run["step_ms"]), rate=_round(run["tokens_per_s"]), unit="tokens/s",
            baseline=run.get("baseline") if model != "torch.nn" else None,
            ratio=_round(run["ratio"]) if model != "torch.nn" and run.get("ratio") else None,
            role="baseline" if model == "torch.nn" else None,
            peak_gib=_round(run.get("peak_memory_gib")), first_step_s=_round(run.get("first_step_s")),
            host_ms=_round(run.get("host_ms")), mfu=_round(run.get("mfu")), device=meta["device"],
            date=meta["date_utc"],
            versions={k: meta[k] for k in ("torch", "triton", "cuda", "python") if meta.get(k)}, commit=commit)))
    for model, run in results.get("cold_start", {}).items():  # --cold-start: the first step of a new process
        if "first_step_s" in run:
            rows.append(_clean(dict(
                op="gpt_train", backend=model, shape=shape, dtype=meta["dtype"], direction="train",
                mode="cold start", first_step_s=_round(run["first_step_s"]), process_s=_round(run.get("process_s")),
                role="baseline" if model == "torch.nn" else None, device=meta["device"], date=meta["date_utc"],
                versions={k: meta[k] for k in ("torch", "triton", "cuda", "python") if meta.get(k)}, commit=commit)))
    return rows


def rows_from_scaling(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/scaling.py`` scaling.json: tokens/s per GPU of a training step on 1
    and N GPUs (DDP, FSDP2), with the scaling efficiency and the peak memory per GPU."""
    meta = results["meta"]
    shape = f"{meta['arch']} {meta['parameters'] / 1e6:.1f}M B{meta['batch_per_gpu']} T{meta['block_size']}"
    commit = _commit(meta)
    rows = []
    for run in results["runs"].values():
        if "tokens_per_s_per_gpu" not in run:
            continue
        rows.append(_clean(dict(
            op="gpt_train", backend=run["model"], shape=shape, dtype=run["dtype"], direction="train",
            mode=run["mode"], ms=_round(run["step_ms"]), rate=_round(run["tokens_per_s_per_gpu"]),
            unit="tokens/s per GPU", gpus=run["gpus"], efficiency=_round(run.get("efficiency")),
            host_ms=_round(run.get("host_ms")),
            peak_gib=_round(run.get("peak_memory_gib")), first_step_s=_round(run.get("first_step_s")),
            role="baseline" if run["model"] == "torch.nn" else None, device=run["device"], date=meta["date_utc"],
            versions={k: meta[k] for k in ("torch", "triton", "cuda", "python") if meta.get(k)}, commit=commit)))
    return rows


def rows_from_host(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/host.py`` host.json: host microseconds per call of each op,
    against the torch call it stands for (ratio: torch's time over ours)."""
    meta = results["meta"]
    rows = []
    for r in results["rows"]:
        if "us_per_call" not in r:
            continue
        rows.append(_clean(dict(
            op=r["op"], backend=r["backend"], shape="host, tiny operands", dtype="bfloat16", direction=r["direction"],
            mode="host", ms=_round(r["us_per_call"] / 1000), baseline="torch",
            ratio=_round(r["torch_us_per_call"] / r["us_per_call"]), device=meta["device"],
            date=meta.get("date_utc", meta.get("date")),  # (files before 2026-11-30: the day alone)
            versions={k: meta.get(k) for k in ("torch", "triton", "cuda", "python") if meta.get(k)},
            commit=_commit(meta))))
    return rows


FUSED_MODES = ("fused", "unfused", "eager", "compile")  # benchmarks/fused.py's variants


def rows_from_fused(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/fused.py`` fused.json: a forward and backward of each fused op, each
    fused variant against its backend's unfused composition (ratio: their time over ours). Older runs
    held the LM head and loss only, its shape as N, d, V (the same label: N x d x V)."""
    meta = results["meta"]
    rows = []
    for r in results["fused"]:
        if "ms" not in r:
            continue
        backend, _, mode = r["variant"].partition(":")
        op = r.get("op", "linear_cross_entropy")
        shape = " x ".join(map(str, r["shape"] if "shape" in r else (r["N"], r["d"], r["V"])))
        rows.append(_clean(dict(
            op=op, backend=backend, shape=shape, dtype=meta["dtype"],
            direction="fwd+bwd", mode=mode, ms=_round(r["ms"]),
            peak_gib=_round(r["peak_bytes"] / 2**30) if r.get("peak_bytes") is not None else None,
            baseline=f"{backend}:unfused" if "ratio_time" in r else None,
            ratio=_round(1 / r["ratio_time"]) if r.get("ratio_time") else None,
            memory_ratio=r.get("ratio_memory"), device=meta["device"], date=meta["date_utc"],
            versions={k: meta[k] for k in ("torch", "triton", "cuda", "python") if meta.get(k)},
            commit=_commit(meta))))
    return rows


def rows_from_index_check(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/index_check.py`` index_check.json: each op's forward time on each
    backend and what its check of the indices costs of it (``check_ms``, ``check_share``; none where
    torch's own kernel checks, ``how`` says which check)."""
    meta = results["meta"]
    return [_clean(dict(
        op=r["op"], backend=r["backend"], shape=f"{meta['tokens']}x{meta['vocab']}x{meta['dim']}",
        dtype=meta.get("dtype", "bfloat16"), direction="fwd", mode="index check", ms=_round(r["op_ms"]),
        check_ms=_round(r["check_ms"]), check_share=_round(r["fraction"]), how=r["how"], device=meta["device"],
        date=meta.get("date_utc", meta.get("date")),
        versions={k: meta.get(k) for k in ("torch", "triton", "cuda", "python") if meta.get(k)},
        commit=meta.get("commit") or _commit(meta))) for r in results["rows"]]


def rows_from_decode(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/decode.py`` decode.json: decode tokens/s of each model and mode (ms:
    one decode step), kcourse's against its transformers baseline; only runs whose tokens matched."""
    meta = results["meta"]
    commit = _commit(meta)
    rows = []
    for r in results["decode"]:
        if not r.get("decode_tokens_per_s") or not r.get("tokens_match"):
            continue
        model = meta["models"][r["arch"]]
        rows.append(_clean(dict(
            op="gpt_decode", backend=r["model"], direction="decode", mode=r["mode"], dtype=meta["dtype"],
            shape=f"{r['arch']} {model['parameters'] / 1e6:.1f}M B{r['batch']} P{meta['prompt_len']} "
                  f"N{meta['new_tokens']}",
            ms=_round(r["decode_ms_per_token"]), rate=_round(r["decode_tokens_per_s"]), unit="tokens/s",
            prefill_ms=_round(r["prefill_ms"]), baseline=r.get("baseline"), ratio=_round(r.get("ratio")),
            role="baseline" if r["model"] == "transformers" else None,
            device=meta["device"], date=meta["date_utc"],
            versions={k: meta[k] for k in ("torch", "triton", "transformers", "cuda", "python") if meta.get(k)},
            commit=commit)))
    return rows


def rows_from_peers(results: dict) -> list[dict]:
    """The rows of a ``benchmarks/peers.py`` peers.json: every point that ran and was checked, peers and
    kcourse's backends, each with its time against the fastest peer at the point."""
    meta = results["meta"]
    versions = {k: meta[k] for k in ("torch", "triton", "cuda", "python") if meta.get(k)}
    versions.update({name: peer["version"] for name, peer in results["peers"].items()
                     if peer["available"] and name in ("quack", "liger") and peer.get("version")})
    rows = []
    for p in results["points"]:
        if p["status"] != "ok" or not p.get("checked") or p.get("ms") is None:
            continue
        tflops = p.get("tflops")  # gemm's; the memory-bound ops' rate is GB/s
        rows.append(_clean(dict(
            op=p["op"], backend=p["backend"], shape=shape_text(p), dtype=p["dtype"], direction=p["direction"],
            mode="peers graphed" if meta.get("graphed") else "peers", ms=_round(p["ms"]),
            rate=_round(tflops if tflops is not None else p.get("gbs")),
            unit="TFLOP/s" if tflops is not None else "GB/s", fraction=_round(p.get("ratio")),
            ceiling=p.get("ceiling_name"), baseline=p.get("best_peer"), ratio=_round(p.get("ratio")),
            role="peer" if p.get("peer") else None, device=meta["device"], date=meta["date_utc"],
            versions=versions, commit=_commit(meta))))
    return rows


def rows_from_file(path: Path) -> list[dict]:
    """The rows of a run's JSON, whichever runner wrote it; [] for anything else."""
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    if isinstance(results, dict) and "table" in results and "runs" in results:  # benchmarks/ab.py's
        return [{**r, "role": "ab-base"} if run["side"] == "base" else r for run in results["runs"]
                for r in rows_from_variants({"meta": run["meta"], "variants": run["variants"]})]
    if not isinstance(results, dict) or "meta" not in results:
        return []
    if "peers" in results:
        return rows_from_peers(results)
    if "points" in results:
        return rows_from_bench(results)
    if "decode" in results:
        return rows_from_decode(results)
    if "fused" in results:
        return rows_from_fused(results)
    if "variants" in results:
        return rows_from_variants(results)
    if "runs" in results:
        return rows_from_scaling(results)
    if "rows" in results and any("op_ms" in r for r in results["rows"]):
        return rows_from_index_check(results)
    if "rows" in results:
        return rows_from_host(results)
    if "torch.nn" in results:
        return rows_from_gpt(results)
    return []


# ----------------------------------------------------------------------------- the history file


RUN_FIELDS = ("versions", "commit")  # a run's, kept once on its run line, not on each of its points


_LEGACY_LM_HEAD = re.compile(r"^N(\d+) d(\d+) V(\d+)$")


def _open(path: Path, mode: str):
    """``path`` opened as text: through gzip when it ends in ``.gz`` (appending writes a new member)."""
    return gzip.open(path, mode + "t") if path.suffix == ".gz" else path.open(mode)


def read_lines(path: Path = HISTORY) -> list[str]:
    """The history file's lines, decompressed."""
    with _open(path, "r") as f:
        return f.read().splitlines()


def load(path: Path = HISTORY) -> list[dict]:
    """Every measured point, each with its run's versions and commit."""
    if not path.exists():
        return []
    rows, run, same, columns = [], {}, {}, []
    for line in read_lines(path):
        if not line.strip():
            continue
        row = json.loads(line)
        if isinstance(row, dict) and "run" in row:
            run, same, columns = row["run"], row.get("same", {}), row.get("columns", [])
            continue
        point = {**same, **{k: v for k, v in zip(columns, row) if v is not None}} if isinstance(row, list) else row
        if isinstance(point.get("shape"), str):  # fused.py's LM head before 2026-11-29: "N16384 d768 V50304"
            point["shape"] = _LEGACY_LM_HEAD.sub(r"\1 x \2 x \3", point["shape"])
        rows.append({**point, **{k: run[k] for k in ("device", "date", *RUN_FIELDS) if k in run}})
    return rows


def write(rows: list[dict], f) -> None:
    """``rows`` (sorted by date) as history lines: for each stretch of one run, a run line (the run, the
    fields its points share, the names of the others), then one array of values a point."""
    compact = dict(separators=(",", ":"))
    for _, stretch in itertools.groupby(rows, key=_run_of):
        stretch = list(stretch)
        header = {"device": stretch[0]["device"], "date": stretch[0]["date"],
                  **{k: stretch[0][k] for k in RUN_FIELDS if k in stretch[0]}}
        points = [{k: v for k, v in r.items() if k not in ("device", "date", *RUN_FIELDS)} for r in stretch]
        names = list(dict.fromkeys(k for p in points for k in p))
        text = [{k: json.dumps(v) for k, v in p.items()} for p in points]  # compared as written: 1 is not 1.0
        same = {k: points[0][k] for k in names
                if len(points) > 1 and k in text[0] and all(t.get(k) == text[0][k] for t in text)}
        columns = [k for k in names if k not in same]
        f.write(json.dumps({"run": header, "same": same, "columns": columns}, **compact) + "\n")
        for p in points:
            f.write(json.dumps([p.get(k) for k in columns], **compact) + "\n")


def _run_of(row: dict) -> str:
    """What identifies a row's run: its device, date, versions and commit."""
    return json.dumps([row["device"], row["date"], *(row.get(k) for k in RUN_FIELDS)])


def add(paths: list[Path], history: Path = HISTORY, ab_base: bool = False) -> int:
    """Append the rows of each run not yet in the history; the number of rows appended. ``ab_base``:
    the runs are of an older version, measured beside a newer one (role ``ab-base``)."""
    seen = {(r["device"], r["date"], r["op"]) for r in load(history)}
    new = []
    for path in paths:
        rows = [{**r, "role": "ab-base"} if ab_base else r
                for r in rows_from_file(path) if (r["device"], r["date"], r["op"]) not in seen]
        if not rows and not rows_from_file(path):
            print(f"{path}: not the JSON of one of benchmarks/'s runners, skipped", file=sys.stderr)
        new += rows
        seen |= {(r["device"], r["date"], r["op"]) for r in rows}
    history.parent.mkdir(parents=True, exist_ok=True)
    with _open(history, "a") as f:
        write(sorted(new, key=lambda r: r["date"]), f)
    return len(new)


def latest(rows: list[dict]) -> dict[str, list[dict]]:
    """Per device slug, the newest row of each (op, backend, shape, dtype, direction, mode)."""
    newest: dict[tuple, dict] = {}
    for r in rows:
        if r.get("role") == "ab-base":
            continue
        key = (device_slug(r["device"]), *(r.get(k) for k in KEY))
        if key not in newest or r["date"] >= newest[key]["date"]:
            newest[key] = r
    by_device = defaultdict(list)
    for key, r in newest.items():
        by_device[key[0]].append(r)
    return dict(sorted(by_device.items()))


# ----------------------------------------------------------------------------- the summaries

OP_ORDER = ("copy", "swap", "scal", "axpby", "dot", "gemv", "geru", "gemm", "softmax", "log_softmax",
            "cross_entropy", "layer_norm", "rms_norm", "swiglu", "rope", "embedding", "attention", "gpt_train",
            "gpt_decode")
BACKENDS = ("python", "pytorch", "triton", "cute")


def _order(r: dict):
    op = OP_ORDER.index(r["op"]) if r["op"] in OP_ORDER else len(OP_ORDER)
    backend = BACKENDS.index(r["backend"]) if r["backend"] in BACKENDS else -1
    direction = ("fwd", "bwd").index(r["direction"]) if r["direction"] in ("fwd", "bwd") else 2
    return op, direction, r["dtype"], r["shape"], backend, r["backend"]


def target_rows(rows: list[dict]) -> list[dict]:
    return sorted((r for r in rows if r.get("goal") is not None), key=_order)


def _met(r: dict) -> str:
    met = r["fraction"] >= r["goal"] and (r.get("ratio") is None or r["ratio"] >= 1)
    return "met" if met else "missed"


def device_markdown(slug: str, rows: list[dict]) -> str:
    """``latest/<device>.md``: the newest target points and training throughput of one device."""
    dates = sorted({r["date"][:10] for r in rows})
    names = sorted({r["device"] for r in rows})
    versions = sorted({", ".join(f"{k} {v}" for k, v in r["versions"].items()) for r in rows if r.get("versions")})
    out = [f"# Latest benchmark results: {', '.join(names)}", "",
           f"Generated by `python -m benchmarks.history latest` from [`history.jsonl.gz`](../history.jsonl.gz): the newest "
           f"measurement of each point, taken {dates[0]} to {dates[-1]} (UTC) with {'; '.join(versions)}. "
           "How each point is measured: [`benchmarks/README.md`](../../README.md).", "",
           f"![fraction of the ceiling at the target points]({slug}.png)", "",
           "## Target points", "",
           "| op | dir | shape | dtype | backend | ms | rate | fraction of ceiling | vs torch eager | goal | result | date |",
           "|---|---|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in target_rows(rows):
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "-"
        out.append(f"| {r['op']} | {r['direction']} | {r['shape']} | {r['dtype']} | {r['backend']} | {r['ms']:.4f} "
                   f"| {r['rate']:.4g} {r['unit']} | {r['fraction']:.3f} of {r['ceiling']} | {ratio} "
                   f"| >= {r['goal']:.2f} | {_met(r)} | {r['date'][:10]} |")
    def section(title: str, note: str, columns: str, cells, picked: list[dict]) -> None:
        """A table of ``picked`` rows under ``title``: ``columns`` "name | name> | ..." (">": a number,
        right-aligned), each row's cells from ``cells(r)``."""
        if not picked:
            return
        names = [c.strip() for c in columns.split("|")]
        out.extend(["", f"## {title}", "", *([note, ""] if note else []),
                    "| " + " | ".join(n.rstrip(">") for n in names) + " |",
                    "|" + "|".join("---:" if n.endswith(">") else "---" for n in names) + "|"])
        out.extend("| " + " | ".join(cells(r)) + " |" for r in picked)

    def ratio(r, baseline=False):
        if r.get("ratio") is None:
            return "-"
        return f"{r['ratio']:.2f}x" + (f" ({r['baseline']})" if baseline else "")

    def number(value, spec):
        return "-" if value is None else format(value, spec)

    section("GPT training step (`benchmarks/gpt.py`)",
            "Host ms: a step's Python and launches alone, begun on an idle GPU (near ms / step or above it, the "
            "host sets the pace); - where not measured.",
            "model | backend | mode | dtype | ms / step> | host ms> | tokens/s> | vs its torch.nn baseline> | date",
            lambda r: (r["shape"], r["backend"], r.get("mode", "-"), r["dtype"], f"{r['ms']:.2f}",
                       number(r.get("host_ms"), ".1f"), f"{r['rate']:,.0f}", ratio(r), r["date"][:10]),
            sorted((r for r in rows if r["op"] == "gpt_train" and "gpus" not in r and "ms" in r),
                   key=lambda r: (r["shape"], r.get("mode", ""), _order(r))))
    section("First training step of a new process (`benchmarks/gpt.py --cold-start`)",
            "Compiled kernels and tuning picks of an earlier process on disk; target <= 5 s.",
            "model | backend | dtype | first step s> | whole process s> | date",
            lambda r: (r["shape"], r["backend"], r["dtype"], f"{r['first_step_s']:.2f}",
                       number(r.get("process_s"), ".1f"), r["date"][:10]),
            sorted((r for r in rows if r["op"] == "gpt_train" and r.get("mode") == "cold start"),
                   key=lambda r: (r["shape"], _order(r))))
    section("GPT training over GPUs (`benchmarks/scaling.py`)",
            "Batch per GPU fixed. Efficiency: tokens/s per GPU over the same model's on 1 GPU (target >= 0.90 "
            "with DDP); FSDP2's peak memory per GPU should be below DDP's. Host ms: the slowest rank's median time "
            "to issue a step (near ms / step: the host sets the pace); - where not measured.",
            "model | backend | mode | dtype | ms / step> | host ms> | tokens/s per GPU> | efficiency> | "
            "peak GiB per GPU> | date",
            lambda r: (r["shape"], r["backend"], r["mode"], r["dtype"], f"{r['ms']:.2f}",
                       number(r.get("host_ms"), ".1f"), f"{r['rate']:,.0f}", number(r.get("efficiency"), ".3f"),
                       number(r.get("peak_gib"), ".2f"), r["date"][:10]),
            sorted((r for r in rows if r["op"] == "gpt_train" and "gpus" in r),
                   key=lambda r: (r["shape"], _order(r), r["gpus"], r["mode"])))
    section("GPT decode (`benchmarks/decode.py`)", "",
            "model | backend | mode | dtype | prefill ms> | ms / step> | decode tokens/s> | vs transformers> | date",
            lambda r: (r["shape"], r["backend"], r["mode"], r["dtype"], f"{r['prefill_ms']:.2f}", f"{r['ms']:.3f}",
                       f"{r['rate']:,.0f}", ratio(r, baseline=True), r["date"][:10]),
            sorted((r for r in rows if r["op"] == "gpt_decode"), key=lambda r: (r["shape"], r["mode"], _order(r))))
    section("Fused ops (`benchmarks/fused.py`)",
            "One forward and backward. Speed: the backend's unfused composition's time over the fused op's (target "
            ">= 1.0x); memory: the fused op's peak over the unfused one's (the LM head's target <= 0.25x). torch's "
            "rows are the torch.nn.functional composition, eager and compiled.",
            "op | shape | backend | variant | dtype | ms> | peak GiB> | speed vs unfused> | memory vs unfused> | date",
            lambda r: (r["op"], r["shape"], r["backend"], r["mode"], r["dtype"], f"{r['ms']:.2f}",
                       number(r.get("peak_gib"), ".2f"), ratio(r), number(r.get("memory_ratio"), ".3f"), r["date"][:10]),
            sorted((r for r in rows if r.get("direction") == "fwd+bwd" and r["mode"] in FUSED_MODES),
                   key=lambda r: (r["op"], r["shape"], _order(r), r["mode"])))
    section("Against the peers (`benchmarks/peers.py`)",
            "Per op, direction, dtype and kcourse backend, over the op's sizes: the best peer's ms over ours at "
            "each point (above 1: faster than every peer; target >= 1.00 everywhere, >= 0.95 at no more than two "
            "points per op). Timed eagerly, or as CUDA-graph replays (`--graphed`: the kernels without the host).",
            "op | dir | dtype | backend | timed | lowest> | at (best peer) | highest> | points below 1.00x> | date",
            lambda r: (r["op"], r["direction"], r["dtype"], r["backend"],
                       "graphed" if r["mode"] == "peers graphed" else "eager", f"{r['lowest']:.2f}x",
                       f"{r['shape']} ({r['baseline']})", f"{r['highest']:.2f}x", f"{r['below']} of {r['points']}",
                       r["date"][:10]),
            peer_ranges(rows))
    section("Host time per call (`benchmarks/host.py`)",
            "Tiny operands: the host's time (validation, dispatch, launch), not the GPU's. The ratio is torch's "
            "time over ours.",
            "op | dir | backend | us / call> | vs torch> | date",
            lambda r: (r["op"], r["direction"], r["backend"], f"{r['ms'] * 1000:.1f}", f"{r['ratio']:.2f}x",
                       r["date"][:10]),
            sorted((r for r in rows if r.get("mode") == "host"), key=lambda r: (r["op"], r["direction"], _order(r))))
    section("Cost of the index checks (`benchmarks/index_check.py`)",
            "The device-side check that refuses an out-of-range index, against the op's forward (target: under 2%).",
            "op | backend | shape | op ms> | check ms> | share> | how | date",
            lambda r: (r["op"], r["backend"], r["shape"], f"{r['ms']:.4f}", number(r.get("check_ms"), ".4f"),
                       "-" if r.get("check_share") is None else f"{100 * r['check_share']:.1f}%", r["how"],
                       r["date"][:10]),
            sorted((r for r in rows if r.get("mode") == "index check"), key=lambda r: (r["op"], _order(r))))
    return "\n".join(out) + "\n"


PEER_MODES = ("peers", "peers graphed")  # benchmarks/peers.py eagerly, and with --graphed (kernels alone)


def peer_ranges(rows: list[dict]) -> list[dict]:
    """Per (op, direction, dtype, kcourse backend) of the ``peers`` rows: the lowest ratio to the best
    peer (its row's fields), the highest and how many are below 1."""
    groups = defaultdict(list)
    for r in rows:
        if r.get("mode") in PEER_MODES and not r.get("role") and r.get("ratio") is not None:
            groups[(r["mode"], r["op"], r["direction"], r["dtype"], r["backend"])].append(r)
    out = []
    for group in groups.values():
        ratios = [r["ratio"] for r in group]
        lowest = min(group, key=lambda r: r["ratio"])
        out.append(dict(lowest, lowest=lowest["ratio"], highest=max(ratios), below=sum(x < 1 for x in ratios),
                        points=len(group), date=max(r["date"] for r in group)))
    return sorted(out, key=lambda r: _order(r)[:3] + _order(r)[4:])  # not by shape: each group's lowest's


def device_plot(slug: str, rows: list[dict], path: Path) -> None:
    """A small bar chart: each backend's range of fractions of the ceiling over an op's target points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = defaultdict(list)
    for r in target_rows(rows):
        groups[(f"{r['op']} {r['direction']}", r["backend"])].append(r["fraction"])
    labels = list(dict.fromkeys(k[0] for k in groups))
    backends = [b for b in BACKENDS if any(k[1] == b for k in groups)]
    colors = {"python": "tab:gray", "pytorch": "tab:blue", "triton": "tab:orange", "cute": "tab:green"}
    fig, ax = plt.subplots(figsize=(6.4, 0.28 * len(labels) + 1.0))
    height = 0.8 / max(len(backends), 1)
    for i, b in enumerate(backends):
        ys, lo, hi = [], [], []
        for j, label in enumerate(labels):
            if (label, b) in groups:
                ys.append(j + (i - (len(backends) - 1) / 2) * height)
                lo.append(min(groups[label, b]))
                hi.append(max(groups[label, b]))
        ax.barh(ys, hi, height=height, color=colors.get(b), alpha=0.35)
        ax.barh(ys, lo, height=height, color=colors.get(b), label=b)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("fraction of the ceiling (lowest solid, highest light)", fontsize=7)
    ax.set_title(f"{slug}: target points, newest results", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def write_latest(rows: list[dict], out: Path = LATEST) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for slug, device_rows in latest(rows).items():
        md = out / f"{slug}.md"
        md.write_text(device_markdown(slug, device_rows))
        written.append(md)
        if target_rows(device_rows):
            try:
                device_plot(slug, device_rows, out / f"{slug}.png")
                written.append(out / f"{slug}.png")
            except ImportError:
                print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
    return written


def newest_day(rows) -> list[dict]:
    """The training rows of each (backend, mode) measured on its newest day. A model and batch not
    measured again would otherwise keep an older version's ratio in the README's range beside the
    current one (the device pages keep every configuration's newest row, with its date)."""
    rows = list(rows)
    day: dict[tuple, str] = {}
    for r in rows:
        key = (r["backend"], r.get("mode"))
        day[key] = max(day.get(key, ""), r["date"][:10])
    return [r for r in rows if r["date"][:10] == day[(r["backend"], r.get("mode"))]]


def readme_table(rows: list[dict]) -> str:
    """README.md's performance table: per (op, direction), each device's backends with the range of
    their fractions of the ceiling over the target points (training: tokens/s over its torch.nn baseline)."""
    per_device = latest(rows)
    # a training ratio comes from the newest run that measured one: a run without its torch.nn
    # baseline (benchmarks/ab.py's new side, say) gives no ratio and must not hide an earlier one
    rated = latest([r for r in rows if r["op"] == "gpt_train" and r.get("ratio") is not None
                    and r.get("role") != "baseline"])
    devices = [d for d in per_device if d != "cpu"]
    cells: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    ceilings = {}
    for d in devices:
        for r in target_rows(per_device[d]):
            cells[(r["op"], r["direction"])][d].append(r)
            ceilings[(r["op"], r["direction"])] = r["ceiling"]
        for r in newest_day(rated.get(d, [])):
            cells[("gpt_train", r.get("mode", "eager"))][d].append(r)

    def span(values):
        lo, hi = min(values), max(values)
        return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"

    def dates(d):
        days = sorted({r["date"][:10] for r in per_device[d]})
        return days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"

    head = ["| op | dir | of | " + " | ".join(f"[{d.upper()}](benchmarks/results/latest/{d}.md), {dates(d)}"
                                              for d in devices) + " |",
            "|---|---|---|" + "---|" * len(devices)]
    lines = []
    for (op, direction) in sorted(cells, key=lambda k: (OP_ORDER.index(k[0]) if k[0] in OP_ORDER else 99, k[1] != "fwd", k[1])):
        row = []
        for d in devices:
            by_backend = defaultdict(list)
            for r in cells[(op, direction)].get(d, []):
                by_backend[r["backend"]].append(r["ratio"] if op == "gpt_train" else r["fraction"])
            row.append(" · ".join(f"{b} {span(v)}" for b, v in sorted(
                by_backend.items(), key=lambda kv: BACKENDS.index(kv[0]) if kv[0] in BACKENDS else -1)) or "-")
        if op == "gpt_train":  # each mode against its own torch.nn baseline (eager, compile, autocast ...)
            of = " / ".join(sorted({r.get("baseline", "torch.nn eager").replace(":", " ")
                                    for by_device in cells[(op, direction)].values() for r in by_device}))
        else:
            of = ceilings[(op, direction)]
        lines.append(f"| {op} | {direction} | {of} | " + " | ".join(row) + " |")
    return "\n".join(head + lines)


def write_readme(rows: list[dict], readme: Path = README) -> None:
    text = readme.read_text()
    head, rest = text.split(START)
    _, tail = rest.split(END)
    readme.write_text(f"{head}{START}\n{readme_table(rows)}\n{END}{tail}")


def readme_section(readme: Path = README) -> str:
    text = readme.read_text()
    return text[text.index(START) + len(START):text.index(END)].strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_add = sub.add_parser("add", help="append runs' JSON to history.jsonl.gz, then rewrite latest/ and the README table")
    p_add.add_argument("runs", nargs="+", type=Path)
    p_add.add_argument("--ab-base", action="store_true",
                       help="the runs are of an older version, measured beside a newer one on the same host")
    sub.add_parser("latest", help="rewrite latest/<device>.md and .png from history.jsonl.gz")
    sub.add_parser("readme", help="rewrite README.md's performance table from history.jsonl.gz")
    args = parser.parse_args(argv)
    if args.command == "add":
        print(f"appended {add(args.runs, ab_base=args.ab_base)} rows to {HISTORY.relative_to(ROOT)}")
    rows = load()
    if args.command in ("add", "latest"):
        for path in write_latest(rows):
            print("wrote", path.relative_to(ROOT))
    if args.command in ("add", "readme"):
        write_readme(rows)
        print("wrote README.md's performance table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
