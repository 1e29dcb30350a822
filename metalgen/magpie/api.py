"""Magpie TTS from Python: `load(path)` -> `MagpieTTS`, whose `synthesize` turns text into audio.

    from metalgen import magpie
    tts = magpie.load("magpie_tts_multilingual_357m.nemo")   # finds the codec .nemo (see load)
    wav, sr = tts.synthesize("Hello world.", language="en", speaker=0)

The pipeline is NeMo's `do_tts` for one chunk: the text front end (metalgen/magpie/text.py) gives
the tokenizer's ids + text EOS, `generate_codes` draws the codec codes frame by frame, and the
NanoCodec decoder turns them into a float32 waveform. Not yet here: long-text chunking, the
phoneme front ends (so the published checkpoint's phoneme languages raise a MetalgenError),
reference-audio cloning, and chunked codec streaming.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from .generate import MagpieSampling, generate_codes
from .nemo_file import read_nemo
from .text import MagpieText

PathLike = Union[str, Path]


def _speaker_names(path: Path, n: int) -> List[str]:
    """Names of the baked speakers from a speaker JSON inside the `.nemo` ({name: index} or a list
    of names, any member whose name mentions "speaker"), else "0".."N-1". The published files'
    layout is unverified (docs/magpie.md 1.3), so anything that does not name exactly the indices
    0..N-1 is ignored."""
    default = [str(i) for i in range(n)]
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar.getmembers():
                base = m.name.rsplit("/", 1)[-1].lower()
                if not (m.isfile() and base.endswith(".json") and "speaker" in base and m.size < 1 << 20):
                    continue
                data = json.loads(tar.extractfile(m).read().decode("utf-8"))
                if isinstance(data, dict) and sorted(data.values()) == list(range(n)):
                    names = default[:]
                    for name, index in data.items():
                        names[int(index)] = str(name)
                    return names
                if isinstance(data, list) and len(data) == n and all(isinstance(x, str) for x in data):
                    return list(data)
    except (tarfile.TarError, OSError, ValueError, TypeError, UnicodeDecodeError):
        pass
    return default


def find_codec(model_path: Path, config: dict, codec: Optional[PathLike] = None) -> Path:
    """The codec `.nemo`: `codec` when given; else the config's `codecmodel_path` when that file
    exists; else a `.nemo` beside the model (one whose name mentions "codec", or the only other one)."""
    if codec is not None:
        path = Path(codec)
        if not path.is_file():
            raise MetalgenError(f"no codec .nemo file at {path}")
        return path
    stored = config.get("codecmodel_path")
    if stored and Path(str(stored)).is_file():
        return Path(str(stored))
    others = sorted(p for p in model_path.parent.glob("*.nemo") if p.resolve() != model_path.resolve())
    named = [p for p in others if "codec" in p.name.lower()]
    for group in (named, others):
        if len(group) == 1:
            return group[0]
    where = f"its stored codecmodel_path {stored} does not exist, and " if stored else ""
    found = f"{len(others)} other .nemo files" if others else "no other .nemo file"
    raise MetalgenError(
        f"no NanoCodec for {model_path.name}: {where}{model_path.parent} holds {found} to use as the codec; "
        "pass codec=<path to the codec .nemo>"
    )


class MagpieTTS:
    """A loaded Magpie checkpoint with its codec and text front end."""

    def __init__(self, model, codec, text: MagpieText, config: dict, speakers: List[str], source: str):
        self.model = model
        self.codec = codec
        self.text = text
        self.config = config
        self.speakers = speakers
        self.source = source
        self.sampling = MagpieSampling.from_config(config)

    @property
    def languages(self) -> List[str]:
        return self.text.languages

    @property
    def sample_rate(self) -> int:
        return int(self.codec.args.sample_rate)

    def speaker_index(self, speaker: Union[int, str]) -> int:
        """A speaker index, or a name from `speakers`, as the baked speaker's row."""
        if isinstance(speaker, str) and not speaker.lstrip("-").isdigit():
            if speaker not in self.speakers:
                raise MetalgenError(f"Magpie speaker '{speaker}' is unknown (speakers: {', '.join(self.speakers)})")
            return self.speakers.index(speaker)
        try:
            index = int(speaker)
        except (TypeError, ValueError):
            raise MetalgenError(f"Magpie speaker {speaker!r} is neither an index nor a name")
        if not 0 <= index < len(self.speakers):
            raise MetalgenError(
                f"Magpie speaker index {index} is out of range: this checkpoint has {len(self.speakers)} "
                f"speakers (0..{len(self.speakers) - 1})"
            )
        return index

    def encode(self, text: str, language: str = "en") -> List[int]:
        """The text ids fed to the model (tokenizer ids + text EOS)."""
        return self.text.encode(text, language)

    def codes(
        self,
        text: str,
        language: str = "en",
        speaker: Union[int, str] = 0,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        cfg: bool = True,
        cfg_scale: Optional[float] = None,
        max_frames: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> np.ndarray:
        """Codec codes (C, T) int64 for `text` (see `synthesize`)."""
        index = self.speaker_index(speaker)
        ids = self.encode(text, language)
        overrides = {k: v for k, v in (("temperature", temperature), ("top_k", top_k), ("cfg_scale", cfg_scale))
                     if v is not None}
        sampling = MagpieSampling.from_config(self.config, **overrides) if overrides else self.sampling
        return generate_codes(self.model, ids, index, sampling, cfg=cfg, max_frames=max_frames, seed=seed)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes (C, T) -> waveform (T * samples_per_frame,) float32."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.shape[-1] == 0:
            return np.zeros(0, np.float32)
        wav = self.codec.decode(mx.array(codes.reshape(1, *codes.shape[-2:])))
        return np.array(wav[0], dtype=np.float32)

    def synthesize(
        self,
        text: str,
        language: str = "en",
        speaker: Union[int, str] = 0,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        cfg: bool = True,
        cfg_scale: Optional[float] = None,
        max_frames: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> Tuple[np.ndarray, int]:
        """(waveform float32, sample rate) for `text` in `language` by baked `speaker` (an index or
        a name of `speakers`). `temperature` (0: greedy), `top_k`, `cfg_scale` and `max_frames`
        default to the checkpoint's inference parameters; `cfg` toggles classifier-free guidance;
        `seed` makes sampling repeatable."""
        codes = self.codes(text, language, speaker, temperature, top_k, cfg, cfg_scale, max_frames, seed)
        return self.decode(codes), self.sample_rate

    def stream(self, text: str, language: str = "en", speaker: Union[int, str] = 0,
               **kw) -> Iterator[Tuple[np.ndarray, int]]:
        """Yields (waveform chunk, sample rate). For now it yields the whole waveform once, after
        generation ends: chunked codec streaming (decoding frames as they are drawn) is next."""
        yield self.synthesize(text, language, speaker, **kw)


def load(path: PathLike, codec: Optional[PathLike] = None) -> MagpieTTS:
    """A Magpie `.nemo` and its NanoCodec -> MagpieTTS. The codec is `codec` when given, else the
    config's `codecmodel_path` if that file exists, else a `.nemo` beside the model (see find_codec)."""
    from ..models.magpie.codec import load_codec
    from ..models.magpie.model import Model

    path = Path(path)
    config, weights = read_nemo(path)
    codec_path = find_codec(path, config, codec)
    model = Model.from_weights(config, weights, source=str(path))
    text = MagpieText.from_config(config, text_vocab_size=model.args.text_vocab_size)
    nano = load_codec(codec_path)
    a, c = model.args, nano.args
    if (a.num_codebooks, a.codebook_size) != (c.num_codebooks, c.codebook_size):
        raise MetalgenError(
            f"the codec {codec_path} has {c.num_codebooks} codebooks of {c.codebook_size} codes, but "
            f"{path.name} expects {a.num_codebooks} of {a.codebook_size}"
        )
    return MagpieTTS(model, nano, text, config, _speaker_names(path, a.n_speakers), str(path))
