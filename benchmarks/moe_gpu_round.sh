#!/usr/bin/env bash
# The MoE and quantized decode work on a GPU machine: the GPU tests, per-phase timing and the fast paths
# against plain on Qwen3-30B-A3B, and `metalgen bench --compare mlx-lm` (mlx-lm in its own process on its
# own weights). Logs go to benchmarks/results/ by hand.
# Usage (repo root, MLX and mlx-lm installed): OUT=dir PART=checks|decode|prefill bash benchmarks/moe_gpu_round.sh
# checks: the MoE kernel tests, the prefill kernel check (grouped GEMM tiles, against the built-in), the
# prefill memory probe.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
part=${PART:-checks}
source "$(dirname "$0")/gpu_round_bench.sh"
case "$part" in
checks)
    timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels_moe.py -k gpu 2>&1 \
        | grep -E "passed|failed|Error|assert|FAILED" | tee "$out/gpu_tests.txt"
    timeout 150 python3 -m kernels_metal.check --quick --only moe_prefill --out "$out" 2>&1 | grep -v -i warning \
        | tail -n 40 | tee "$out/check_moe.txt"
    for m in dummy:qwen3-30b-a3b dummy:qwen3-30b-a3b-4bit; do
        timeout 200 python3 benchmarks/prefill_memory_probe.py $m --modes gemm,blocks 2>&1 | grep -v -i warning \
            | tee -a "$out/memory_probe.txt"
    done
    ;;
decode)
    echo "## bf16, prompt 128, 256 tokens" >> "$out/bench.txt"
    bench 30b --model dummy:qwen3-30b-a3b --profile
    echo "## 4-bit, prompt 128, 256 tokens" >> "$out/bench.txt"
    bench 30b_4bit --model dummy:qwen3-30b-a3b-4bit --profile
    ;;
prefill)
    echo "## bf16, prompt 2048" >> "$out/bench.txt"
    bench 30b_2048 --model dummy:qwen3-30b-a3b --prompt-tokens 2048 --gen-tokens 16
    echo "## 4-bit, prompt 2048" >> "$out/bench.txt"
    bench 30b_4bit_2048 --model dummy:qwen3-30b-a3b-4bit --prompt-tokens 2048 --gen-tokens 16
    echo "## bf16, prompt 4096 (peak memory)" >> "$out/bench.txt"
    bench 30b_4096 --model dummy:qwen3-30b-a3b --prompt-tokens 4096 --gen-tokens 64 --runs 1
    echo "## qwen3-0.6b 4-bit (dense, the quantized megakernel)" >> "$out/bench.txt"
    bench 06b_4bit --model dummy:qwen3-0.6b-4bit
    ;;
esac
