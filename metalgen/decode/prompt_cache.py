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
    """One attention layer of a StackedPromptCache, with the KVCache interface the models call.

    After an update, `keys` / `values` are the layer's positions so far as `kv_store` returned them (on a
    GPU fresh copies made by the launch that wrote the cache in place: MLX sees no edge from that write to
    a read of the stacked arrays themselves, so nothing here reads them without one)."""

    def __init__(self, owner: "StackedPromptCache", layer: int):  # noqa: D107 - no KVCache buffers of its own
        self.owner = owner
        self.layer = layer
        self.max_size = None
        self._fetched = None  # (keys, values) (1, Hkv, offset, D) of the last update

    @property
    def offset(self) -> int:
        return self.owner.state.pos + self.owner.pending[self.layer]

    def _kv(self):
        if self._fetched is None or self._fetched[0].shape[2] != self.offset:
            self._fetched = self.owner.read_layer(self.layer, self.offset)
        return self._fetched

    @property
    def keys(self) -> mx.array:  # (1, Hkv, offset, D)
        return self._kv()[0]

    @property
    def values(self) -> mx.array:
        return self._kv()[1]

    def update(self, k: mx.array, v: mx.array) -> None:
        """Append k, v: (1, kv_heads, n, head_dim) at this layer's offset."""
        owner, n = self.owner, k.shape[2]
        if k.shape[0] != 1:
            raise ValueError("a stacked prompt cache holds one sequence")
        owner.reserve(owner.state.pos + n)
        st = owner.state
        store = K.kv_store if owner.in_place else K.reference.kv_store
        st.kc, st.vc, st.dep, keys, values = store(st.kc, st.vc, k.astype(st.kc.dtype), v.astype(st.vc.dtype),
                                                   self.layer, self.offset, st.dep)
        if self.layer == len(owner) - 1:
            st.pos += n
            owner.pending = [0] * len(owner)
        else:
            owner.pending[self.layer] = n
        self._fetched = (keys, values)

    def update_and_fetch(self, k: mx.array, v: mx.array):
        self.update(k, v)
        fetched, self._fetched = self._fetched, None  # held by the caller's graph, not by the cache
        return fetched

    @property
    def state(self) -> List[mx.array]:
        """The arrays to evaluate to materialize this cache: the last in-place launch on the stacked arrays
        (reading the layer back here, 28 layers a prefill chunk, made a 16k-token prompt 40% slower), or
        the arrays themselves where they are updated as MLX arrays."""
        st = self.owner.state
        if self.owner.in_place:
            return [] if st.dep is None else [st.dep]
        return [st.kc, st.vc]

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
        # a GPU decoder's kernels write the stacked arrays in place, and so does kv_store then; the
        # reference decoder updates them as MLX arrays, and so does the reference kv_store
        self.in_place = hasattr(decoder, "kernel_name")

    def trim(self, n: int) -> int:
        """Forget the last `n` positions (later writes overwrite them); returns `n`."""
        n = max(0, min(int(n), self.state.pos))
        self.state.pos -= n
        self.pending = [0] * len(self)
        self.release()
        return n

    def release(self) -> None:
        """Let go of the layers' last returned keys and values (a copy of the cache's positions on a GPU),
        once the step that reads them is enqueued; the decoder reads the stacked arrays themselves."""
        for layer in self:
            layer._fetched = None

    def settle(self) -> None:
        """Wait for the last in-place launch on the cache (before MLX operations read its arrays)."""
        if self.in_place and self.state.dep is not None:
            mx.eval(self.state.dep)

    def read_layer(self, layer: int, end: int):
        """Layer `layer`'s first `end` keys and values (1, Hkv, end, D), read after the last launch."""
        self.settle()
        st = self.state
        return st.kc[layer:layer + 1, :, :end], st.vc[layer:layer + 1, :, :end]

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
        self.settle()  # the copy reads what the kernels wrote
        # fresh buffers, which the kernels may write in place
        st.kc, st.vc = mx.concatenate([st.kc, pad], axis=2), mx.concatenate([st.vc, pad], axis=2)
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
