"""Qwen3-Omni audio input: metalgen.omni.features (log-mel, token counts, loading) and
metalgen.models.qwen3_omni.audio_encoder against transformers' WhisperFeatureExtractor (as
Qwen3-Omni's processor configures it) and Qwen3OmniMoeAudioEncoder (the tiny random model of
tests/omni_reference.py), in float32 on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx
from mlx.utils import tree_flatten

from metalgen.errors import MetalgenError
from metalgen.models.qwen3_omni.audio_encoder import AudioEncoder, AudioEncoderArgs, sanitize_audio_weights
from metalgen.omni.features import HOP, audio_token_count, load_audio_16k, log_mel, mel_filters
from metalgen.tts.audio import resample

PREFIX = "thinker.audio_tower."
SR = 16000


def clip(seconds: float, seed: int, extra: int = 0) -> np.ndarray:
    """A speech-like test clip: two tones under a slow envelope plus noise, float32 at 16 kHz."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR) + extra
    t = np.arange(n) / SR
    tones = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1830 * t + 1.0)
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 0.7 * t)
    return (envelope * tones + 0.02 * rng.standard_normal(n)).astype(np.float32)


def tiny_audio_args() -> AudioEncoderArgs:
    from omni_reference import tiny_config_dict

    return AudioEncoderArgs.from_dict(tiny_config_dict()["thinker_config"]["audio_config"])


def one_line_error(fn, *args) -> str:
    with pytest.raises(MetalgenError) as info:
        fn(*args)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# -- features ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extractor():
    """Whisper's extractor with Qwen3-Omni's preprocessor settings, and the processor's call kwargs."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    fe = transformers.WhisperFeatureExtractor(feature_size=128, sampling_rate=SR, hop_length=160, n_fft=400)
    # padding to the longest clip of the call, no truncation, a frame mask: the processor's own
    # (a class attribute of transformers 5.24's processor; older ones kept the same values elsewhere)
    fallback = {"sampling_rate": SR, "padding": True, "truncation": False, "return_attention_mask": True}
    return fe, dict(getattr(Qwen3OmniMoeProcessor, "audio_kwargs", fallback))


@pytest.mark.parametrize("seconds,extra", [(0.5, 0), (3.7, 73), (31.0, 11)])
def test_log_mel_matches_the_processor(extractor, seconds, extra):
    fe, kwargs = extractor
    wav = clip(seconds, seed=int(seconds * 10), extra=extra)
    out = fe(wav, return_tensors="np", **kwargs)
    mask = out["attention_mask"][0].astype(bool)
    ref = out["input_features"][0][:, mask]  # the frames get_audio_features hands the encoder
    ours = log_mel(wav)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (128, len(wav) // HOP)
    assert np.abs(ours - ref).max() < 1e-4


def test_log_mel_clamps_below_the_kept_frames_maximum(extractor):
    # a faint tone, digital silence, and a loud burst in the last 100 samples, which only the
    # STFT's dropped last frame sees: the 80 dB floor must follow the kept frames' maximum
    fe, kwargs = extractor
    wav = np.zeros(50 * HOP + 150, np.float32)
    wav[:4000] = 1e-4 * np.sin(2 * np.pi * 300 * np.arange(4000) / SR)
    wav[-100:] = 0.9 * np.random.default_rng(3).standard_normal(100)
    out = fe(wav, return_tensors="np", **kwargs)
    ref = out["input_features"][0][:, out["attention_mask"][0].astype(bool)]
    assert np.abs(log_mel(wav) - ref).max() < 1e-4


def test_log_mel_matches_the_numpy_path_on_clips_under_one_window(extractor):
    # torch.stft cannot reflect-pad clips of 200 samples or fewer; the extractor's numpy path can,
    # and ours follows it there
    fe, _ = extractor
    for n in (160, 200, 377):
        wav = clip(0, seed=n, extra=n)
        ref = fe._np_extract_fbank_features(wav[None], "cpu")[0]
        assert np.abs(log_mel(wav) - ref).max() < 1e-4


def test_mel_filters_are_whispers(extractor):
    fe, _ = extractor
    assert np.abs(mel_filters() - fe.mel_filters).max() < 1e-12


def test_audio_token_count_matches_transformers():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    for frames in range(0, 3001):
        assert audio_token_count(frames) == int(_get_feat_extract_output_lengths(frames, 50)), frames


def test_log_mel_rejects_bad_clips():
    assert "too short" in one_line_error(log_mel, np.zeros(HOP - 1, np.float32))
    one_line_error(log_mel, np.zeros(0, np.float32))
    one_line_error(log_mel, np.zeros((2, 16000), np.float32))
    assert "load_audio_16k" in one_line_error(log_mel, np.zeros(16000, np.int16))
    bad = np.zeros(16000, np.float32)
    bad[5] = np.nan
    one_line_error(log_mel, bad)


def test_load_audio_16k(tmp_path):
    sf = pytest.importorskip("soundfile")

    rng = np.random.default_rng(1)
    stereo = (0.1 * rng.standard_normal((22050, 2))).astype(np.float32)
    path = tmp_path / "stereo.wav"
    sf.write(str(path), stereo, 22050, subtype="FLOAT")
    wav = load_audio_16k(path)
    assert wav.dtype == np.float32 and wav.shape == (16000,)
    assert np.abs(wav - resample(stereo.mean(axis=1), 22050, SR)).max() < 1e-6
    # arrays: (channels, samples) is recognised, int16 is scaled, None means 16 kHz already
    assert np.abs(load_audio_16k(stereo.T, 22050) - wav).max() < 1e-6
    pcm = (stereo[:, 0] * 32768).astype(np.int16)
    assert np.abs(load_audio_16k(pcm, 22050) - load_audio_16k(pcm / 32768.0, 22050)).max() < 1e-6
    mono = clip(0.25, seed=2)
    assert np.array_equal(load_audio_16k(mono), mono)

    assert "does not exist" in one_line_error(load_audio_16k, tmp_path / "missing.wav")
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"not a wav file\nat all")
    assert "could not read" in one_line_error(load_audio_16k, garbage)
    assert "no audio" in one_line_error(load_audio_16k, np.zeros(0, np.float32))
    one_line_error(load_audio_16k, np.array([0.0, np.inf], np.float32))


# -- encoder ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def towers():
    """(transformers' audio tower, ours with its weights) from the tiny random Qwen3-Omni."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from omni_reference import build_tiny_omni

    model = build_tiny_omni()
    # transformers 5 nests the tower under thinker.model; its checkpoint key is thinker.audio_tower
    tower = getattr(model.thinker, "audio_tower", None) or model.thinker.model.audio_tower
    checkpoint = {PREFIX + k: v.detach().numpy() for k, v in tower.state_dict().items()}
    checkpoint["thinker.model.embed_tokens.weight"] = np.zeros((4, 2), np.float32)  # not ours: passed through
    weights = sanitize_audio_weights(checkpoint, PREFIX)
    assert weights["thinker.model.embed_tokens.weight"] is checkpoint["thinker.model.embed_tokens.weight"]
    ours = AudioEncoder(tiny_audio_args())
    ours.load_weights([(k[len(PREFIX):], mx.array(v)) for k, v in weights.items() if k.startswith(PREFIX)],
                      strict=True)
    return model, tower, ours


# 37: one short chunk; 100: one full chunk; 250: full chunks and a padded remainder; 1000 and
# 1700: several n_window_infer windows (104 tokens each) and a shorter last window
@pytest.mark.parametrize("frames", [37, 100, 250, 1000, 1700])
def test_encoder_matches_transformers(towers, frames):
    import torch

    _, tower, ours = towers
    features = np.random.default_rng(frames).standard_normal((128, frames)).astype(np.float32)
    with torch.no_grad():
        ref = tower(torch.from_numpy(features), feature_lens=torch.tensor([frames])).last_hidden_state.numpy()
    out = np.array(ours(mx.array(features)))
    assert out.shape == ref.shape == (audio_token_count(frames), 32)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


def test_encoder_in_conv_groups_matches_transformers(towers):
    """A long clip's chunks go through the convolutions a group at a time (conv_chunksize): 1700
    frames in groups of 4 chunks, the last group short."""
    import dataclasses

    import torch

    _, tower, ours = towers
    features = np.random.default_rng(5).standard_normal((128, 1700)).astype(np.float32)
    with torch.no_grad():
        ref = tower(torch.from_numpy(features), feature_lens=torch.tensor([1700])).last_hidden_state.numpy()
    args = ours.args
    ours.args = dataclasses.replace(args, conv_chunksize=4)
    try:
        out = np.array(ours(mx.array(features)))
    finally:
        ours.args = args
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


def test_clip_to_audio_tokens_matches_transformers(towers, extractor):
    """A clip end to end: extractor + get_audio_features against log_mel + our encoder."""
    import torch

    model, _, ours = towers
    fe, kwargs = extractor
    wav = clip(9.3, seed=7, extra=41)
    inputs = fe(wav, return_tensors="pt", **kwargs)
    with torch.no_grad():
        ref = model.thinker.get_audio_features(
            inputs["input_features"], feature_attention_mask=inputs["attention_mask"]
        ).last_hidden_state.numpy()
    out = np.array(ours(mx.array(log_mel(wav))))
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


def test_sanitize_converts_once_and_only_under_the_prefix():
    encoder = AudioEncoder(tiny_audio_args())
    mlx_layout = {PREFIX + k: np.array(v) for k, v in tree_flatten(encoder.parameters())}
    torch_layout = {
        k: (v.transpose(0, 3, 1, 2) if k.endswith(("conv2d1.weight", "conv2d2.weight", "conv2d3.weight")) else v)
        for k, v in mlx_layout.items()
    }
    torch_layout["other.conv2d1.weight"] = torch_layout[PREFIX + "conv2d1.weight"]
    torch_layout[PREFIX + "positional_embedding.positional_embedding"] = np.zeros((1500, 32), np.float32)

    once = sanitize_audio_weights(torch_layout, PREFIX)
    twice = sanitize_audio_weights(once, PREFIX)
    assert PREFIX + "positional_embedding.positional_embedding" not in once
    assert once["other.conv2d1.weight"].shape == (16, 1, 3, 3)  # outside the prefix: untouched
    for key, value in mlx_layout.items():
        assert np.array_equal(once[key], value), key
        assert np.array_equal(twice[key], value), key
    # a dict without conv2d1 is judged tensor by tensor
    partial = {k: v for k, v in torch_layout.items() if not k.endswith("conv2d1.weight")}
    assert sanitize_audio_weights(partial, PREFIX)[PREFIX + "conv2d2.weight"].shape == (16, 3, 3, 16)


def test_encoder_rejects_bad_features():
    encoder = AudioEncoder(tiny_audio_args())
    assert "(128, frames)" in one_line_error(encoder, mx.zeros((64, 100)))
    assert "no frames" in one_line_error(encoder, mx.zeros((128, 0)))
    one_line_error(encoder, mx.zeros((128,)))
    one_line_error(encoder, mx.zeros((1, 128, 100)))

