"""The Python entry points: `load`, `stream` and `generate`."""

from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Union

from .errors import MetalgenError
from .generate import GenerationResponse, stream_generate
from .loading import load
from .sampling import make_logits_processors, make_sampler

Prompt = Union[str, Sequence[int], Sequence[dict]]


def encode_prompt(tokenizer, prompt: Prompt, *, system: Optional[str] = None) -> List[int]:
    """Token ids for a prompt: a string is encoded as is, a list of ids is kept, and a list
    of chat messages ({"role", "content"}) goes through the tokenizer's chat template."""
    if isinstance(prompt, str):
        if not prompt:
            raise MetalgenError("the prompt is empty")
        return tokenizer.encode(prompt)
    prompt = list(prompt)
    if not prompt:
        raise MetalgenError("the prompt is empty")
    if all(isinstance(t, int) for t in prompt):
        return prompt
    if all(isinstance(m, dict) for m in prompt):
        messages = ([{"role": "system", "content": system}] if system else []) + prompt
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    raise MetalgenError("a prompt is a string, a list of token ids, or a list of chat messages")


def stream(
    model,
    tokenizer,
    prompt: Prompt,
    *,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: Optional[float] = None,
    repetition_context_size: int = 20,
    seed: Optional[int] = None,
    stop: Sequence[str] = (),
    prefill_step_size: int = 512,
    decode: Optional[str] = None,
    tracer=None,
) -> Iterator[GenerationResponse]:
    """Generate from `prompt`, yielding a `GenerationResponse` per token as it is made.

    `prompt` is a string (encoded as is), a list of token ids, or a list of chat messages
    (rendered with the tokenizer's chat template). Sampling is greedy at temperature 0;
    `seed` makes sampled output reproducible. Generation stops at an EOS token, at any
    string in `stop`, or after `max_tokens`. `decode` picks the decode path after prefill
    ("auto", "plain", "fused", "megakernel"; docs/decode.md); None means "auto".
    """
    ids = encode_prompt(tokenizer, prompt)
    sampler = make_sampler(temperature, top_k, top_p, min_p, seed)
    processors = make_logits_processors(repetition_penalty, repetition_context_size)
    extra = {} if tracer is None else {"tracer": tracer}
    yield from stream_generate(
        model,
        tokenizer,
        ids,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors,
        stop_strings=stop,
        prefill_step_size=prefill_step_size,
        decode=decode,
        **extra,
    )


def generate(model, tokenizer, prompt: Prompt, **kwargs) -> str:
    """Generate and return the whole text; takes `stream`'s arguments."""
    return "".join(r.text for r in stream(model, tokenizer, prompt, **kwargs))


__all__ = ["load", "stream", "generate", "encode_prompt"]
