"""Text to speech: Qwen3-TTS (24 kHz) and Magpie TTS (NeMo, 22.05 kHz) behind one `load`.

    import metalgen.tts
    tts = metalgen.tts.load("dummy:qwen3-tts-0.6b")          # or a folder / hub id
    wav, sr = tts.synthesize("Hello!", speaker="vivian", language="english", seed=0)
    for chunk in tts.stream("Hello!", speaker="vivian"):    # audio while frames are generated
        ...
    magpie = metalgen.tts.load("nvidia/magpie_tts_multilingual_357m")   # or a .nemo, dummy:magpie-357m
    wav, sr = magpie.synthesize("Hello!", speaker="Sofia", language="en")

See docs/tts.md.
"""

from __future__ import annotations

from typing import Optional

from .api import TTSModel
from .audio import write_wav
from .frames import FrameGenerator, SamplingConfig

__all__ = ["load", "is_magpie", "TTSModel", "SamplingConfig", "FrameGenerator", "write_wav"]


def is_magpie(path_or_id: str) -> bool:
    """Whether `path_or_id` names a Magpie checkpoint: `dummy:magpie-*`, a `.nemo` file, a folder
    holding a `.nemo` and no config.json, or a hub id with "magpie" in its name."""
    from pathlib import Path

    name = str(path_or_id)
    if name.startswith("dummy:"):
        return name[len("dummy:"):].startswith("magpie")
    path = Path(name).expanduser()
    if name.endswith(".nemo"):
        return True
    if path.is_dir():
        return not (path / "config.json").exists() and any(path.glob("*.nemo"))
    return name.count("/") == 1 and "magpie" in name.lower()


def load(path_or_id: str, *, dtype=None, revision: Optional[str] = None, codec: Optional[str] = None):
    """Load a TTS checkpoint: a Qwen3-TTS 12 Hz one (a TTSModel) or a Magpie one (a
    metalgen.magpie.MagpieTTS). Both have `synthesize(text, speaker=, language=, seed=, ...)` ->
    (waveform, sample rate), `stream(...)` -> waveform chunks, `speakers`, `languages`,
    `sample_rate`.

    Args:
        path_or_id: Qwen3-TTS: a folder in the published layout, a hub id such as
            "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", or "dummy:qwen3-tts-0.6b" (random weights).
            Magpie: a `.nemo` file, a folder holding one, the hub id
            "nvidia/magpie_tts_multilingual_357m", or "dummy:magpie-357m" / "-357m-v2512" / "-tiny".
        dtype: cast the talker's (Magpie: the transformer's) weights ("bfloat16", "float16",
            "float32"); None keeps the checkpoint's. The speech decoder / codec stays float32
            unless a Qwen3-TTS dtype is given.
        revision: a hub branch, tag or commit.
        codec: Magpie only: the NanoCodec `.nemo` (default: found as `metalgen.magpie.load` finds it).
    """
    if is_magpie(path_or_id):
        if path_or_id.startswith("dummy:"):
            from ..magpie.dummy import load_dummy as load_magpie_dummy

            return load_magpie_dummy(path_or_id[len("dummy:"):], dtype=dtype)
        from ..magpie import load as load_magpie

        return load_magpie(path_or_id, codec=codec, dtype=dtype, revision=revision)
    if codec is not None:
        from ..errors import MetalgenError

        raise MetalgenError("a codec path applies to Magpie checkpoints only")
    if path_or_id.startswith("dummy:"):
        from .dummy import load_dummy

        return load_dummy(path_or_id[len("dummy:"):], dtype=dtype)
    from .loading import load_parts, resolve

    folder = resolve(path_or_id, revision)
    model, speech, tokenizer, gen = load_parts(folder, dtype)
    return TTSModel(model, speech, tokenizer, gen, name=path_or_id)
