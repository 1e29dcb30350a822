"""Runs make_reference.py in the qwen-tts reference venv and caches its output.

The venv is made by tests/qwen_tts_ref/setup_venv.sh (CI runs it before pytest). Outputs are
cached in tests/qwen_tts_ref/.venv/refcache/<script name>/<hash of the script>/ (git-ignored), so a rerun
costs nothing. METALGEN_QWEN_TTS_REF=/path/to/dump uses an existing dump instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Tuple, Union

from reference_cache import cached_dump

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
    out = cached_dump(VENV, SCRIPT, "base.npz", "qwen-tts",
                      {"OMP_NUM_THREADS": str(os.cpu_count() or 1)})
    return out, ""
