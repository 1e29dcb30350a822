#!/usr/bin/env bash
# The Apple side of the decode work, for the first Apple-silicon machine that runs it (the Metal CI
# workflow, .github/workflows/metal.yml, or by hand on a Mac). Writes under $OUT:
#   check.jsonl / check.txt  every kernel against its reference on Metal (python -m kernels_metal.check)
#   decode_check.txt         the fused decode path teacher-forced against plain (benchmarks/decode_check.py)
#   bench.txt, bench_*.json  `metalgen bench --compare mlx-lm` tables, auto and fused, bf16 and 4-bit
#   speed_table.md           the runs as the README's table (benchmarks/speed_table.py), as the H200 rounds give it
# Usage (repo root, the project and mlx-lm installed): OUT=dir bash benchmarks/metal_round.sh [shape ...]
set -uo pipefail
out=${OUT:-/tmp/metal}
mkdir -p "$out"
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
source "$(dirname "$0")/gpu_round_bench.sh"
shapes=${*:-qwen2.5-0.5b qwen3-0.6b}
python3 -c "import kernels_metal as K; assert K.backend() == 'metal', K.backend()" || { echo "not on Metal"; exit 1; }
python3 -m kernels_metal.check --quick --out "$out" 2>&1 | tee "$out/check.txt"
# the fused path (one launch a phase) is what Metal runs; the megakernel's grid barrier needs
# co-resident threadgroups, which Metal does not promise, so it stays CUDA-only (docs/decode.md)
# (4-bit too: the fused path reads MLX-quantized rows as the megakernel does)
OUT=$out DECODE_MODES=fused DECODE_LONG=0 python3 benchmarks/decode_check.py $shapes $(printf "%s-4bit " $shapes) 2>&1 \
    | tee "$out/decode_check.txt"
for s in $shapes; do
    for q in "" -4bit; do
        bench "$s$q-auto" --model "dummy:$s$q" --prompt-tokens 128 --gen-tokens 256 --runs 3
        bench "$s$q-fused" --model "dummy:$s$q" --prompt-tokens 128 --gen-tokens 256 --runs 3 --decode fused
    done
done
python3 benchmarks/speed_table.py "$out" > "$out/speed_table.md" && cat "$out/speed_table.md"
