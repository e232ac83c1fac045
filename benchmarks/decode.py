"""Decode throughput of kcourse's GPT.generate against transformers' generate, same weights, one process.

    python -m benchmarks.decode --out DIR                                  # GPT-2 and Llama-like ~124M, B = 1 and 16
    python -m benchmarks.decode --out DIR --archs gpt2 --batches 16 --backends triton
    python -m benchmarks.decode --out DIR --variants eager,static           # a subset (see --variants)
    python -m benchmarks.decode --out /tmp/d --tiny --device cpu --backends python   # smoke test, no GPU
    python -m benchmarks.history add DIR/decode.json

Models, bf16 weights (--dtype): ``gpt2``, GPT-2 124M (12 layers, width 768, 12 heads, vocabulary
50304, learned positions, layernorm, tanh GELU, biases, tied head) and ``llama``, a Llama-like model
of about the same size (12 layers, width 768, 12 query heads sharing 4 key/value heads, rope,
rmsnorm, SwiGLU of width 2048, no biases, untied head: ~152M parameters). Each is a transformers
``GPT2LMHeadModel`` / ``LlamaForCausalLM`` built from its config (``kcourse.modules.hf.hf_config``;
nothing is downloaded) with transformers' own random initialization under seed 0, and kcourse's
GPT on each backend is ``GPT.from_hf`` of it: the same weights.

A variant is MODEL:MODE. MODEL is ``transformers`` or a kcourse backend (--backends; python is
skipped on CUDA, too slow). The modes:
  transformers:static          generate(cache_implementation="static", disable_compile=True): a static
                               KV cache, the forward eager
  transformers:static-compile  generate(cache_implementation="static"), what transformers does by
                               default on CUDA with a static cache: the decode forward torch.compile'd
                               (its CompileConfig: mode="reduce-overhead", CUDA graphs); CUDA only
  transformers:dynamic         generate() with its default DynamicCache, eager
  B:eager                      GPT.generate(temperature=0): the prompt into a KVCache, then one
                               token per step, every op through backend B
  B:graph                      GPT.generate(temperature=0, cuda_graph=True): the prompt eager into a
                               static cache, then every decode step a replay of one CUDA graph
                               (kcourse.modules.generate.GraphedStep, kept on the model between
                               calls as transformers keeps its compiled forward); CUDA only
  B:compile                    the prefill eager, then the decode step (one token through every
                               layer, the head, argmax) under torch.compile(fullgraph=True)
  B:compile-breaks             the same step under torch.compile(fullgraph=False) (not a default
                               variant: --variants compile-breaks)
  B:compile-static             the decode step on a static cache (GPT.kv_cache(static=True), kept
                               between calls, its buffers marked as static addresses) under
                               torch.compile(fullgraph=True, mode="reduce-overhead"): inductor's
                               CUDA graphs of kcourse's step, as transformers compiles its own
transformers' generate always gets do_sample=False, max_new_tokens = min_new_tokens = --new-tokens
(it never stops early; the models have no EOS token anyway) and an all-ones attention mask. Each
kcourse mode is compared with the transformers mode of the same kind (``baseline``, ``ratio`` =
our decode tokens/s over its): eager with static, graph, compile and compile-breaks with
static-compile (static on the CPU).

The compiled decode step reads the cache that GPT.generate uses without ``cuda_graph``: per layer
one ``(B, Hkv, max_len, hd)`` buffer of which attention reads the first ``pos + 1`` positions, so
the attention op's Tk grows by one each step. torch.compile handles that (after a recompile,
dynamo's automatic dynamic shapes make the length symbolic) but runs each op with its host cost.
The graph mode instead attends over the whole static buffer with the attention op's ``kv_len``
(read on the device), which a CUDA graph replays. The compiled step traces whole (fullgraph=True;
tests/test_compile.py); compile-breaks is the same without fullgraph, for comparison.

Method. For each (arch, batch) the prompt is --prompt-len random tokens per row (seeded). Each
variant's generate runs once untimed (its ``first_call_s``: compiling, autotuning, CUDA graph
capture), then ``generate(prompt, N)`` and ``generate(prompt, 1)`` (N = --new-tokens) are each
timed by ``benchmarks/timing.py``'s ``cpu_ms``: the median wall time of --repeats calls after a
warm-up call, each call ending in ``torch.cuda.synchronize()`` (generate is a host-driven loop and
transformers' stopping check synchronizes each step, so the wall time is its latency). prefill =
generate(prompt, 1): the prompt's forward, the head and the first token (and generate's own setup,
e.g. transformers allocating its static cache). decode = generate(prompt, N) - prefill: the N - 1
decode steps, each one token per row; decode tokens/s = batch * (N - 1) / decode.

Check. For each (arch, batch) a reference is computed first, untimed: transformers' generate with
the static cache, eager (the static mode), with the logits that chose each token. Each variant's
tokens (from its untimed first call) are compared with it:
  matched        the number of leading new tokens equal in every row
  tokens_equal   whether the first --check-tokens (8) are equal in every row
  divergences    each row that differs somewhere: (row, step of its first difference, gap), gap =
                 the reference's logit of its own token minus its logit of ours, over the largest
                 |logit| at that step (up to there the two contexts are the same, so the reference's
                 logits judge our token)
  tokens_match   every gap <= --tie-tol (2e-2): the rows equal the reference up to a near-tie
tokens_match is the check (a failing variant is marked MISMATCH in the table, and history.py records
only matching ones); tokens_equal is the stricter one that bf16 often fails at full size: with
random weights the logits of a 50k vocabulary are nearly flat (the top two often round to the same
bf16 value), so two correct implementations part after a few tokens, in some row even at the first
(measured on the CPU: gaps 0 to 0.007 where kcourse and transformers part; positions one off in the
position table gave 0.14 to 0.47). Random weights also make attention nearly uniform, so the check
catches what changes the hidden states broadly (weights, cache contents, layouts, the wrong
token), not necessarily a small error in the positions of a rope model.

A variant that fails is recorded with its error and the traceback's tail; the others still run.
The eager variants of every (arch, batch) run first, the compiled ones (long first calls) after
them; after a compiled variant torch._dynamo.reset() runs (as in benchmarks/gpt.py). DIR/decode.json
is rewritten after every variant; --time-limit starts no variant after so many seconds (the rest
are recorded as not run), so a bounded run still writes its table.

Cost on an H200 (16 host cores, torch 2.11), 128 new tokens, --repeats 5: GPT-2 and the Llama-like
model at batch 1 and 16 with transformers:static, transformers:static-compile and every backend's
eager and graph modes (32 variants) took about 400 s. First calls (``first_call_s``) were 1.4-26 s
eager (triton's autotuning of new shapes the longest), 0.14-24 s graph (the capture; triton's
tuning where eager had not run first) and 7-16 s for transformers:static-compile (it compiles again
after each dynamo reset); each timed generate call of 128 tokens then takes 1-3.5 s eager (9-26 ms
a step) and 0.1-0.6 s graph.
"""
from __future__ import annotations

import argparse
import gc
import json
import re
import time
import traceback
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.timing import cpu_ms
from kcourse.modules import GPT, GPTConfig, set_backend
from kcourse.modules.hf import hf_config

ROOT = Path(__file__).resolve().parents[1]
ARCHS = {
    "gpt2": dict(activation="gelu_tanh"),  # GPT-2's gelu_new
    "llama": dict(activation="swiglu", norm="rmsnorm", pos="rope", bias=False, n_kv_head=4, tie_weights=False,
                  mlp_hidden=2048),
}
TINY_ARCHS = {"gpt2": dict(activation="gelu_tanh"),
              "llama": dict(activation="swiglu", norm="rmsnorm", pos="rope", bias=False, n_kv_head=2,
                            tie_weights=False, mlp_hidden=96)}
TRANSFORMERS_MODES = ("static", "static-compile", "dynamic")
KCOURSE_MODES = ("eager", "graph", "compile", "compile-static", "compile-breaks")
BASELINE = {"eager": "static", "graph": "static-compile", "compile": "static-compile",
            "compile-static": "static-compile", "compile-breaks": "static-compile"}


def config(arch: str, tiny: bool) -> GPTConfig:
    if tiny:
        return GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64, **TINY_ARCHS[arch])
    return GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, **ARCHS[arch])


def variant_names(args) -> tuple[list[str], dict[str, str]]:
    """The variants to run per (arch, batch), in order, and the ones skipped with the reason."""
    backends, skipped = common.usable_backends(args.backends, args.cuda)
    every = [f"transformers:{m}" for m in TRANSFORMERS_MODES] + [f"{b}:{m}" for b in backends for m in KCOURSE_MODES]
    names = [n for n in every if not n.endswith(":compile-breaks")]
    if args.variants:
        wanted = args.variants.split(",")
        known = {*every, *TRANSFORMERS_MODES, *KCOURSE_MODES, "transformers", *args.backends, *skipped}
        bad = [w for w in wanted if w not in known]
        if bad:
            raise SystemExit(f"--variants: unknown {', '.join(bad)}; give MODEL:MODE, a MODE "
                             f"({', '.join(TRANSFORMERS_MODES + KCOURSE_MODES)}) or a MODEL "
                             f"(transformers, {', '.join(args.backends)})")
        names = [n for n in every if n in wanted or n.partition(":")[2] in wanted
                 or (n in names and n.partition(":")[0] in wanted)]
    if not args.cuda and "transformers:static-compile" in names:
        names.remove("transformers:static-compile")
        skipped["transformers:static-compile"] = "transformers compiles its decode forward only on CUDA"
    for name in [n for n in names if n.endswith(":graph") and not args.cuda]:
        names.remove(name)
        skipped[name] = "CUDA graphs need a GPU"
    return names, skipped


def sync(args) -> None:
    if args.cuda:
        torch.cuda.synchronize()


def hf_generate(hf, mode: str):
    """``gen(prompt, n)``: transformers' greedy generate of exactly ``n`` tokens in ``mode``."""
    options = {"static": dict(cache_implementation="static", disable_compile=True),
               "static-compile": dict(cache_implementation="static"), "dynamic": {}}[mode]

    def gen(prompt, n, **more):
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, pad_token_id=0, **options, **more)
    return gen


def kcourse_generate(gpt: GPT, mode: str):
    """``gen(prompt, n)``: kcourse's greedy tokens, GPT.generate (eager) or a compiled decode step."""
    if mode in ("eager", "graph"):
        return lambda prompt, n: gpt.generate(prompt, n, temperature=0, cuda_graph=mode == "graph")

    def step(tok, cache):  # one token per row through every layer, the head and argmax
        return gpt.lm_head(gpt.hidden_states(tok, cache)[:, -1]).argmax(dim=-1, keepdim=True)

    if mode == "compile-static":
        return compiled_static_generate(gpt, step)
    compiled = torch.compile(step, fullgraph=mode == "compile")

    @torch.no_grad()
    def gen(prompt, n):
        cache = gpt.kv_cache(prompt.shape[1] + n - 1)
        tok = step(prompt, cache)  # the prefill, eager
        out = [prompt, tok]
        for _ in range(n - 1):
            tok = compiled(tok, cache)
            out.append(tok)
        return torch.cat(out, dim=1)
    return gen


def compiled_static_generate(gpt: GPT, step):
    """``gen(prompt, n)`` with every decode step a call of ``step`` compiled with reduce-overhead on a
    static cache of block_size positions, one per batch size, kept between calls (the graphs read its
    buffers at fixed addresses: marked static once the prefill has made them)."""
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    caches = {}

    @torch.no_grad()
    def gen(prompt, n):
        cache = caches.get(prompt.shape[0])
        fresh = cache is None
        if fresh:
            cache = caches[prompt.shape[0]] = gpt.kv_cache(gpt.config.block_size, static=True)
        cache.reset()
        tok = step(prompt, cache)  # the prefill, eager (the first one allocates the buffers)
        if fresh:
            for t in (*cache.k, *cache.v, cache.length):
                torch._dynamo.mark_static_address(t)
        out = [prompt, tok]
        for _ in range(n - 1):
            tok = compiled(tok, cache).clone()  # the graph's output is overwritten by its next replay
            out.append(tok)
        return torch.cat(out, dim=1)
    return gen


def reference_tokens(hf, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' greedy tokens ``(B, P + n)`` (static cache, eager) and the logits that chose
    each new token, ``(B, n, V)`` float32."""
    out = hf_generate(hf, "static")(prompt, n, return_dict_in_generate=True, output_logits=True)
    return out.sequences, torch.stack(out.logits, dim=1).float()


def compare(tokens: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor], P: int, args) -> dict:
    """How far ``tokens (B, P + N)`` follow the reference: ``matched``, the leading new tokens equal
    in every row; ``tokens_equal``, the first --check-tokens equal in every row; ``divergences``,
    each differing row's first difference (row, step, the reference's logit of its own token minus
    that of ours, over the largest |logit| there); ``tokens_match``, every such gap at most
    --tie-tol (a near-tie: up to there the contexts are the same, so the reference's logits judge
    our token)."""
    ref, logits = reference
    if tokens.shape != ref.shape:
        raise RuntimeError(f"generate returned {tuple(tokens.shape)}, expected {tuple(ref.shape)} (B, P + N)")
    ours, theirs = tokens[:, P:], ref[:, P:]
    divergences = []
    for b, row in enumerate((ours != theirs).tolist()):
        if True in row:
            i = row.index(True)
            scores = logits[b, i]
            gap = (scores[theirs[b, i]] - scores[ours[b, i]]) / scores.abs().max()
            divergences.append((b, i, round(gap.item(), 5)))
    N = ours.shape[1]
    matched = min((i for _, i, _ in divergences), default=N)
    return {"matched": matched, "tokens_equal": matched >= min(args.check_tokens, N),
            "tokens_match": all(gap <= args.tie_tol for _, _, gap in divergences),
            "divergences": divergences[:32]}


def run_variant(gen, args, prompt: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor]) -> dict:
    P, N, B = prompt.shape[1], args.new_tokens, prompt.shape[0]

    def timed(n):
        def call():
            gen(prompt, n)
            sync(args)
        return call

    start = time.perf_counter()
    tokens = gen(prompt, N)
    sync(args)
    first = time.perf_counter() - start
    check = compare(tokens, reference, P, args)
    generate_ms = cpu_ms(timed(N), args.repeats)
    prefill_ms = cpu_ms(timed(1), args.repeats)
    decode_ms = generate_ms - prefill_ms
    return {"prefill_ms": prefill_ms, "generate_ms": generate_ms, "decode_ms": decode_ms,
            "decode_ms_per_token": decode_ms / (N - 1),
            "decode_tokens_per_s": B * (N - 1) / (decode_ms / 1e3) if decode_ms > 0 else None,
            "first_call_s": first, **check}


def measure(name: str, gen, args, prompt, reference) -> dict:
    """``run_variant``, with an error reported rather than raised."""
    try:
        result = run_variant(gen, args, prompt, reference)
    except Exception as e:  # one failing variant must not hide the others
        tail = "".join(traceback.format_exc().splitlines(keepends=True)[-25:])[-4000:]
        error = f"{type(e).__name__}: {e}"  # dynamo's message ends with the user code it stopped in: keep both ends
        result = {"error": error if len(error) <= 3000 else f"{error[:1500]} [...] {error[-1500:]}", "traceback": tail}
        print(f"    failed: {short(error)}", flush=True)
    if "compile" in name:
        torch._dynamo.reset()
    if args.cuda or "compile" in name or "error" in result:  # graphs, pools, a traceback's frames (~0.3 s a call)
        gc.collect()
    if args.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if "error" not in result:
        rate = result["decode_tokens_per_s"]
        print(f"    prefill {result['prefill_ms']:.2f} ms, decode {rate or 0:,.0f} tokens/s, first call "
              f"{result['first_call_s']:.2f} s, {result['matched']}/{args.new_tokens} leading tokens as transformers"
              f"{'' if result['tokens_match'] else ' (MISMATCH: not a near-tie)'}", flush=True)
    return result


def ratios(runs: list[dict]) -> None:
    """Each kcourse run's decode tokens/s over its transformers baseline's (same arch and batch), in place."""
    rates = {(r["arch"], r["batch"], r["variant"]): r.get("decode_tokens_per_s") for r in runs}
    for r in runs:
        if r["model"] == "transformers" or not r.get("decode_tokens_per_s"):
            continue
        base = f"transformers:{BASELINE[r['mode']]}"
        if (r["arch"], r["batch"], base) not in rates and r["mode"] != "eager":
            base = "transformers:static"  # the CPU: no static-compile
        r["baseline"] = base
        rate = rates.get((r["arch"], r["batch"], base))
        r["ratio"] = r["decode_tokens_per_s"] / rate if rate else None


def meta(args, models: dict) -> dict:
    return {"benchmark": "decode", **common.environment(args.device), "dtype": args.dtype,
            "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "batches": args.batches,
            "repeats": args.repeats, "check_tokens": args.check_tokens, "tie_tol": args.tie_tol, "tiny": args.tiny, "models": models}


def short(error: str) -> str:
    """An error's first line, and for dynamo's the innermost line of user code it stopped in."""
    first = error.splitlines()[0][:120]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', error.partition("from user code:")[2])
    return f"{first} (at {Path(frames[-1][0]).name}:{frames[-1][1]} in {frames[-1][2]})" if frames else first


def table(results: dict) -> str:
    m = results["meta"]
    lines = [f"decode: prompt {m['prompt_len']} tokens, {m['new_tokens']} new, {m['dtype']}, {m['device']}, "
             f"torch {m['torch']}, transformers {m['transformers']}, triton {m['triton']}",
             f"  {'arch':5s} {'B':>3s} {'variant':28s} {'prefill ms':>10s} {'decode tok/s':>12s} {'ms/step':>8s} "
             f"{'ratio':>6s} {'baseline':27s} {'1st call s':>10s} {'matched':>7s}"]
    for r in results["decode"]:
        head = f"  {r['arch']:5s} {r['batch']:>3d} {r['variant']:28s}"
        if "error" in r:
            lines.append(f"{head} FAILED: {short(r['error'])}")
            continue
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else "-"
        rate = f"{r['decode_tokens_per_s']:,.0f}" if r["decode_tokens_per_s"] else "-"
        lines.append(f"{head} {r['prefill_ms']:10.2f} {rate:>12s} {r['decode_ms_per_token']:8.2f} {ratio:>6s} "
                     f"{r.get('baseline', ''):27s} {r['first_call_s']:10.2f} {r['matched']:>7d}"
                     f"{'' if r['tokens_match'] else '  MISMATCH'}")
    for name, why in results["skipped"].items():
        lines.append(f"  {name if ':' in name else name + ':*':38s} skipped: {why}")
    lines.append("  matched: leading new tokens equal to transformers' (static cache, eager) in every row; MISMATCH: "
                 f"a row whose first differing token is not a near-tie (gap over max |logit| > {m['tie_tol']:g})")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="writes OUT/decode.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="pytorch,triton,cute", help="kcourse backends (comma list)")
    p.add_argument("--archs", default="gpt2,llama", help="comma list of gpt2, llama")
    p.add_argument("--batches", default="1,16", help="comma list of batch sizes")
    p.add_argument("--variants", default=None,
                   help="comma list of MODEL:MODE names, MODEs or MODELs (all variants matching any); default: "
                        "every transformers mode and every backend's eager and compile")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per row (default 128, --tiny 8)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per row (default 128, --tiny 8)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each generate (the median is kept)")
    p.add_argument("--check-tokens", type=int, default=8,
                   help="tokens_equal: whether this many leading new tokens equal transformers' in every row")
    p.add_argument("--tie-tol", type=float, default=2e-2,
                   help="tokens_match: the largest gap, over max |logit|, between transformers' logit of its "
                        "token and of ours where a row first differs (a near-tie)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--tiny", action="store_true", help="a tiny model: a smoke test of this script")
    p.add_argument("--time-limit", type=float, default=None,
                   help="start no variant after this many seconds (the rest are recorded as not run)")
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    archs = [a for a in args.archs.split(",") if a]
    if any(a not in ARCHS for a in archs):
        p.error(f"--archs: choose from {', '.join(ARCHS)}")
    args.prompt_len = args.prompt_len or (8 if args.tiny else 128)
    args.new_tokens = args.new_tokens or (8 if args.tiny else 128)
    args.cuda = torch.device(args.device).type == "cuda"
    if args.new_tokens < 2 or args.prompt_len < 1 or args.repeats < 1 or min(args.batches, default=0) < 1:
        p.error("--new-tokens must be >= 2 (one prefill token, then decode steps); --prompt-len, --repeats and "
                "each batch >= 1")
    names, skipped = variant_names(args)
    import transformers

    dtype = getattr(torch, args.dtype)
    hfs, gpts, models = {}, {}, {}
    for arch in archs:
        c = config(arch, args.tiny)
        if args.prompt_len + args.new_tokens > c.block_size:
            p.error(f"--prompt-len + --new-tokens ({args.prompt_len + args.new_tokens}) exceed the model's "
                    f"block_size ({c.block_size})")
        hc = hf_config(c)
        torch.manual_seed(0)
        cls = transformers.GPT2LMHeadModel if hc.model_type == "gpt2" else transformers.LlamaForCausalLM
        hfs[arch] = cls(hc).to(args.device, dtype).eval()
        gpts[arch] = GPT.from_hf(hfs[arch]).eval()  # the same weights; set_backend picks each variant's backend
        models[arch] = {"class": cls.__name__, "parameters": sum(t.numel() for t in hfs[arch].parameters()),
                        "attn_implementation": hfs[arch].config._attn_implementation, **vars(c)}
    results = {"meta": meta(args, models), "skipped": skipped, "decode": []}
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    # the eager variants of every (arch, batch) first, the compiled ones (long first calls) after them
    jobs = [(arch, batch, name) for compiled in (False, True) for arch in archs for batch in args.batches
            for name in names if ("compile" in name) == compiled]
    order = {job: k for k, job in enumerate((a, b, n) for a in archs for b in args.batches for n in names)}
    prompts, references = {}, {}
    start = time.perf_counter()
    for arch, batch, name in jobs:
        model, _, mode = name.partition(":")
        row = {"arch": arch, "batch": batch, "variant": name, "model": model, "mode": mode}
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            row["error"] = f"not run: --time-limit {args.time_limit:g} s reached"
        else:
            if (arch, batch) not in prompts:
                gen = torch.Generator().manual_seed(batch)
                prompt = torch.randint(0, models[arch]["vocab_size"], (batch, args.prompt_len), generator=gen)
                prompts[arch, batch] = prompt.to(args.device)
                print(f"{arch}, batch {batch}: the reference (transformers, static cache, eager)", flush=True)
                references[arch, batch] = reference_tokens(hfs[arch], prompts[arch, batch], args.new_tokens)
            print(f"{arch}, batch {batch}: {name} ...", flush=True)
            if model == "transformers":
                generate = hf_generate(hfs[arch], mode)
            else:
                generate = kcourse_generate(set_backend(gpts[arch], model), mode)
            row.update(measure(name, generate, args, prompts[arch, batch], references[arch, batch]))
            if name == "transformers:static-compile":  # whether generate took its compiled forward
                row["transformers_compiled"] = hasattr(hfs[arch], "_compiled_call")
        results["decode"].append(row)
        results["decode"].sort(key=lambda r: order[r["arch"], r["batch"], r["variant"]])
        ratios(results["decode"])
        (args.out / "decode.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(results), flush=True)
    return results

if __name__ == "__main__":
    main()
