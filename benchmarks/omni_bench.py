"""Qwen3-Omni speed on metalgen: thinker decode, talker + code predictor per frame, Code2Wav per frame,
and the interleaved reply end to end (time to first audio after the prefill, real-time factor).

    python benchmarks/omni_bench.py --model dummy:qwen3-omni-30b-a3b [--model dummy:qwen3-omni-30b-a3b-4bit]
        [--tokens 64] [--frames 96] [--audio-seconds 0] [--out benchmarks/results/omni.jsonl]

Each part, after a warm-up run:
- thinker: text-only reply of `--tokens` tokens (greedy), decode tokens/s.
- frames: the talker and code predictor alone (text already there), `--frames` frames with the
  codec EOS suppressed, ms per frame (one frame is 80 ms of speech).
- code2wav: the same frames decoded whole and in 4-then-doubling chunks as streamed, ms per frame.
- reply: `stream()` with the default talker sampling (EOS suppressed, so `--frames` frames), the
  thinker at temperature 0.7 (its EOS masked too, so `--tokens` tokens): time from the end of the prefill to the first audio piece on the host,
  wall time, audio seconds, real-time factor (audio seconds / wall seconds).
Random weights: the text is noise and the lengths are forced; the speed is the real model's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

QUESTION = ("You are a friendly voice assistant. In two or three sentences, explain why the sky is blue "
            "and why sunsets are red, for a curious ten-year-old.")


class _Stamped(list):
    """A frames_out list that notes when each frame's codes reached the host."""

    def __init__(self):
        super().__init__()
        self.times = []

    def append(self, item):
        self.times.append(time.perf_counter())
        super().append(item)


def _timed(fn, runs: int):
    fn()  # warm-up: kernels built, caches sized
    times = []
    out = None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench(model_name: str, tokens: int, frames: int, runs: int, audio_seconds: float, dtype=None) -> dict:
    import metalgen.omni as omni
    G = importlib.import_module("metalgen.omni.generate")  # the module (the package exports a function of that name)
    from metalgen.omni.prompt import TalkerText, assistant_start, talker_prompt
    from metalgen.sampling import make_sampler

    tic = time.perf_counter()
    parts = omni.load(model_name, dtype=dtype)
    load_s = time.perf_counter() - tic
    messages = [{"role": "user", "content": QUESTION}]
    audio = []
    if audio_seconds > 0:
        t = np.arange(int(16000 * audio_seconds)) / 16000
        audio = [(0.1 * np.sin(2 * np.pi * 220 * t).astype(np.float32), 16000)]
    row = dict(model=model_name, backend=str(mx.default_device()), load_s=round(load_s, 2), tokens=tokens,
               frames=frames, audio_in_s=audio_seconds)

    # the thinker's EOS masked, as transformers' min_new_tokens does: every run makes `tokens` tokens
    eos = mx.array(sorted(parts.tokenizer.eos_token_ids), dtype=mx.int32)

    def no_eos(history, logits):
        return logits.at[:, eos].add(-mx.inf)

    # thinker alone
    def text_only():
        t0 = time.perf_counter()
        first = None
        n = 0
        for r in omni.stream(parts, messages, audio=audio, return_audio=False, max_tokens=tokens,
                             logits_processors=[no_eos]):
            if r.token is not None:
                n += 1
                if first is None:
                    first = time.perf_counter()
        end = time.perf_counter()
        return (end - first) / max(n - 1, 1), first - t0

    text_only()
    results = [text_only() for _ in range(runs)]
    step_s = statistics.median(r[0] for r in results)
    ttft = statistics.median(r[1] for r in results)
    row["thinker_tok_s"] = round(1.0 / step_s, 1)
    row["thinker_ttft_ms"] = round(1000 * ttft, 1)

    # talker + code predictor alone, text ready
    args, model = parts.args, parts.model
    sampling = G.talker_sampling(max_frames=frames, min_frames=frames)  # EOS suppressed: exactly `frames`

    def frames_only():
        prep = G.prepare(parts, messages, audio)
        a0 = assistant_start(prep.ids, args)
        special = mx.array([[args.tts_bos_token_id, args.tts_eos_token_id, args.tts_pad_token_id]], dtype=mx.int32)
        special = model.talker.text_projection(model.thinker.embed(special))
        text = TalkerText(model.talker, model.thinker.embed, prep.embeddings[:, a0:], special)
        for tok in range(40):  # a finished reply of 40 tokens
            text.push(1000 + tok, last=tok == 39)
        emb = talker_prompt(model.talker, args, prep.ids, prep.embeddings, prep.tapped, text, G.speaker_id(parts, None))
        mx.eval(emb)
        loop = G.OmniFrames(model.talker, args, emb, text, lambda: None, sampling, seed=0)
        t = time.perf_counter()
        codes = np.stack(list(loop.frames()))
        return (time.perf_counter() - t) / len(codes), codes, loop.paths

    frames_only()
    results = [frames_only() for _ in range(runs)]
    frame_s = statistics.median(r[0] for r in results)
    codes, paths = results[-1][1], results[-1][2]
    row["frame_ms"] = round(1000 * frame_s, 2)
    row["paths"] = paths

    # Code2Wav
    c = mx.array(codes[None])

    def whole():
        mx.eval(model.code2wav(c))

    def streamed():
        dec = model.code2wav.stream(first_chunk=4, chunk=300, left_context=25)
        for i in range(codes.shape[0]):
            for piece in dec.push(c[:, i:i + 1]):
                mx.eval(piece)
        for piece in dec.flush():
            mx.eval(piece)

    row["code2wav_whole_ms_per_frame"] = round(1000 * _timed(whole, runs)[0] / codes.shape[0], 3)
    row["code2wav_stream_ms_per_frame"] = round(1000 * _timed(streamed, runs)[0] / codes.shape[0], 3)

    # the whole reply, interleaved
    def reply():
        marks = {}
        original = G.prepare

        def timed_prepare(*a, **k):
            out = original(*a, **k)
            mx.eval(out.embeddings, out.tapped if out.tapped is not None else [])
            marks["prefilled"] = time.perf_counter()
            return out

        G.prepare = timed_prepare
        try:
            t0 = time.perf_counter()
            samples, first = 0, None
            record = {"logits": False}
            stamps = _Stamped()
            for r in omni.stream(parts, messages, audio=audio, max_tokens=tokens, talker=sampling,
                                 logits_processors=[no_eos],
                                 sampler=make_sampler(0.7, seed=0), seed=0, record=record, frames_out=stamps):
                if r.audio is not None and r.audio.size:
                    samples += r.audio.size
                    if first is None:
                        first = time.perf_counter()
            end = time.perf_counter()
        finally:
            G.prepare = original
        p = marks["prefilled"]
        return dict(wall=end - t0, prefill=p - t0, first_audio=first - p, audio_s=samples / G.SAMPLE_RATE,
                    talker_start=record["talker_start"] - p, first_frame=stamps.times[0] - p,
                    fourth_frame=stamps.times[3] - p)

    walls = []
    reply()
    for _ in range(runs):
        walls.append(reply())
    r = sorted(walls, key=lambda x: x["wall"])[len(walls) // 2]
    row.update(reply_wall_s=round(r["wall"], 3), reply_prefill_ms=round(1000 * r["prefill"], 1),
               first_audio_after_prefill_ms=round(1000 * r["first_audio"], 1),
               talker_start_after_prefill_ms=round(1000 * r["talker_start"], 1),
               first_frame_after_prefill_ms=round(1000 * r["first_frame"], 1),
               fourth_frame_after_prefill_ms=round(1000 * r["fourth_frame"], 1), reply_audio_s=round(r["audio_s"], 2),
               rtf=round(r["audio_s"] / r["wall"], 2))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--frames", type=int, default=96)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--audio-seconds", type=float, default=0.0)
    p.add_argument("--out", default=None, help="append one JSON line per model")
    a = p.parse_args()
    for name in a.model or ["dummy:qwen3-omni-tiny"]:
        row = bench(name, a.tokens, a.frames, a.runs, a.audio_seconds, a.dtype)
        row["date"] = time.strftime("%Y-%m-%d")
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
        mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
