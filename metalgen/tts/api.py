"""`metalgen.tts.load(...)` -> TTSModel with `synthesize(...)` and `stream(...)`."""

from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from .audio import AudioInput
from .frames import FrameGenerator, SamplingConfig
from .prompt import Prompt, assistant_text, build_prompt, instruct_text, ref_text as ref_text_of

# The streamed pipeline's first chunk: 2 frames (160 ms of audio) keep the time to first audio
# short; the chunks after it double up to `chunk_frames`.
FIRST_CHUNK_FRAMES = 2
KIND_NAMES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}


class TTSModel:
    """A loaded Qwen3-TTS checkpoint: talker + code predictor (`model`), the speech tokenizer
    (`speech`), the text tokenizer, and the checkpoint's sampling defaults."""

    def __init__(self, model, speech, tokenizer, generate_config: Optional[dict] = None, name: str = ""):
        self.model = model
        self.speech = speech
        self.tokenizer = tokenizer
        self.generate_config = dict(generate_config or {})
        self.name = name
        self.args = model.args

    # ---- what the checkpoint offers -------------------------------------------------------
    @property
    def model_type(self) -> str:
        return self.args.tts_model_type

    @property
    def sample_rate(self) -> int:
        return int(self.speech.args.output_sample_rate)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.speech.decoder.total_upsample

    @property
    def speakers(self) -> List[str]:
        return sorted((self.args.talker.spk_id or {}).keys())

    @property
    def languages(self) -> List[str]:
        langs = [k for k in (self.args.talker.codec_language_id or {}) if "dialect" not in k]
        return ["auto"] + sorted(langs)

    @property
    def supports_instruct(self) -> bool:
        if self.model_type == "voice_design":
            return True
        # The 0.6B CustomVoice model was not trained with instructions (the reference drops them).
        return self.model_type == "custom_voice" and "0b6" not in str(self.args.tts_model_size)

    # ---- inputs -> prompt -----------------------------------------------------------------
    def _check_options(self, text, speaker, language, instruct, ref_audio, ref_text):
        kind = KIND_NAMES[self.model_type]
        if text is None or not str(text).strip():
            raise MetalgenError("the text is empty")
        if self.model_type == "custom_voice":
            if not speaker:
                raise MetalgenError(f"this {kind} model needs a speaker (one of: {', '.join(self.speakers)})")
            if ref_audio is not None or ref_text is not None:
                raise MetalgenError(f"voice cloning (ref_audio/ref_text) needs a Base model; this is a {kind} model")
            if instruct and not self.supports_instruct:
                raise MetalgenError(f"this {kind} model ({self.args.tts_model_size}) does not take an instruction")
        elif self.model_type == "voice_design":
            if not instruct:
                raise MetalgenError(f"a {kind} model needs an instruction describing the voice")
            if speaker:
                raise MetalgenError(f"a {kind} model has no named speakers; describe the voice with an instruction")
            if ref_audio is not None or ref_text is not None:
                raise MetalgenError(f"voice cloning (ref_audio/ref_text) needs a Base model; this is a {kind} model")
        else:
            if ref_audio is None:
                raise MetalgenError(f"a {kind} model clones a voice: give a reference clip (ref_audio)")
            if speaker:
                raise MetalgenError(f"a {kind} model has no named speakers; it clones the voice of ref_audio")
            if instruct:
                raise MetalgenError(f"a {kind} model does not take an instruction")

    def _language_id(self, language: Optional[str], speaker: Optional[str]) -> Optional[int]:
        t = self.args.talker
        lang = (language or "auto").lower()
        if lang not in self.languages:
            raise MetalgenError(f"unknown language '{language}' (valid: {', '.join(self.languages)})")
        lang_id = None if lang == "auto" else int(t.codec_language_id[lang])
        if speaker and lang in ("chinese", "auto"):
            dialect = (t.spk_is_dialect or {}).get(speaker.lower(), False)
            if dialect:
                lang_id = int(t.codec_language_id[dialect])
        return lang_id

    def _speaker_embed(self, speaker: str) -> mx.array:
        spk = self.args.talker.spk_id or {}
        key = speaker.lower()
        if key not in spk:
            raise MetalgenError(f"unknown speaker '{speaker}' (valid: {', '.join(self.speakers)})")
        sid = spk[key]
        sid = int(sid[0] if isinstance(sid, (list, tuple)) else sid)
        return self.model.talker.codec_embed(mx.array([sid], dtype=mx.int32))[0]

    def prepare(self, text, speaker=None, language=None, instruct=None, ref_audio: Optional[AudioInput] = None,
                ref_text=None, non_streaming: Optional[bool] = None) -> Tuple[Prompt, Optional[np.ndarray]]:
        """Validate the options and build the talker prompt; returns (prompt, reference codes
        to prepend before decoding or None)."""
        self._check_options(text, speaker, language, instruct, ref_audio, ref_text)
        lang_id = self._language_id(language, speaker)
        ids = self.tokenizer.encode(assistant_text(str(text)))
        instruct_ids = self.tokenizer.encode(instruct_text(instruct)) if instruct else None
        speaker_embed = None
        icl = None
        ref_codes = None
        if self.model_type == "custom_voice":
            speaker_embed = self._speaker_embed(speaker)
        elif self.model_type == "base":
            from .clone import reference_prompt

            speaker_embed, ref_codes = reference_prompt(self, ref_audio, with_codes=bool(ref_text))
            if ref_text:
                icl = {"ref_ids": self.tokenizer.encode(ref_text_of(ref_text)), "ref_codes": mx.array(ref_codes)}
        if non_streaming is None:
            non_streaming = self.model_type != "base"
        prompt = build_prompt(self.model, ids, lang_id, speaker_embed, instruct_ids, non_streaming, icl)
        return prompt, ref_codes

    # ---- generation ------------------------------------------------------------------------
    def sampling(self, **overrides) -> SamplingConfig:
        return SamplingConfig.from_generate_config(self.generate_config, **overrides)

    def generate_codes(self, text, speaker=None, language=None, instruct=None, ref_audio=None, ref_text=None,
                       seed=None, non_streaming=None, **sampling) -> np.ndarray:
        """The codec frames (T, 16) int32 for a text."""
        frames, _ = self.iter_frames(text, speaker, language, instruct, ref_audio, ref_text, seed,
                                     non_streaming, **sampling)
        return np.stack(frames) if frames else np.zeros((0, self.args.talker.num_code_groups), np.int32)

    def iter_frames(self, text, speaker=None, language=None, instruct=None, ref_audio=None, ref_text=None,
                    seed=None, non_streaming=None, decode: Optional[str] = "auto", **sampling):
        prompt, ref_codes = self.prepare(text, speaker, language, instruct, ref_audio, ref_text, non_streaming)
        gen = FrameGenerator(self.model, prompt, self.sampling(**sampling), seed=seed, decode=decode)
        return list(gen.frames()), ref_codes

    def decode(self, codes: np.ndarray, chunk: int = 300, left_context: int = 25) -> np.ndarray:
        """Codes (T, 16) -> float32 waveform (T * upsample,), chunked as the reference decodes."""
        codes = np.asarray(codes)
        if codes.shape[0] == 0:
            return np.zeros((0,), np.float32)
        wav = self.speech.decoder.chunked(mx.array(np.maximum(codes, 0)[None].astype(np.int32)), chunk, left_context)
        return np.array(wav[0].astype(mx.float32))

    def synthesize(self, text: str, speaker: Optional[str] = None, language: Optional[str] = None,
                   instruct: Optional[str] = None, ref_audio: Optional[AudioInput] = None,
                   ref_text: Optional[str] = None, seed: Optional[int] = None,
                   non_streaming: Optional[bool] = None, **sampling) -> Tuple[np.ndarray, int]:
        """Text -> (float32 waveform, sample rate). `sampling` overrides the checkpoint's defaults
        (temperature, top_k, top_p, repetition_penalty, sub_temperature, sub_top_k, sub_top_p,
        max_frames); temperature=0 is greedy. `non_streaming` puts the whole text in the prompt
        (True) or feeds it alongside the first frames (False); None takes the model type's
        default (whole text except for Base)."""
        frames, ref_codes = self.iter_frames(text, speaker, language, instruct, ref_audio, ref_text, seed,
                                             non_streaming, **sampling)
        codes = np.stack(frames) if frames else np.zeros((0, self.args.talker.num_code_groups), np.int32)
        if ref_codes is None:
            return self.decode(codes), self.sample_rate
        both = np.concatenate([ref_codes, codes], axis=0)
        wav = self.decode(both)
        cut = int(ref_codes.shape[0] / max(both.shape[0], 1) * wav.shape[0])
        return wav[cut:], self.sample_rate

    def stream(self, text: str, speaker: Optional[str] = None, language: Optional[str] = None,
               instruct: Optional[str] = None, ref_audio: Optional[AudioInput] = None,
               ref_text: Optional[str] = None, seed: Optional[int] = None, chunk_frames: int = 12,
               left_context: int = 25, non_streaming: Optional[bool] = None,
               first_chunk_frames: Optional[int] = FIRST_CHUNK_FRAMES, decode: Optional[str] = "auto",
               **sampling) -> Iterator[np.ndarray]:
        """Yield float32 audio chunks while frames are generated: frames are decoded with
        `left_context` frames of history (the reference's chunked decode), the first chunk after
        `first_chunk_frames` frames (None: `chunk_frames`) and each later one twice the size of
        the one before, up to `chunk_frames`. `non_streaming` as in `synthesize`; `decode` picks
        the talker's and code predictor's decode path (metalgen.decode modes)."""
        from ..models.qwen3_tts.speech_decoder import StreamingDecoder

        prompt, ref_codes = self.prepare(text, speaker, language, instruct, ref_audio, ref_text,
                                         non_streaming)
        gen = FrameGenerator(self.model, prompt, self.sampling(**sampling), seed=seed, decode=decode)
        dec = StreamingDecoder(self.speech.decoder, chunk_frames, left_context, first_chunk_frames)
        if ref_codes is not None:
            # Decode the reference frames as history only: their audio is not emitted.
            dec.codes = mx.array(ref_codes[None].astype(np.int32))
            dec.start = ref_codes.shape[0]
        for frame in gen.frames():
            for piece in dec.push(mx.array(frame[None, None].astype(np.int32))):
                yield np.array(piece[0].astype(mx.float32))
        for piece in dec.flush():
            yield np.array(piece[0].astype(mx.float32))
