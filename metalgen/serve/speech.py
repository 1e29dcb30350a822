"""`POST /v1/audio/speech`: OpenAI's text-to-speech route over a Qwen3-TTS or a Magpie TTS model (docs/serve.md,
"Speech").

The request names a `voice` (a speaker of the checkpoint, or a reference voice the server was started with),
may add `instructions` (Qwen3-TTS's instruct text) and picks a `response_format`. "wav" and "pcm" are sent
while the audio is generated (chunked HTTP: a WAV header whose sizes say "unknown" first, then 16-bit
samples); "flac", "mp3" and "opus" are encoded by soundfile once the clip is complete, where its libsndfile
can write them at the model's sample rate. `stream_format: "sse"` sends the same bytes as base64
`speech.audio.delta` events and a closing `speech.audio.done` with the usage.

The request parsing, the worker, the audio encoding and the streaming are shared; what differs between the
two model families (their voices, languages, limits and the call that streams the audio) is a small class
each, `QwenSpeech` and `MagpieSpeech`, which `SpeechEngine` picks from the loaded model."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import queue
import struct
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import mlx.core as mx
import numpy as np
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from ..errors import MetalgenError
from ..magpie.chunking import ChunkRules
from .engine import DEFAULT_MAX_QUEUE, InFlight, JobEvents
from .http import DEFAULT_MAX_REQUEST_BYTES, cancel_on_disconnect, error_response, read_body
from .protocol import RequestError, _number

# config.json model types served by this route (the others are text decoders); Magpie checkpoints are NeMo
# `.nemo` files, which have none (see `model_kind`)
SPEECH_MODEL_TYPES = ("qwen3_tts",)
# config.json model types that write and speak: their text routes and this one, on one loaded model
TEXT_AND_SPEECH_MODEL_TYPES = ("qwen3_omni_moe",)
STREAMED = ("wav", "pcm")
# soundfile (format, subtype) of the formats encoded whole, when its libsndfile writes them (see `encodable`)
ENCODED = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's, in its order
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg"}
# text tokens the talker prompt adds around the input (role tags, codec prefix, speaker): a bound, not a count
PROMPT_OVERHEAD = 32


def model_kind(path_or_id: str, revision: Optional[str] = None) -> str:
    """What a model serves: "speech", "text", or "text+speech" (Qwen3-Omni: both, the speech route only where the
    checkpoint has its talker). A Magpie checkpoint is told as `metalgen.tts.load` tells it
    (`metalgen.tts.is_magpie`: a `.nemo`, a folder of them without a config.json, a Magpie hub id), so that
    the server and the loader agree; anything else by its config's model_type (a dummy shape's config, a
    folder's or a hub snapshot's config.json), not by its name."""
    from ..tts import is_magpie

    if is_magpie(path_or_id):
        return "speech"
    if path_or_id.startswith("dummy:"):
        from ..dummy import dummy_config
        from ..magpie.dummy import SHAPES as MAGPIE_SHAPES
        from ..tts.dummy import SHAPES as TTS_SHAPES

        shape = path_or_id[len("dummy:"):]
        if shape in TTS_SHAPES:
            model_type = TTS_SHAPES[shape]["config"]["model_type"]
        else:
            try:
                model_type = dummy_config(shape)["model_type"]
            except MetalgenError as e:
                shapes = ", ".join([*TTS_SHAPES, *MAGPIE_SHAPES])
                raise MetalgenError(f"{e}; speech shapes: {shapes}")
    else:
        from ..loading import read_json, resolve_model_path

        folder = resolve_model_path(path_or_id, revision)
        model_type = read_json(folder / "config.json", "config.json").get("model_type")
    if model_type in TEXT_AND_SPEECH_MODEL_TYPES:
        return "text+speech"
    return "speech" if model_type in SPEECH_MODEL_TYPES else "text"


def parse_voices(specs: List[str], transcripts: List[str] = ()) -> Dict[str, Tuple[str, Optional[str]]]:
    """`metalgen serve --voice NAME=CLIP [--voice-text NAME=TRANSCRIPT]` -> {name: (clip, transcript or None)}."""
    def pairs(items, flag):
        out = {}
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or not name.strip() or not value.strip():
                raise MetalgenError(f"{flag} takes NAME=VALUE, got {item!r}")
            out[name.strip()] = value
        return out

    clips, texts = pairs(specs, "--voice"), pairs(transcripts, "--voice-text")
    for name in texts.keys() - clips.keys():
        raise MetalgenError(f"--voice-text {name}=... has no --voice {name}=CLIP")
    return {name: (clip, texts.get(name)) for name, clip in clips.items()}


# ---- audio bytes -----------------------------------------------------------------------------------------

def pcm16(wav: np.ndarray) -> bytes:
    """float32 samples in [-1, 1] -> 16-bit little-endian PCM (clipped, rounded to nearest)."""
    return np.rint(np.clip(wav, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_header(sample_rate: int) -> bytes:
    """A 44-byte RIFF header of 16-bit mono PCM whose RIFF and data sizes are 0xFFFFFFFF: the length is not
    known while the audio streams, and readers (libsndfile, ffmpeg) then read the data to the end."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " + fmt + b"data" + struct.pack("<I", unknown)


def encode(fmt: str, wav: np.ndarray, sample_rate: int) -> bytes:
    """A whole clip in one of the `ENCODED` formats, through soundfile."""
    import soundfile as sf

    out = io.BytesIO()
    container, subtype = ENCODED[fmt]
    sf.write(out, np.asarray(wav, np.float32), sample_rate, format=container, subtype=subtype)
    return out.getvalue()


def encodable(sample_rate: int) -> Dict[str, str]:
    """Which `ENCODED` formats soundfile writes at `sample_rate` here ({format: ""}), and why the others
    cannot be ({format: reason}): libsndfile builds differ, and MP3 and Opus take only some rates."""
    found = {}
    for fmt in ENCODED:
        try:
            encode(fmt, np.zeros(sample_rate // 10, np.float32), sample_rate)
            found[fmt] = ""
        except Exception as e:  # noqa: BLE001 - any failure means "not here"; its first line says why
            why = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            found[fmt] = why.split("Error : ")[-1]  # libsndfile's reason, without "Error opening <file>: "
    return found


# ---- the request -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class SpeechRequest:
    """One /v1/audio/speech request, checked against the served model. The model's half of the check
    (`QwenSpeech.check`, `MagpieSpeech.check`) fills `voice` and `language` in the model's own terms and
    `input_tokens`."""

    model: str
    input: str
    voice: Optional[Union[str, int]]  # as asked; after the check, the voice as the model names it
    instructions: Optional[str]
    language: Optional[str]
    response_format: str
    stream_format: str  # "audio" or "sse"
    seed: Optional[int]
    input_tokens: int = 0
    # extensions: the sampling settings asked for (temperature, top_k, cfg_scale); absent = the checkpoint's
    sampling: Dict[str, Any] = dataclasses.field(default_factory=dict)


def _shortened(names: List[str], most: int = 12) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names) - most} more)" if len(names) > most else "") if names else "none"


def _text(body: dict, name: str, required: bool = False) -> Optional[str]:
    value = body.get(name)
    if value is None:
        if required:
            raise RequestError(f"'{name}' is required", param=name)
        return None
    if not isinstance(value, str):
        raise RequestError(f"'{name}' must be a string", param=name)
    return value


def _voice_name_error() -> RequestError:
    return RequestError("'voice' must be a string (a voice name)", param="voice")


def parse_speech_request(body, engine: "SpeechEngine") -> SpeechRequest:
    """Check a /v1/audio/speech body (parsed JSON) against `engine`'s model: a RequestError naming the field
    for anything it cannot serve as asked. The fields' types and the output options are checked here for
    every model, then the voice, language, instructions, sampling and input by the model's half
    (`engine.family`), which fills in the request in the model's own terms."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = _text(body, "model", required=True)
    if model != engine.name:
        raise RequestError(f"the model '{model}' does not exist here (this server has '{engine.name}')", 404,
                           param="model")
    text = _text(body, "input", required=True)
    if not text.strip():
        raise RequestError("'input' is empty", param="input")
    voice = body.get("voice")
    if isinstance(voice, dict):  # OpenAI's custom-voice form: {"id": "..."}
        voice = voice.get("id")
    # an integer is a speaker index, which only Magpie takes (Qwen3-TTS's check refuses it)
    if voice is not None and (isinstance(voice, bool) or not isinstance(voice, (str, int))):
        raise _voice_name_error()
    instructions = _text(body, "instructions") or None
    language = _text(body, "language")  # an extension: the model's language (Qwen3-TTS: auto; Magpie: en)
    fmt = body.get("response_format", "mp3")  # OpenAI's default
    if fmt not in FORMATS:
        raise RequestError(f"'response_format' must be one of {', '.join(FORMATS)}, got {fmt!r}",
                           param="response_format")
    if fmt not in STREAMED and engine.formats.get(fmt, "not supported") != "":
        why = engine.formats.get(fmt) or "no encoder without new dependencies"
        raise RequestError(f"response_format '{fmt}' is not available here ({why}); wav and pcm are",
                           param="response_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)):
        raise RequestError("'speed' must be a number", param="speed")
    if speed != 1.0:
        raise RequestError(f"'speed' other than 1.0 is not supported: {engine.family.label} has no rate control, "
                           "and resampling the audio would shift its pitch", param="speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise RequestError(f"'stream_format' must be 'audio' or 'sse', got {stream_format!r}", param="stream_format")
    seed = body.get("seed")  # an extension: the sampling is random
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
        raise RequestError("'seed' must be an integer in 0..2**32-1", param="seed")
    # extensions, checked as the text routes check them; absent leaves the checkpoint's setting
    sampling = dict(temperature=_number(body, "temperature", None, float, 0.0, 2.0),
                    top_k=_number(body, "top_k", None, int, 1),
                    cfg_scale=_number(body, "cfg_scale", None, float, 0.0, 20.0))
    req = SpeechRequest(model=model, input=text, voice=voice, instructions=instructions, language=language,
                        response_format=fmt, stream_format=stream_format, seed=seed,
                        sampling={k: v for k, v in sampling.items() if v is not None})
    engine.family.check(req)  # last: Magpie's runs the text front end
    return req


# ---- the two model families ------------------------------------------------------------------------------

class QwenSpeech:
    """Qwen3-TTS's half of a SpeechEngine (a metalgen.tts TTSModel): CustomVoice speakers, a VoiceDesign
    description, or the reference voices of a Base model (`ref_voices`: {name: (clip, transcript or None)});
    `max_frames` caps a clip's 80 ms frames (None: the checkpoint's limit)."""

    label = "Qwen3-TTS"

    def __init__(self, tts, name: str, decode: Optional[str], max_frames: Optional[int],
                 ref_voices: Dict[str, Tuple[str, Optional[str]]]):
        from ..tts.audio import read_reference

        self.tts, self.decode = tts, decode
        self.max_frames = int(tts.sampling().max_frames if max_frames is None else max_frames)
        if self.max_frames < 1:
            raise MetalgenError(f"max frames must be >= 1, got {self.max_frames}")
        self.input_limit = tts.args.talker.max_position_embeddings - self.max_frames - PROMPT_OVERHEAD
        self.sample_rate = tts.sample_rate
        self.samples_per_frame = int(tts.speech.decoder.total_upsample)
        self.refs: Dict[str, Tuple[Tuple[np.ndarray, int], Optional[str]]] = {}
        if ref_voices and tts.model_type != "base":
            raise MetalgenError(f"reference voices are for a Base model; {name} is {tts.model_type}")
        for voice, (clip, transcript) in ref_voices.items():
            # read once, here: a bad clip fails at start-up, not in every request
            self.refs[voice] = ((read_reference(clip, self.sample_rate), self.sample_rate), transcript)

    @property
    def voices(self) -> List[str]:
        """The CustomVoice speakers or the Base reference voices."""
        return sorted(self.refs) if self.tts.model_type == "base" else list(self.tts.speakers)

    def parameters(self):
        """The weights to evaluate before the worker starts (the talker and the speech decoder)."""
        return [self.tts.model.parameters(), self.tts.speech.parameters()]

    def check(self, req: SpeechRequest) -> None:
        """Refuse (RequestError) what this model cannot speak as asked; set the voice as the model names it and
        the input's token count."""
        tts, kind = self.tts, self.tts.model_type
        if isinstance(req.voice, int):
            raise _voice_name_error()
        if kind == "voice_design":
            # the voice is the one `instructions` describe; `voice` (which OpenAI clients must send) names nothing
            req.voice = None
            if not req.instructions:
                raise RequestError("this VoiceDesign model needs 'instructions' describing the voice",
                                   param="instructions")
        else:
            known = self.voices
            hint = "" if known or kind != "base" else "; a Base model clones the voices of `metalgen serve --voice`"
            if not req.voice:
                raise RequestError(f"'voice' is required (known: {_shortened(known)}){hint}", param="voice")
            match = {v.lower(): v for v in known}.get(req.voice.lower())
            if match is None:
                raise RequestError(f"unknown voice '{req.voice}' (known: {_shortened(known)}){hint}", param="voice")
            req.voice = match
            if req.instructions and not tts.supports_instruct:
                raise RequestError(f"this model ({tts.args.tts_model_size} {kind}) does not take 'instructions'",
                                   param="instructions")
        if req.language is not None and req.language.lower() not in tts.languages:
            raise RequestError(f"unknown language '{req.language}' (known: {_shortened(tts.languages)})",
                               param="language")
        if "cfg_scale" in req.sampling:
            raise RequestError("'cfg_scale' is Magpie's classifier-free guidance; Qwen3-TTS has none",
                               param="cfg_scale")
        tokens = len(tts.tokenizer.encode(req.input))
        tokens += len(tts.tokenizer.encode(req.instructions)) if req.instructions else 0
        if tokens > self.input_limit:
            raise RequestError(f"'input' has {tokens} tokens, past this model's limit of {self.input_limit} (its "
                               f"context less {self.max_frames} frames of audio)", param="input")
        req.input_tokens = tokens

    def stream(self, req: SpeechRequest) -> Iterator[np.ndarray]:
        """The checked request's audio, chunk by chunk (`TTSModel.stream`)."""
        kw = dict(speaker=req.voice, language=req.language, instruct=req.instructions, seed=req.seed,
                  decode=self.decode, max_frames=self.max_frames)
        # one temperature and top-k for the talker and the code predictor alike, as one model to the client
        for key in ("temperature", "top_k"):
            if key in req.sampling:
                kw[key] = kw["sub_" + key] = req.sampling[key]
        if req.voice in self.refs:  # a Base model's reference voice, not a speaker
            kw["speaker"] = None
            (kw["ref_audio"], kw["ref_text"]) = self.refs[req.voice]
        return self.tts.stream(req.input, **kw)


class OmniSpeech:
    """Qwen3-Omni's half of a SpeechEngine (metalgen.omni OmniParts, loaded whole): the talker speaks `input` as
    the assistant's reply to it in one of the checkpoint's speakers, the thinker only prefilling the
    conversation (`metalgen.omni.stream(say=...)`); `max_frames` caps a clip's 80 ms frames (None: the
    checkpoint's talker limit)."""

    label = "Qwen3-Omni"

    def __init__(self, parts, name: str, decode: Optional[str], max_frames: Optional[int]):
        from ..omni import SAMPLE_RATE, talker_sampling

        if parts.args.talker is None or "talker" not in parts.model or "code2wav" not in parts.model:
            raise MetalgenError(f"{name} has no talker and Code2Wav: it serves text only")
        self.parts, self.decode = parts, decode
        self.max_frames = int(talker_sampling(parts.generation_config).max_frames if max_frames is None
                              else max_frames)
        if self.max_frames < 1:
            raise MetalgenError(f"max frames must be >= 1, got {self.max_frames}")
        context = min(parts.args.talker.text.max_position_embeddings, parts.model.thinker.spec.max_position_embeddings)
        # the text is in the prompt twice (the user's turn, the reply the talker reads) beside the frames
        self.input_limit = (context - self.max_frames - PROMPT_OVERHEAD) // 2
        self.sample_rate = SAMPLE_RATE
        self.samples_per_frame = int(parts.model.code2wav.total_upsample)

    @property
    def voices(self) -> List[str]:
        """The checkpoint's speakers."""
        return sorted(self.parts.args.talker.speaker_id)

    def parameters(self):
        return [self.parts.model.parameters()]

    def check(self, req: SpeechRequest) -> None:
        """Refuse (RequestError) what Qwen3-Omni cannot speak as asked; set the voice and the input's token count."""
        if isinstance(req.voice, int):
            raise _voice_name_error()
        known = self.voices
        if not req.voice:
            raise RequestError(f"'voice' is required (known: {_shortened(known)})", param="voice")
        if req.voice.lower() not in known:
            raise RequestError(f"unknown voice '{req.voice}' (known: {_shortened(known)})", param="voice")
        req.voice = req.voice.lower()
        if req.instructions:
            raise RequestError("Qwen3-Omni does not take 'instructions' here (its voice is the speaker's)",
                               param="instructions")
        if req.language is not None:
            raise RequestError("Qwen3-Omni takes no 'language': it speaks the language of the input",
                               param="language")
        if "cfg_scale" in req.sampling:
            raise RequestError("'cfg_scale' is Magpie's classifier-free guidance; Qwen3-Omni has none",
                               param="cfg_scale")
        tokens = len(self.parts.tokenizer.encode(req.input))
        if tokens > self.input_limit:
            raise RequestError(f"'input' has {tokens} tokens, past this model's limit of {self.input_limit} (half its "
                               f"context less {self.max_frames} frames of audio)", param="input")
        req.input_tokens = tokens

    def stream(self, req: SpeechRequest) -> Iterator[np.ndarray]:
        """The checked request's audio, chunk by chunk."""
        from ..omni import stream, talker_sampling

        talker = talker_sampling(self.parts.generation_config, max_frames=self.max_frames,
                                 **{k: req.sampling[k] for k in ("temperature", "top_k") if k in req.sampling})
        pieces = stream(self.parts, [{"role": "user", "content": req.input}], speaker=req.voice, say=req.input,
                        talker=talker, seed=req.seed, decode=self.decode)
        return (p.audio for p in pieces if p.audio is not None)


# two probes for `_language_errors`: a letter most tokenizers map, and a character none does
_PROBES = ("a", "\x00")


def _language_errors(tts) -> Dict[str, str]:
    """{language: why} for the checkpoint's languages that no text can be spoken in (a tokenizer metalgen
    cannot build: Japanese or Mandarin without its optional packages, a missing dictionary). Told apart from a text's own fault without
    reading messages: such a language refuses two unlike texts with the same error, while a working tokenizer's
    error names the text's characters."""
    errors = {}
    for language in tts.languages:
        found = []
        for probe in _PROBES:
            try:
                tts.encode(probe, language)
                found.append(None)
            except MetalgenError as e:
                found.append(str(e))
        if found[0] is not None and found[0] == found[1]:
            errors[language] = found[0]
    return errors


class MagpieSpeech:
    """Magpie TTS's half of a SpeechEngine (a metalgen.magpie MagpieTTS): `voice` is a baked speaker (its name,
    any case, or its index) or a voice cloned at start-up from `ref_voices` ({name: (clip, None)}; checkpoints
    with a context encoder only); `language` a code or name of the checkpoint's (default "en"); `max_frames`
    caps a clip's codec frames (46 ms each; None: the checkpoint's limit)."""

    label = "Magpie TTS"
    model_type = "magpie"  # MagpieTTS.model_type: how SpeechEngine tells the loaded model's family
    DEFAULT_LANGUAGE = "en"  # MagpieTTS's own default

    def __init__(self, tts, name: str, max_frames: Optional[int], ref_voices: Dict[str, Tuple[str, Optional[str]]]):
        self.tts = tts
        a = tts.model.args
        self.max_frames = int(tts.sampling.max_frames if max_frames is None else max_frames)
        tts.sampling_for(max_frames=self.max_frames)  # its own checks (at least one decoder step's frames)
        self.sample_rate = tts.sample_rate
        self.samples_per_frame = tts.samples_per_frame
        self.speakers = {s.lower(): i for i, s in enumerate(tts.speakers)}
        self.refs: Dict[str, mx.array] = {}
        for voice, (clip, transcript) in ref_voices.items():
            if transcript is not None:
                raise MetalgenError(f"--voice-text {voice}=...: Magpie clones a voice from the clip alone")
            if voice.lower() in self.speakers:
                raise MetalgenError(f"--voice {voice}: {name} has a speaker of that name already")
            self.refs[voice] = self._clone(voice, clip)
        self.clones = {v.lower(): v for v in self.refs}
        self.language_errors = _language_errors(tts)
        # the text encoder's learned positions bound the input; without them nothing does
        encoder, decoder = tts.model.encoder, tts.model.decoder
        self.input_limit = a.encoder.max_length_causal_mask if "position_embeddings" in encoder else None
        # the decoder's: the longest speaker context, a BOS block and a position per step (checked here, once,
        # rather than failing every request)
        context = max([a.baked_context_len] * bool(tts.speakers) + [c.shape[1] for c in self.refs.values()],
                      default=0)
        need = context + 1 + self.max_frames // a.frame_stacking_factor
        if "position_embeddings" in decoder and need > a.decoder.max_length_causal_mask:
            raise MetalgenError(f"{name}: {self.max_frames} frames after a {context}-frame speaker context need "
                                f"{need} decoder positions; the model has {a.decoder.max_length_causal_mask}")

    def _clone(self, voice: str, clip: str) -> mx.array:
        """The speaker context of `clip`, made once: what `MagpieTTS.prepare(ref_audio=clip)` makes (the same
        function, called without the text prepare would need), passed to every request as its speaker."""
        from ..magpie.clone import reference_context

        try:
            context = reference_context(self.tts.model, self.tts.codec, clip)
        except MetalgenError as e:
            raise MetalgenError(f"--voice {voice}: {e}")
        mx.eval(context)  # here: an array still to compute would be computed on this thread's stream, not the worker's
        return context

    @property
    def voices(self) -> List[str]:
        """The baked speakers, then the cloned voices."""
        return list(self.tts.speakers) + sorted(self.refs)

    def parameters(self):
        """The weights to evaluate before the worker starts (the transformer and the codec)."""
        return [self.tts.model.parameters(), self.tts.codec.parameters()]

    def _voice(self, voice) -> Union[str, int]:
        """The cloned voice's name or the baked speaker's index that `voice` (a name, any case, or an index,
        as an integer or its digits) names."""
        if not isinstance(voice, int):
            if voice.lower() in self.clones:
                return self.clones[voice.lower()]
            if voice.lower() in self.speakers:
                return self.speakers[voice.lower()]
            if not voice.strip().isdigit():
                raise self._voice_error(f"unknown voice '{voice}'")
        index = int(voice)
        if not 0 <= index < len(self.tts.speakers):
            raise self._voice_error(f"unknown voice '{voice}'")
        return index

    def _voice_error(self, what: str) -> RequestError:
        """`what`, then the voices a request may name."""
        n = len(self.tts.speakers)
        if not n and not self.refs:  # a checkpoint that only clones, started without a voice to clone
            return RequestError(f"{what}: this checkpoint has no baked speakers, and clones the voices of "
                                "`metalgen serve --voice NAME=CLIP` (none given)", param="voice")
        index = f"; or a speaker index 0..{n - 1}" if n else ""
        return RequestError(f"{what} (known: {_shortened(self.voices)}{index})", param="voice")

    def check(self, req: SpeechRequest) -> None:
        """Refuse (RequestError) what this checkpoint cannot speak as asked; set the voice (a speaker index or
        a cloned voice's name), the language code and the input's text token count."""
        tts = self.tts
        if req.instructions:
            raise RequestError("Magpie TTS does not take 'instructions' (its voice is the speaker's)",
                               param="instructions")
        if req.voice is None or req.voice == "":
            raise self._voice_error("'voice' is required")
        voice = self._voice(req.voice)
        asked = self.DEFAULT_LANGUAGE if req.language is None else req.language
        language = tts.language_code(asked)  # a code or a name ("English"), any case
        if language not in tts.languages:
            default = " (the default)" if req.language is None else ""
            raise RequestError(f"unknown language '{asked}'{default} (known: {_shortened(tts.languages)})",
                               param="language")
        if language in self.language_errors:
            raise RequestError(self.language_errors[language], param="language")
        speaker = self.refs[voice] if isinstance(voice, str) else voice
        try:
            # the voice, language and sampling are known good here: what is left to fail is the text, cut
            # into the chunks that are spoken one after another (one below the language's threshold)
            chunks, _, _ = tts.prepare_chunks(req.input, language, speaker, **req.sampling)
        except MetalgenError as e:
            raise RequestError(str(e), param="input")
        # the encoder sees one chunk at a time, after the first with up to ChunkState's history tokens
        history = ChunkRules.history_tokens if len(chunks) > 1 else 0
        longest = max(len(c) for c in chunks) + history
        if self.input_limit is not None and longest > self.input_limit:
            raise RequestError(f"'input' has a sentence of {longest} text tokens with its context, past this model's "
                               f"limit of {self.input_limit} (its text encoder's positions)", param="input")
        req.voice, req.language, req.input_tokens = voice, language, sum(len(c) for c in chunks)

    def stream(self, req: SpeechRequest) -> Iterator[np.ndarray]:
        """The checked request's audio, chunk by chunk (`MagpieTTS.stream`)."""
        speaker = self.refs[req.voice] if isinstance(req.voice, str) else req.voice
        return self.tts.stream(req.input, language=req.language, speaker=speaker, seed=req.seed,
                               max_frames=self.max_frames, **req.sampling)


# ---- the engine ------------------------------------------------------------------------------------------

class SpeechJob(JobEvents):
    """One request in flight. Its events: ("audio", float32 chunk)..., then ("done", frames) or ("error",
    RequestError)."""

    def __init__(self, req: SpeechRequest, loop: asyncio.AbstractEventLoop):
        super().__init__(loop)
        self.req = req


class SpeechEngine:
    """Serves a loaded speech model (a metalgen.tts TTSModel or a metalgen.magpie MagpieTTS, as
    `metalgen.tts.load` gives them, or metalgen.omni OmniParts) as `name`, one request at a time on a worker
    thread, through the model's `stream` (audio chunks while the frames are generated). `ref_voices` maps voice
    names to (reference clip, its transcript or None): a Qwen3-TTS Base model's voices, or voices a Magpie
    checkpoint with a context encoder clones; `max_frames` caps a clip's frames (None: the checkpoint's limit);
    `decode` is Qwen3-TTS's and Qwen3-Omni's decode path. What differs by model is `family` (a QwenSpeech, a
    MagpieSpeech or an OmniSpeech)."""

    task = "speech"

    def __init__(self, tts, name: str, decode: Optional[str] = "auto", max_frames: Optional[int] = None,
                 ref_voices: Optional[Dict[str, Tuple[str, Optional[str]]]] = None,
                 max_queue: Optional[int] = DEFAULT_MAX_QUEUE):
        self.tts, self.name = tts, name
        from ..omni.loading import OmniParts

        if isinstance(tts, OmniParts):
            if ref_voices:
                raise MetalgenError("--voice is for Qwen3-TTS Base and Magpie: Qwen3-Omni speaks in its own speakers")
            self.family = OmniSpeech(tts, name, decode, max_frames)
        elif tts.model_type == MagpieSpeech.model_type:
            self.family = MagpieSpeech(tts, name, max_frames, ref_voices or {})
        else:
            self.family = QwenSpeech(tts, name, decode, max_frames, ref_voices or {})
        self.max_frames = self.family.max_frames
        self.sample_rate = self.family.sample_rate
        self.samples_per_frame = self.family.samples_per_frame
        self.formats = encodable(self.sample_rate)
        self.last: Optional[Tuple[str, int]] = None  # how the last job ended ("done"/"cancelled"/"error", frames)
        # as the text engine does: evaluate the weights here, generate on the worker's own stream
        mx.eval(*self.family.parameters())
        self.stream = mx.new_thread_local_stream(mx.default_device())
        self.jobs: "queue.Queue[SpeechJob]" = queue.Queue()
        self.in_flight = InFlight(1, max_queue)  # one generating, at most max_queue waiting
        self.worker = threading.Thread(target=self._work, name="metalgen-speech", daemon=True)
        self.worker.start()

    @property
    def voices(self) -> List[str]:
        """The voice names a request may ask for."""
        return self.family.voices

    def admit(self) -> None:
        """Raises RequestError (429) while the queue is full (`max_queue` requests waiting)."""
        self.in_flight.admit()

    def submit(self, req: SpeechRequest) -> SpeechJob:
        job = SpeechJob(req, asyncio.get_running_loop())
        self.in_flight.add(job)
        self.jobs.put(job)
        return job

    def _work(self) -> None:
        with mx.stream(self.stream):
            while True:
                job = self.jobs.get()
                try:
                    self._serve(job)
                finally:
                    self.in_flight.discard(job)  # (a job skipped, or one whose serving failed)

    def _serve(self, job: SpeechJob) -> None:
        if job.cancelled.is_set():
            return
        req, samples, end = job.req, 0, "done"
        try:
            with contextlib.closing(self.family.stream(req)) as chunks:
                for chunk in chunks:
                    samples += chunk.shape[0]
                    job.put("audio", chunk)
                    if job.cancelled.is_set():
                        end = "cancelled"
                        break
            last = ("done", samples // self.samples_per_frame)
        except MetalgenError as e:
            end = "error"
            last = ("error", e if isinstance(e, RequestError) else RequestError(str(e)))
        except Exception as e:  # noqa: BLE001 - the server survives a failed request, and says why
            end = "error"
            last = ("error", RequestError(f"speech generation failed: {type(e).__name__}: {e}", 500, "server_error"))
        # recorded before the last event, so that whoever has the whole answer also sees how the job ended
        self.last = (end, samples // self.samples_per_frame)
        self.in_flight.discard(job)  # before its last event: whoever has the answer may send the next request
        job.put(*last)


# ---- the route -------------------------------------------------------------------------------------------

def not_served(engine, path: str) -> RequestError:
    """The error of a route the loaded model does not serve (a text model's for speech, and the reverse)."""
    if getattr(engine, "task", "text") == "speech":
        return RequestError(f"'{engine.name}' is a speech model: this server serves /v1/audio/speech, not {path}",
                            404, param="model")
    return RequestError(f"'{engine.name}' is a text model: this server serves /v1/chat/completions and "
                        f"/v1/completions, not {path}", 404, param="model")


class _Failed(Exception):
    """A generation that failed after its audio began: raised out of the body so that the connection is cut
    and the client sees a broken stream rather than a clip that merely ends early."""


def speech_route(engine, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
    """The /v1/audio/speech handler over `engine` (a text engine's answers that it does not serve speech); a
    body past `max_request_bytes` is refused (413), and a request while the engine's queue is full (429)."""

    async def speech(request: Request):
        if getattr(engine, "task", "text") != "speech":
            return error_response(not_served(engine, "/v1/audio/speech"))
        try:
            try:
                raw = await read_body(request, max_request_bytes)
            except ClientDisconnect:  # gone before its body arrived: nobody to answer
                return Response(status_code=400)
            try:
                body = json.loads(raw)
            except ValueError as e:  # bad JSON or UTF-8, or an integer past Python's 4300 digits
                raise RequestError(f"the request body is not valid JSON ({str(e).splitlines()[0]})")
            except RecursionError:  # nesting deeper than the parser's stack
                raise RequestError("the request body is not valid JSON (nested too deeply)")
            req = parse_speech_request(body, engine)
            engine.admit()  # 429 while the queue is full
        except RequestError as e:
            return error_response(e)
        job = engine.submit(req)
        watch = asyncio.ensure_future(cancel_on_disconnect(request, [job]))
        streaming = False
        try:
            first = await job.events.get()  # the status waits for the first chunk: input errors come before it
            if first[0] == "error":
                return error_response(first[1])
            if req.response_format in STREAMED:
                watch.cancel()  # the streamed response watches the connection itself from here
                streaming = True
                media = "text/event-stream" if req.stream_format == "sse" else MEDIA_TYPES[req.response_format]
                return StreamingResponse(_body(job, req, first, engine), media_type=media)
            chunks, event = [], first
            while event[0] == "audio":
                chunks.append(event[1])
                event = await job.events.get()
            if event[0] == "error":
                return error_response(event[1])
            wav = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            data = await asyncio.to_thread(encode, req.response_format, wav, engine.sample_rate)
            if req.stream_format == "sse":
                return Response(_sse_delta(data) + _sse_done(req, event[1]), media_type="text/event-stream")
            return Response(data, media_type=MEDIA_TYPES[req.response_format])
        finally:
            watch.cancel()
            if not streaming:
                job.cancelled.set()  # a no-op once done; stops a generation whose answer failed

    return speech


def _sse_delta(data: bytes) -> bytes:
    return f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': base64.b64encode(data).decode()})}\n\n".encode()


def _sse_done(req: SpeechRequest, frames: int) -> bytes:
    use = {"input_tokens": req.input_tokens, "output_tokens": frames, "total_tokens": req.input_tokens + frames}
    return f"data: {json.dumps({'type': 'speech.audio.done', 'usage': use})}\n\n".encode()


async def _body(job: SpeechJob, req: SpeechRequest, first, engine: SpeechEngine):
    """The streamed body: the WAV header (for wav), then each chunk's 16-bit samples as it comes, raw or as
    server-sent events; a closed connection cancels the generation."""
    sse = req.stream_format == "sse"
    try:
        if req.response_format == "wav":
            header = wav_header(engine.sample_rate)
            yield _sse_delta(header) if sse else header
        event = first
        while event[0] == "audio":
            data = pcm16(event[1])
            yield _sse_delta(data) if sse else data
            event = await job.events.get()
        if event[0] == "error":
            if sse:
                yield f"data: {json.dumps(event[1].body())}\n\n".encode()
                return
            raise _Failed(str(event[1]))
        if sse:
            yield _sse_done(req, event[1])
    finally:
        job.cancelled.set()
