#!/usr/bin/env bash
# The dense fast path (issue 14) on a GPU machine: every dense dummy shape against mlx-lm (its own process,
# its own weights), sampling, long contexts, the GPU tests. Logs go to benchmarks/results/ by hand;
# benchmarks/speed_table.py turns the JSON into the README's table.
# Usage (repo root, MLX and mlx-lm installed): OUT=dir PART=bf16|4bit|sampling|long|probe|tests [SHAPES="..."]
#   bash benchmarks/dense_gpu_round.sh
# probe: benchmarks/sample_probe.py (the sampler and the repetition penalty per token).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
source "$(dirname "$0")/gpu_round_bench.sh"
SHAPES=${SHAPES:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b qwen2.5-7b qwen3-0.6b qwen3-1.7b qwen3-4b qwen3-8b}
case "${PART:-bf16}" in
bf16)
    for s in $SHAPES; do bench "$s" --model "dummy:$s" --prompt-tokens 128 --gen-tokens 256 --runs 2; done
    ;;
4bit)
    for s in $SHAPES; do bench "$s-4bit" --model "dummy:$s-4bit" --prompt-tokens 128 --gen-tokens 256 --runs 2; done
    ;;
sampling)
    for s in qwen3-0.6b qwen3-8b-4bit; do
        bench "$s-sampled" --model "dummy:$s" --prompt-tokens 128 --gen-tokens 256 --runs 2 \
            --temp 0.7 --top-p 0.9 --repetition-penalty 1.1
    done
    ;;
long)
    for n in 4096 16384; do
        bench "qwen3-0.6b-ctx$n" --model dummy:qwen3-0.6b --prompt-tokens "$n" --gen-tokens 256 --runs 1
    done
    ;;
probe)
    timeout 200 python3 benchmarks/sample_probe.py 2>&1 | grep -v -i warning | tee "$out/sample_probe.txt"
    ;;
tests)
    timeout 400 python3 -m pytest -q -p no:cacheprovider -rs tests/test_decode_paths.py tests/test_generate.py \
        tests/test_decode_prompt_cache.py tests/test_kernels_dispatch.py -k "gpu or processors or auto or sample or kv_store" \
        2>&1 | grep -v "^  \|^$" | tail -n 30 | tee "$out/gpu_tests.txt"
    ;;
esac
