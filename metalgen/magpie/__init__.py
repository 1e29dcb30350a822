"""Magpie TTS (NeMo MagpieTTSModel + NanoCodec): checkpoint reading, loading and synthesis.

    from metalgen import magpie
    tts = magpie.load("model.nemo")            # the codec .nemo is found beside it, or codec=...
    wav, sr = tts.synthesize("Hello world.", language="en", speaker=0)

`load` / `MagpieTTS` (api.py), the text front end `MagpieText` (text.py), the generation loop
`generate_codes` / `MagpieSampling` (generate.py) and the `.nemo` reader `read_nemo` (nemo_file.py).
"""

from .api import MagpieTTS, load
from .generate import MagpieSampling, generate_codes
from .nemo_file import read_nemo
from .text import MagpieText

__all__ = ["MagpieTTS", "load", "MagpieText", "MagpieSampling", "generate_codes", "read_nemo"]
