"""Magpie TTS from Python: `load(path)` -> `MagpieTTS`, whose `synthesize` turns text into audio.

    from metalgen import magpie
    tts = magpie.load("magpie_tts_multilingual_357m.nemo")   # finds the codec .nemo (see load)
    wav, sr = tts.synthesize("Hello world.", language="en", speaker="Sofia")
    for chunk in tts.stream("Hello world.", language="en"):  # audio while frames are drawn
        ...

`metalgen.tts.load` takes the same paths, the hub id and `dummy:magpie-*` too. The pipeline is
NeMo's `do_tts`: a text at or over its language's threshold (45 words in English) is cut into
sentence chunks (metalgen/magpie/chunking.py), the text front end (metalgen/magpie/text.py) gives
each chunk's tokenizer ids + text EOS, `stream_chunks` draws the codec codes frame by frame, chunk
after chunk, and the NanoCodec decoder turns them into a float32 waveform, whole (`synthesize`) or
piece by piece as the frames come (`stream`, metalgen/magpie/streaming.py). `speaker` is a baked
speaker (name or index) or a speaker context made from a reference clip (metalgen/magpie/clone.py).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from ..loading import parse_dtype
from .chunking import chunk_ids
from .generate import MagpieSampling, generate_chunks, stream_chunks
from .nemo_file import read_nemo
from .streaming import CHUNK_FRAMES, CHUNK_GROWTH, FIRST_CHUNK_FRAMES, stream_audio
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


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not name.endswith(".nemo")


def _hub_folder(repo: str, revision: Optional[str]) -> Path:
    """The snapshot folder of hub repo `repo` (its .nemo and JSON files), from the local cache when
    it is there; one-line errors when it is not and the hub cannot be reached."""
    import os

    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise MetalgenError(f"huggingface_hub is needed to fetch '{repo}': {e}")
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=["*.nemo", "*.json"]))
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise MetalgenError(f"'{repo}' is not in the local Hugging Face cache and {why}")
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MetalgenError(f"could not fetch '{repo}' from the Hugging Face hub: {first}")


def _nemo_in(folder: Path, what: str, codec: bool = False) -> Path:
    """The one model (or, with `codec`, codec) `.nemo` in `folder`: a codec's name mentions
    "codec", a model's does not, unless the folder holds a single `.nemo`."""
    found = sorted(folder.glob("*.nemo"))
    wanted = [p for p in found if ("codec" in p.name.lower()) == codec]
    if len(wanted) == 1:
        return wanted[0]
    if len(found) == 1:
        return found[0]
    if not found:
        raise MetalgenError(f"{what} holds no .nemo file")
    raise MetalgenError(f"{what} holds {len(found)} .nemo files ({', '.join(p.name for p in found)}); "
                        "give the one to load")


def resolve_nemo(path_or_id: PathLike, revision: Optional[str] = None) -> Path:
    """The Magpie `.nemo` that `path_or_id` names: a `.nemo` file; a folder holding one (the one
    whose name does not mention "codec" when it holds the codec too); a hub id, fetched into (or
    found in) the local Hugging Face cache."""
    path = Path(path_or_id).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _nemo_in(path, f"the folder {path}")
    text = str(path_or_id)
    if _looks_like_hub_id(text):
        return _nemo_in(_hub_folder(text, revision), f"the hub repo {text}")
    raise MetalgenError(f"no Magpie .nemo file or folder at {path_or_id}")


def find_codec(model_path: Path, config: dict, codec: Optional[PathLike] = None) -> Path:
    """The codec `.nemo`: `codec` when given; else the config's `codecmodel_path` when that file
    exists; else a `.nemo` beside the model (one whose name mentions "codec", or the only other one);
    else `codecmodel_path` as a hub id (`nvidia/nemo-nano-codec-...`), from the local Hugging Face
    cache or the hub."""
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
    if stored and _looks_like_hub_id(str(stored)):
        # NeMo loads it with from_pretrained: the published config names the codec's hub repo.
        try:
            return _nemo_in(_hub_folder(str(stored), None), f"the hub repo {stored}", codec=True)
        except MetalgenError as e:
            raise MetalgenError(f"no NanoCodec for {model_path.name}: {e}; pass codec=<path to the codec .nemo>")
    where = f"its stored codecmodel_path {stored} does not exist, and " if stored else ""
    found = f"{len(others)} other .nemo files" if others else "no other .nemo file"
    raise MetalgenError(
        f"no NanoCodec for {model_path.name}: {where}{model_path.parent} holds {found} to use as the codec; "
        "pass codec=<path to the codec .nemo>"
    )


# Language names accepted beside the codes the checkpoints use (as Qwen3-TTS takes names).
LANGUAGE_NAMES = {"english": "en", "spanish": "es", "german": "de", "french": "fr", "italian": "it",
                  "vietnamese": "vi", "hindi": "hi", "mandarin": "zh", "chinese": "zh", "japanese": "ja"}
# The sampling settings a call may override (MagpieSampling's fields of the same names).
SAMPLING_KEYS = ("temperature", "top_k", "cfg_scale", "max_frames", "min_frames")


class MagpieTTS:
    """A loaded Magpie checkpoint with its codec and text front end: `synthesize` (whole audio),
    `stream` (audio chunks while frames are drawn), `codes` and `decode` (the two halves)."""

    model_type = "magpie"

    def __init__(self, model, codec, text: MagpieText, config: dict, speakers: List[str], source: str):
        self.model = model
        self.codec = codec
        self.text = text
        self.config = config
        self.speakers = speakers
        self.source = source
        self.name = source
        self.sampling = MagpieSampling.from_config(config)

    @property
    def languages(self) -> List[str]:
        return self.text.languages

    @property
    def sample_rate(self) -> int:
        return int(self.codec.args.sample_rate)

    @property
    def samples_per_frame(self) -> int:
        return int(self.codec.args.samples_per_frame)

    @property
    def frame_rate(self) -> float:
        """Codec frames a second (21.5 for NanoCodec)."""
        return self.sample_rate / self.samples_per_frame

    def speaker_index(self, speaker: Union[int, str, None]) -> int:
        """A speaker index, or a name from `speakers` (any case), as the baked speaker's row; None
        is speaker 0, NeMo's default."""
        if speaker is None:
            return 0
        if isinstance(speaker, str) and not speaker.lstrip("-").isdigit():
            folded = [s.lower() for s in self.speakers]
            if speaker.lower() not in folded:
                raise MetalgenError(f"Magpie speaker '{speaker}' is unknown (speakers: {', '.join(self.speakers)})")
            return folded.index(speaker.lower())
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

    def language_code(self, language: Optional[str]) -> str:
        """The checkpoint's code for `language`: a code ("en") or a name ("English"), any case;
        None is English."""
        if language is None:
            return "en"
        lang = str(language).strip().lower()
        return LANGUAGE_NAMES.get(lang, lang)

    def encode(self, text: str, language: Optional[str] = "en") -> List[int]:
        """The text ids fed to the model (tokenizer ids + text EOS)."""
        if text is None or not str(text).strip():
            raise MetalgenError("the text is empty")
        return self.text.encode(str(text), self.language_code(language))

    def encode_chunks(self, text: str, language: Optional[str] = "en") -> List[List[int]]:
        """The text ids of each chunk NeMo's do_tts speaks (one chunk below the language's
        threshold, else one a sentence; see metalgen.magpie.chunking), each ending with text EOS."""
        if text is None or not str(text).strip():
            raise MetalgenError("the text is empty")
        lang = self.language_code(language)
        chunks = chunk_ids(str(text), lang, lambda t: self.text.encode(t, lang))
        if not chunks:
            raise MetalgenError("the text is empty")
        return chunks

    def sampling_for(self, **overrides) -> MagpieSampling:
        """The checkpoint's inference parameters with the given (non-None) `SAMPLING_KEYS` changed."""
        unknown = sorted(set(overrides) - set(SAMPLING_KEYS))
        if unknown:
            raise MetalgenError(f"Magpie does not take the option(s) {', '.join(unknown)}")
        given = {k: v for k, v in overrides.items() if v is not None}
        for key in ("max_frames", "min_frames", "top_k"):
            if key in given and int(given[key]) < (1 if key != "min_frames" else 0):
                raise MetalgenError(f"Magpie {key} must be at least {1 if key != 'min_frames' else 0}")
        S = self.model.args.frame_stacking_factor
        if int(given.get("max_frames", S)) < S:
            raise MetalgenError(f"Magpie max_frames must be at least {S}: each decoder step makes {S} frames")
        return MagpieSampling.from_config(self.config, **given) if given else self.sampling

    def prepare(self, text: str, language: Optional[str] = "en", speaker: Union[int, str, None, mx.array] = 0,
                ref_audio=None, **sampling) -> Tuple[List[int], Union[int, mx.array], MagpieSampling]:
        """Every check a request needs before any work: (text ids, speaker, sampling). The speaker
        is a baked speaker's row, or a speaker context (1, T_ctx, d) passed through as given (the
        output of metalgen.magpie.clone's reference_context, which the generation loop takes).
        `ref_audio` (a path, an array at the codec's rate, or an (array, rate) pair) clones the
        voice of that clip instead: only checkpoints with a context encoder can (see clone.py)."""
        ids = self.encode(text, language)
        return (ids,) + self._voice_and_sampling(speaker, ref_audio, **sampling)

    def _voice_and_sampling(self, speaker, ref_audio, **sampling) -> Tuple[Union[int, mx.array], MagpieSampling]:
        """`prepare`'s speaker and sampling half."""
        if ref_audio is not None:
            from .clone import reference_context

            s = self.sampling_for(**sampling)
            return reference_context(self.model, self.codec, ref_audio), s
        if isinstance(speaker, mx.array):
            d = self.model.args.d_model
            if speaker.ndim != 3 or speaker.shape[0] != 1 or speaker.shape[2] != d:
                raise MetalgenError(f"a Magpie speaker context must be (1, frames, {d}), got {tuple(speaker.shape)}")
            return speaker, self.sampling_for(**sampling)
        return self.speaker_index(speaker), self.sampling_for(**sampling)

    def prepare_chunks(self, text: str, language: Optional[str] = "en",
                       speaker: Union[int, str, None, mx.array] = 0, ref_audio=None,
                       **sampling) -> Tuple[List[List[int]], Union[int, mx.array], MagpieSampling]:
        """`prepare` for the text as do_tts cuts it: (each chunk's ids, speaker, sampling)."""
        chunks = self.encode_chunks(text, language)
        return (chunks,) + self._voice_and_sampling(speaker, ref_audio, **sampling)

    def codes(self, text: str, language: Optional[str] = "en", speaker: Union[int, str, None] = 0,
              cfg: bool = True, seed: Optional[int] = None, ref_audio=None, **sampling) -> np.ndarray:
        """Codec codes (C, T) int64 for `text` (see `synthesize`)."""
        chunks, index, s = self.prepare_chunks(text, language, speaker, ref_audio, **sampling)
        # The fast loop (frames.py: NeMo's decoder cache, reset before each chunk of a long text).
        return generate_chunks(self.model, chunks, index, s, cfg=cfg, seed=seed)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Codes (C, T) -> waveform (T * samples_per_frame,) float32."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.shape[-1] == 0:
            return np.zeros(0, np.float32)
        wav = self.codec.decode(mx.array(codes.reshape(1, *codes.shape[-2:])))
        return np.array(wav[0], dtype=np.float32)

    def synthesize(self, text: str, language: Optional[str] = "en", speaker: Union[int, str, None] = 0,
                   cfg: bool = True, seed: Optional[int] = None, ref_audio=None,
                   **sampling) -> Tuple[np.ndarray, int]:
        """(waveform float32, sample rate) for `text` in `language` (a code such as "en" or a name)
        by `speaker` (an index or a name of `speakers`, or a speaker context: see `prepare`).
        `sampling` overrides the checkpoint's inference parameters: `temperature` (0: greedy),
        `top_k`, `cfg_scale`, `max_frames`, `min_frames` (codec frames before EOS may be drawn);
        `cfg` toggles classifier-free guidance; `seed` makes sampling repeatable; `ref_audio` clones
        a reference clip's voice (see `prepare`)."""
        codes = self.codes(text, language, speaker, cfg, seed, ref_audio, **sampling)
        return self.decode(codes), self.sample_rate

    def stream(self, text: str, language: Optional[str] = "en", speaker: Union[int, str, None] = 0,
               cfg: bool = True, seed: Optional[int] = None, chunk_frames: int = CHUNK_FRAMES,
               first_chunk_frames: Optional[int] = FIRST_CHUNK_FRAMES, left_context: Optional[int] = None,
               ref_audio=None, chunk_growth: int = CHUNK_GROWTH, **sampling) -> Iterator[np.ndarray]:
        """Float32 waveform chunks (at `sample_rate`) while the frames are drawn: the first after
        `first_chunk_frames` codec frames, each later one `chunk_growth` times the one before up to
        `chunk_frames` (None: every chunk `chunk_frames`). Their concatenation is `synthesize`'s
        waveform for the same seed. The options are checked here, before the first chunk is
        asked for; the rest are `synthesize`'s."""
        chunks, index, s = self.prepare_chunks(text, language, speaker, ref_audio, **sampling)
        if chunk_frames < 1 or (first_chunk_frames is not None and first_chunk_frames < 1) or chunk_growth < 1:
            raise MetalgenError("chunk_frames, first_chunk_frames and chunk_growth must be >= 1")
        # The fast loop, chunk after chunk for a long text (see `codes`); the audio comes piece by piece
        # across the chunks from one codec stream (do_tts decodes the joined codes once).
        pieces = stream_chunks(self.model, chunks, index, s, cfg=cfg, seed=seed)
        return stream_audio(self.codec, pieces, chunk_frames, first_chunk_frames, left_context, chunk_growth)


def load(path: PathLike, codec: Optional[PathLike] = None, dtype=None, revision: Optional[str] = None) -> MagpieTTS:
    """A Magpie checkpoint and its NanoCodec -> MagpieTTS.

    `path`: a `.nemo` file, a folder holding one (see `resolve_nemo`) or a Hugging Face hub id
    (`nvidia/magpie_tts_multilingual_357m`, from the local cache or the hub; `revision` picks a
    branch such as v2512). The codec is `codec` when given, else the config's `codecmodel_path` if
    that file exists, else a `.nemo` beside the model, else `codecmodel_path` as a hub id (see
    find_codec). `dtype` casts the transformer's weights (the `.nemo` holds float32); the codec
    stays float32."""
    from .codec_file import load_codec
    from ..models.magpie.model import Model

    path = resolve_nemo(path, revision)
    config, weights = read_nemo(path)
    codec_path = find_codec(path, config, codec)
    model = Model.from_weights(config, weights, source=str(path))
    if dtype is not None:
        model.set_dtype(parse_dtype(dtype))
    text = MagpieText.from_config(config, text_vocab_size=model.args.text_vocab_size, nemo_path=path)
    nano = load_codec(codec_path)
    a, c = model.args, nano.args
    if (a.num_codebooks, a.codebook_size) != (c.num_codebooks, c.codebook_size):
        raise MetalgenError(
            f"the codec {codec_path} has {c.num_codebooks} codebooks of {c.codebook_size} codes, but "
            f"{path.name} expects {a.num_codebooks} of {a.codebook_size}"
        )
    return MagpieTTS(model, nano, text, config, _speaker_names(path, a.n_speakers), str(path))
