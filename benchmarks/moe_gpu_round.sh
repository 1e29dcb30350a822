#!/usr/bin/env bash
# The MoE and quantized decode work on a GPU machine: the GPU tests, per-phase timing and the fast paths
# against plain on Qwen3-30B-A3B, and `metalgen bench --compare mlx-lm` (mlx-lm in its own process on its
# own weights). Logs go to benchmarks/results/ by hand.
# Usage (repo root, MLX and mlx-lm installed): OUT=dir PART=checks|decode|prefill bash benchmarks/moe_gpu_round.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
part=${PART:-checks}
bench() {  # name, then metalgen bench's arguments
    local name=$1
    shift
    timeout 280 python3 -m metalgen bench "$@" --compare mlx-lm --json "$out/bench_$name.json" 2>&1 | grep -v -i warning \
        | tail -n 8 | tee -a "$out/bench.txt"
}
case "$part" in
checks)
    timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels_moe.py tests/test_decode_paths.py \
        -k "gpu or moe or bitwise or quantized" 2>&1 | grep -E "vs plain|passed|failed|Error|assert|FAILED" \
        | tee "$out/gpu_tests.txt"
    timeout 150 python3 benchmarks/decode_phase_probe.py qwen3-30b-a3b qwen3-30b-a3b-4bit --versions 1 --tokens 24 2>&1 \
        | grep -v -i warning | tee "$out/phase_probe.txt"
    timeout 100 python3 benchmarks/moe_decode_check.py dummy:qwen3-30b-a3b-4bit megakernel 2>&1 | tee "$out/check_30b_4bit.txt"
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
