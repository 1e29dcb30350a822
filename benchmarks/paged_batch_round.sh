#!/usr/bin/env bash
# The paged batch cache on a GPU machine: its kernel against the reference and against MLX's gather + SDPA,
# its tests on the GPU backend, and a batched step of BatchGenerator next to an older tree's (A/B in one
# lease through batch_ab_round.sh: BASE is a copy of the older metalgen, kernels_metal, profiling and
# tokenizer packages).
# Usage (repo root, MLX installed): [MODELS="dummy:..."] bash benchmarks/paged_batch_round.sh OUT_DIR [BASE_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}
base=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
PYTHONPATH=.:tests python3 -m pytest -q -p no:cacheprovider tests/test_kernels_dispatch.py tests/test_paged_cache.py \
    tests/test_batch_step.py tests/test_batch_cache.py tests/test_batch.py tests/test_prefix_cache.py 2>&1 | tee "$out/pytest.log" | tail -n 15
PYTHONPATH=. python3 -m kernels_metal.check --only paged,attn --quick 2>&1 | grep -v '^\[kernels' > "$out/check_paged.txt"
grep -c '"ok": false' "$out/check_paged.txt"; grep paged "$out/check_paged.txt" | cut -c1-230
for model in ${MODELS:-dummy:qwen3-0.6b dummy:qwen3-8b-4bit}; do
    bash benchmarks/batch_ab_round.sh "$out" "$model" 1,8,32,64 ${base:+"$base"} .
done
