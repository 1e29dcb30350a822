#!/usr/bin/env bash
# Qwen3-TTS on a GPU machine: the frame loop's decode paths checked against plain (teacher forced),
# the text decode paths' GPU tests, `metalgen bench --tts` for both sizes next to mlx-lm, and the
# speech-decoder probe.
# Usage (repo root, MLX installed): OUT=dir bash benchmarks/tts_gpu_round.sh
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
python3 -c 'import mlx.core as mx, kernels_metal as K; print("mlx", mx.__version__, mx.default_device(), "backend", K.backend())'
timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/test_tts_frames.py tests/test_decode_paths.py 2>&1 \
    | grep -v "^$" | tail -n 12
for size in 0.6b 1.7b; do
    timeout 200 python3 -m metalgen bench --tts --model "dummy:qwen3-tts-$size" --compare mlx-lm \
        --json "$out/tts_$size.json" 2>&1 | tail -n 7
done
timeout 100 python3 -m metalgen bench --tts --model dummy:qwen3-tts-0.6b --chunk-frames 24 2>&1 | tail -n 4
timeout 200 python3 benchmarks/tts_decoder_probe.py ${PROBE_FRAMES:-2 6 14 37 49 73} 2>&1 | tee "$out/decoder_probe.txt" \
    | grep -v "^    "
