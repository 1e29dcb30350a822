# Sourced by the *_gpu_round.sh scripts: bench NAME ARGS... runs `metalgen bench ARGS --compare mlx-lm`
# (mlx-lm in its own process on its own weights), its JSON to $out/bench_NAME.json, its table appended
# to $out/bench.txt.
bench() {
    local name=$1
    shift
    timeout 280 python3 -m metalgen bench "$@" --compare mlx-lm --json "$out/bench_$name.json" 2>&1 | grep -v -i warning \
        | tail -n 8 | tee -a "$out/bench.txt"
}
