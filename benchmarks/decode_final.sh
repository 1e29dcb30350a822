#!/usr/bin/env bash
# The one device run for decode v2 (docs/decode.md). From the repo root, MLX installed, PYTHONPATH=.:
#   OUT=/some/dir bash benchmarks/decode_final.sh
# Per shape (its own process, under a timeout: a v2 hang costs only that shape): 256-step check vs
# plain for megakernel v1 and v2, decode tok/s of v1, v2, plain and mlx-lm, % of floor. Then a
# 132-group v2 run of qwen2.5-0.5b (bench only), a profiled generate and its summary. Table last.
set -u
OUT=${OUT:-/tmp/decode_final}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.}
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
for shape in qwen2.5-0.5b qwen3-0.6b qwen3-4b; do
  steps=256
  [ "$shape" = qwen3-4b ] && steps=128   # the 4b check at 256 steps x 2 versions does not fit 5 minutes
  FINAL_STEPS=$steps timeout 90 python3 benchmarks/decode_final.py "$shape" > "$OUT/final_$shape.log" 2>&1
  echo "$shape rc=$? $(( $(date +%s) - T0 ))s" >> "$OUT/rc.txt"
done
# v2 at 1 group per multiprocessor (v1 saw equal kernel times at 132 and 264 groups)
mkdir -p "$OUT/g132"
OUT="$OUT/g132" FINAL_BLOCKS=132 FINAL_STEPS=32 timeout 40 python3 benchmarks/decode_final.py qwen2.5-0.5b \
  megakernel_v2 > "$OUT/final_132.log" 2>&1
echo "132 rc=$? $(( $(date +%s) - T0 ))s" >> "$OUT/rc.txt"
# a profiled generation on the default path (v1 unless AUTO_V2 lists the shape), then v2 pinned
timeout 35 python3 -m metalgen generate --model dummy:qwen2.5-0.5b --max-tokens 64 --profile "$OUT/trace.jsonl" \
  > "$OUT/generate.log" 2>&1
timeout 15 python3 -m profiling summarize "$OUT/trace.jsonl" > "$OUT/summary.txt" 2>&1
timeout 35 python3 -m metalgen generate --model dummy:qwen2.5-0.5b --max-tokens 64 \
  --decode megakernel_v2 --profile "$OUT/trace_v2.jsonl" > "$OUT/generate_v2.log" 2>&1
timeout 15 python3 -m profiling summarize "$OUT/trace_v2.jsonl" > "$OUT/summary_v2.txt" 2>&1
echo "end $(( $(date +%s) - T0 ))s" >> "$OUT/rc.txt"
echo "==== logs (tails)"
for f in "$OUT"/final_*.log; do echo "--- $f"; grep -v 'Traceback\|^  ' "$f" | tail -9; done
echo "--- generate (default path)"; tail -5 "$OUT/generate.log"; tail -25 "$OUT/summary.txt"
echo "--- generate (v2)"; tail -3 "$OUT/generate_v2.log"; tail -8 "$OUT/summary_v2.txt"
cat "$OUT/gpu.txt" "$OUT/rc.txt"
echo "==== decode, prompt 128, 256 tokens, bf16 (per version: max rel err vs plain, tok/s, x mlx-lm, % floor)"
python3 benchmarks/decode_final.py --table
echo "-- v2 at 132 groups:"; OUT="$OUT/g132" python3 benchmarks/decode_final.py --table | tail -n +2
