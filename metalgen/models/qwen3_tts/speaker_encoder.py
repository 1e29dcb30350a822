"""The Base model's speaker encoder (ECAPA-TDNN): 128-bin log-mel frames of a 24 kHz clip ->
one speaker embedding in the talker's hidden size, which takes the speaker slot of the prompt.

Attributes follow the checkpoint keys under `speaker_encoder.`; convolutions are 'same'-padded
with reflection, as in the reference. `log_mel` is the reference's mel_spectrogram (Slaney mel
filterbank, periodic Hann window, magnitude with 1e-9, log with a 1e-5 floor), in numpy.
"""

from __future__ import annotations

from typing import List

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .config import SpeakerEncoderArgs
from .speech_decoder import conv1d_gemm


def _reflect_pad(x: mx.array, left: int, right: int) -> mx.array:
    """Reflect-pad (B, T, C) along T (the edge sample itself is not repeated)."""
    parts = []
    if left:
        parts.append(x[:, 1 : left + 1][:, ::-1])
    parts.append(x)
    if right:
        parts.append(x[:, -right - 1 : -1][:, ::-1])
    return mx.concatenate(parts, axis=1) if len(parts) > 1 else x


class TDNNBlock(nn.Module):
    """ReLU(Conv1d) with 'same' reflect padding (stride 1)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation)

    def __call__(self, x):
        total = self.conv.dilation * (self.conv.weight.shape[1] - 1)
        x = _reflect_pad(x, total // 2, total - total // 2)
        return nn.relu(conv1d_gemm(x, self.conv.weight, self.conv.get("bias"), self.conv.dilation))


class Res2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = [TDNNBlock(cin // scale, cout // scale, kernel, dilation) for _ in range(scale - 1)]

    def __call__(self, x):
        parts = mx.split(x, self.scale, axis=-1)
        outs: List[mx.array] = []
        for i, part in enumerate(parts):
            if i == 0:
                y = part
            elif i == 1:
                y = self.blocks[0](part)
            else:
                y = self.blocks[i - 1](part + y)
            outs.append(y)
        return mx.concatenate(outs, axis=-1)


class SEBlock(nn.Module):
    def __init__(self, cin: int, se: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv1d(cin, se, 1)
        self.conv2 = nn.Conv1d(se, cout, 1)

    def __call__(self, x):
        s = mx.mean(x, axis=1, keepdims=True)
        s = nn.relu(self.conv1(s))
        return x * mx.sigmoid(self.conv2(s))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin, cout, scale, se, kernel, dilation):
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se, cout)

    def __call__(self, x):
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    def __init__(self, channels: int, attention: int):
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention, 1, 1)
        self.conv = nn.Conv1d(attention, channels, 1)

    @staticmethod
    def _stats(x, w):
        mean = mx.sum(w * x, axis=1)
        std = mx.sqrt(mx.maximum(mx.sum(w * mx.square(x - mean[:, None]), axis=1), 1e-12))
        return mean, std

    def __call__(self, x):
        T = x.shape[1]
        mean, std = self._stats(x, mx.full((1, T, 1), 1.0 / T))
        ctx = mx.concatenate([x, mx.repeat(mean[:, None], T, 1), mx.repeat(std[:, None], T, 1)], axis=-1)
        att = mx.softmax(self.conv(mx.tanh(self.tdnn(ctx))), axis=1)
        mean, std = self._stats(x, att)
        return mx.concatenate([mean, std], axis=-1)[:, None]  # (B, 1, 2C)


class SpeakerEncoder(nn.Module):
    def __init__(self, args: SpeakerEncoderArgs):
        super().__init__()
        ch, ks, dil = list(args.enc_channels), list(args.enc_kernel_sizes), list(args.enc_dilations)
        self.args = args
        self.blocks = [TDNNBlock(args.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            self.blocks.append(SERes2NetBlock(ch[i - 1], ch[i], args.enc_res2net_scale, args.enc_se_channels,
                                              ks[i], dil[i]))
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], args.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, args.enc_dim, 1)

    def __call__(self, mels: mx.array) -> mx.array:
        """mels (B, frames, mel_dim) -> (B, enc_dim)."""
        h = mels
        outs = []
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        h = self.mfa(mx.concatenate(outs[1:], axis=-1))
        return self.fc(self.asp(h))[:, 0]


def slaney_mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """librosa.filters.mel(htk=False, norm='slaney'): (n_mels, n_fft // 2 + 1)."""
    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        lin = f / (200.0 / 3)
        logstep = np.log(6.4) / 27.0
        return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / logstep, lin)

    def mel_to_hz(m):
        m = np.asarray(m, dtype=np.float64)
        logstep = np.log(6.4) / 27.0
        return np.where(m >= 15.0, 1000.0 * np.exp(logstep * (m - 15.0)), (200.0 / 3) * m)

    fft_freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def log_mel(wav: np.ndarray, sr: int = 24000, n_fft: int = 1024, n_mels: int = 128, hop: int = 256,
            win: int = 1024, fmin: float = 0.0, fmax: float = 12000.0) -> np.ndarray:
    """The reference's mel_spectrogram(center=False) of a mono clip: (frames, n_mels) float32."""
    pad = (n_fft - hop) // 2
    y = np.pad(wav.astype(np.float64), (pad, pad), mode="reflect")
    n = 1 + (len(y) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(n)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)  # periodic Hann
    spec = np.fft.rfft(y[idx] * window[None, :], n=n_fft, axis=-1)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    mel = mag @ slaney_mel_filters(sr, n_fft, n_mels, fmin, fmax).T.astype(np.float64)
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)
