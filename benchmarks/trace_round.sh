# Where a decode token's device time goes (benchmarks/cuda_trace.py, then benchmarks/trace_token.py) for each
# SHAPE, greedy and sampled (temp 0.7, top-p 0.9, repetition penalty 1.1); the tables to $OUT/trace/tokens.txt.
# On the GPU machine, after MLX is installed:  OUT=dir SHAPES="qwen2.5-0.5b qwen3-0.6b" bash benchmarks/trace_round.sh
set -u
out=$OUT/trace
mkdir -p "$out"
for shape in ${SHAPES:-qwen2.5-0.5b qwen3-0.6b}; do
    for mode in greedy sampled; do
        args=()
        [ "$mode" = sampled ] && args=(--temp 0.7 --top-p 0.9 --repetition-penalty 1.1)
        csv=/tmp/trace_${shape}_$mode.csv
        PYTHONPATH=. python3 benchmarks/cuda_trace.py "$shape" "$csv" "${args[@]}" 2>&1 | grep -v -i warning | tail -n 2
        echo "== $shape $mode" | tee -a "$out/tokens.txt"
        python3 benchmarks/trace_token.py "$csv" 2>&1 | tee -a "$out/tokens.txt"
    done
done
