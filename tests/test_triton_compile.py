"""The triton gemm kernels compile for an sm_90 GPU on any machine: every epilogue activation of the
pointer kernel and of the Hopper (TMA) kernel, both kernels' gated pair (linear_swiglu), and split K's
summing kernel. The interpreter runs the
kernels' Python, not Triton's compiler, so a construct it accepts can still fail to compile (a
constexpr string, a None descriptor); this catches that without a GPU. Each compile runs in a fresh
process without ``TRITON_INTERPRET`` (under pytest here the kernels are interpreted functions)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

COMPILE = textwrap.dedent("""
    import sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kcourse.blas.triton import _gemm_tma, gemm

    TARGET = GPUTarget("cuda", 90, 32)

    def compile_(fn, types, consts, **options):
        sig = {n: "constexpr" if n in consts else types(n) for n in fn.arg_names}
        src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        return triton.compile(src, target=TARGET, options=options)

    scalar = lambda n: "fp32" if n in ("alpha", "beta") else "i32"  # sizes and strides below 2^31, as launched
    what = sys.argv[1]
    for act in sys.argv[2:]:
        none = {"Z_ptr": None} if act == "none" else {}
        if what in ("pointer", "pair"):  # pair: linear_swiglu's two accumulators (B2, C2, Z2)
            single = {"B2_ptr": None, "C2_ptr": None, "Z2_ptr": None} if what == "pointer" else {}
            compile_(gemm.gemm_kernel.fn.fn, lambda n: "*fp16" if n.endswith("_ptr") else scalar(n),
                     {"ACTIVATION": act, "PRECISION": "ieee", "UPCAST": False, "BLOCK_M": 128, "BLOCK_N": 128,
                      "BLOCK_K": 64, "GROUP_M": 8, "EVEN_K": False, **none, **single}, num_warps=8, num_stages=3)
        elif what in ("tma", "tma-pair"):
            pair = what == "tma-pair"
            bm, bn, bk = (128, 128, 64) if pair else (128, 256, 64)
            half = f"tensordesc<fp16[{bm}, {bn // 2}]>"
            desc = {"a_desc": f"tensordesc<fp16[{bm}, {bk}]>", "b_desc": f"tensordesc<fp16[{bn}, {bk}]>",
                    "b2_desc": f"tensordesc<fp16[{bn}, {bk}]>", "out_desc": half, "z_desc": half, "z2_desc": half}
            unused = {**({"z_desc": None} if act == "none" else {}),
                      **({} if pair else {"b2_desc": None, "z2_desc": None, "C2_ptr": None})}
            compile_(_gemm_tma.gemm_tma_kernel, lambda n: desc.get(n, "*fp16" if n.startswith("C") else scalar(n)),
                     {"ACTIVATION": act, "A_KMAJOR": True, "A_BATCHED": False, "B_KMAJOR": True, "B_BATCHED": False,
                      "OUT_BATCHED": False, "SPLIT": False, "NUM_SMS": 132, "BLOCK_M": bm, "BLOCK_N": bn,
                      "BLOCK_K": bk, "GROUP_M": 8, "SUBTILE": True, "WARP_SPECIALIZE": False, **unused},
                     num_warps=8, num_stages=3)
        else:
            compile_(_gemm_tma.splitk_sum_kernel,
                     lambda n: "*fp32" if n == "partial_ptr" else "*fp16" if n.endswith("_ptr") else scalar(n),
                     {"ACTIVATION": act, "BLOCK_M": 16, "BLOCK_N": 128, **none}, num_warps=4)
        print(what, act, "compiled")
""")


@pytest.mark.parametrize("kernel, activations", [
    ("pointer", ["none", "gelu", "gelu_tanh", "relu", "silu"]),
    ("pair", ["silu"]),
    ("tma", ["none", "gelu"]),
    ("tma-pair", ["silu"]),
    ("splitk", ["gelu_tanh"]),
])
def test_gemm_epilogue_compiles_for_sm90(kernel, activations):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", COMPILE, kernel, *activations], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled") == len(activations)
