"""Prompts: the thinker's (chat ids with audio placeholders) and the talker's (what transformers'
`Qwen3OmniMoeForConditionalGeneration.generate` builds from the thinker's states).

The talker's prompt, for a conversation whose thinker input ids are `ids`:

    user part        every token of every user turn (its <|im_start|>user ... <|im_end|>\\n),
                     in order: text tokens as text_projection(thinker embedding), audio / image /
                     video tokens as hidden_projection(thinker hidden state after
                     `accept_hidden_layer` layers); system and earlier assistant turns are left out
    assistant part   A = the thinker embeddings from the last <|im_start|>assistant on (prompt,
                     then the generated tokens but the last), text-projected:
                         A[0..2]          + zeros
                         tts_pad x 4      + codec nothink, think_bos, think_eos, speaker
                         tts_bos          + codec_pad
                         A[3]             + codec_bos
    trailing         A[4], A[5], ... fed one per frame, then tts_eos once, then tts_pad

A is known token by token as the thinker goes (`TalkerText`), so the talker starts after the
thinker's first few tokens instead of after its whole reply.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from ..models.qwen3_omni.config import OmniArgs

AUDIO_MARK = "\u0000metalgen-audio-{}\u0000"


def thinker_ids(tokenizer, args: OmniArgs, messages: Sequence[dict], audio_tokens: Sequence[int] = (),
                **template_kwargs) -> List[int]:
    """The thinker's input ids for chat `messages`, with each audio clip of `audio_tokens` (its
    encoder token count) placed at the start of the last user turn as
    <|audio_start|> <|audio_pad|> x n <|audio_end|>, where Qwen3-Omni's template puts audio."""
    messages = [dict(m) for m in messages]
    if not messages:
        raise MetalgenError("the conversation is empty")
    if audio_tokens:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise MetalgenError("audio input needs a user message to attach to")
        last = messages[users[-1]]
        marks = "".join(AUDIO_MARK.format(i) for i in range(len(audio_tokens)))
        last["content"] = marks + str(last.get("content") or "")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
    ids: List[int] = []
    for i, n in enumerate(audio_tokens):
        before, _, text = text.partition(AUDIO_MARK.format(i))
        ids += tokenizer.encode(before, add_special_tokens=False)
        ids += [args.audio_start_token_id] + [args.audio_token_id] * int(n) + [args.audio_end_token_id]
    ids += tokenizer.encode(text, add_special_tokens=False)
    return ids


def user_positions(ids: Sequence[int], args: OmniArgs) -> np.ndarray:
    """Indices of the tokens of user turns: the token after the latest <|im_start|> at or before a
    position names its role (the first token's role is the second token, as transformers clamps)."""
    ids = np.asarray(ids)
    n = len(ids)
    pos = np.arange(n)
    starts = np.where(ids == args.im_start_token_id, pos, -1)
    previous = np.maximum.accumulate(starts).clip(min=0)
    roles = ids[np.minimum(previous + 1, n - 1)]
    return pos[roles == args.user_token_id]


def assistant_start(ids: Sequence[int], args: OmniArgs) -> int:
    """Index of the last <|im_start|> followed by the assistant role token."""
    ids = np.asarray(ids)
    hits = np.nonzero((ids[:-1] == args.im_start_token_id) & (ids[1:] == args.assistant_token_id))[0]
    if hits.size == 0:
        raise MetalgenError("the prompt has no assistant turn to answer in (add_generation_prompt)")
    return int(hits[-1])


def media_mask(ids: Sequence[int], args: OmniArgs) -> np.ndarray:
    ids = np.asarray(ids)
    return (ids == args.audio_token_id) | (ids == args.image_token_id) | (ids == args.video_token_id)


class TalkerText:
    """The assistant sequence A of the module docstring, growing as the thinker generates.

    `push(token, last)` adds a generated token; `last` says no token follows it (EOS or the
    thinker's token limit), which makes it the one token left out of A. `entry(j)` is the text
    input of talker frame j: A[4 + j], then tts_eos, then tts_pad; None while the thinker has not
    got that far. Everything is text-projected here, one token at a time, lazily."""

    def __init__(self, talker, embed: Callable[[mx.array], mx.array], prompt_embeddings: mx.array,
                 special: mx.array):
        # prompt_embeddings: (1, P, thinker hidden), the prompt from the assistant start on
        self.talker = talker
        self.embed = embed
        self.tts_bos, self.tts_eos, self.tts_pad = (special[:, i:i + 1] for i in range(3))
        self.rows: List[mx.array] = [self.talker.text_projection(prompt_embeddings)]  # pieces of A
        self.length = int(prompt_embeddings.shape[1])
        self.pending: Optional[int] = None  # the newest token: in A once a later one comes
        self.done = False

    def push(self, token: int, last: bool) -> None:
        if self.done:
            return
        if self.pending is not None:
            self._append(self.pending)
        self.pending = None if last else int(token)
        self.done = bool(last)

    def _append(self, token: int) -> None:
        e = self.embed(mx.array([[token]], dtype=mx.int32))
        self.rows.append(self.talker.text_projection(e))
        self.length += 1

    def a(self, start: int, stop: int) -> mx.array:
        """A[start:stop] (1, stop - start, hidden)."""
        if len(self.rows) > 1:
            self.rows = [mx.concatenate(self.rows, axis=1)]
        return self.rows[0][:, start:stop]

    def ready(self, count: int) -> bool:
        """Whether A's first `count` entries are final."""
        return self.length >= count or self.done

    def entry(self, j: int) -> Optional[mx.array]:
        i = 4 + j
        if i < self.length:
            return self.a(i, i + 1)
        if not self.done:
            return None
        return self.tts_eos if i == self.length else self.tts_pad


def talker_prompt(talker, args: OmniArgs, ids: Sequence[int], embeddings: mx.array, tapped: mx.array,
                  text: TalkerText, speaker_id: int) -> mx.array:
    """The talker's prompt embeddings (1, U + 9, talker hidden): user part, then assistant part.
    embeddings / tapped: the thinker's input embeddings and hidden states after
    `accept_hidden_layer` layers, (1, len(ids), thinker hidden) (only their user rows are read)."""
    if not text.ready(4):
        raise ValueError("the assistant sequence needs 4 entries before the talker can start")
    t = args.talker
    users = user_positions(ids, args)
    parts = []
    if users.size:
        media = media_mask(ids, args)[users]
        idx = mx.array(users.astype(np.int32))
        proj_text = talker.text_projection(embeddings[:, idx])
        if media.any():
            proj_media = talker.hidden_projection(tapped[:, idx])
            parts.append(mx.where(mx.array(media)[None, :, None], proj_media, proj_text))
        else:
            parts.append(proj_text)
    hidden = t.text.hidden_size
    pad4 = mx.broadcast_to(text.tts_pad, (1, 4, hidden))
    text_part = mx.concatenate([text.a(0, 3), pad4, text.tts_bos, text.a(3, 4)], axis=1)
    codec_ids = mx.array([[t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id, speaker_id,
                           t.codec_pad_id, t.codec_bos_id]], dtype=mx.int32)
    codec_part = mx.concatenate([mx.zeros((1, 3, hidden), text_part.dtype),
                                 talker.codec_embed(codec_ids).astype(text_part.dtype)], axis=1)
    parts.append(text_part + codec_part)
    return mx.concatenate(parts, axis=1)
