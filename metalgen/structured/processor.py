"""The token mask applied during generation: a logits processor `(history, logits) -> logits`.

Generation enqueues step n+1 before it reads token n back (metalgen.generate, metalgen.batch), and the
mask of step n+1 depends on token n. The processor is called while step n+1 is being built: it first
enqueues the forward pass (`mx.async_eval(logits)`), then reads token n (the wait the loop would make
anyway a moment later: still one wait on the device a token), advances the automaton, makes the mask on
the host while the device runs the forward pass, and returns the masked logits, which the sampler then
draws from. What is lost against the unconstrained loop is the overlap of the sampler with the host's
work between steps, and the mask's time where it is longer than a forward pass (docs/serve.md).
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from ..errors import MetalgenError
from .automaton import Grammar
from .vocab import TokenIndex


class JsonConstraint:
    """A logits processor that allows only the tokens keeping the output a valid prefix of a JSON text of
    `grammar`, and the EOS ids once it is complete (alone once nothing may follow). Stateful: one per
    generated sequence. `history` (T,) holds the prompt (its first call's length) then the tokens so far."""

    def __init__(self, grammar: Grammar, index: TokenIndex):
        self.grammar, self.index = grammar, index
        self.state = grammar.start
        self.base: Optional[int] = None  # history's length at the first call: the prompt's ids
        self.read = 0  # generated tokens the automaton has taken
        self.ended = False  # an EOS came: generation is over (a step already enqueued may still ask)
        self._eos = set(index.eos_ids.tolist())

    def advance(self, token: int) -> None:
        """Take a generated token (MetalgenError if the automaton refuses it: a masked token was drawn)."""
        if self.ended:
            return
        if token in self._eos:
            self.ended = True
            return
        data = self.index.token_bytes.get(token)
        state = None if data is None else self.grammar.feed(self.state, data)
        if state is None:
            raise MetalgenError(f"structured output: token {token} does not continue the JSON text")
        self.state = state

    def mask(self) -> mx.array:
        """The allowed tokens now, boolean (V,)."""
        if self.ended:
            return mx.array(self.index.eos_mask)
        return mx.array(self.index.mask(self.grammar, self.state))

    def __call__(self, history: mx.array, logits: mx.array) -> mx.array:
        mx.async_eval(logits)  # the forward pass runs while the host reads the token and makes the mask
        if self.base is None:
            self.base = int(history.size)
        else:
            fresh = int(history.size) - self.base - self.read
            if fresh > 0:
                for token in history[-fresh:].tolist():
                    self.advance(int(token))
                self.read += fresh
        allowed = self.mask()
        V = logits.shape[-1]
        if allowed.size != V:  # a model vocabulary padded past the index's: padding ids stay masked
            allowed = allowed[:V] if allowed.size > V else mx.concatenate([allowed, mx.zeros((V - allowed.size,), mx.bool_)])
        return mx.where(allowed, logits, mx.array(-float("inf"), logits.dtype))
