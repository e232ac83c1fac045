#!/usr/bin/env bash
# session scratch: the triton suite through the new launch path, cute's fused ops, eager GPT-2 at batch 16
out=$1; export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader > $out/env.txt
( KCOURSE_RECORD=$out/verified-triton.json timeout -s INT -k 15 170 python3 -m pytest -q -p no:cacheprovider -n 11 -m "not gpu" -k triton -rf tests > $out/tests-triton.log 2>&1 ) &
( KCOURSE_RECORD=$out/verified-cute.json timeout -s INT -k 15 170 python3 -m pytest -q -p no:cacheprovider -n 4 -m "not gpu" -k cute -rf tests/test_linear.py tests/test_linear_swiglu.py tests/test_add_norm.py > $out/tests-cute.log 2>&1 ) &
wait
tail -n 6 $out/tests-triton.log; tail -n 3 $out/tests-cute.log
timeout 150 python3 -m benchmarks.gpt --out /tmp/g --batch 16 --variants triton:eager,cute:eager,pytorch:eager --time-limit 110 > $out/gpt.log 2>&1; cp /tmp/g/gpt.json $out/gpt16-eager.json
tail -n 9 $out/gpt.log
