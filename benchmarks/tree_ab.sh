# The working tree's decode speed against an older tree's on one machine, alternating runs so that both see the
# same card: OLD_TAR (a `git archive` of the files that differ, e.g. `git archive HEAD metalgen kernels_metal`) is
# unpacked over a copy of this tree. Each argument is one `metalgen bench` setting; each is run ROUNDS times a
# side (new, old, new, old, ...), and a line a run goes to $OUT/ab/ab.txt. On the GPU machine, after MLX is in:
#   OUT=dir OLD_TAR=out/old.tar ROUNDS=2 bash benchmarks/tree_ab.sh "--model dummy:qwen2.5-0.5b --runs 5" ...
set -u
out=$OUT/ab
mkdir -p "$out"
old=/tmp/tree_ab_old
rm -rf "$old"
mkdir -p "$old"
tar --exclude='./.w*' --exclude=./out -cf - . | tar -C "$old" -xf -
tar -C "$old" -xf "$OLD_TAR"
here=$(pwd)
for args in "$@"; do
    for r in $(seq "${ROUNDS:-2}"); do
        for side in new old; do
            dir=$here
            [ "$side" = old ] && dir=$old
            json=/tmp/tree_ab.json
            rm -f "$json"
            # shellcheck disable=SC2086
            (cd "$dir" && PYTHONPATH=. timeout 280 python3 -m metalgen bench $args --json "$json" >/dev/null 2>&1)
            rate=$(python3 -c "import json; print('%.1f' % json.load(open('$json'))['results'][0]['decode_tps'])" 2>/dev/null)
            echo "$side  ${rate:-failed}  $args" | tee -a "$out/ab.txt"
        done
    done
done
