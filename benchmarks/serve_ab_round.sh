#!/usr/bin/env bash
# A/B of `metalgen serve` under load between package trees in one lease, interleaved: each round runs
# serve_load.py once per tree (a folder holding copies of metalgen, kernels_metal, profiling and tokenizer,
# their metalgen/assets copied in from this checkout; "." is this checkout), all on one checkpoint folder.
# Usage (repo root, MLX and mlx-lm installed): [ROUNDS=2] [LEVELS=32] [EXTRA="--repeats 3"]
#     bash benchmarks/serve_ab_round.sh OUT_DIR MODEL TREE...
set -uo pipefail
out=$1 model=$2
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd) root=$(pwd)
export PYTHONUNBUFFERED=1
ckpt="$out/checkpoint"
for round in $(seq 1 "${ROUNDS:-2}"); do
    for tree in "$@"; do
        [ "$tree" = . ] || { [ -d "$tree/metalgen/assets" ] || cp -r metalgen/assets "$tree/metalgen/"; }
        tag=$(basename "$(cd "$tree" && pwd)")
        dir="$out/${tag}_r$round"
        mkdir -p "$dir"
        [ -d "$ckpt" ] && ln -sfn "$(cd "$ckpt" && pwd)" "$dir/checkpoint"
        echo "== round $round, tree $tree"
        # run from inside the tree: the server is `python -m metalgen`, which imports the working directory's
        # package before anything on PYTHONPATH
        (cd "$tree" && PYTHONPATH=. python3 "$root/benchmarks/serve_load.py" --model "$model" --engines metalgen@32 \
            --concurrency "${LEVELS:-32}" --prompt-tokens 128 --gen-tokens 128 --max-batch 32 ${EXTRA:---repeats 3} \
            --out "$dir") 2>&1 | grep -E '^\| metalgen' | sed "s/^/$tag r$round /"
        [ -d "$ckpt" ] || { [ -d "$dir/checkpoint" ] && mv "$dir/checkpoint" "$ckpt"; }
    done
done
