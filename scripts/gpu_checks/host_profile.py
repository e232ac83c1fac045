"""cProfile of eager kcourse training steps: where the host (Python) time goes.

    PYTHONPATH=. python scripts/gpu_checks/host_profile.py triton [gpt2|llama]

The model and batches of benchmarks/gpt.py (bf16, T = 1024, batch 8, fused AdamW): 5 warm-up
steps, 5 timed ones (ms per eager step), then 5 under cProfile, printed by own time and by
cumulative time. Eager kcourse is host-bound (the GPU work of a step is ~9 ms on an H200, its
eager step ~40 ms): this shows which launches and which Python cost the most.
"""
import cProfile, pstats, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpt as G
from kcourse.modules import GPT

backend = sys.argv[1]
class Args: tiny = False; arch = sys.argv[2] if len(sys.argv) > 2 else "gpt2"; batch = 8; device = "cuda"
c = G.config(Args)
torch.manual_seed(0)
model = GPT(c, backend=backend).to("cuda", torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
data = G.batches(Args, c)
for i in range(5):
    G.train_step(model, opt, *data[i % 4])
torch.cuda.synchronize()
t0 = time.perf_counter()
for i in range(5):
    G.train_step(model, opt, *data[i % 4])
torch.cuda.synchronize()
print(f"{backend}: {(time.perf_counter() - t0) / 5 * 1e3:.1f} ms per eager step")
prof = cProfile.Profile()
prof.enable()
for i in range(5):
    G.train_step(model, opt, *data[i % 4])
torch.cuda.synchronize()
prof.disable()
st = pstats.Stats(prof)
st.sort_stats("tottime").print_stats(35)
st.sort_stats("cumtime").print_stats(45)
