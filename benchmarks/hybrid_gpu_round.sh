#!/usr/bin/env bash
# The hybrid (Gated DeltaNet) work on a GPU machine. Logs go to benchmarks/results/ by hand.
# Usage (repo root, MLX and mlx-lm installed): OUT=dir PART=parity|bench|long|tests|mega|moe bash benchmarks/hybrid_gpu_round.sh
# parity: benchmarks/hybrid_parity_probe.py with MLX's TF32 float32 matmuls on (its default) and off.
# bench:  `metalgen bench --compare mlx-lm` (mlx-lm in its own process on its own weights), dense shapes.
# tests:  the hybrid model and kernel tests on the GPU.
# mega:   the hybrid megakernel's GPU tests (tests/test_decode_paths.py -k gpu_hybrid).
# moe:    the 35B-A3B shape, bf16 and 4-bit.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
source "$(dirname "$0")/gpu_round_bench.sh"
case "${PART:-parity}" in
parity)
    timeout 120 python3 benchmarks/hybrid_parity_probe.py 2>&1 | grep -v -i warning | tee "$out/parity_tf32_on.txt"
    MLX_ENABLE_TF32=0 timeout 120 python3 benchmarks/hybrid_parity_probe.py 2>&1 | grep -v -i warning \
        | tee "$out/parity_tf32_off.txt"
    ;;
bench)
    bench qwen3.5-0.8b --model dummy:qwen3.5-0.8b --prompt-tokens 128 --gen-tokens 256 --runs 3
    bench qwen3.5-4b --model dummy:qwen3.5-4b --prompt-tokens 128 --gen-tokens 256 --runs 2
    ;;
long)
    bench qwen3.5-0.8b-8k --model dummy:qwen3.5-0.8b --prompt-tokens 8192 --gen-tokens 256 --runs 2
    ;;
tests)
    timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_models_hybrid.py tests/test_kernels_gated_delta.py \
        tests/test_decode_compiled.py tests/test_models.py tests/test_models_moe.py 2>&1 | tail -n 15 | tee "$out/gpu_tests.txt"
    ;;
mega)
    timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_decode_paths.py -k gpu_hybrid 2>&1 \
        | grep -v "^  \|^$" | tail -n 15 | tee "$out/gpu_tests_mega.txt"
    ;;
moe)
    bench qwen3.5-35b-a3b-4bit --model dummy:qwen3.5-35b-a3b-4bit --prompt-tokens 128 --gen-tokens 256 --runs 2
    bench qwen3.5-35b-a3b --model dummy:qwen3.5-35b-a3b --prompt-tokens 128 --gen-tokens 256 --runs 2
    ;;
esac
