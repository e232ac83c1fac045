"""Shared fixtures: which backends run here, on which device, and at which sizes.

Without a GPU the triton backend runs through Triton's interpreter, switched on here before any
kernel module is imported (``@triton.jit`` reads ``TRITON_INTERPRET`` when it decorates).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist workers share the machine's cores: one worker's intra-op threads beyond its share
# only make the workers wait for each other.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

from kcourse.backend import OPS, has_kernel  # noqa: E402  (after the interpreter switch)

from _util import DEVICE, require_backend  # noqa: E402

# Backends compared against the python reference. `python` itself is checked against float64
# torch in each test file; listing it here too would compare the reference with itself.
COMPARED = ("pytorch", "triton", "cute")


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", COMPARED, indirect=True)


@pytest.fixture
def backend(request):
    name = request.param
    require_backend(name)
    missing = [op for op in _ops_of(request) if not has_kernel(name, op)]
    if missing:
        pytest.skip(f"{name} backend: no kernel yet for {', '.join(missing)}")
    return name


def _module_ops() -> tuple[str, ...]:
    """The ops kcourse.modules can call: those named in its source (``blas.gemm(...)``, or an
    activation's name in a config string); a new op the modules do not use yet is not among them."""
    import re
    from pathlib import Path

    import kcourse.modules

    source = "\n".join(p.read_text() for p in Path(kcourse.modules.__file__).parent.glob("*.py"))
    return tuple(op for op in OPS if re.search(rf"\b{op}\b", source))


MODULE_OPS = _module_ops()


def _op_of(module: str, params: dict) -> str | None:
    """A test's op: its file's (tests/test_<op>.py), else its ``case``'s (test_autograd's "gemm_bias" ->
    gemm, test_add_norm's "add_rms_norm"), else None."""
    op = module.removeprefix("test_")
    if op in OPS:
        return op
    case = params.get("case")
    if isinstance(case, str):
        for op in OPS:
            if case == op or case.startswith(op + "_"):
                return op
    return None


def _ops_of(request) -> tuple[str, ...]:
    """The ops a test needs: its op (``_op_of``), else the ops the modules call (modules, training,
    compile)."""
    op = _op_of(request.module.__name__, getattr(getattr(request.node, "callspec", None), "params", {}))
    return MODULE_OPS if op is None else (op,)


@pytest.fixture
def triton_chunks(monkeypatch):
    """The triton norm kernels with tiny blocks, so rows of a few hundred columns take the chunked path."""
    require_backend("triton")
    from kcourse.blas.triton import _norm

    monkeypatch.setattr(_norm, "ON_CHIP_FORWARD", 256)
    monkeypatch.setattr(_norm, "ON_CHIP_BACKWARD", 128)
    monkeypatch.setattr(_norm, "CHUNK_D", 128)


@pytest.fixture
def tf32():
    """TF32 matmuls on for the test, restored after. (Not monkeypatch.setattr: torch's
    ``allow_tf32`` is a property of a module object, which monkeypatch cannot undo on pytest 9.2.)"""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = True
    yield
    matmul.allow_tf32 = before


@pytest.fixture(autouse=True)
def _release_gpu_memory(request):
    """A realistic-size test hands its memory back to the driver, so workers sharing the GPU fit."""
    yield
    if DEVICE == "cuda" and "gpu" in request.keywords:
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def pytest_collection_modifyitems(config, items):
    if DEVICE == "cuda":
        return
    # Whole Llama-like models through Triton's interpreter (tens of seconds each): -m slow on a CPU.
    # Its ops (rope, swiglu, rms_norm, grouped-query attention) keep their own tests; the GPT-2-like
    # models keep the whole-model triton tests in the default run, but for the fused against the
    # unfused loss (21 s), whose two halves test_gpt_fused_false_runs_each_op_alone (unfused against
    # fused) and test_gpt_matches_python_backend_and_torch_nn (fused) run on triton already.
    # The triton attention cases in float16 as well: under the interpreter half tiles are upcast to
    # float32 (UPCAST), so float16 walks bfloat16's path, which stays (with float32). And the triton
    # count of kernels and copies per GPT step (16 s): the GPU runs count them (-m "slow or not slow").
    slow = pytest.mark.slow
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("backend") == "triton" and (
                params.get("arch") == "llama" or item.originalname in ("test_gpt_fused_and_unfused_loss_agree",
                                                                       "test_kernels_and_copies_per_step")
                or (item.module.__name__ == "test_attention" and params.get("dtype") == torch.float16)):
            item.add_marker(slow)
    skip = pytest.mark.skip(reason="realistic-size GPU test: needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ----------------------------------------------------------------------------- verification record
# With KCOURSE_RECORD=path, the run writes which (op, backend) pairs its tests passed or failed;
# `scripts/op_table.py record` folds such a file into docs/verified.json, from which the README's
# op x backend table is generated.
_record: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # tag the report with (op, backend); it travels to the controller under pytest-xdist too
    outcome = yield
    report = outcome.get_result()
    module = item.module.__name__
    if report.when != "call" or not module.startswith("test_"):
        return
    params = getattr(getattr(item, "callspec", None), "params", {})
    backend = params.get("backend") or ("python" if item.originalname == "test_python_reference" else None)
    if backend is not None:
        report.user_properties.append(("kcourse", (_op_of(module, params) or module[len("test_"):], backend)))


def pytest_runtest_logreport(report):
    # KCOURSE_FAIL_LOG=path: each failure's report is appended as it arrives, so a run stopped by a
    # time limit (a device call) keeps what failed and why
    path = os.environ.get("KCOURSE_FAIL_LOG")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as f:
            f.write(f"{'=' * 30} {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")
    for key, value in report.user_properties:
        if key == "kcourse" and report.when == "call" and not report.skipped:
            op, backend = value
            counts = _record.setdefault(op, {}).setdefault(backend, {"passed": 0, "failed": 0})
            counts["passed" if report.passed else "failed"] += 1


def pytest_unconfigure(config):
    # after the last test: KCOURSE_RECORD=path gets the per-op counts (the GPU runs' record)
    path = os.environ.get("KCOURSE_RECORD")
    if not path or hasattr(config, "workerinput"):  # xdist workers: the controller writes
        return
    import datetime
    import json
    import platform

    meta = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (triton interpreter)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": _record}, f, indent=1, sort_keys=True)


@pytest.fixture
def triton_tma(monkeypatch):
    """Records each gemm the triton backend sends to its Hopper kernel (test_gemm, test_linear). On an
    sm_90 GPU the kernel is tuned over two configs only (a 128 x 256 and a 128 x 64 tile: both tile
    paths, and the tuning runs of an in-place product, for few compiles); without a GPU the
    dispatcher's device check is bypassed, so the kernel runs through Triton's interpreter."""
    require_backend("triton")
    from kcourse.blas.triton import _gemm_tma, gemm as triton_gemm

    if DEVICE == "cuda":
        if torch.cuda.get_device_capability()[0] != 9:
            pytest.skip("the triton Hopper gemm runs on sm_90 GPUs only")
        monkeypatch.setattr(_gemm_tma, "tuned", _gemm_tma.autotuned([_gemm_tma.CONFIGS[0], _gemm_tma.CONFIGS[-1]]))
    else:
        monkeypatch.setattr(triton_gemm, "tma_plan", _gemm_tma.tma_layouts)
    calls = []

    def recorded(*args):
        calls.append(args[6])  # the plan
        return _gemm_tma.gemm_tma(*args)

    monkeypatch.setattr(triton_gemm, "gemm_tma", recorded)
    return calls
