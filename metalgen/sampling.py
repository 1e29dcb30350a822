"""Samplers and logits processors.

`make_sampler` returns a function `sampler(logits) -> (token, logprob)` that runs wholly on
the device: the fused kernel on GPU backends, its MLX reference on the CPU
(`kernels_metal.sample`). Its random state is a device array advanced by the kernel itself, so
drawing a token never needs a readback.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple

import mlx.core as mx

import kernels_metal as K

from .errors import MetalgenError

Sampler = Callable[[mx.array], Tuple[mx.array, mx.array]]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


def validate_sampling(temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    """Raise MetalgenError for settings no sampler can honour."""
    if temperature < 0:
        raise MetalgenError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise MetalgenError(f"top-k must be >= 0 (0 disables it), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise MetalgenError(f"top-p must be in (0, 1] (1 disables it), got {top_p}")
    if not 0.0 <= min_p < 1.0:
        raise MetalgenError(f"min-p must be in [0, 1) (0 disables it), got {min_p}")


def make_sampler(
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: Optional[int] = None,
) -> Sampler:
    """Build a sampler: temperature, then top-k, top-p and min-p (in that order), then a
    draw from the survivors; greedy when temperature is 0.

    Args:
        seed: seeds the device-side generator; the same seed gives the same tokens on the same
            backend. None draws a seed from the OS.

    Returns:
        `sampler(logits (B, V)) -> (tokens (B,) int32, logprobs (B,) float32)`, where logprob
        is that of the chosen token under the unfiltered, untempered distribution.
    """
    validate_sampling(temperature, top_k, top_p, min_p)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    state = K.make_sample_state(seed)

    def sampler(logits: mx.array) -> Tuple[mx.array, mx.array]:
        nonlocal state
        tokens, logprobs, state = K.sample(logits, temperature, top_k, top_p, min_p, state)
        return tokens, logprobs

    return sampler


def make_repetition_penalty(penalty: float, context_size: int = 20) -> LogitsProcessor:
    """Penalize tokens seen in the last `context_size` tokens (prompt included), as Hugging
    Face does: positive logits are divided by `penalty`, negative ones multiplied."""
    if penalty <= 0:
        raise MetalgenError(f"repetition penalty must be > 0, got {penalty}")
    if context_size < 1:
        raise MetalgenError(f"repetition context size must be >= 1, got {context_size}")

    def processor(tokens: mx.array, logits: mx.array) -> mx.array:
        # tokens: (T,) ids so far on the device; logits: (1, V)
        recent = tokens[-context_size:]
        picked = logits[:, recent]
        picked = mx.where(picked < 0, picked * penalty, picked / penalty)
        logits[:, recent] = picked
        return logits

    return processor


def make_logits_processors(
    repetition_penalty: Optional[float] = None, repetition_context_size: int = 20
) -> List[LogitsProcessor]:
    """The processors the sampling settings ask for (an empty list when none)."""
    processors: List[LogitsProcessor] = []
    if repetition_penalty is not None and repetition_penalty != 1.0:
        processors.append(make_repetition_penalty(repetition_penalty, repetition_context_size))
    return processors
