"""Checks a decode path against the plain path: both fed the same tokens, logits compared at
every step (used by the tests on the CPU with the reference path, and by
benchmarks/decode_check.py on a GPU with the fused and megakernel paths)."""

from __future__ import annotations

import copy
from typing import List

import mlx.core as mx
import numpy as np

from ..cache import make_prompt_cache
from .path import make_step, rel_err


def prefill_random(model, prompt_tokens: int, seed: int = 0):
    """A seeded random prompt of `prompt_tokens` ids through the plain path: (the last position's
    logits (1, vocab), the filled per-layer caches), evaluated."""
    vocab = model.spec.vocab_size
    prompt = mx.array(np.random.default_rng(seed).integers(0, vocab, prompt_tokens), mx.int32)
    cache = make_prompt_cache(model, decode="plain")
    logits = model.logits(model.hidden(prompt[None], cache=cache)[:, -1, :])
    mx.eval(logits, [c.state for c in cache])
    return logits, cache


def _teacher_forced(model, mode: str, prompt_tokens: int, steps: int, seed: int, model32=None):
    """Per step, fed the plain path's greedy tokens: (the fast path's logits, plain's, and
    `model32`'s on the same tokens or None). One prefill serves plain and fast: the fast path gets
    its own copies of the per-layer cache objects (the compiled path advances them in place; their
    arrays are immutable, so sharing them is safe), and plain goes on with the originals."""
    logits, cache = prefill_random(model, prompt_tokens, seed)
    cache32 = prefill_random(model32, prompt_tokens, seed)[1] if model32 is not None else None
    fast = make_step(model, [copy.copy(c) for c in cache], prompt_tokens, steps, mode)
    if fast is None:
        raise RuntimeError(f"decode path {mode} is not available here")
    for _ in range(steps):
        tok = mx.argmax(logits, axis=-1).astype(mx.int32)
        logits = model.logits(model.hidden(tok[None], cache=cache)[:, -1, :])
        truth = None if model32 is None else model32.logits(model32.hidden(tok[None], cache=cache32)[:, -1, :])
        yield fast(tok), logits, truth


def step_errors(model, mode: str, prompt_tokens: int = 16, steps: int = 32, seed: int = 0) -> List[float]:
    """Per-step relative error ||fast - plain|| / ||plain|| of the logits, teacher-forced with
    the plain path's greedy tokens."""
    return [rel_err(got, plain) for got, plain, _ in _teacher_forced(model, mode, prompt_tokens, steps, seed)]


def step_errors_vs_float32(model, mode: str, prompt_tokens: int = 16, steps: int = 32, seed: int = 0):
    """The bf16 noise floor next to a decode path's error, teacher-forced with the plain bf16
    path's greedy tokens: per-step relative logit errors (fast vs plain, fast vs float32, plain vs
    float32), where float32 is the plain path on the same weights upcast (a second copy of the
    model is built). A fast path that rounds in other places than plain differs from it by about
    the noise floor, so "no further from float32 than plain" is the fair check where plain's own
    bf16 error is large (qwen3-4b: 4.6%, docs/decode.md)."""
    import copy

    from mlx.utils import tree_map

    model32 = copy.deepcopy(model)
    # (a quantized layer's codes stay as they are: its scales and biases go to float32)
    model32.update(tree_map(lambda a: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a,
                            model.parameters()))
    vs_plain, fast32, plain32 = [], [], []
    for got, plain, truth in _teacher_forced(model, mode, prompt_tokens, steps, seed, model32):
        vs_plain.append(rel_err(got, plain))
        fast32.append(rel_err(got, truth))
        plain32.append(rel_err(plain, truth))
    return vs_plain, fast32, plain32
