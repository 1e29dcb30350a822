"""Qwen3-TTS (12 Hz) on metalgen's Qwen decoder: the talker (M-RoPE) and code predictor, the
speech tokenizer's decoder, and (Base model type) the speaker encoder. See docs/tts.md."""

from .config import SpeechTokenizerArgs, TTSArgs
from .model import Model, SpeechTokenizer

__all__ = ["Model", "SpeechTokenizer", "TTSArgs", "SpeechTokenizerArgs"]
