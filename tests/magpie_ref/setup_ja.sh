#!/usr/bin/env bash
# Puts pyopenjtalk and the open_jtalk 1.11 UTF-8 dictionary (open_jtalk_dic_utf_8-1.11) into the Magpie
# reference venv (tests/magpie_ref/.venv, made by setup_venv.sh) and into each Python named as an argument
# (e.g. `bash tests/magpie_ref/setup_ja.sh python`), for the Japanese parity test (tests/test_magpie_ja.py).
# Not run by CI: the test skips without it.
#
# pyopenjtalk (a source package: needs a C++ compiler) downloads its dictionary from GitHub on first use.
# Where that is not reachable, the dictionary comes from Debian's open-jtalk-mecab-naist-jdic 1.11 package: its
# sys.dic, matrix.bin, char.bin and unk.dic are byte-identical to what pyopenjtalk's own mecab-dict-index builds
# from the open_jtalk 1.11 sources (the same naist-jdic sources as r9y9/open_jtalk, which pyopenjtalk's
# download is built from); the SHA-256 sums below are checked either way.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pythons=("$here/.venv/bin/python" "$@")
declare -A SHA=(
    [sys.dic]=ca57d9029691a70a5dfb99afc2844180256161d7130da65b1a867510e129b9a6
    [matrix.bin]=62fd16b4f64c851d5dc352ef0d5740c5fc83ddc7c203b2b0b1fc5271969a14ce
    [char.bin]=888ee94c5a8a7a26d24ab3f1b7155441351954fd51ea06b4a2f78bd742492b2f
    [unk.dic]=ce97851ecda075914fa3ffe7294a1ab34ee4f6d56ba6bf9197d74143b5dffbfe
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
debian_dictionary() {  # -> $tmp/dic (once)
    [ -d "$tmp/dic" ] && return 0
    (cd "$tmp" && apt-get download open-jtalk-mecab-naist-jdic >/dev/null 2>&1) || return 1
    dpkg-deb -x "$tmp"/open-jtalk-mecab-naist-jdic_*.deb "$tmp/deb" || return 1
    cp -r "$tmp/deb/var/lib/mecab/dic/open-jtalk/naist-jdic" "$tmp/dic"
}
for py in "${pythons[@]}"; do
    [ -x "$py" ] || command -v "$py" >/dev/null || { echo "setup_ja: no python at $py" >&2; exit 1; }
    "$py" -c "import pyopenjtalk" 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check pyopenjtalk
    dir=$("$py" -c "import pyopenjtalk; print(pyopenjtalk.OPEN_JTALK_DICT_DIR.decode())")
    if [ ! -f "$dir/sys.dic" ]; then
        if ! "$py" -c "import pyopenjtalk; pyopenjtalk.g2p('あ')" >/dev/null 2>&1; then
            debian_dictionary || { echo "setup_ja: neither pyopenjtalk's download nor apt-get gave the dictionary" >&2; exit 1; }
            mkdir -p "$dir" && cp "$tmp"/dic/* "$dir"/
        fi
    fi
    for f in "${!SHA[@]}"; do
        echo "${SHA[$f]}  $dir/$f" | sha256sum -c --quiet - \
            || { echo "setup_ja: $dir/$f is not the open_jtalk 1.11 dictionary" >&2; exit 1; }
    done
    "$py" -c "import pyopenjtalk; pyopenjtalk.run_frontend('こんにちは、世界。')"
    echo "setup_ja: pyopenjtalk and $dir ready for $py"
done
