"""`POST /v1/audio/speech`: OpenAI's text-to-speech route over a Qwen3-TTS model (docs/serve.md, "Speech").

The request names a `voice` (a CustomVoice speaker, or a reference voice the server was started with for a
Base model), may add `instructions` (the TTS instruct text) and picks a `response_format`. "wav" and "pcm"
are sent while the audio is generated (chunked HTTP: a WAV header whose sizes say "unknown" first, then
16-bit samples); "flac", "mp3" and "opus" are encoded by soundfile once the clip is complete, where its
libsndfile can write them at the model's sample rate. `stream_format: "sse"` sends the same bytes as
base64 `speech.audio.delta` events and a closing `speech.audio.done` with the usage."""

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
from typing import Dict, List, Optional, Tuple

import mlx.core as mx
import numpy as np
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..errors import MetalgenError
from .engine import JobEvents
from .http import cancel_on_disconnect, error_response
from .protocol import RequestError

# config.json model types served by this route (the others are text decoders)
SPEECH_MODEL_TYPES = ("qwen3_tts",)
STREAMED = ("wav", "pcm")
# soundfile (format, subtype) of the formats encoded whole, when its libsndfile writes them (see `encodable`)
ENCODED = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's, in its order
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg"}
# text tokens the talker prompt adds around the input (role tags, codec prefix, speaker): a bound, not a count
PROMPT_OVERHEAD = 32


def model_kind(path_or_id: str, revision: Optional[str] = None) -> str:
    """What a model serves, "speech" or "text", from its config's model_type (a dummy shape's config, a
    folder's or a hub snapshot's config.json), not from its name."""
    if path_or_id.startswith("dummy:"):
        from ..dummy import dummy_config
        from ..tts.dummy import SHAPES as TTS_SHAPES

        shape = path_or_id[len("dummy:"):]
        if shape in TTS_SHAPES:
            model_type = TTS_SHAPES[shape]["config"]["model_type"]
        else:
            try:
                model_type = dummy_config(shape)["model_type"]
            except MetalgenError as e:
                raise MetalgenError(f"{e}; speech shapes: {', '.join(TTS_SHAPES)}")
    else:
        from ..loading import read_json, resolve_model_path

        folder = resolve_model_path(path_or_id, revision)
        model_type = read_json(folder / "config.json", "config.json").get("model_type")
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
    """One /v1/audio/speech request, checked against the served model."""

    model: str
    input: str
    voice: Optional[str]  # the CustomVoice speaker or Base reference voice, as the model names it
    instructions: Optional[str]
    language: Optional[str]
    response_format: str
    stream_format: str  # "audio" or "sse"
    seed: Optional[int]
    input_tokens: int


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


def parse_speech_request(body, engine: "SpeechEngine") -> SpeechRequest:
    """Check a /v1/audio/speech body (parsed JSON) against `engine`'s model: a RequestError naming the field
    for anything it cannot serve as asked."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = _text(body, "model", required=True)
    if model != engine.name:
        raise RequestError(f"the model '{model}' does not exist here (this server has '{engine.name}')", 404,
                           param="model")
    tts = engine.tts
    text = _text(body, "input", required=True)
    if not text.strip():
        raise RequestError("'input' is empty", param="input")
    voice = body.get("voice")
    if isinstance(voice, dict):  # OpenAI's custom-voice form: {"id": "..."}
        voice = voice.get("id")
    if voice is not None and not isinstance(voice, str):
        raise RequestError("'voice' must be a string (a voice name)", param="voice")
    instructions = _text(body, "instructions") or None
    kind = tts.model_type
    if kind == "voice_design":
        # the voice is the one `instructions` describe; `voice` (which OpenAI clients must send) names nothing
        voice = None
        if not instructions:
            raise RequestError("this VoiceDesign model needs 'instructions' describing the voice",
                               param="instructions")
    else:
        known = engine.voices
        hint = "" if known or kind != "base" else "; a Base model clones the voices of `metalgen serve --voice`"
        if not voice:
            raise RequestError(f"'voice' is required (known: {_shortened(known)}){hint}", param="voice")
        match = {v.lower(): v for v in known}.get(voice.lower())
        if match is None:
            raise RequestError(f"unknown voice '{voice}' (known: {_shortened(known)}){hint}", param="voice")
        voice = match
        if instructions and not tts.supports_instruct:
            raise RequestError(f"this model ({tts.args.tts_model_size} {kind}) does not take 'instructions'",
                               param="instructions")
    language = _text(body, "language")  # an extension: Qwen3-TTS's language (default auto)
    if language is not None and language.lower() not in tts.languages:
        raise RequestError(f"unknown language '{language}' (known: {_shortened(tts.languages)})", param="language")
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
        raise RequestError("'speed' other than 1.0 is not supported: Qwen3-TTS has no rate control, and "
                           "resampling the audio would shift its pitch", param="speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in ("audio", "sse"):
        raise RequestError(f"'stream_format' must be 'audio' or 'sse', got {stream_format!r}", param="stream_format")
    seed = body.get("seed")  # an extension: the sampling is random
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
        raise RequestError("'seed' must be an integer in 0..2**32-1", param="seed")
    tokens = len(tts.tokenizer.encode(text)) + (len(tts.tokenizer.encode(instructions)) if instructions else 0)
    limit = engine.input_limit
    if tokens > limit:
        raise RequestError(f"'input' has {tokens} tokens, past this model's limit of {limit} (its context less "
                           f"{engine.max_frames} frames of audio)", param="input")
    return SpeechRequest(model=model, input=text, voice=voice, instructions=instructions, language=language,
                         response_format=fmt, stream_format=stream_format, seed=seed, input_tokens=tokens)


# ---- the engine ------------------------------------------------------------------------------------------

class SpeechJob(JobEvents):
    """One request in flight. Its events: ("audio", float32 chunk)..., then ("done", frames) or ("error",
    RequestError)."""

    def __init__(self, req: SpeechRequest, loop: asyncio.AbstractEventLoop):
        super().__init__(loop)
        self.req = req


class SpeechEngine:
    """Serves a loaded `metalgen.tts.TTSModel` as `name`, one request at a time on a worker thread, through
    `TTSModel.stream` (audio chunks while the frames are generated). `ref_voices` maps voice names to
    (reference clip, its transcript or None) for a Base model; `max_frames` caps a clip's 80 ms frames
    (None: the checkpoint's limit)."""

    task = "speech"

    def __init__(self, tts, name: str, decode: Optional[str] = "auto", max_frames: Optional[int] = None,
                 ref_voices: Optional[Dict[str, Tuple[str, Optional[str]]]] = None):
        from ..tts.audio import read_reference

        self.tts, self.name, self.decode = tts, name, decode
        self.max_frames = int(tts.sampling().max_frames if max_frames is None else max_frames)
        if self.max_frames < 1:
            raise MetalgenError(f"max frames must be >= 1, got {self.max_frames}")
        self.input_limit = tts.args.talker.max_position_embeddings - self.max_frames - PROMPT_OVERHEAD
        self.sample_rate = tts.sample_rate
        self.samples_per_frame = int(tts.speech.decoder.total_upsample)
        self.refs: Dict[str, Tuple[Tuple[np.ndarray, int], Optional[str]]] = {}
        if ref_voices and tts.model_type != "base":
            raise MetalgenError(f"reference voices are for a Base model; {name} is {tts.model_type}")
        for voice, (clip, transcript) in (ref_voices or {}).items():
            # read once, here: a bad clip fails at start-up, not in every request
            self.refs[voice] = ((read_reference(clip, self.sample_rate), self.sample_rate), transcript)
        self.formats = encodable(self.sample_rate)
        self.last: Optional[Tuple[str, int]] = None  # how the last job ended ("done"/"cancelled"/"error", frames)
        # as the text engine does: evaluate the weights here, generate on the worker's own stream
        mx.eval(tts.model.parameters(), tts.speech.parameters())
        self.stream = mx.new_thread_local_stream(mx.default_device())
        self.jobs: "queue.Queue[SpeechJob]" = queue.Queue()
        self.worker = threading.Thread(target=self._work, name="metalgen-speech", daemon=True)
        self.worker.start()

    @property
    def voices(self) -> List[str]:
        """The voice names a request may ask for: the CustomVoice speakers or the Base reference voices."""
        return sorted(self.refs) if self.tts.model_type == "base" else list(self.tts.speakers)

    def submit(self, req: SpeechRequest) -> SpeechJob:
        job = SpeechJob(req, asyncio.get_running_loop())
        self.jobs.put(job)
        return job

    def _work(self) -> None:
        with mx.stream(self.stream):
            while True:
                self._serve(self.jobs.get())

    def _serve(self, job: SpeechJob) -> None:
        if job.cancelled.is_set():
            return
        req, samples, end = job.req, 0, "done"
        kw = dict(speaker=req.voice, language=req.language, instruct=req.instructions, seed=req.seed,
                  decode=self.decode, max_frames=self.max_frames)
        if req.voice in self.refs:  # a Base model's reference voice, not a speaker
            kw["speaker"] = None
            (kw["ref_audio"], kw["ref_text"]) = self.refs[req.voice]
        try:
            with contextlib.closing(self.tts.stream(req.input, **kw)) as chunks:
                for chunk in chunks:
                    samples += chunk.shape[0]
                    job.put("audio", chunk)
                    if job.cancelled.is_set():
                        end = "cancelled"
                        break
            job.put("done", samples // self.samples_per_frame)
        except MetalgenError as e:
            end = "error"
            job.put("error", e if isinstance(e, RequestError) else RequestError(str(e)))
        except Exception as e:  # noqa: BLE001 - the server survives a failed request, and says why
            end = "error"
            job.put("error", RequestError(f"speech generation failed: {type(e).__name__}: {e}", 500, "server_error"))
        self.last = (end, samples // self.samples_per_frame)


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


def speech_route(engine):
    """The /v1/audio/speech handler over `engine` (a text engine's answers that it does not serve speech)."""

    async def speech(request: Request):
        if getattr(engine, "task", "text") != "speech":
            return error_response(not_served(engine, "/v1/audio/speech"))
        try:
            try:
                body = json.loads(await request.body())
            except ValueError as e:  # bad JSON or UTF-8, or an integer past Python's 4300 digits
                raise RequestError(f"the request body is not valid JSON ({str(e).splitlines()[0]})")
            except RecursionError:  # nesting deeper than the parser's stack
                raise RequestError("the request body is not valid JSON (nested too deeply)")
            req = parse_speech_request(body, engine)
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
