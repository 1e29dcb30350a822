"""Checks a decode path against the plain path: both fed the same tokens, logits compared at
every step (used by the tests on the CPU with the reference path, and by
benchmarks/decode_check.py on a GPU with the fused and megakernel paths)."""

from __future__ import annotations

from typing import List

import mlx.core as mx
import numpy as np

from ..cache import make_prompt_cache
from .path import make_step, rel_err


def step_errors(model, mode: str, prompt_tokens: int = 16, steps: int = 32, seed: int = 0) -> List[float]:
    """Per-step relative error ||fast - plain|| / ||plain|| of the logits, teacher-forced with
    the plain path's greedy tokens."""
    vocab = model.spec.vocab_size
    prompt = mx.array(np.random.default_rng(seed).integers(0, vocab, prompt_tokens), mx.int32)
    plain_cache = make_prompt_cache(model)
    fast_cache = make_prompt_cache(model)
    logits = model.logits(model.hidden(prompt[None], cache=plain_cache)[:, -1, :])
    model.hidden(prompt[None], cache=fast_cache)
    mx.eval(logits, [c.state for c in plain_cache], [c.state for c in fast_cache])
    fast = make_step(model, fast_cache, prompt_tokens, steps, mode)
    if fast is None:
        raise RuntimeError(f"decode path {mode} is not available here")
    errs = []
    for _ in range(steps):
        tok = mx.argmax(logits, axis=-1).astype(mx.int32)
        logits = model.logits(model.hidden(tok[None], cache=plain_cache)[:, -1, :])
        got = fast(tok)
        errs.append(rel_err(got, logits))
    return errs
