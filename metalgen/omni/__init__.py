"""Qwen3-Omni: text and speech in, text and speech out.

    import metalgen.omni as omni
    parts = omni.load("Qwen/Qwen3-Omni-30B-A3B-Instruct")      # or a folder, or dummy:qwen3-omni-tiny
    for piece in omni.stream(parts, [{"role": "user", "content": "Hi!"}], audio=["question.wav"]):
        print(piece.text, end="")                                # text as the thinker writes it
        if piece.audio is not None: ...                          # 24 kHz float32 samples as decoded

`generate` gathers the whole reply (text and waveform). The pieces: loading.py (checkpoints and
dummy shapes), features.py (audio in), prompt.py (the thinker's and the talker's prompts),
generate.py (the interleaved thinker / talker / Code2Wav loop).
"""

from __future__ import annotations

from ..tts.audio import write_wav
from .generate import SAMPLE_RATE, OmniResponse, OmniResult, generate, speaker_id, stream, talker_sampling
from .loading import OmniParts, load

__all__ = ["load", "stream", "generate", "talker_sampling", "speaker_id", "write_wav", "OmniParts", "OmniResponse",
           "OmniResult", "SAMPLE_RATE"]
