#!/usr/bin/env bash
# The load table on a GPU machine, in parts that each fit one device call (600 s): metalgen serve
# against mlx_lm.server on one checkpoint folder, both servers up at once and every run of a level going
# engine after engine (serve_load.py --interleave), each run with prompts of its own, the median of the runs
# after the first reported. Usage (repo root, MLX and mlx-lm installed): bash benchmarks/serve_round.sh PART OUT_DIR
#   PART  0.6b      qwen3-0.6b at 1, 8 and 32 streams, 5 runs a level (--max-batch 128), and a 4096-token chat
#         0.6b-128  qwen3-0.6b at 128 streams, 3 runs of at most 60 s
#         8b        qwen3-8b-4bit at 1, 8 and 32 streams, 3 runs (--max-batch 128)
#         8b-128    qwen3-8b-4bit at 128 streams, 2 runs of at most 90 s
# (mlx_lm.server 0.32.2 stalled at 128 streams on 2026-11-26, H200: 216 of a run's 256 requests in 4 minutes, the last
# ones six at a time every 13-27 s; a run cut at its --level-timeout reports the requests that finished)
set -uo pipefail
part=$1 out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1
case $part in
    0.6b) model=dummy:qwen3-0.6b levels=1,8,32 repeats=5 extra="--chat-tokens 4096" ;;
    0.6b-128) model=dummy:qwen3-0.6b levels=128 repeats=3 extra="--level-timeout 60" ;;
    8b) model=dummy:qwen3-8b-4bit levels=1,8,32 repeats=3 extra="" ;;
    8b-128) model=dummy:qwen3-8b-4bit levels=128 repeats=2 extra="--level-timeout 90" ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
esac
# the checkpoint folder outside OUT_DIR (an 8B one is GBs, and the parts of one model share it)
ckpt=/tmp/serve_round_ckpt/${model#dummy:}
mkdir -p "$ckpt" "$out/$part"
ln -sfn "$ckpt" "$out/$part/checkpoint"
PYTHONPATH=. python3 benchmarks/serve_load.py --model "$model" --engines metalgen@128,mlx_lm --max-batch 128 \
    --concurrency "$levels" --prompt-tokens 128 --gen-tokens 128 --repeats "$repeats" --interleave $extra \
    --out "$out/$part" 2>&1 | grep -E '^level:|^\||x\)$|^A rate'
rm -f "$out/$part/checkpoint"
