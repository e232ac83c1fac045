"""Convert a Hugging Face transformers GPT-2 or Llama into kcourse, check it, and generate text.

    python examples/hf_generate.py --arch llama --backend pytorch            # a small random Llama
    python examples/hf_generate.py --checkpoint ~/models/gpt2 --backend triton --device cuda \\
        --prompt "The meaning of life is" --max-new-tokens 40 --cuda-graph

Without --checkpoint the model is built from a small config with random weights and a byte
vocabulary (token = byte), so its text is noise: the point is the check. With --checkpoint, a local
directory saved by ``save_pretrained`` (config.json, the weights and, for text, a tokenizer; nothing
is downloaded) is loaded. Then the script:

1. converts it with ``GPT.from_hf`` onto --backend,
2. compares kcourse's logits of the prompt with transformers' (relative error against --rtol),
3. compares kcourse's greedy tokens (KV cache) with transformers' ``generate(do_sample=False)``,
4. samples --max-new-tokens tokens at --temperature and --top-k, and prints the text.

--cuda-graph (CUDA) decodes as ``GPT.generate(cuda_graph=True)`` does: a static KV cache and each
decode step a replay of one captured CUDA graph (the first call captures it).

It exits with status 1 when the logits differ by more than --rtol.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import kcourse
from kcourse.modules import GPT


def build(arch: str):
    """A small random transformers model over bytes (vocab 256)."""
    import transformers

    tokens = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=256, n_positions=256, n_embd=64, n_layer=2, n_head=4, **tokens)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      **tokens)
    return transformers.LlamaForCausalLM(config)


def load(directory: str):
    """The model (and its tokenizer, or None) saved in a local directory."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    files = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if not any((Path(directory) / f).is_file() for f in files):
        return model, None
    return model, transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="a local directory saved by save_pretrained")
    p.add_argument("--arch", default="gpt2", choices=["gpt2", "llama"], help="the model built without --checkpoint")
    p.add_argument("--backend", default="pytorch", choices=kcourse.backend.NAMES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prompt", default="def main():")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--rtol", type=float, default=None, help="logit tolerance (default 1e-4 float32, 5e-2 bfloat16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cuda-graph", action="store_true", help="decode steps as CUDA graph replays (CUDA only)")
    args = p.parse_args(argv)
    rtol = args.rtol or (1e-4 if args.dtype == "float32" else 5e-2)
    torch.manual_seed(args.seed)

    hf, tokenizer = load(args.checkpoint) if args.checkpoint else (build(args.arch), None)
    hf = hf.to(args.device, getattr(torch, args.dtype)).eval()
    if tokenizer is None and hf.config.vocab_size < 256:
        p.error(f"no tokenizer and a vocabulary of {hf.config.vocab_size} (< 256): cannot encode the prompt as bytes")
    encode = tokenizer.encode if tokenizer else lambda text: list(text.encode())
    decode = tokenizer.decode if tokenizer else lambda ids: bytes(ids).decode("utf-8", errors="replace")
    idx = torch.tensor([encode(args.prompt)], device=args.device)

    gpt = GPT.from_hf(hf, backend=args.backend)
    print(f"{type(hf).__name__} -> kcourse GPT on {args.backend}: {gpt.config}")
    with torch.no_grad():
        theirs, ours = hf(idx).logits.float(), gpt(idx)[0].float()
    error = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    print(f"logits of the {idx.shape[1]}-token prompt: max relative error {error:.2e} (tolerance {rtol:.0e})")

    n = max(0, min(args.max_new_tokens, gpt.config.block_size - idx.shape[1]))  # within the position table
    start = time.perf_counter()
    greedy = gpt.generate(idx, n, temperature=0, cuda_graph=args.cuda_graph)
    seconds = time.perf_counter() - start
    expected = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, do_sample=False,
                           pad_token_id=0)
    same = torch.equal(greedy[:, :expected.shape[1]], expected)  # transformers stops at an end-of-text token
    print(f"greedy, {n} tokens in {seconds:.2f} s: {'identical to' if same else 'DIFFERENT from'} transformers' generate")

    sampled = gpt.generate(idx, n, temperature=args.temperature, top_k=args.top_k, cuda_graph=args.cuda_graph)
    text = decode(sampled[0, idx.shape[1]:].tolist())
    print(f"--- sample (temperature {args.temperature}, top_k {args.top_k}) ---\n{args.prompt}{text}")
    return {"logit_error": error, "rtol": rtol, "greedy_identical": same, "text": text}


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["logit_error"] <= result["rtol"] else 1)
