"""Qwen3-TTS: text -> 24 kHz speech on metalgen's decoder and kernels.

    import metalgen.tts
    tts = metalgen.tts.load("dummy:qwen3-tts-0.6b")          # or a folder / hub id
    wav, sr = tts.synthesize("Hello!", speaker="vivian", language="english", seed=0)
    for chunk in tts.stream("Hello!", speaker="vivian"):    # audio while frames are generated
        ...

See docs/tts.md.
"""

from __future__ import annotations

from typing import Optional

from .api import TTSModel
from .audio import write_wav
from .frames import FrameGenerator, SamplingConfig

__all__ = ["load", "TTSModel", "SamplingConfig", "FrameGenerator", "write_wav"]


def load(path_or_id: str, *, dtype=None, revision: Optional[str] = None) -> TTSModel:
    """Load a Qwen3-TTS 12 Hz checkpoint (CustomVoice, VoiceDesign or Base; 0.6B or 1.7B).

    Args:
        path_or_id: a folder in the published layout, a hub id such as
            "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", or "dummy:qwen3-tts-0.6b" (random weights).
        dtype: cast the talker's weights ("bfloat16", "float16", "float32"); None keeps the
            checkpoint's. The speech decoder stays float32 unless a dtype is given.
    """
    if path_or_id.startswith("dummy:"):
        from .dummy import load_dummy

        return load_dummy(path_or_id[len("dummy:"):], dtype=dtype)
    from .loading import load_parts, resolve

    folder = resolve(path_or_id, revision)
    model, speech, tokenizer, gen = load_parts(folder, dtype)
    return TTSModel(model, speech, tokenizer, gen, name=path_or_id)
