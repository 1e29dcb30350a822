#!/usr/bin/env bash
# The decode megakernel on a GPU machine: per-phase timing, the GPU checks against plain (and the
# float32 noise floor), `metalgen bench --compare mlx-lm` on three shapes, and the TTS frame loop.
# Usage (repo root, MLX installed): OUT=dir [PART=checks|bench] bash benchmarks/decode_gpu_round.sh
# (PART splits the round in two for a 10-minute call limit; default both)
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
part=${PART:-all}
if [ "$part" != bench ]; then
    timeout 150 python3 benchmarks/decode_phase_probe.py --versions 1 2>&1 | tee "$out/phase_probe.txt"
    timeout 150 python3 benchmarks/decode_step_probe.py qwen2.5-0.5b qwen3-0.6b qwen3-4b 2>&1 | tee "$out/step_probe.txt"
    timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/test_decode_paths.py -k "gpu_paths or bitwise" 2>&1 \
        | grep -E "vs plain|passed|failed|Error|assert" | tee "$out/gpu_paths.txt"
    timeout 100 python3 -m pytest -q -s -p no:cacheprovider tests/test_tts_frames.py tests/test_kernels_dispatch.py -k "megakernel or gpu" 2>&1 \
        | grep -E "vs plain|passed|failed|Error|assert" | tee -a "$out/gpu_paths.txt"
fi
if [ "$part" != checks ]; then
    for shape in qwen2.5-0.5b qwen3-0.6b qwen3-4b; do
        timeout 120 python3 -m metalgen bench --model "dummy:$shape" --compare mlx-lm --json "$out/bench-$shape.json" 2>&1 \
            | tail -n 4 | tee -a "$out/bench.txt"
    done
    timeout 100 python3 -m metalgen bench --tts --model dummy:qwen3-tts-0.6b 2>&1 | tail -n 4 | tee -a "$out/bench.txt"
fi
