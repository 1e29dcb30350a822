"""Runs make_reference.py in the Magpie reference venv and caches its output.

The venv is made by tests/magpie_ref/setup_venv.sh, which CI does NOT run (nemo-toolkit and its
dependencies take minutes to install): tests skip until a developer has run it. Nothing here
builds the venv. Outputs are cached in tests/magpie_ref/.venv/refcache/<hash of the script>/
(git-ignored), so a rerun costs nothing. METALGEN_MAGPIE_REF=/path/to/dump uses an existing dump.
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
MARKER = "magpie.npz"
HOW = "run bash tests/magpie_ref/setup_venv.sh"


def venv_python() -> Path:
    return VENV / "bin" / "python"


def reference_dump() -> Tuple[Union[Path, None], str]:
    """(folder with magpie.npz, magpie.json, tokenizers.json, magpie.nemo, codec.nemo) or (None, why not)."""
    given = os.environ.get("METALGEN_MAGPIE_REF")
    if given:
        path = Path(given)
        return (path, "") if (path / MARKER).exists() else (None, f"{given} holds no Magpie reference dump")
    py = venv_python()
    if not (VENV / "READY").exists() or not py.exists():
        failed = VENV / "FAILED"
        why = failed.read_text().strip() if failed.exists() else "it has not been created"
        return None, f"no Magpie reference venv ({why}); {HOW}"
    key = hashlib.sha1(SCRIPT.read_bytes()).hexdigest()[:12]
    cache = VENV / "refcache"
    out = cache / key
    if (out / MARKER).exists():
        return out, ""
    # Written to a private folder and renamed into place, so concurrent test runs never read a
    # half-written dump; dumps of older script versions are removed.
    tmp = cache / f"{key}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [str(py), str(SCRIPT), str(tmp)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1"},
    )
    if proc.returncode != 0 or not (tmp / MARKER).exists():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError("make_reference.py failed in the Magpie venv:\n" + "\n".join(tail))
    try:
        os.rename(tmp, out)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    for old in cache.iterdir():
        if old.name != key and ".tmp" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    return out, ""
