#!/bin/bash
# The whole test suite on the GPU machine, a part a call (a call runs at most 10 minutes; the suite takes
# 7 minutes with 12 workers on the H200 and about 8 in three parts on an H100). The test files are cut into
# PARTS parts of about equal source size (the same cut every time for the same files); part PART runs
# with NW workers, then every test that failed runs again alone, since a test that runs out of GPU memory
# beside other workers, or shares a process with one whose CUDA error poisoned it, can pass by itself.
#
#   OUT=dir PART=0 [PARTS=3] [NW=...] [WHEELS=.w4] [SOLO="file ..."] bash benchmarks/gpu_suite.sh
#
# WHEELS names a carried folder of wheels that the image lacks and the test extra needs (soundfile and cffi,
# pycparser, pytest-xdist and execnet, hypothesis and sortedcontainers, the serve stack: openai, starlette,
# uvicorn, httptools, uvloop), installed first with --no-index --no-deps; without them the soundfile and serve
# tests fail on import. Made here with
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .w4 soundfile cffi pycparser \
#     pytest-xdist execnet hypothesis sortedcontainers openai starlette uvicorn httptools uvloop
#
# NW defaults to 3 on a card of at most 80 GB, else 8: on an H100 (2026-11-26,
# benchmarks/results/gpu_suite_h100_2026-11-26/) one part met an illegal memory access with 5 workers and not
# with 3, where two TTS frame tests still ran out of memory beside the others (both pass alone).
# Writes $OUT/gpu_suite_part$PART.log (the whole log), $OUT/gpu_suite_part$PART_failed.txt and
# $OUT/gpu_suite_part$PART_alone.log (the failures run alone).
set -u
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
part=${PART:-0}
parts=${PARTS:-3}
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nw=${NW:-$([ "${mem:-0}" -le 82000 ] && echo 3 || echo 8)}
log="$out/gpu_suite_part$part.log"
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps "$WHEELS"/*.whl > "$out/gpu_suite_wheels.log" 2>&1 \
    || echo "installing the wheels in $WHEELS failed: see $out/gpu_suite_wheels.log"
fi
# SOLO: files that get a part of their own, the first parts (tests/test_decode_paths.py builds a megakernel per case:
# 230-290 s alone with 6 workers on the H200, 2026-11-27, where the other files took 393 s in all with 8)
solo=${SOLO-tests/test_decode_paths.py}
files=$(python3 - "$part" "$parts" $solo <<'EOF'
import glob, os, sys
part, parts, solo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
solo = [f for f in solo if os.path.exists(f)][: parts - 1]
rest = parts - len(solo)
cut, size = [[] for _ in range(rest)], [0] * rest
for f in sorted(glob.glob("tests/test_*.py"), key=lambda f: (-os.path.getsize(f), f)):
    if f in solo:
        continue
    i = size.index(min(size))
    cut[i].append(f)
    size[i] += os.path.getsize(f)
cut = [[f] for f in solo] + cut
print(" ".join(sorted(cut[part])))
EOF
)
{
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "part $part of $parts, $nw workers: $files"
} | tee "$log"
timeout "${SUITE_TIMEOUT:-480}" python3 -m pytest -q -p no:cacheprovider -n "$nw" --tb=short -rfE $files 2>&1 \
  | grep -v "PytestBenchmarkWarning" >> "$log"
rc=${PIPESTATUS[0]}
echo "pytest exit status $rc" >> "$log"
tail -n 3 "$log"
# failed or errored tests (parameters with spaces are run as their whole test function)
grep -E "^(FAILED|ERROR) " "$log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*//; /\[.* /s/\[.*$//' | sort -u \
  > "$out/gpu_suite_part${part}_failed.txt"
if [ -s "$out/gpu_suite_part${part}_failed.txt" ]; then
  echo "running $(wc -l < "$out/gpu_suite_part${part}_failed.txt") failed tests alone"
  timeout "${ALONE_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
    $(cat "$out/gpu_suite_part${part}_failed.txt") 2>&1 | grep -v "PytestBenchmarkWarning" \
    > "$out/gpu_suite_part${part}_alone.log"
  echo "pytest exit status ${PIPESTATUS[0]}" >> "$out/gpu_suite_part${part}_alone.log"
  tail -n 3 "$out/gpu_suite_part${part}_alone.log"
fi
