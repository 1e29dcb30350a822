"""GPU-resident decode paths on stacked weights (docs/decode.md).

`make_step` is the hook generate_step uses after prefill; `decoder_for` picks a decoder
(plain / reference / fused / megakernel / auto) for a model.
"""

from .path import MODES, decoder_for, make_step, self_check, stacked_weights, start_state
from .reference import ReferenceDecoder
from .stacked import DecodeState, StackedWeights, empty_state, stack_weights, stacked_cache

__all__ = ["MODES", "decoder_for", "make_step", "self_check", "stacked_weights", "start_state",
           "ReferenceDecoder", "DecodeState", "StackedWeights", "empty_state", "stack_weights", "stacked_cache"]
