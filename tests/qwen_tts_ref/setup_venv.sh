#!/usr/bin/env bash
# Creates (or reuses) the reference venv for the Qwen3-TTS parity tests:
# tests/qwen_tts_ref/.venv with torch CPU, transformers 4.57.3 and qwen-tts 0.1.1.
# Safe to run repeatedly; exits 0 even when it cannot build the venv (the parity tests then skip
# with the reason written to tests/qwen_tts_ref/.venv/FAILED). The folder is git-ignored (.venv/).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
py=${PYTHON:-python3}
ok() { "$venv/bin/python" -c "import qwen_tts, transformers; assert transformers.__version__ == '4.57.3'" 2>/dev/null; }
if [ -x "$venv/bin/python" ] && ok; then
    echo "qwen-tts reference venv: reusing $venv"; exit 0
fi
rm -rf "$venv"
fail() { mkdir -p "$venv"; echo "$1" > "$venv/FAILED"; echo "qwen-tts reference venv: $1" >&2; exit 0; }
"$py" -m venv "$venv" || fail "python -m venv failed"
pip="$venv/bin/python -m pip install -q --disable-pip-version-check"
pyv=$("$py" -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')
wheel=$(ls /opt/wheels/torch-*-cp${pyv}-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
    $pip "$wheel" || fail "installing $wheel failed"
else
    $pip torch --index-url https://download.pytorch.org/whl/cpu || fail "installing torch (CPU) failed"
fi
$pip numpy transformers==4.57.3 accelerate==1.12.0 einops librosa soundfile sox onnxruntime \
    || fail "installing transformers 4.57.3 and friends failed (no network?)"
$pip --no-deps qwen-tts==0.1.1 torchaudio==2.11.0 || fail "installing qwen-tts 0.1.1 failed"
# torchaudio's compiled library does not load beside torch CPU; qwen_tts only needs its pure-Python
# kaldi module.
rm -f "$venv"/lib/python*/site-packages/torchaudio/lib/*.so
ok || fail "the venv was built but 'import qwen_tts' fails"
echo "qwen-tts reference venv: ready at $venv"
