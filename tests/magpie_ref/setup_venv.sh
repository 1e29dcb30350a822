#!/usr/bin/env bash
# Creates (or reuses) the reference venv for the Magpie TTS parity tests:
# tests/magpie_ref/.venv with torch CPU and nemo-toolkit 3.0.0 (installed --no-deps, plus only what
# `from nemo.collections.tts.models import MagpieTTSModel, AudioCodecModel` needs).
# Not run by CI: run it by hand; the Magpie tests skip until it has succeeded. Rerunning it is a
# no-op once the venv is ready. Exits non-zero, saying why, when it cannot build the venv (the
# reason is also kept in tests/magpie_ref/.venv/FAILED). The folder is git-ignored (.venv/).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
py=${PYTHON:-python3}
NEMO_VERSION=3.0.0
ready() {
    [ -f "$venv/READY" ] && [ -x "$venv/bin/python" ] && "$venv/bin/python" -c \
        "import importlib.metadata as m; assert m.version('nemo-toolkit') == '$NEMO_VERSION'" 2>/dev/null
}
# NeMo's Mandarin G2P (ChineseG2p) imports these when it is built: the Mandarin parity tests need them, and
# metalgen's `zh` extra installs the same packages (the test skips when the two sides' versions differ).
ZH_PACKAGES="jieba pypinyin pypinyin-dict"
if ready; then
    if ! "$venv/bin/python" -c "import jieba, pypinyin, pypinyin_dict" 2>/dev/null; then
        "$venv/bin/python" -m pip install -q --disable-pip-version-check $ZH_PACKAGES \
            || { echo "magpie reference venv: installing $ZH_PACKAGES failed (no network?)" >&2; exit 1; }
    fi
    echo "magpie reference venv: reusing $venv"; exit 0
fi
rm -rf "$venv"
fail() {
    rm -rf "$venv"; mkdir -p "$venv"; echo "$1" > "$venv/FAILED"
    echo "magpie reference venv: $1" >&2; exit 1
}
start=$(date +%s)
"$py" -m venv "$venv" || fail "python -m venv failed"
pip="$venv/bin/python -m pip install -q --disable-pip-version-check"
pyv=$("$py" -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')
# A CPU torch wheel already on the machine: PyPI's default torch drags in gigabytes of CUDA.
wheel=$(ls /opt/wheels/torch-*-cp${pyv}-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
    $pip "$wheel" || fail "installing $wheel failed"
else
    $pip torch --index-url https://download.pytorch.org/whl/cpu || fail "installing torch (CPU) failed"
fi
$pip --no-deps "nemo-toolkit==$NEMO_VERSION" || fail "installing nemo-toolkit $NEMO_VERSION failed (no network?)"
# What the Magpie/codec imports pull in (found by importing and adding what was missing); the rest
# of nemo-toolkit's dependency list (cuda-bindings, tensorboard, aistore, ...) is not needed.
$pip numpy "omegaconf<=2.3" "hydra-core>1.3,<=1.3.2" "lightning>2.2.1,<=2.4.0" torchmetrics transformers \
    huggingface_hub einops librosa soundfile wrapt text-unidecode onnx lhotse sentencepiece pandas \
    kaldialign braceexpand webdataset datasets wandb \
    nv-one-logger-core nv-one-logger-training-telemetry nv-one-logger-pytorch-lightning-integration $ZH_PACKAGES \
    || fail "installing nemo-toolkit's runtime dependencies failed (no network?)"
"$venv/bin/python" -c "from nemo.collections.tts.models import MagpieTTSModel, AudioCodecModel" >/dev/null 2>"$venv/import.log" \
    || fail "the venv was built but importing MagpieTTSModel fails: $(tail -n 1 "$venv/import.log")"
touch "$venv/READY"
echo "magpie reference venv: ready at $venv ($(( $(date +%s) - start )) s)"
