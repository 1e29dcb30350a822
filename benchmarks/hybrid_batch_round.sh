#!/usr/bin/env bash
# Batched hybrid (Gated DeltaNet) stacks on a GPU machine: the batch's tests on the GPU backend (every
# architecture, the prefix cache's state snapshots included), then the load benchmark of a hybrid shape
# against mlx_lm.server on the same checkpoint folder, with a two-turn chat for the prefix cache.
# Usage (repo root, MLX and mlx-lm installed): [MODELS="dummy:..."] [LEVELS=1,8,32] bash benchmarks/hybrid_batch_round.sh OUT_DIR
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
PYTHONPATH=.:tests python3 -m pytest -q -p no:cacheprovider tests/test_batch.py tests/test_batch_cache.py \
    tests/test_paged_cache.py tests/test_prefix_cache.py tests/test_batch_step.py 2>&1 | tee "$out/pytest.log" | tail -n 8
for model in ${MODELS:-dummy:qwen3.5-0.8b}; do
    name=${model#dummy:}
    PYTHONPATH=. python3 benchmarks/serve_load.py --model "$model" --engines metalgen@32,metalgen@1,mlx_lm \
        --concurrency "${LEVELS:-1,8,32}" --prompt-tokens 128 --gen-tokens 128 --max-batch 32 --repeats 2 \
        --chat-tokens 4096 --out "$out/load_$name" 2>&1 | tail -n 30
done
