#!/usr/bin/env bash
# The MoE work on a GPU machine: kernel checks, the GPU tests, the 30B-A3B decode paths against plain,
# and `metalgen bench --compare mlx-lm` (mlx-lm in its own process on its own weights).
# Usage (repo root, MLX and mlx-lm installed): OUT=dir PART=checks|bench|prefill|q4 bash benchmarks/moe_gpu_round.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
part=${PART:-checks}
case "$part" in
checks)
    timeout 200 python3 -m kernels_metal.check --only moe,gemv --quick 2>&1 | tail -n 60 | tee "$out/kernels_check.txt"
    timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels_moe.py tests/test_decode_paths.py \
        tests/test_kernels_dispatch.py -k "gpu or moe or bitwise" 2>&1 | grep -E "vs plain|passed|failed|Error|assert" \
        | tee "$out/gpu_tests.txt"
    ;;
bench)
    timeout 150 python3 benchmarks/moe_decode_check.py dummy:qwen3-30b-a3b 2>&1 | tee "$out/check_30b.txt"
    timeout 300 python3 -m metalgen bench --model dummy:qwen3-30b-a3b --compare mlx-lm --profile \
        --json "$out/bench_30b.json" 2>&1 | tail -n 8 | tee "$out/bench_30b.txt"
    ;;
prefill)
    timeout 280 python3 -m metalgen bench --model dummy:qwen3-30b-a3b --prompt-tokens 2048 --gen-tokens 16 \
        --compare mlx-lm --json "$out/bench_30b_2048.json" 2>&1 | tail -n 6 | tee "$out/bench_30b_2048.txt"
    timeout 280 python3 -m metalgen bench --model dummy:qwen3-30b-a3b-4bit --compare mlx-lm \
        --json "$out/bench_30b_4bit.json" 2>&1 | tail -n 6 | tee "$out/bench_30b_4bit.txt"
    ;;
esac
