#!/usr/bin/env bash
# The GPU checks: the whole test suite on CUDA (recorded for the README's op table) and the
# benchmarks. Usage (repository root, on the GPU machine): bash scripts/gpu_run.sh "$OUT" [tests|small|large|bench|gpt|cute|fuzz|fuzz-each|all];
# small tests take ~9 minutes on an H200 host (16 cores; cute included; SHARD=1/2 and 2/2 halve them), large ones ~5,
# bench ~4, cute ~3 (+ large): one device call each (10-minute limit).
# A time limit interrupts pytest (SIGINT): it stops its workers and prints what failed.
# Writes $OUT/tests*.log, $OUT/fuzz.log and fuzz-failures.txt, $OUT/verified-{small,large}.json (scripts/op_table.py record takes both), $OUT/bench.log and $OUT/bench.tgz (results.json, PNGs, summary.md).
set -uo pipefail
out=${1:?usage: gpu_run.sh OUTDIR [tests|bench|all]}
what=${2:-all}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)'
} 2>&1 | tee "$out/env.txt"
status=0
if [[ $what == tests || $what == small || $what == all ]]; then
  # small tests on 12 workers; the realistic-size ones (marker gpu, up to ~20 GiB each) on 3
  # SHARD=i/n: every n-th test file from the i-th (1-based): the whole suite no longer fits one call
  files=tests
  if [[ -n ${SHARD:-} ]]; then files=$(ls tests/test_*.py | awk -v i="${SHARD%/*}" -v n="${SHARD#*/}" 'NR % n == i % n'); fi
  KCOURSE_RECORD="$out/verified-small${SHARD:+-${SHARD%/*}}.json" timeout -s INT -k 30 ${SMALL_TIMEOUT:-560} python3 -m pytest -q \
    -p no:cacheprovider -n 12 -m "not gpu" --durations=10 $files 2>&1 | tee "$out/tests.log" | tail -n 30
  status=${PIPESTATUS[0]}
fi
if [[ $what == tests || $what == large || $what == all ]]; then
  KCOURSE_RECORD="$out/verified-large.json" timeout -s INT -k 30 ${LARGE_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -n 3 \
    -m gpu --durations=10 tests 2>&1 | tee "$out/tests-large.log" | tail -n 30
  (( status |= PIPESTATUS[0] ))
fi
if [[ $what == bench || $what == all ]]; then
  timeout 540 python3 -m benchmarks.run --out /tmp/bench --backends ${BENCH_BACKENDS:-pytorch,triton} ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.log" | tail -n 60
  tar -C /tmp -czf "$out/bench.tgz" bench
  timeout 120 python3 -m benchmarks.index_check --out "$out" 2>&1 | tee "$out/index_check.log"  # $out/index_check.json
fi
if [[ $what == cute ]]; then  # the cute backend's tests (source .cute/activate.sh first: DEVELOPERS.md)
  prims="softmax log_softmax cross_entropy layer_norm rms_norm add_norm linear linear_cross_entropy gelu silu relu swiglu embedding rope attention modules training"
  KCOURSE_RECORD="$out/verified-cute-primitives.json" timeout -s INT -k 30 ${CUTE_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
    -n 12 -m "not gpu" -k cute -rf --durations=10 $(for t in $prims; do echo tests/test_$t.py; done) > "$out/tests-cute-primitives.log" 2>&1
  status=$?; tail -n 3 "$out/tests-cute-primitives.log"
  blas="copy swap scal axpby dot gemv geru gemm autograd"
  KCOURSE_RECORD="$out/verified-cute-blas.json" timeout -s INT -k 30 ${CUTE_BLAS_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider \
    -n 12 -m "not gpu" -k cute -rf $(for t in $blas; do echo tests/test_$t.py; done) > "$out/tests-cute-blas.log" 2>&1
  (( status |= $? )); tail -n 3 "$out/tests-cute-blas.log"
  KCOURSE_RECORD="$out/verified-cute-large.json" timeout -s INT -k 30 ${CUTE_LARGE_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
    -n 3 -m gpu -k cute -rf --durations=10 tests > "$out/tests-cute-large.log" 2>&1
  (( status |= $? )); tail -n 3 "$out/tests-cute-large.log"
fi
if [[ $what == fuzz ]]; then  # tests/test_fuzz.py's large budget on triton and cute (source .cute/activate.sh first)
  KCOURSE_FAIL_LOG="$out/fuzz-failures.txt" KCOURSE_FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-1000} timeout -s INT -k 30 ${FUZZ_TIMEOUT:-480} \
    python3 -m pytest -p no:cacheprovider -n 16 --dist worksteal -m "not gpu" -v -k "triton or cute" tests/test_fuzz.py \
    > "$out/fuzz.log" 2>&1
  status=$?; grep -E "passed|failed" "$out/fuzz.log" | tail -n 3
fi
if [[ $what == fuzz-each ]]; then  # FUZZ_TESTS="test_embedding[triton] ...": each in its own process, at once
  # (a CUDA error poisons the process it happens in), CUDA_LAUNCH_BLOCKING=1 (FUZZ_BLOCKING) so it names the
  # launch; FUZZ_SPLIT=n runs each test in n processes of FUZZ_EXAMPLES / n random examples each;
  # each passed example is a line of passed.txt, each failure's report goes to failures.txt
  mkdir -p "$out/fuzz-each"
  split=${FUZZ_SPLIT:-1}
  for id in ${FUZZ_TESTS:?name the tests}; do
    for part in $(seq "$split"); do
      ( KCOURSE_FUZZ_EXAMPLES=$(( ${FUZZ_EXAMPLES:-400} / split )) CUDA_LAUNCH_BLOCKING=${FUZZ_BLOCKING:-1} \
          KCOURSE_FUZZ_PROGRESS="$out/fuzz-each/passed.txt" KCOURSE_FAIL_LOG="$out/fuzz-each/failures.txt" \
          timeout -s INT -k 30 ${FUZZ_TIMEOUT:-300} python3 -m pytest -p no:cacheprovider -n 0 -q -x \
          "tests/test_fuzz.py::$id" > "$out/fuzz-each/$(tr -d '[]' <<< "$id")-$part.log" 2>&1
        echo "$? $id $part" >> "$out/fuzz-each/exit-codes.txt" ) &
    done
  done
  wait; sort -k2 "$out/fuzz-each/exit-codes.txt"
  echo "examples passed:"; sort "$out/fuzz-each/passed.txt" | uniq -c  # a time limit stops a test, not the count
  tar -C "$out" -czf "$out/fuzz-each.tgz" fuzz-each && rm -rf "$out/fuzz-each"  # one file (a call returns few)
fi
if [[ $what == gpt ]]; then  # training throughput of GPT-2 124M: GPT_BACKENDS x GPT_VARIANTS against torch.nn, one call
  for arch in ${GPT_ARCHS:-gpt2}; do
    timeout ${GPT_TIMEOUT:-540} python3 -m benchmarks.gpt --out "/tmp/gpt-$arch" --arch "$arch" \
      --backends ${GPT_BACKENDS:-pytorch,triton,cute} --variants ${GPT_VARIANTS:-eager,autocast} \
      --time-limit ${GPT_TIME_LIMIT:-420} 2>&1 | tee -a "$out/gpt.log"
    cp "/tmp/gpt-$arch/gpt.json" "$out/gpt-$arch.json"
  done
fi
exit $status
