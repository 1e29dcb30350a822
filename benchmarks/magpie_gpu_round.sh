#!/usr/bin/env bash
# Magpie TTS on a GPU machine: the fused LT kernel's check, `metalgen bench --tts` on the 357M shapes
# (CFG on and off, bf16 and fp32, 128 and 256 frames, the old 24-frame chunks), and the Magpie tests. Logs go to $OUT; copy them to
# benchmarks/results/ by hand. Usage (repo root, MLX installed): OUT=dir bash benchmarks/magpie_gpu_round.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/device.txt"
[ "${LT_CHECK:-1}" = 1 ] && timeout 200 python3 benchmarks/magpie_lt_check.py --chains 100 --samples 1000 --iters 100 --log "$out/lt_check.txt" \
    2>&1 | grep -v -i warning | tail -n 40
for args in "bf16_cfg:--dtype bfloat16" "bf16_nocfg:--dtype bfloat16 --no-cfg" "fp32_cfg:--dtype float32" \
        "bf16_cfg_256:--dtype bfloat16 --frames 256" "bf16_cfg_chunk24:--dtype bfloat16 --chunk-frames 24"; do
    name=${args%%:*}
    timeout 150 python3 -m metalgen bench --tts --model dummy:magpie-357m --frames 128 ${args#*:} --runs 3 \
        --json "$out/bench_$name.json" 2>&1 | grep -v -i warning | tail -n 25 | tee -a "$out/bench.txt"
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_magpie.py tests/test_kernels_magpie_decoder.py \
    tests/test_magpie_generate.py tests/test_magpie_stream.py tests/test_magpie_api.py tests/test_magpie_codec.py \
    tests/test_magpie_chunking.py 2>&1 | tail -n 15 \
    | tee "$out/gpu_tests.txt"
[ "${PROBE:-0}" = 1 ] && timeout 200 python3 benchmarks/magpie_codec_probe.py --log "$out/codec_probe.txt" 2>&1 | grep -v -i warning
exit 0
