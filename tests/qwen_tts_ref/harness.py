"""Runs make_reference.py in the qwen-tts reference venv and caches its output.

The venv is made by tests/qwen_tts_ref/setup_venv.sh (CI runs it before pytest). Outputs are
cached in tests/qwen_tts_ref/.venv/refcache/<hash of the script>/ (git-ignored), so a rerun
costs nothing. METALGEN_QWEN_TTS_REF=/path/to/dump uses an existing dump instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Tuple, Union

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
SCRIPT = HERE / "make_reference.py"


def venv_python() -> Path:
    return VENV / "bin" / "python"


def reference_dump() -> Tuple[Union[Path, None], str]:
    """(folder with custom_voice/, custom_voice.npz, custom_voice.json) or (None, why not)."""
    given = os.environ.get("METALGEN_QWEN_TTS_REF")
    if given:
        path = Path(given)
        return (path, "") if (path / "custom_voice.npz").exists() else (None, f"{given} holds no reference dump")
    py = venv_python()
    if not py.exists():
        failed = VENV / "FAILED"
        why = failed.read_text().strip() if failed.exists() else "it has not been created"
        return None, f"no qwen-tts reference venv ({why}); run tests/qwen_tts_ref/setup_venv.sh"
    key = hashlib.sha1(SCRIPT.read_bytes()).hexdigest()[:12]
    cache = VENV / "refcache"
    out = cache / key
    if (out / "base.npz").exists():
        return out, ""
    # Written to a private folder and renamed into place, so concurrent test runs never read
    # a half-written dump; dumps of older script versions are removed.
    tmp = cache / f"{key}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [str(py), str(SCRIPT), str(tmp)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": str(os.cpu_count() or 1)},
    )
    if proc.returncode != 0 or not (tmp / "base.npz").exists():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError("make_reference.py failed in the qwen-tts venv:\n" + "\n".join(tail))
    try:
        os.rename(tmp, out)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    for old in cache.iterdir():
        if old.name != key and ".tmp" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    return out, ""
