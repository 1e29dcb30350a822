"""The talker's prompt: text and codec embeddings summed position by position, as the
reference builds them (qwen-tts 0.1.1, `Qwen3TTSForConditionalGeneration.generate`).

    [instruct text]                                      (optional, "<|im_start|>user\n...<|im_end|>\n")
    text("<|im_start|>assistant\n")                      3 positions
    tts_pad x (n - 2), tts_bos  +  codec[: n - 1]        codec = think/nothink, think_bos, [language],
                                                         think_eos, [speaker], codec_pad, codec_bos
    non-streaming text:  text(ids) + tts_eos  +  codec_pad each,  then tts_pad + codec_bos
    streaming text:      text(first id) + codec_bos; the rest is fed one id per frame

`trailing` holds what is added to each generated frame's input (text still to be read, then
tts_pad).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

import mlx.core as mx

from ..errors import MetalgenError


@dataclasses.dataclass
class Prompt:
    embeddings: mx.array  # (1, L, hidden)
    trailing: mx.array  # (1, T, hidden): added to generated frame n's input while n < T
    pad: mx.array  # (1, 1, hidden): added once `trailing` runs out


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def ref_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def _ids(values: Sequence[int]) -> mx.array:
    return mx.array([list(values)], dtype=mx.int32)


def build_prompt(
    model,
    input_ids: Sequence[int],
    language_id: Optional[int],
    speaker_embed: Optional[mx.array] = None,
    instruct_ids: Optional[Sequence[int]] = None,
    non_streaming: bool = True,
    icl: Optional[dict] = None,
) -> Prompt:
    """model: metalgen.models.qwen3_tts.Model. input_ids: the tokens of `assistant_text(text)`.
    speaker_embed: (hidden,) or None. icl: {'ref_ids': tokens of ref_text(..), 'ref_codes':
    (T, G) int} for voice cloning in context (Base model)."""
    args = model.args
    t = args.talker
    talker = model.talker
    ids = list(input_ids)
    if len(ids) < 9:
        raise MetalgenError("the text is empty")

    special = talker.text_embed(_ids([args.tts_bos_token_id, args.tts_eos_token_id, args.tts_pad_token_id]))
    tts_bos, tts_eos, tts_pad = special[:, 0:1], special[:, 1:2], special[:, 2:3]

    if language_id is None:
        prefix = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    else:
        prefix = [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
    codec = [talker.codec_embed(_ids(prefix))]
    if speaker_embed is not None:
        codec.append(speaker_embed.reshape(1, 1, -1).astype(codec[0].dtype))
    codec.append(talker.codec_embed(_ids([t.codec_pad_id, t.codec_bos_id])))
    codec = mx.concatenate(codec, axis=1)
    n = codec.shape[1]

    parts: List[mx.array] = []
    if instruct_ids:
        parts.append(talker.text_embed(_ids(instruct_ids)))
    parts.append(talker.text_embed(_ids(ids[:3])))
    pads = mx.concatenate([mx.repeat(tts_pad, n - 2, axis=1), tts_bos], axis=1)
    parts.append(pads + codec[:, :-1])

    if icl is not None:
        body, trailing = _icl_part(model, ids[3:-5], icl, tts_pad, tts_eos, non_streaming)
        parts.append(body)
    elif non_streaming:
        text_ids = ids[3:-5]
        text = mx.concatenate([talker.text_embed(_ids(text_ids)), tts_eos], axis=1)
        parts.append(text + talker.codec_embed(_ids([t.codec_pad_id] * (len(text_ids) + 1))))
        parts.append(tts_pad + talker.codec_embed(_ids([t.codec_bos_id])))
        trailing = tts_pad
    else:
        parts.append(talker.text_embed(_ids(ids[3:4])) + codec[:, -1:])
        trailing = mx.concatenate([talker.text_embed(_ids(ids[4:-5])), tts_eos], axis=1)
    return Prompt(mx.concatenate(parts, axis=1), trailing, tts_pad)


def _icl_part(model, text_ids, icl, tts_pad, tts_eos, non_streaming):
    """Reference text + target text against codec_bos + the reference clip's codes."""
    t = model.args.talker
    talker = model.talker
    ref_ids = list(icl["ref_ids"])[3:-2]
    codes = icl["ref_codes"]  # (T, G)
    text = talker.text_embed(_ids(ref_ids + list(text_ids)))
    text = mx.concatenate([text, tts_eos], axis=1)
    frames = talker.codec_embed(codes[None, :, 0])
    for g in range(1, codes.shape[1]):
        frames = frames + talker.code_predictor.embed(g, codes[None, :, g])
    codec = mx.concatenate([talker.codec_embed(_ids([t.codec_bos_id])), frames], axis=1)
    tl, cl = text.shape[1], codec.shape[1]
    if non_streaming:
        body = text + talker.codec_embed(_ids([t.codec_pad_id] * tl))
        return mx.concatenate([body, codec + tts_pad], axis=1), tts_pad
    if tl > cl:
        return text[:, :cl] + codec, text[:, cl:]
    text = mx.concatenate([text, mx.repeat(tts_pad, cl - tl, axis=1)], axis=1) if cl > tl else text
    return text + codec, tts_pad
