"""The cached run of a reference script in its own venv, shared by tests/qwen_tts_ref and tests/magpie_ref.

The script writes its dump into a folder; the dump is kept in `<venv>/refcache/<script name>/<hash of the script>/`
(git-ignored), so a rerun costs nothing and an edited script makes a fresh one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict


def cached_dump(venv: Path, script: Path, marker: str, what: str, env: Dict[str, str]) -> Path:
    """Run `script` with the venv's python into a fresh folder unless the cache already holds a dump
    with `marker` in it; return the dump's folder. `what` names the venv in the error of a failed run;
    `env` is added to the environment."""
    key = hashlib.sha1(script.read_bytes()).hexdigest()[:12]
    # One folder per script, so several reference scripts can share a venv without removing
    # each other's dumps.
    cache = venv / "refcache" / script.stem
    out = cache / key
    if (out / marker).exists():
        return out
    # Written to a private folder and renamed into place, so concurrent test runs never read
    # a half-written dump; dumps of older script versions are removed.
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{key}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(script), str(tmp)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
    )
    if proc.returncode != 0 or not (tmp / marker).exists():
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{script.name} failed in the {what} venv:\n" + "\n".join(tail))
    try:
        os.rename(tmp, out)
    except OSError:  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    for old in cache.iterdir():
        if old.name != key and ".tmp" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    return out
