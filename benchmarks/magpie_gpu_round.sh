#!/usr/bin/env bash
# Magpie TTS on a GPU machine: the fused LT kernel's check, the codec's chunk schedules
# (benchmarks/magpie_codec_schedule.py), `metalgen bench --tts` on the 357M shapes (the defaults: float32,
# CFG on, 128 frames, chunks growing x4; then bf16, doubling chunks, CFG off, 256 frames), and the Magpie tests. Logs go to $OUT; copy
# them to benchmarks/results/ by hand. Usage (repo root, MLX installed): OUT=dir bash benchmarks/magpie_gpu_round.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/device.txt"
[ "${LT_CHECK:-1}" = 1 ] && timeout 200 python3 benchmarks/magpie_lt_check.py --chains 100 --samples 1000 --iters 100 --log "$out/lt_check.txt" \
    2>&1 | grep -v -i warning | tail -n 40
[ "${SCHEDULE:-1}" = 1 ] && timeout 200 python3 benchmarks/magpie_codec_schedule.py --log "$out/codec_schedule.txt" \
    2>&1 | grep -v -i warning
settings=("default:" "bf16_cfg:--dtype bfloat16" "bf16_cfg_x2:--dtype bfloat16 --chunk-growth 2"
    "bf16_nocfg:--dtype bfloat16 --no-cfg" "bf16_cfg_256:--dtype bfloat16 --frames 256" "fp32_cfg_256:--frames 256")
for args in "${settings[@]}"; do
    name=${args%%:*}
    timeout 150 python3 -m metalgen bench --tts --model dummy:magpie-357m ${args#*:} --runs 3 \
        --json "$out/bench_$name.json" 2>&1 | grep -v -i warning | tail -n 25 | tee -a "$out/bench.txt"
done
# one JSON line per setting (the device returns at most 8 files)
python3 - "$out" <<'PY'
import glob, json, os, sys
with open(os.path.join(sys.argv[1], "bench.jsonl"), "w") as f:
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
        f.write(json.dumps({"setting": os.path.basename(path)[6:-5], **json.load(open(path))}) + "\n")
        os.remove(path)
PY
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_magpie.py tests/test_kernels_magpie_decoder.py \
    tests/test_magpie_generate.py tests/test_magpie_stream.py tests/test_magpie_api.py tests/test_magpie_codec.py \
    tests/test_magpie_chunking.py 2>&1 | tail -n 15 \
    | tee "$out/gpu_tests.txt"
[ "${PROBE:-0}" = 1 ] && timeout 200 python3 benchmarks/magpie_codec_probe.py --log "$out/codec_probe.txt" 2>&1 | grep -v -i warning
exit 0
