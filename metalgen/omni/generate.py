"""Qwen3-Omni generation: the thinker's text, the talker's codec frames and Code2Wav's audio, interleaved.

Layered like the text engine: `prepare` (audio in, prompt ids, the thinker's prefill with the
talker's tap), `OmniFrames` (the TTS frame loop, fed text as the thinker makes it), then `stream`,
which yields text pieces and audio pieces as they are produced, and `generate` (the whole reply).

The schedule is one thread: the thinker's decode is double-buffered by `generate_step`, the
talker's by the frame loop, and each frame advances the thinker by one token, so text never
waits for audio. The talker starts once the assistant sequence has 4 entries (usually after the
thinker's first token) and pulls more thinker tokens whenever a frame needs text that is not there
yet: the first audio follows the prefill by a few frames, not by the whole reply.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, List, Optional, Sequence

import mlx.core as mx
import numpy as np

from ..cache import make_prompt_cache
from ..errors import MetalgenError
from ..generate import TokenText, generate_step
from ..sampling import make_sampler
from ..tts.frames import FrameGenerator, SamplingConfig
from ..tts.prompt import Prompt
from .loading import OmniParts
from .prompt import TalkerText, assistant_start, talker_prompt, thinker_ids

SAMPLE_RATE = 24000
PREFILL_STEP = 512


def talker_sampling(generation_config: Optional[dict] = None, **overrides) -> SamplingConfig:
    """The talker's defaults as transformers' Qwen3-Omni `generate` sets them: codebook 0 at
    temperature 0.9, top-k 50, repetition penalty 1.05; the code predictor at temperature 1 (its
    generation config's), top-k 50, top-p 0.8, greedy when the talker is; no minimum frame count.
    `talker_*` keys of the checkpoint's generation_config.json override them, then `overrides`."""
    c = SamplingConfig(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, sub_temperature=1.0,
                       sub_top_k=50, sub_top_p=0.8, max_frames=4096, min_frames=0)
    g = generation_config or {}
    names = {"talker_temperature": "temperature", "talker_top_k": "top_k", "talker_top_p": "top_p",
             "talker_repetition_penalty": "repetition_penalty", "talker_max_new_tokens": "max_frames"}
    for key, field in names.items():
        if key in g:
            setattr(c, field, type(getattr(c, field))(g[key]))
    for k, v in overrides.items():
        if v is not None:
            if not hasattr(c, k):
                raise TypeError(f"unknown talker sampling option '{k}'")
            setattr(c, k, v)
    if c.temperature == 0:
        c.sub_temperature = 0.0  # transformers mirrors the talker's do_sample onto the code predictor
    c.validate()
    return c


def speaker_id(parts: OmniParts, speaker: Optional[str]) -> int:
    """The codec id of a speaker the checkpoint defines (case-insensitive); None takes Ethan, the
    reference's default, or the first one."""
    speakers = parts.args.talker.speaker_id
    if not speakers:
        raise MetalgenError(f"{parts.name} defines no speakers")
    if speaker is None:
        speaker = "ethan" if "ethan" in speakers else sorted(speakers)[0]
    sid = speakers.get(speaker.lower())
    if sid is None:
        raise MetalgenError(f"unknown speaker '{speaker}' (this checkpoint has: {', '.join(sorted(speakers))})")
    return sid


def _clips(audio) -> list:
    """`audio` as a list of clips; a lone clip (a path, an array, or an (array, rate) pair) is one
    clip, not a sequence of them (iterating it would take each character or sample for a clip)."""
    if audio is None:
        return []
    if isinstance(audio, (str, Path, np.ndarray)) or (
            isinstance(audio, tuple) and len(audio) == 2 and isinstance(audio[1], (int, np.integer))):
        return [audio]
    return list(audio)


@dataclasses.dataclass
class Prepared:
    """A conversation ready for the thinker's decode: ids, the thinker's input embeddings, the
    hidden states the talker reads at media positions, and the cache holding all but the last
    prompt token."""

    ids: List[int]
    embeddings: mx.array  # (1, L, thinker hidden)
    tapped: Optional[mx.array]  # (1, L - 1, thinker hidden), or None when no audio output is wanted
    cache: Any
    audio_tokens: List[int]


def prepare(parts: OmniParts, messages: Sequence[dict], audio: Sequence[Any] = (), with_talker: bool = True,
            decode: Optional[str] = "auto", template_kwargs: Optional[dict] = None) -> Prepared:
    """Encode the audio clips, build the prompt ids and prefill the thinker (all but the last token)."""
    from .features import audio_token_count, load_audio_16k, log_mel

    model, args = parts.model, parts.args
    thinker = model.thinker
    encoded = []
    audio = _clips(audio)
    if audio:
        if "audio_tower" not in thinker:
            raise MetalgenError("this model was loaded without its audio encoder")
        n_window = thinker.audio_tower.args.n_window
        for clip in audio:
            wav = load_audio_16k(*clip) if isinstance(clip, tuple) else load_audio_16k(clip)
            feats = log_mel(wav)
            encoded.append((audio_token_count(feats.shape[1], n_window), feats))
    counts = [n for n, _ in encoded]
    ids = thinker_ids(parts.tokenizer, args, messages, counts, **(template_kwargs or {}))
    context = thinker.spec.max_position_embeddings
    if len(ids) >= context:
        audio_part = ""
        if counts:
            # 13 tokens a second of audio: say how much audio fits, the usual reason for a long prompt
            seconds = sum(f.shape[1] for _, f in encoded) / 100
            audio_part = f" ({sum(counts)} of them for {seconds:.0f} s of audio; about 13 a second)"
        raise MetalgenError(f"the prompt has {len(ids)} tokens{audio_part}, past the model's context of {context}")

    embeddings = thinker.embed(mx.array([ids], dtype=mx.int32))
    if encoded:
        where = np.nonzero(np.asarray(ids) == args.audio_token_id)[0]
        # each clip's tokens are one contiguous run, in order: (tokens, hidden) rows -> their positions
        rows = mx.concatenate([thinker.audio_tower(mx.array(f)) for _, f in encoded], axis=0)
        if rows.shape[0] != where.size:
            raise MetalgenError(f"the audio encoder gave {rows.shape[0]} tokens for {where.size} placeholders")
        embeddings[:, mx.array(where.astype(np.int32))] = rows[None].astype(embeddings.dtype)

    cache = make_prompt_cache(thinker, decode=decode or "auto")
    tap = args.talker.accept_hidden_layer if (with_talker and args.talker is not None) else None
    taps = []
    body = embeddings[:, :-1]
    for start in range(0, body.shape[1], PREFILL_STEP):
        chunk = body[:, start:start + PREFILL_STEP]
        if tap is None:
            thinker.model(cache=cache, input_embeddings=chunk, layer_by_layer=True)
        else:
            _, tapped = thinker.hidden_and_tap(chunk, cache, tap)
            taps.append(tapped)
            mx.eval(tapped)
        mx.eval([c.state for c in cache])
    tapped = (mx.concatenate(taps, axis=1) if taps else None) if tap is not None else None
    return Prepared(ids, embeddings, tapped, cache, counts)


class OmniFrames(FrameGenerator):
    """The TTS frame loop on the Omni talker, fed its text by a `TalkerText` that the thinker fills:
    `need_text()` is called (it advances the thinker) until frame j's text entry exists."""

    def __init__(self, talker, args, prompt_embeddings: mx.array, text: TalkerText, need_text,
                 sampling: SamplingConfig, seed: Optional[int] = None, record_logits: bool = False,
                 decode: Optional[str] = "auto"):
        model = SimpleNamespace(talker=talker, args=SimpleNamespace(talker=args.talker))
        super().__init__(model, Prompt(prompt_embeddings, None, None), sampling, seed, record_logits, decode)
        self.text = text
        self.need_text = need_text

    def talker_input(self, total: mx.array, step: int) -> mx.array:
        entry = self.text.entry(step)
        while entry is None:
            self.need_text()
            entry = self.text.entry(step)
        return total + entry.astype(total.dtype)


@dataclasses.dataclass
class OmniResponse:
    """One piece of the reply: new text (maybe empty) or new audio samples (24 kHz float32 mono)."""

    text: str = ""
    audio: Optional[np.ndarray] = None
    token: Optional[int] = None
    finish_reason: Optional[str] = None  # the thinker's, on its last text piece
    prompt_tokens: int = 0
    generation_tokens: int = 0
    frames: int = 0
    sample_rate: int = SAMPLE_RATE


class _Thinker:
    """The reply's token stream as pulls: each pull takes one token of `tokens` ((token, logprobs) pairs: the
    thinker's decode, or a given reply's ids) into `queue` and the talker's text."""

    def __init__(self, parts: OmniParts, prep: Prepared, text: Optional[TalkerText], tokens: Iterator,
                 max_tokens: int, stop: Sequence[str] = (), eos: Optional[Sequence[int]] = None):
        self.tokens = tokens
        self.detok = TokenText(parts.tokenizer, stop, eos)
        self.text = text
        self.max_tokens = max_tokens
        self.count = 0
        self.done = max_tokens < 1
        self.queue: List[OmniResponse] = []
        self.prompt_tokens = len(prep.ids)

    def pull(self) -> None:
        if self.done:
            return
        token, _ = next(self.tokens)
        self.count += 1
        piece, finish = self.detok.add(token, last=self.count >= self.max_tokens)
        if finish is not None:
            self.done = True
            self.tokens.close()
        if self.text is not None:
            self.text.push(token, last=finish is not None)
        self.queue.append(OmniResponse(text=piece, token=token, finish_reason=finish,
                                       prompt_tokens=self.prompt_tokens, generation_tokens=self.count))

    def drain(self) -> Iterator[OmniResponse]:
        while self.queue:
            yield self.queue.pop(0)


def stream(parts: OmniParts, messages: Sequence[dict], *, audio: Sequence[Any] = (), speaker: Optional[str] = None,
           return_audio: bool = True, max_tokens: int = 1024, sampler=None, logits_processors=(),
           stop: Sequence[str] = (), talker: Optional[SamplingConfig] = None, seed: Optional[int] = None,
           chunk_frames: int = 300, first_chunk: Optional[int] = 4, left_context: int = 25, gapless: bool = True,
           decode: Optional[str] = "auto", template_kwargs: Optional[dict] = None,
           frames_out: Optional[list] = None, record=None, say: Optional[str] = None) -> Iterator[OmniResponse]:
    """Answer a conversation in text and speech, piece by piece.

    messages: chat messages ({"role", "content"}); `audio`: WAV paths or (array, rate) clips (or one
    such clip) placed at the start of the last user turn. The thinker samples with `sampler` (greedy
    by default), the talker with `talker` (metalgen.omni.talker_sampling's defaults). Audio is
    decoded `first_chunk` frames first, doubling up to `chunk_frames` (None: chunks of `chunk_frames`
    from the start, which equals transformers' chunked decode), with `left_context` frames of
    context. `gapless` fills each chunk's first 555 samples (the decoder's transposed convolutions
    trim them) from the left context; transformers' chunked decode leaves them out, a 23 ms hole at
    every chunk boundary (False: as it does).
    frames_out: a list that receives each frame's codes (16,) as they come; record: a dict that
    receives the frame loop (with its recorded logits unless record["logits"] is False) and the
    time the talker started (`talker_start`, perf_counter seconds).
    say: the reply's text, given: the talker speaks it after the conversation, and the thinker only
    prefills the conversation (text-to-speech; the sampler, max_tokens and stop do not apply).
    """
    model, args = parts.model, parts.args
    want_audio = bool(return_audio)
    if say is not None and (not want_audio or not say.strip()):
        raise MetalgenError("a given reply (say) is for speech: audio on, and a text that is not empty")
    if want_audio and (args.talker is None or "talker" not in model or "code2wav" not in model):
        raise MetalgenError(f"{parts.name} has no talker and Code2Wav loaded: text output only (--no-audio)")
    sid = speaker_id(parts, speaker) if want_audio else None
    if want_audio:
        talker = talker or talker_sampling(parts.generation_config)
    prep = prepare(parts, messages, audio, with_talker=want_audio, decode=decode, template_kwargs=template_kwargs)
    text = None
    if want_audio:
        a0 = assistant_start(prep.ids, args)
        special = mx.array([[args.tts_bos_token_id, args.tts_eos_token_id, args.tts_pad_token_id]], dtype=mx.int32)
        special = model.talker.text_projection(model.thinker.embed(special))
        text = TalkerText(model.talker, model.thinker.embed, prep.embeddings[:, a0:], special)
    if say is None:
        tokens = generate_step(mx.array(prep.ids[-1:], dtype=mx.int32), model.thinker, max_tokens=max_tokens,
                               sampler=sampler or make_sampler(), logits_processors=logits_processors,
                               prompt_cache=prep.cache, decode=decode)
        thinker = _Thinker(parts, prep, text, tokens, max_tokens, stop)
    else:
        # a given reply: its tokens, then the end of the turn, which ends it as the thinker's EOS would. The talker
        # reads the reply's token embeddings, not the thinker's hidden states over them, so nothing is decoded
        ids = list(parts.tokenizer.encode(say)) + [args.im_end_token_id]
        thinker = _Thinker(parts, prep, text, ((t, None) for t in ids), len(ids), eos=[args.im_end_token_id])

    if not want_audio:
        while not thinker.done:
            thinker.pull()
            yield from thinker.drain()
        return
    while not text.ready(4) and not thinker.done:
        thinker.pull()
        yield from thinker.drain()
    if not text.ready(4):
        # the thinker said (almost) nothing: nothing for the talker to read
        yield from thinker.drain()
        return
    embeddings = talker_prompt(model.talker, args, prep.ids, prep.embeddings, prep.tapped, text, sid)
    frames = OmniFrames(model.talker, args, embeddings, text, thinker.pull, talker, seed=seed,
                        record_logits=record is not None and record.get("logits", True), decode=decode)
    if record is not None:
        record["frames"] = frames
        record["talker_start"] = time.perf_counter()
    decoder = model.code2wav.stream(first_chunk=first_chunk, chunk=chunk_frames, left_context=left_context,
                                    gapless=gapless)
    count = 0
    for codes in frames.frames():
        count += 1
        if frames_out is not None:
            frames_out.append(codes)
        thinker.pull()  # text keeps flowing at least a token a frame
        yield from thinker.drain()
        for piece in decoder.push(mx.array(codes[None, None, :])):
            yield OmniResponse(audio=np.array(piece[0].astype(mx.float32)), frames=count)
    while not thinker.done:
        thinker.pull()
        yield from thinker.drain()
    yield from thinker.drain()
    for piece in decoder.flush():
        yield OmniResponse(audio=np.array(piece[0].astype(mx.float32)), frames=count)


@dataclasses.dataclass
class OmniResult:
    """A whole reply: its text, its waveform (24 kHz) and what it took."""

    text: str
    audio: Optional[np.ndarray]
    tokens: List[int]
    finish_reason: Optional[str]
    prompt_tokens: int
    frames: int
    seconds: float
    sample_rate: int = SAMPLE_RATE


def generate(parts: OmniParts, messages: Sequence[dict], **kwargs) -> OmniResult:
    """`stream` gathered: the whole text and the whole waveform."""
    start = time.perf_counter()
    text, tokens, pieces = [], [], []
    finish, prompt_tokens, frames = None, 0, 0
    for r in stream(parts, messages, **kwargs):
        text.append(r.text)
        if r.token is not None:
            tokens.append(r.token)
            prompt_tokens = r.prompt_tokens
        if r.finish_reason:
            finish = r.finish_reason
        if r.audio is not None:
            pieces.append(r.audio)
            frames = r.frames
    audio = np.concatenate(pieces) if pieces else (np.zeros((0,), np.float32) if kwargs.get("return_audio", True)
                                                     else None)
    return OmniResult("".join(text), audio, tokens, finish, prompt_tokens, frames, time.perf_counter() - start)
