"""The frame loop: one talker step for codebook 0, then the code predictor for codebooks 1..G-1.

Built on the model, cache and sampling APIs of the text engine (KVCache, make_sampler ->
kernels_metal.sample). Like `generate_step`, it is double-buffered: frame n+1 (its talker
step, codebook-0 draw and the 15 code-predictor steps) is enqueued with `mx.async_eval`
before frame n's codes are read back, so the device never waits on the host; codebook 0 of
a frame is the only value the loop needs on the host (to stop on the codec EOS).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

import mlx.core as mx
import numpy as np

from ..cache import KVCache
from ..errors import MetalgenError
from ..sampling import make_repetition_penalty, make_sampler, validate_sampling
from .prompt import Prompt


@dataclasses.dataclass
class SamplingConfig:
    """The reference's defaults (qwen-tts generate_config.json); temperature 0 is greedy.
    `sub_*` apply to the code predictor (codebooks 1..G-1)."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    sub_temperature: float = 0.9
    sub_top_k: int = 50
    sub_top_p: float = 1.0
    max_frames: int = 4096
    min_frames: int = 2

    @classmethod
    def from_generate_config(cls, config: dict, **overrides) -> "SamplingConfig":
        """Defaults from a checkpoint's generation_config.json (do_sample false -> greedy)."""
        c = cls()
        if config:
            c.temperature = float(config.get("temperature", c.temperature)) if config.get("do_sample", True) else 0.0
            c.top_k = int(config.get("top_k", c.top_k))
            c.top_p = float(config.get("top_p", c.top_p))
            c.repetition_penalty = float(config.get("repetition_penalty", c.repetition_penalty))
            if config.get("subtalker_dosample", True):
                c.sub_temperature = float(config.get("subtalker_temperature", c.sub_temperature))
            else:
                c.sub_temperature = 0.0
            c.sub_top_k = int(config.get("subtalker_top_k", c.sub_top_k))
            c.sub_top_p = float(config.get("subtalker_top_p", c.sub_top_p))
            c.max_frames = int(config.get("max_new_tokens", c.max_frames))
        for k, v in overrides.items():
            if v is not None:
                if not hasattr(c, k):
                    raise TypeError(f"unknown sampling option '{k}'")
                setattr(c, k, v)
        c.validate()
        return c

    def validate(self) -> None:
        validate_sampling(self.temperature, self.top_k, self.top_p, 0.0)
        validate_sampling(self.sub_temperature, self.sub_top_k, self.sub_top_p, 0.0)
        if self.repetition_penalty <= 0:
            raise MetalgenError(f"repetition penalty must be > 0, got {self.repetition_penalty}")
        if self.max_frames < 1:
            raise MetalgenError(f"max frames must be >= 1, got {self.max_frames}")


class FrameGenerator:
    """Generates frames of G codes for one prompt. Iterate `frames()`; each item is an
    (G,) int32 numpy array. Stops on the codec EOS (never returned) or after max_frames.

    `decode` picks the path of the talker's and the code predictor's decode steps, as the text
    engine's `generate_step` does (metalgen.decode: "auto", "plain", "reference", "megakernel",
    ...): the prompt always goes through the plain path, whose cache is then copied once into the
    stacked layout; the code predictor's stacked cache is reset every frame."""

    def __init__(self, model, prompt: Prompt, sampling: SamplingConfig, seed: Optional[int] = None,
                 record_logits: bool = False, decode: Optional[str] = "auto"):
        from ..decode import decoder_for

        self.model = model
        self.talker = model.talker
        self.cp = model.talker.code_predictor
        self.args = model.args.talker
        self.prompt = prompt
        self.sampling = sampling
        if seed is None:
            seed = int.from_bytes(np.random.bytes(4), "little")
        self.sample0 = make_sampler(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed)
        self.sample_sub = make_sampler(
            sampling.sub_temperature, sampling.sub_top_k, sampling.sub_top_p, seed=(seed + 0x9E3779B9) % 2**32
        )
        # The reference penalizes every earlier codebook-0 code: a window as long as the output.
        self.penalize = (make_repetition_penalty(sampling.repetition_penalty, sampling.max_frames)
                         if sampling.repetition_penalty != 1.0 else None)
        self.groups = self.args.num_code_groups
        vocab = self.args.vocab_size
        eos = self.args.codec_eos_token_id
        # Control ids (the top 1024 of the codec vocabulary) are never drawn, except the EOS.
        mask = np.zeros((vocab,), dtype=np.float32)
        mask[max(0, vocab - 1024):] = -np.inf
        mask[eos] = 0.0
        self.suppress = mx.array(mask)
        no_eos = mask.copy()
        no_eos[eos] = -np.inf
        self.suppress_eos = mx.array(no_eos)
        self.eos = eos
        self.record = record_logits
        self.talker_logits = []  # raw talker logits per frame (record_logits)
        self.cp_logits = []  # raw code-predictor logits per frame, (G-1, vocab) (record_logits)
        mode = decode or "auto"
        self.talker_dec = decoder_for(self.talker.model, mode)
        self.cp_dec = decoder_for(self.cp.model, mode)
        self.cp_state = None
        if self.cp_dec is not None:
            from ..decode import empty_state

            # positions: the talker hidden, codebook 0, codebooks 1..G-2 (the last one is not fed)
            self.cp_state = self.cp_dec.prepare(empty_state(self.cp_dec.w, self.groups))
        self.talker_cache = None
        self.talker_state = None

    @property
    def paths(self) -> dict:
        """The decode path each stack runs on ("plain" or the decoder's name)."""
        return {"talker": self.talker_dec.name if self.talker_dec is not None else "plain",
                "code_predictor": self.cp_dec.name if self.cp_dec is not None else "plain"}

    def _pick0(self, logits: mx.array, history: Optional[mx.array], step: int) -> mx.array:
        """Codebook 0 from raw talker logits (1, V): repetition penalty over every earlier
        codebook-0 code, suppressed control ids (and the EOS before min_frames), then the draw."""
        logits = logits.astype(mx.float32)
        if history is not None and self.penalize is not None:
            logits = self.penalize(history, logits)
        logits = logits + (self.suppress_eos if step < self.sampling.min_frames else self.suppress)
        token, _ = self.sample0(logits)
        return token  # (1,)

    # ---- the two stacks, on whichever path was picked -------------------------------------------
    def prefill(self):
        """The prompt through the talker (plain path): its last hidden state (1, 1, H) and
        codec logits (1, V). Sets up the talker's cache for `talk`."""
        cache = [KVCache() for _ in self.talker.layers]
        h = self.talker.hidden(self.prompt.embeddings, cache)
        last = h[:, -1:, :]
        logits = self.talker.logits(last[:, 0, :])
        if self.talker_dec is None:
            self.talker_cache = cache
        else:
            from ..decode import start_state

            length = self.prompt.embeddings.shape[1]
            self.talker_state = start_state(self.talker_dec, cache, length, self.sampling.max_frames + 1)
        return last, logits

    def talk(self, x: mx.array):
        """One talker step on the input embedding x (1, 1, H): (hidden (1, 1, H), logits (1, V))."""
        if self.talker_dec is None:
            h = self.talker.hidden(x, self.talker_cache)[:, -1:, :]
        else:
            h = self.talker_dec.step(self.talker_state, embedding=x)[None]  # (1, H) -> (1, 1, H)
        return h, self.talker.logits(h[:, 0, :])

    def cp_begin(self):
        """A fresh code-predictor cache for one frame: per-layer KVCaches on the plain path
        (returned), the stacked state reset to position 0 on the others (None returned)."""
        if self.cp_dec is None:
            return [KVCache(max_size=self.groups + 1) for _ in self.cp.layers]
        self.cp_state.reset()
        return None

    def cp_step(self, x: mx.array, g: int, cache) -> mx.array:
        """Code-predictor head g's logits (1, vocab) after feeding x (1, L, talker hidden), with
        the frame's `cache` from `cp_begin`."""
        if self.cp_dec is None:
            return self.cp(x, g, cache)
        if "small_to_mtp_projection" in self.cp:
            x = self.cp.small_to_mtp_projection(x)
        h = None
        for i in range(x.shape[1]):
            h = self.cp_dec.step(self.cp_state, embedding=x[0, i])
        return self.cp.lm_head[g](h)

    def predict(self, last_hidden: mx.array, code0: mx.array):
        """Codebooks 1..G-1 for one frame and the talker input of the next step (all lazy):
        (codes (G,) int32, summed codec embeddings (1, 1, H), recorded head logits)."""
        e0 = self.talker.codec_embed(code0[None])  # (1, 1, H)
        cache = self.cp_begin()
        logits = self.cp_step(mx.concatenate([last_hidden, e0], axis=1), 0, cache)
        codes = [code0]
        total = e0
        recorded = []
        for g in range(1, self.groups):
            if self.record:
                recorded.append(logits)
            token, _ = self.sample_sub(logits)
            codes.append(token)
            e = self.cp.embed(g, token[None])
            total = total + e
            if g < self.groups - 1:
                logits = self.cp_step(e, g, cache)
        return mx.concatenate(codes).astype(mx.int32), total, recorded

    def talker_input(self, total: mx.array, step: int) -> mx.array:
        """The talker's input after frame `step`: its summed codec embeddings plus the next text
        embedding (or tts_pad once the text is used up)."""
        t = self.prompt.trailing
        return total + (t[:, step : step + 1] if step < t.shape[1] else self.prompt.pad)

    def _step(self, logits, last_hidden, history, step):
        code0 = self._pick0(logits, history, step)
        codes, total, recorded = self.predict(last_hidden, code0)
        hidden, next_logits = self.talk(self.talker_input(total, step))
        history = code0 if history is None else mx.concatenate([history, code0])
        return dict(code0=code0, codes=codes, logits=logits, next_logits=next_logits,
                    hidden=hidden, history=history, recorded=recorded)

    def frames(self) -> Iterator[np.ndarray]:
        last, logits = self.prefill()
        pending = self._step(logits, last, None, 0)
        mx.async_eval(pending["codes"], pending["next_logits"])
        step = 0
        while True:
            cur = pending
            if step + 1 < self.sampling.max_frames:
                pending = self._step(cur["next_logits"], cur["hidden"], cur["history"], step + 1)
                mx.async_eval(pending["codes"], pending["next_logits"])
            else:
                pending = None
            if self.record:
                self.talker_logits.append(np.array(cur["logits"][0].astype(mx.float32)))
                if cur["recorded"]:
                    self.cp_logits.append(np.array(mx.concatenate(cur["recorded"]).astype(mx.float32)))
            codes = np.array(cur["codes"])
            if int(codes[0]) == self.eos:
                return
            yield codes
            step += 1
            if pending is None:
                return
