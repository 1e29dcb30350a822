"""Magpie Python API (metalgen/magpie/api.py) on the tiny reference dump (tests/magpie_ref): load
the `.nemo` pair, synthesize the dump's English sentence greedily with CFG over 32 frames and match
NeMo's waveform; and the one-line errors. Skipped, with the reason, without the dump."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from magpie_ref.harness import reference_folder
from metalgen.errors import MetalgenError


@pytest.fixture(scope="module")
def ref():
    folder = reference_folder()
    from metalgen import magpie

    meta = json.loads((folder / "magpie.json").read_text())
    return dict(folder=folder, npz=np.load(folder / "magpie.npz"), meta=meta, tts=magpie.load(folder / "magpie.nemo"))


def test_loaded(ref):
    tts = ref["tts"]
    assert tts.speakers == ["0", "1"]
    assert tts.languages == ["de", "en", "es", "fr", "hi", "it", "vi"]
    assert tts.sample_rate == ref["meta"]["codec_config"]["sample_rate"] == 22050


def test_synthesize_greedy_matches_nemo(ref):
    tts, npz, meta = ref["tts"], ref["npz"], ref["meta"]
    assert tts.encode(meta["text"], "en") == npz["text_ids"][0].tolist()
    # synthesize runs the fast loop, NeMo's KV-cached mode: its greedy codes are the dump's cached ones
    codes = tts.codes(meta["text"], "en", speaker=meta["speaker_index"], temperature=0, max_frames=32)
    np.testing.assert_array_equal(codes, npz["greedy_codes_cached_cfg"])
    wav, sr = tts.synthesize(meta["text"], "en", speaker=meta["speaker_index"], temperature=0, max_frames=32)
    assert sr == 22050 and wav.dtype == np.float32 and wav.shape == (32 * 16,)
    np.testing.assert_array_equal(wav, tts.decode(codes))
    # the decode half against NeMo's do_tts waveform of its (uncached) greedy codes
    want = npz["greedy_audio_cfg"]
    assert np.corrcoef(tts.decode(npz["greedy_codes_cfg"]), want)[0, 1] > 0.9999
    # streamed: chunks of 4, 8, 16, 4 frames (doubling), each decoded with the codec's receptive field of
    # context, and of 4, 16, 12 (the default growth, x4)
    chunks = list(tts.stream(meta["text"], "en", speaker="1", temperature=0, max_frames=32, chunk_frames=16,
                             chunk_growth=2))
    assert [c.shape[0] for c in chunks] == [4 * 16, 8 * 16, 16 * 16, 4 * 16]
    grown = list(tts.stream(meta["text"], "en", speaker="1", temperature=0, max_frames=32))
    assert [c.shape[0] for c in grown] == [4 * 16, 16 * 16, 12 * 16]
    np.testing.assert_allclose(np.concatenate(grown), wav, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(chunks), wav, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kw, pattern", [
    (dict(language="zh"), r"no tokenizer for language 'zh' \(it has: de, en, es, fr, hi, it, vi\)"),
    (dict(text="Call 911"), r"cannot map 2 characters: '9' \(U\+0039\), '1'"),
    (dict(speaker=2), r"speaker index 2 is out of range: this checkpoint has 2 speakers \(0\.\.1\)"),
    (dict(speaker="Aria"), r"speaker 'Aria' is unknown \(speakers: 0, 1\)"),
])
def test_errors(ref, kw, pattern):
    args = {"text": "Hello.", "language": "en", "max_frames": 2, **kw}
    with pytest.raises(MetalgenError, match=pattern) as e:
        ref["tts"].synthesize(args.pop("text"), args.pop("language"), **args)
    assert "\n" not in str(e.value)


def test_missing_codec(ref, tmp_path):
    from metalgen import magpie

    shutil.copy(ref["folder"] / "magpie.nemo", tmp_path / "magpie.nemo")
    with pytest.raises(MetalgenError, match=r"no NanoCodec for magpie.nemo: its stored codecmodel_path .* codec=") as e:
        magpie.load(tmp_path / "magpie.nemo")
    assert "\n" not in str(e.value)
    with pytest.raises(MetalgenError, match="no codec .nemo file at"):
        magpie.load(tmp_path / "magpie.nemo", codec=tmp_path / "absent.nemo")
    shutil.copy(ref["folder"] / "codec.nemo", tmp_path / "nano_codec.nemo")  # found beside it
    assert magpie.load(tmp_path / "magpie.nemo").sample_rate == 22050


def test_which_loader(tmp_path):
    """metalgen.tts.load's dispatch: Magpie for dummy:magpie-*, .nemo files, folders of them and hub
    ids naming Magpie; Qwen3-TTS for the rest (no reference dump needed)."""
    from metalgen.tts import is_magpie

    (tmp_path / "m.nemo").write_bytes(b"")
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "config.json").write_text("{}")
    assert is_magpie("dummy:magpie-tiny") and is_magpie(str(tmp_path / "m.nemo")) and is_magpie(str(tmp_path))
    assert is_magpie("nvidia/magpie_tts_multilingual_357m") and is_magpie("missing/file.nemo")
    assert not is_magpie("dummy:qwen3-tts-tiny") and not is_magpie(str(qwen))
    assert not is_magpie("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
