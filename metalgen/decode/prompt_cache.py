"""A caller's prompt cache that the fast decode paths run on in place (multi-turn chat, a reused prefix).

`StackedPromptCache` is a list of per-layer caches, as `make_prompt_cache` returns, whose layers are views
of one stacked KV cache (a `DecodeState`: (L, kv_heads, capacity, D) keys and values). The plain path's
prefill writes each layer's new keys and values into the stacked arrays (`kernels_metal.kv_store`: in
place on a GPU), and the decoder (megakernel, fused or reference) then decodes on the same state. Between
turns nothing is copied: the next prompt is prefilled at the position where the last decode step stopped.

Positions: the state's `pos` is the number of positions every layer holds. During a forward pass of n
tokens the layers are updated in order; a layer that has written its n positions and is not the last one
reports `pos + n` as its offset until the last layer commits them (state.pos += n).
"""

from __future__ import annotations

from typing import List, Optional

import mlx.core as mx

import kernels_metal as K

from ..cache import KVCache
from ..errors import MetalgenError
from .stacked import DecodeState, empty_state


class StackedLayerCache(KVCache):
    """One attention layer of a StackedPromptCache, with the KVCache interface the models call."""

    def __init__(self, owner: "StackedPromptCache", layer: int):  # noqa: D107 - no KVCache buffers of its own
        self.owner = owner
        self.layer = layer
        self.max_size = None

    @property
    def offset(self) -> int:
        return self.owner.state.pos + self.owner.pending[self.layer]

    @property
    def keys(self) -> mx.array:  # (1, Hkv, capacity, D): the layer's view of the stacked keys
        return self.owner.state.kc[self.layer:self.layer + 1]

    @property
    def values(self) -> mx.array:
        return self.owner.state.vc[self.layer:self.layer + 1]

    def update(self, k: mx.array, v: mx.array) -> None:
        """Append k, v: (1, kv_heads, n, head_dim) at this layer's offset."""
        owner, n = self.owner, k.shape[2]
        if k.shape[0] != 1:
            raise ValueError("a stacked prompt cache holds one sequence")
        owner.reserve(owner.state.pos + n)
        st = owner.state
        st.kc, st.vc, st.dep = K.kv_store(st.kc, st.vc, k, v, self.layer, self.offset, st.dep)
        if self.layer == len(owner) - 1:
            st.pos += n
            owner.pending = [0] * len(owner)
        else:
            owner.pending[self.layer] = n

    def update_and_fetch(self, k: mx.array, v: mx.array):
        self.update(k, v)
        end = self.offset
        return self.keys[..., :end, :], self.values[..., :end, :]

    @property
    def state(self) -> List[mx.array]:
        return [self.keys[..., :self.offset, :], self.values[..., :self.offset, :]]

    @property
    def nbytes(self) -> int:
        st = self.owner.state
        return (st.kc.nbytes + st.vc.nbytes) // len(self.owner)


class StackedPromptCache(list):
    """Per-layer caches over one stacked KV cache that `decoder` (a metalgen.decode decoder) steps on.

    Build it with `metalgen.make_prompt_cache(model)` (on a backend where a fast path runs) and pass it as
    `prompt_cache=` to generate_step / stream_generate / generate as often as the conversation goes on."""

    # capacity grows in steps of this many positions at least (each growth copies the cache once)
    step = 1024

    def __init__(self, decoder, capacity: int = 0):
        w = decoder.w
        super().__init__(StackedLayerCache(self, layer) for layer in range(w.layers))
        self.decoder = decoder
        self.max_positions = w.rope_table.max_positions
        self.state: DecodeState = decoder.prepare(empty_state(w, max(1, min(capacity, self.max_positions))))
        self.pending = [0] * w.layers

    @property
    def offset(self) -> int:
        """The positions every layer holds."""
        return self.state.pos

    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions (a copy of the cache when it must grow)."""
        st = self.state
        if positions <= st.capacity:
            return
        if positions > self.max_positions:
            raise MetalgenError(f"the prompt cache would hold {positions} positions, past the model's context of "
                                f"{self.max_positions}")
        cap = min(self.max_positions, max(positions, 2 * st.capacity, -(-positions // self.step) * self.step))
        L, H, _, D = st.kc.shape
        pad = mx.zeros((L, H, cap - st.capacity, D), st.kc.dtype)
        # fresh buffers, which the kernels may write in place; ordered after the last launch on the old ones
        kc, vc = mx.depends([st.kc, st.vc], [st.dep]) if st.dep is not None else (st.kc, st.vc)
        st.kc, st.vc = mx.concatenate([kc, pad], axis=2), mx.concatenate([vc, pad], axis=2)
        mx.eval(st.kc, st.vc)
        st.capacity = cap
        st.dep = None


def stacked_prompt_cache(model, mode: Optional[str] = None) -> Optional[StackedPromptCache]:
    """A StackedPromptCache on the decoder that `mode` ("auto" by default) gives `model`, or None where that
    is the plain path or a hybrid stack (whose Gated DeltaNet layers keep per-layer caches)."""
    from .path import decoder_for

    if getattr(getattr(model, "spec", None), "hybrid", None) is not None:
        return None
    dec = decoder_for(model, mode)
    return None if dec is None else StackedPromptCache(dec)
