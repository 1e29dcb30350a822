"""Runs make_reference.py in the Magpie reference venv and caches its output.

The venv is made by tests/magpie_ref/setup_venv.sh, which CI does NOT run (nemo-toolkit and its
dependencies take minutes to install): tests skip until a developer has run it. Nothing here
builds the venv. Outputs are cached in tests/magpie_ref/.venv/refcache/<script name>/<hash of the script>/
(git-ignored), so a rerun costs nothing. METALGEN_MAGPIE_REF=/path/to/dump uses an existing dump.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Tuple, Union

import pytest
from reference_cache import cached_dump

from metalgen.errors import MetalgenError

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
    return cached_dump(VENV, SCRIPT, MARKER, "Magpie", {"HF_HUB_OFFLINE": "1"}), ""


def reference_folder() -> Path:
    """The dump's folder, or the calling test skipped with the reason it is missing."""
    import pytest

    folder, why = reference_dump()
    if folder is None:
        pytest.skip(why)
    return folder


def reference_model(folder: Path) -> dict:
    """The dump's arrays (`npz`), magpie.json (`meta`), the .nemo's config and weights, and our Model
    loaded from them: what the model and generation tests start from."""
    import json

    import numpy as np

    from metalgen.magpie.nemo_file import read_nemo
    from metalgen.models.magpie.model import Model

    cfg, weights = read_nemo(folder / "magpie.nemo")
    return dict(npz=np.load(folder / "magpie.npz"), meta=json.loads((folder / "magpie.json").read_text()),
                cfg=cfg, weights=weights, model=Model.from_weights(cfg, weights, source=str(folder / "magpie.nemo")))


def nemo_config(path: Path) -> dict:
    """model_config.yaml of a front-end dump's tiny `.nemo` (which holds no weights, so not read_nemo)."""
    import tarfile

    import yaml

    with tarfile.open(path) as tar:
        return yaml.safe_load(tar.extractfile("./model_config.yaml").read().decode("utf-8"))


def write_nemo_files(path: Path, files: dict) -> Path:
    """A `.nemo`-style tar at `path` holding each {name: text} of `files` under ./name."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def assert_tokenizers_match(ref: dict, text) -> None:
    """A front-end dump's aggregated tokenizers (order, vocabularies, offsets, pad ids, text BOS/EOS) against
    a MagpieText built from the same config, every tokenizer of it built."""
    assert text.order == ref["tokenizer_order"] and not text.unavailable
    for name in ref["tokenizer_order"]:
        assert text.tokenizers[name].tokens == ref["tokens"][name], name
        assert text.offsets[name] == ref["offsets"][name], name
        assert text.tokenizers[name].pad_id + text.offsets[name] == ref["pad_ids"][name], name
    assert (text.text_bos_id, text.text_eos_id) == (ref["text_bos_id"], ref["text_eos_id"])


def assert_encoding_matches(text, sentence: str, name: str, lang: str, ids: List[int], refused: bool) -> bool:
    """MagpieText.encode of `sentence` in `lang` (tokenizer `name`): NeMo's `ids` and the text EOS, or where
    NeMo drops or skips symbols with a log line (`refused`), the port's one-line error naming the tokenizer.
    True where it encoded."""
    if refused:
        with pytest.raises(MetalgenError, match=f"^the Magpie tokenizer '{name}' cannot map"):
            text.encode(sentence, lang)
        return False
    assert text.encode(sentence, lang) == ids + [text.text_eos_id], f"{name}: {sentence!r}"
    return True


G2P_SCRIPT = HERE / "make_g2p_reference.py"
G2P_MARKER = "g2p.json"


def g2p_reference_folder() -> Path:
    """The folder of make_g2p_reference.py's dump (g2p.json, g2p.nemo), made once per script version in
    its own cache folder, or the calling test skipped when the venv is missing.
    METALGEN_MAGPIE_G2P_REF=/dir uses an existing dump."""
    return _script_dump("METALGEN_MAGPIE_G2P_REF", G2P_SCRIPT, G2P_MARKER, "G2P reference dump")


CLONE_SCRIPT = HERE / "make_clone_reference.py"
CLONE_MARKER = "clone.npz"


def clone_reference_folder() -> Path:
    """The folder of make_clone_reference.py's dump (clone.npz, clone.json, clone.nemo, clone_s2tc.nemo,
    codec_*.nemo, clip.wav), made once per script version in its own cache folder, or the calling test
    skipped when the venv is missing. METALGEN_MAGPIE_CLONE_REF=/dir uses an existing dump."""
    return _script_dump("METALGEN_MAGPIE_CLONE_REF", CLONE_SCRIPT, CLONE_MARKER, "cloning reference dump")


CHUNK_SCRIPT = HERE / "make_chunk_reference.py"
CHUNK_MARKER = "chunk.npz"


def chunk_reference_folder() -> Path:
    """The folder of make_chunk_reference.py's dump (chunk.json, chunk.npz, magpie.nemo, magpie_s2.nemo,
    codec.nemo), made once per script version in its own cache folder, or the calling test skipped when
    the venv is missing. METALGEN_MAGPIE_CHUNK_REF=/dir uses an existing dump."""
    return _script_dump("METALGEN_MAGPIE_CHUNK_REF", CHUNK_SCRIPT, CHUNK_MARKER, "long-text reference dump")


ZH_SCRIPT = HERE / "make_zh_reference.py"
ZH_MARKER = "zh.json"


def zh_reference_folder() -> Path:
    """The folder of make_zh_reference.py's dump (zh.json, zh.nemo): NeMo's Mandarin front end with jieba and
    pypinyin, made once per script version, or the calling test skipped when the venv is missing.
    METALGEN_MAGPIE_ZH_REF=/dir uses an existing dump."""
    return _script_dump("METALGEN_MAGPIE_ZH_REF", ZH_SCRIPT, ZH_MARKER, "Mandarin reference dump")


JA_SCRIPT = HERE / "make_ja_reference.py"
JA_MARKER = "ja.json"
JA_HOW = "run bash tests/magpie_ref/setup_ja.sh"


def ja_reference_folder() -> Path:
    """The folder of make_ja_reference.py's dump (ja.json, ja.nemo): NeMo's Japanese front end with pyopenjtalk,
    made once per script version, or the calling test skipped when the venv, or pyopenjtalk and its dictionary
    in it, are missing. METALGEN_MAGPIE_JA_REF=/dir uses an existing dump."""
    import subprocess

    import pytest

    if not os.environ.get("METALGEN_MAGPIE_JA_REF") and (VENV / "READY").exists() and venv_python().exists():
        probe = ("import os, pyopenjtalk; "
                 "assert os.path.isfile(os.path.join(pyopenjtalk.OPEN_JTALK_DICT_DIR.decode(), 'sys.dic'))")
        if subprocess.run([str(venv_python()), "-c", probe], capture_output=True).returncode != 0:
            pytest.skip(f"the Magpie reference venv has no pyopenjtalk with its dictionary; {JA_HOW}")
    return _script_dump("METALGEN_MAGPIE_JA_REF", JA_SCRIPT, JA_MARKER, "Japanese reference dump")


def _script_dump(env: str, script: Path, marker: str, what: str) -> Path:
    """The folder of `script`'s dump (it holds `marker`), made once per script version in its own cache
    folder through the NeMo venv, or the calling test skipped when the venv is missing; the environment
    variable `env` naming a folder uses an existing dump instead."""
    import pytest

    given = os.environ.get(env)
    if given:
        if not (Path(given) / marker).exists():
            pytest.skip(f"{given} holds no Magpie {what}")
        return Path(given)
    py = venv_python()
    if not (VENV / "READY").exists() or not py.exists():
        failed = VENV / "FAILED"
        why = failed.read_text().strip() if failed.exists() else "it has not been created"
        pytest.skip(f"no Magpie reference venv ({why}); {HOW}")
    return cached_dump(VENV, script, marker, "Magpie", {"HF_HUB_OFFLINE": "1"})
