#!/usr/bin/env bash
# The engine on a GPU machine: the CPU test suite's engine tests on the GPU backend, the CLI with
# a profile, and metalgen bench --compare mlx-lm on three real shapes.
# Usage (repo root, MLX installed): bash benchmarks/gpu_engine_check.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -c 'import mlx.core as mx, kernels_metal as K; print("mlx", mx.__version__, mx.default_device(), "backend", K.backend())'
python3 -m pytest -q -p no:cacheprovider tests/test_models.py tests/test_generate.py tests/test_sampling.py \
    tests/test_cache.py tests/test_loading.py tests/test_cli.py 2>&1 | tee "$out/pytest.log" | tail -n 25
python3 -m metalgen generate --model dummy:qwen2.5-0.5b --prompt "Hello" --max-tokens 64 \
    --profile "$out/trace.jsonl" > "$out/generate.txt" 2> "$out/generate.err"
tail -n 5 "$out/generate.err"
python3 -m profiling summarize "$out/trace.jsonl" | tee "$out/summary.txt"
for shape in qwen2.5-0.5b qwen3-0.6b qwen3-4b; do
    python3 -m metalgen bench --model "dummy:$shape" --compare mlx-lm --json "$out/bench-$shape.json" 2>&1 | tail -n 4
done
python3 -m metalgen bench --model dummy:qwen2.5-0.5b --prompt-tokens 2048 --gen-tokens 32 --compare mlx-lm 2>&1 | tail -n 4
