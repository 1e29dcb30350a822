"""Samplers and logits processors.

`make_sampler` returns a function `sampler(logits) -> (token, logprob)` that runs wholly on
the device: the fused kernel on GPU backends, its MLX reference on the CPU
(`kernels_metal.sample`). Its random state is a device array advanced by the kernel itself, so
drawing a token never needs a readback.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence, Tuple

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
    return DeviceSampler(temperature, top_k, top_p, min_p, seed)


class DeviceSampler:
    """The sampler `make_sampler` builds: `sampler(logits (B, V)) -> (tokens (B,), logprobs (B,))`.

    It also takes a repetition penalty to fold into the same launch (`sampler(logits, recent=ids,
    penalty=p)`), which generation uses in place of a separate `RepetitionPenalty` processor. It holds
    the device-side generator state and, on a GPU, the kernel's working memory for each logits shape.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float, min_p: float, seed: int):
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, top_k, top_p, min_p
        self.state = K.make_sample_state(seed)
        self._scratch = {}
        self._streams = 0

    def next_stream(self) -> int:
        """A random stream for each batch row that draws with this sampler's settings and state
        (metalgen.batch samples rows in one launch): 0 first, which draws exactly as this sampler alone."""
        stream = self._streams
        self._streams += 1
        return stream

    def __call__(self, logits: mx.array, recent: Optional[mx.array] = None,
                 penalty: float = 1.0) -> Tuple[mx.array, mx.array]:
        shape = tuple(logits.shape[-2:]) if logits.ndim > 1 else (1, logits.shape[0])
        if shape not in self._scratch:
            self._scratch[shape] = K.make_sample_scratch(*shape)
        tokens, logprobs, self.state = K.sample(logits, self.temperature, self.top_k, self.top_p, self.min_p,
                                                self.state, recent, penalty, self._scratch[shape])
        return tokens, logprobs

    @property
    def window(self) -> int:
        """How many recent tokens the sampler's state keeps for a repetition penalty (0: none; `keep_recent`)."""
        return K.ring_size(self.state)

    def keep_recent(self, ids: mx.array, window: int) -> None:
        """Keep the last `window` tokens in the sampler's device state, starting from the last of `ids` (the prompt):
        each draw adds its token, and `sampler(logits, penalty=p)` penalizes them inside the sampling launch, so
        that a decode loop holds no history of its own (one row; the seed and counter carry on)."""
        self.state = K.with_recent(self.state, ids, window)

    def last_token(self) -> mx.array:
        """The token the last call drew for row 0, (1,) int32, lazy: a view of the sampler's state, so in the
        device's own memory. A decode step on the GPU reads it as its next input where the returned token (4
        bytes) sits in MLX's unified-memory pool of small arrays, which the CPU's readback touches every step."""
        return K.token_word(self.state)


class RepetitionPenalty:
    """Penalize tokens seen in the last `context_size` tokens (prompt included), as Hugging Face
    does: positive logits are divided by `penalty`, negative ones multiplied. A logits processor
    `(tokens (T,), logits (1, V)) -> logits`; next to a `DeviceSampler`, generation folds it into
    the sampler's launch instead (`process_and_sample`)."""

    def __init__(self, penalty: float, context_size: int = 20):
        if penalty <= 0:
            raise MetalgenError(f"repetition penalty must be > 0, got {penalty}")
        if context_size < 1:
            raise MetalgenError(f"repetition context size must be >= 1, got {context_size}")
        self.penalty, self.context_size = float(penalty), int(context_size)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        # tokens: (T,) ids so far on the device; logits: (1, V)
        recent = tokens[-self.context_size:]
        picked = logits[:, recent]
        picked = mx.where(picked < 0, picked * self.penalty, picked / self.penalty)
        logits[:, recent] = picked
        return logits


def make_repetition_penalty(penalty: float, context_size: int = 20) -> RepetitionPenalty:
    """The repetition penalty over the last `context_size` tokens (`RepetitionPenalty`)."""
    return RepetitionPenalty(penalty, context_size)


class PresenceFrequencyPenalty:
    """OpenAI's presence and frequency penalties: from each token's logit subtract `presence` once if it
    occurs in the generated text so far and `frequency` times its count there. A logits processor
    `(tokens (T,), logits (1, V)) -> logits`; `tokens` holds the prompt's `prompt_tokens` ids first, which
    are not counted (OpenAI penalizes what the model wrote, not what it was given)."""

    def __init__(self, presence: float = 0.0, frequency: float = 0.0, prompt_tokens: int = 0):
        if prompt_tokens < 0:
            raise MetalgenError(f"prompt tokens must be >= 0, got {prompt_tokens}")
        self.presence, self.frequency, self.prompt_tokens = float(presence), float(frequency), int(prompt_tokens)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        generated = tokens[self.prompt_tokens:]
        if generated.size == 0:  # the first token: nothing written yet
            return logits
        # counts of each id on the device: a scatter-add of ones, no readback
        counts = mx.zeros((logits.shape[-1],), mx.float32).at[generated].add(1.0)
        penalty = self.frequency * counts + self.presence * (counts > 0).astype(mx.float32)
        return (logits.astype(mx.float32) - penalty).astype(logits.dtype)


def make_presence_frequency_penalty(presence: float = 0.0, frequency: float = 0.0,
                                    prompt_tokens: int = 0) -> List[LogitsProcessor]:
    """`[PresenceFrequencyPenalty]`, or `[]` when both penalties are 0 (the default path stays as it was)."""
    if presence == 0 and frequency == 0:
        return []
    return [PresenceFrequencyPenalty(presence, frequency, prompt_tokens)]


def lone_penalty(processors: Sequence[LogitsProcessor], sampler: Sampler) -> Optional[RepetitionPenalty]:
    """The repetition penalty that a `DeviceSampler` folds into its launch: the processors' only one, else None."""
    if len(processors) == 1 and isinstance(processors[0], RepetitionPenalty) and isinstance(sampler, DeviceSampler):
        return processors[0]
    return None


def sample_processed(logits: mx.array, sampler: Sampler, processors: Sequence[LogitsProcessor],
                     history: Optional[mx.array]) -> Tuple[mx.array, mx.array]:
    """Run the logits processors, then the sampler, on `logits` (1, V); lazy (token (1,), logprob (1,)).
    A lone repetition penalty before a `DeviceSampler` runs inside the sampler's launch, over the recent tokens
    the end of `history`, or without one, over the recent tokens the sampler keeps (`keep_recent`)."""
    rp = lone_penalty(processors, sampler)
    if rp is not None and history is not None:
        return sampler(logits, recent=history[-rp.context_size:], penalty=rp.penalty)
    if rp is not None and sampler.window == rp.context_size:
        return sampler(logits, penalty=rp.penalty)
    for processor in processors:
        logits = processor(history, logits)
    return sampler(logits)


def make_logits_processors(
    repetition_penalty: Optional[float] = None, repetition_context_size: int = 20
) -> List[LogitsProcessor]:
    """The processors the sampling settings ask for (an empty list when none)."""
    processors: List[LogitsProcessor] = []
    if repetition_penalty is not None and repetition_penalty != 1.0:
        processors.append(make_repetition_penalty(repetition_penalty, repetition_context_size))
    return processors
