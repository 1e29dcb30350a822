#!/usr/bin/env bash
# A/B of BatchGenerator's decode step between package trees in one lease: each tree given as a folder
# holding copies of metalgen, kernels_metal, profiling and tokenizer (their metalgen/assets copied in from
# this checkout), "." being this checkout. Usage: bash benchmarks/batch_ab_round.sh OUT_DIR MODEL SIZES TREE...
set -uo pipefail
out=$1 model=$2 sizes=$3
shift 3
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for tree in "$@"; do
    [ "$tree" = . ] || { [ -d "$tree/metalgen/assets" ] || cp -r metalgen/assets "$tree/metalgen/"; }
    tag=$(basename "$(cd "$tree" && pwd)")
    echo "== $tree $model"
    PYTHONPATH=$tree python3 benchmarks/batch_step_probe.py "$model" "$sizes" 2>&1 | tee "$out/batch_step_${tag}_${model#dummy:}.txt" | tail -n 4
done
