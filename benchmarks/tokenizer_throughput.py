"""Encode throughput of metalgen's pure-Python tokenizer next to Hugging Face `tokenizers`.

Builds a deterministic ~1 MB mixed text (English prose, Python code, CJK, emoji with
modifiers and ZWJ sequences, numbers), encodes it with both, checks the ids agree, and
prints MB/s; also times ``Tokenizer.from_pretrained`` against ``tokenizers``' loader.

    python benchmarks/tokenizer_throughput.py [--folder PATH] [--mb 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenizer import Tokenizer  # noqa: E402

DEFAULT_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "metalgen", "assets", "qwen3-tokenizer")

_CJK = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经"
    "十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样"
    "ありがとうございますこんにちは日本語の文章を書きますカタカナひらがな漢字東京大阪"
    "한국어텍스트안녕하세요감사합니다"
)
_CJK_PUNCT = "，。！？、；：「」（）"
_EMOJI = [
    "👍", "👍🏽", "👋🏿", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🔥", "😀", "🇫🇷", "🧑🏻‍💻", "✨", "🎉", "🤖", "👩🏾‍🔬", "🙂",
]


def _prose(rng: random.Random) -> str:
    # Docstrings of the standard library: real English, with the repetition real text has.
    import collections, json, pathlib, string, textwrap, typing  # noqa: E401

    docs = []
    for mod in (collections, json, pathlib, string, textwrap, typing, argparse, inspect, random, os):
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 80:
                docs.append(doc)
    docs = sorted(set(docs))
    rng.shuffle(docs)
    return "\n\n".join(docs)


def _code() -> str:
    import argparse as a, inspect as i, json.decoder as j, textwrap as t  # noqa: E401

    return "\n".join(inspect.getsource(m).replace("    ", "\t", 3) for m in (a, i, j, t))


def _cjk(rng: random.Random, n_chars: int) -> str:
    out = []
    while n_chars > 0:
        k = rng.randint(6, 30)
        out.append("".join(rng.choice(_CJK) for _ in range(k)) + rng.choice(_CJK_PUNCT))
        n_chars -= k + 1
    return "".join(out)


def _numbers(rng: random.Random, n: int) -> str:
    parts = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            parts.append(f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        elif kind == 1:
            parts.append(f"{rng.uniform(-1e6, 1e6):.4f}")
        elif kind == 2:
            parts.append(f"${rng.randint(0, 10**9):,}")
        else:
            parts.append(f"id={rng.getrandbits(64):x}")
    return " ".join(parts)


def _emoji(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 4))) + " nice" for _ in range(n))


def mixed_text(megabytes: float = 1.0, seed: int = 0) -> str:
    """A deterministic mixed text of about ``megabytes`` MB of UTF-8."""
    rng = random.Random(seed)
    prose, code = _prose(rng), _code()
    target = int(megabytes * 1_000_000)
    chunks = []
    size = 0
    p = c = 0
    while size < target:
        pick = rng.random()
        if pick < 0.40:
            piece = prose[p : p + 4000]
            p = (p + 4000) % max(len(prose) - 4000, 1)
        elif pick < 0.70:
            piece = code[c : c + 3000]
            c = (c + 3000) % max(len(code) - 3000, 1)
        elif pick < 0.85:
            piece = _cjk(rng, 500)
        elif pick < 0.93:
            piece = _numbers(rng, 120)
        else:
            piece = _emoji(rng, 60)
        chunks.append(piece)
        size += len(piece.encode("utf-8"))
    return "\n".join(chunks)


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=DEFAULT_FOLDER, help="tokenizer folder (default: the bundled Qwen3 one)")
    ap.add_argument("--mb", type=float, default=1.0, help="size of the text in MB")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is reported")
    args = ap.parse_args()

    text = mixed_text(args.mb)
    mb = len(text.encode("utf-8")) / 1e6

    load = _best(lambda: Tokenizer.from_pretrained(args.folder), args.repeat)
    ours = Tokenizer.from_pretrained(args.folder)
    t = time.perf_counter()
    ids = ours.encode(text)
    cold = time.perf_counter() - t
    warm = _best(lambda: ours.encode(text), args.repeat)

    def fresh_cache_encode():
        ours._model.cache.clear()
        ours.encode(text)

    cold = min(cold, _best(fresh_cache_encode, args.repeat))
    decode = _best(lambda: ours.decode(ids), args.repeat)

    # Prompts are encoded a few KB at a time, and tokenizers is faster on short inputs than
    # on one 1 MB string, so both shapes are measured.
    chunks = [text[i : i + 4000] for i in range(0, len(text), 4000)]

    def chunked_cold():
        ours._model.cache.clear()
        for c in chunks:
            ours.encode(c)

    chunk_cold = _best(chunked_cold, args.repeat)
    chunk_warm = _best(lambda: [ours.encode(c) for c in chunks], args.repeat)

    print(f"text: {mb:.2f} MB, {len(text):,} characters, {len(ids):,} tokens")
    print(f"metalgen from_pretrained: {load * 1000:.0f} ms")
    print(f"metalgen encode, one string, empty word cache: {mb / cold:6.2f} MB/s")
    print(f"metalgen encode, one string, warm word cache:  {mb / warm:6.2f} MB/s")
    print(f"metalgen encode, 4 KB pieces, empty word cache: {mb / chunk_cold:6.2f} MB/s")
    print(f"metalgen encode, 4 KB pieces, warm word cache:  {mb / chunk_warm:6.2f} MB/s")
    print(f"metalgen decode:                                 {mb / decode:6.2f} MB/s")

    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        print("tokenizers not installed: no reference figures")
        return
    path = os.path.join(args.folder, "tokenizer.json")
    hf_load = _best(lambda: HFTokenizer.from_file(path), args.repeat)
    hf = HFTokenizer.from_file(path)
    ref = hf.encode(text, add_special_tokens=False).ids
    hf_time = _best(lambda: hf.encode(text, add_special_tokens=False), args.repeat)
    hf_chunks = _best(lambda: [hf.encode(c, add_special_tokens=False) for c in chunks], args.repeat)
    print(f"tokenizers from_file: {hf_load * 1000:.0f} ms")
    print(f"tokenizers encode, one string:                   {mb / hf_time:6.2f} MB/s")
    print(f"tokenizers encode, 4 KB pieces:                  {mb / hf_chunks:6.2f} MB/s")
    print(f"ids identical: {ids == ref}")
    print(
        f"metalgen time / tokenizers time: one string {cold / hf_time:.2f}x (empty cache) {warm / hf_time:.2f}x (warm); "
        f"4 KB pieces {chunk_cold / hf_chunks:.2f}x (empty cache) {chunk_warm / hf_chunks:.2f}x (warm)"
    )


if __name__ == "__main__":
    main()
