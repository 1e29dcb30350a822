"""Reference dump for Magpie long-text inference: NeMo 3.0.0's text chunking (`chunk_text_for_inference`,
`split_by_sentence`, the language thresholds) and the greedy codes of `do_tts`'s multi-chunk loop
(`generate_speech` once per chunk with a `ChunkState` carried across them), on the tiny random models of
make_reference.py (character tokenizers).

Runs inside the reference venv of tests/magpie_ref/ (see setup_venv.sh), never in the test
environment; the tiny configs and builders come from make_reference.py:

    HF_HUB_OFFLINE=1 tests/magpie_ref/.venv/bin/python tests/magpie_ref/make_chunk_reference.py OUT_DIR

OUT_DIR/chunk.json   the splits (per case: sentences, word count, threshold decision, chunk texts and ids)
                     and, per generation run, each chunk's input ids, its text window, the codes' length
                     and the carried state after it
OUT_DIR/chunk.npz    per run the concatenated codes do_tts decodes, and each chunk's codes
OUT_DIR/magpie.nemo, magpie_s2.nemo, codec.nemo   the models the runs used
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from make_reference import CHAR_TOKENIZERS, build_codec, build_magpie  # noqa: E402

# The languages the tiny model has a (character) tokenizer for.
TOKENIZED = {code for code, _, _ in CHAR_TOKENIZERS.values()}

# Decoder steps per chunk. The tiny model's decoder positions hold 256 rows (6 of baked context, 1 BOS),
# and a chunk must be able to walk its text to the end so that NeMo's forced chunk end fires.
MAX_STEPS = 160

# Long texts, at or over each language's default threshold, so do_tts itself splits them. Sentences
# of different lengths: windows of at most 35 tokens get NeMo's flat multi-chunk prior, longer ones
# the shaped one.
LONG = {
    "en": ("The old lighthouse stood alone at the edge of the cliff. Yes. Every night its lamp swept "
           "the dark water, and the sailors who passed it felt safe for a while. Dr. Hale kept the "
           "logbook, writing down the weather at nine a.m. and again at dusk! Was anyone still reading it? "
           "Nobody knew, but she wrote on anyway, year after year, without complaint."),
    "de": ("Der alte Leuchtturm stand allein am Rand der Klippe. Ja. Jede Nacht glitt sein Licht über das "
           "dunkle Wasser, und die Seeleute, die vorbeifuhren, fühlten sich eine Weile sicher. Frau Hale "
           "führte das Logbuch und schrieb morgens und abends das Wetter auf! Las es noch jemand? Niemand "
           "wusste es, aber sie schrieb trotzdem weiter, Jahr für Jahr, ohne sich jemals zu beklagen."),
    "es": ("El viejo faro estaba solo al borde del acantilado. Sí. Cada noche su luz barría el agua oscura, "
           "y los marineros que pasaban se sentían seguros por un rato. La doctora Hale llevaba el "
           "cuaderno de bitácora y anotaba el tiempo por la mañana y otra vez al anochecer. ¿Lo leía "
           "alguien todavía? Nadie lo sabía, pero ella seguía escribiendo, año tras año, sin quejarse "
           "nunca de nada, aunque el viento soplara fuerte sobre las rocas y el mar golpeara sin descanso."),
    "fr": ("Le vieux phare se dressait seul au bord de la falaise. Oui. Chaque nuit, sa lumière balayait "
           "l'eau sombre, et les marins qui passaient se sentaient en sécurité pour un moment. Le docteur "
           "Hale tenait le journal de bord et notait le temps le matin et encore au crépuscule! Quelqu'un "
           "le lisait-il encore? Personne ne le savait, mais elle continuait d'écrire, année après année, "
           "sans jamais se plaindre, même quand le vent soufflait fort sur les rochers de la côte."),
    "it": ("Il vecchio faro stava da solo sul bordo della scogliera. Sì. Ogni notte la sua luce spazzava "
           "l'acqua scura, e i marinai che passavano si sentivano al sicuro per un po'. La dottoressa Hale "
           "teneva il diario di bordo e annotava il tempo al mattino e di nuovo al tramonto! Qualcuno lo "
           "leggeva ancora? Nessuno lo sapeva, ma lei continuava a scrivere, anno dopo anno, senza mai "
           "lamentarsi."),
    "vi": ("Ngọn hải đăng cũ đứng một mình bên mép vách đá. Vâng. Mỗi đêm ánh đèn của nó quét qua mặt "
           "nước tối, và những thủy thủ đi ngang qua cảm thấy an toàn trong chốc lát. Bà Hale giữ cuốn "
           "nhật ký và ghi lại thời tiết vào buổi sáng và lúc hoàng hôn! Có ai còn đọc nó không? Không ai "
           "biết, nhưng bà vẫn viết, năm này qua năm khác."),
    "hi": ("पुराना प्रकाशस्तंभ चट्टान के किनारे पर अकेला खड़ा था। हाँ। हर रात उसकी रोशनी अंधेरे पानी पर घूमती थी, "
           "और पास से गुजरने वाले नाविक कुछ देर के लिए सुरक्षित महसूस करते थे। डॉक्टर हेल लॉगबुक रखती थीं और "
           "सुबह और शाम को मौसम लिखती थीं! क्या कोई अब भी उसे पढ़ता था? कोई नहीं जानता था, लेकिन वह साल दर साल "
           "बिना शिकायत लिखती रहीं।"),
}

# The tiny English character tokenizer has no digits (NeMo drops unknown characters with a warning,
# metalgen refuses them), so the tokenized texts spell numbers out.
# Splitting cases beyond the long texts: below the threshold (one chunk, unsplit), exactly at it,
# abbreviations, decimals, hyphens and asterisks, lowercase sentence starts, no final punctuation,
# CJK and Devanagari endings without spaces, and the languages without an offline tokenizer here
# (zh, ja: splits and counts only).
EXTRA = [
    ("en", "Short text. Stays whole."),
    ("en", " ".join(["word"] * 44) + ". Then more."),  # 46 words: split
    ("en", " ".join(["word"] * 43) + ". End."),  # 45 words: exactly the threshold, split
    ("en", " ".join(["word"] * 42) + ". End."),  # 44 words: one chunk
    ("en", "Mr. Smith met Prof. Jones at half past three p.m. today. the next one starts low! ok? " * 6),
    ("en", "A well-known fact: *this* is bold. Another-one here. " * 7 + "trailing words without end"),
    ("en", "Wait... what?! Really? Yes.  Spaces   everywhere.\nNew line here. " * 6),
    ("de", "Hr. Müller kam um zehn Uhr. Das ist gut. " * 9),
    ("es", "¿Qué tal? ¡Muy bien! Gracias. " * 20),
    ("fr", "Bonjour. Ça va? Très bien! " * 20),
    ("vi", "Xin chào. Bạn khỏe không? " * 15),
    ("hi", "नमस्ते। आप कैसे हैं? मैं ठीक हूँ॥ धन्यवाद। " * 8),
    ("hi", "एक दो. तीन चार। पाँच " * 12),
    ("zh", "你好世界。今天天气很好！我们去公园吧？" * 6 + "好的…走吧"),
    ("zh", "你好。" * 10),
    ("ja", "こんにちは世界。今日はいい天気です！公園に行きましょうか？" * 3 + "はい…行きましょう"),
    ("ja", "短い文です。"),
    ("xx", "An unknown language falls back to the English threshold. " * 5),
    ("xx", "Version 3.5 is out. It costs 2.50 today! " * 6),  # digits: no tokenizer here
]


def splits(model, arrays, meta):
    """Every case through NeMo's own helpers: the sentences, the count and the decision, and (where the
    tiny model has the language's tokenizer) the chunks' texts and ids as do_tts gets them."""
    from nemo.collections.tts.parts.utils import tts_dataset_utils as u

    names = list(model.tokenizer.tokenizers.keys())
    th = u.DEFAULT_LANGUAGE_THRESHOLDS
    cases = []
    for lang, text in list(LONG.items()) + EXTRA:
        entry = {"language": lang, "text": text, "sentences": u.split_by_sentence(text, language=lang),
                 "word_count": th.get_word_count(text, lang), "split": th.exceeds_threshold(text, lang)}
        name = u.get_tokenizer_for_language(lang, names)
        if lang in TOKENIZED:
            toks, lens, texts = u.chunk_text_for_inference(text, lang, name, model.tokenizer, model.eos_id)
            entry.update(tokenizer=name, chunk_texts=list(texts), chunk_ids=[t.tolist() for t in toks],
                         chunk_lens=[int(n) for n in lens])
        cases.append(entry)
    meta["splits"] = cases
    meta["thresholds"] = dict(th.thresholds)
    # NeMo counts Japanese words with pyopenjtalk where it imports, characters otherwise
    try:
        import pyopenjtalk  # noqa: F401

        meta["ja_counts"] = "pyopenjtalk"
    except ImportError:
        meta["ja_counts"] = "characters"


def run_do_tts(model, text, language, use_cfg, cached=False):
    """do_tts itself, with generate_speech wrapped to record what each chunk got and gave. `cached`:
    the decoder's KV cache turned on afresh before every chunk (NeMo's generate_speech never reads
    use_kv_cache_for_inference; this is what its cached decoder gives when reset per chunk)."""
    chunks = []
    inner = model.generate_speech

    def wrapped(batch, chunk_state, end_of_text, beginning_of_text, **kw):
        ids = batch["text"][0, : int(batch["text_lens"][0])].tolist()
        model.decoder.reset_cache(use_cache=cached)
        out = inner(batch, chunk_state=chunk_state, end_of_text=end_of_text, beginning_of_text=beginning_of_text,
                    **kw)
        n = int(out.predicted_codes_lens[0])
        chunks.append(dict(
            ids=ids, window=batch["text"][0, : int(batch["text_lens"][0])].tolist(),
            first=bool(beginning_of_text), last=bool(end_of_text[0]),
            codes=out.predicted_codes[0, :, :n].numpy().astype(np.int64), frames=n,
            steps=int(out.predicted_codes.shape[-1]),
            left_offset=int(chunk_state.left_offset[0]),
            last_attended=int(chunk_state.last_attended_timesteps[-1][0]),
            overall_idx=int(chunk_state.overall_idx), end_indices={int(k): int(v) for k, v in
                                                                   chunk_state.end_indices.items()},
        ))
        return out

    model.generate_speech = wrapped
    try:
        with torch.no_grad():
            audio, audio_len = model.do_tts(text, language=language, use_cfg=use_cfg, speaker_index=1)
    finally:
        del model.generate_speech
        model.decoder.reset_cache(use_cache=False)
    return chunks, int(audio_len[0])


def generation(model, tag, runs, arrays, meta):
    for name, (lang, use_cfg, cached) in runs.items():
        chunks, audio_len = run_do_tts(model, LONG[lang], lang, use_cfg, cached)
        key = f"{tag}_{name}"
        arrays[f"{key}_codes"] = np.concatenate([c["codes"] for c in chunks], axis=1)
        for i, c in enumerate(chunks):
            arrays[f"{key}_chunk{i}"] = c.pop("codes")
        meta["runs"][key] = dict(model=tag, language=lang, cfg=use_cfg, cached=cached, speaker_index=1,
                                 audio_len=audio_len, chunks=chunks)


def single_chunk_cached_check(model, meta):
    """generate_speech with the decoder cache on, on one chunk, against infer_batch's cached mode: do
    they agree (so the per-chunk reset above is NeMo's cached decoder)?"""
    from make_reference import SENTENCES, text_batch

    batch = text_batch(model, SENTENCES["en"], 1)
    with torch.no_grad():
        model.use_kv_cache_for_inference = True
        ref = model.infer_batch(dict(batch, text=batch["text"].clone(), text_lens=batch["text_lens"].clone()),
                                use_cfg=True, use_local_transformer_for_inference=True)
        model.use_kv_cache_for_inference = False
        model.decoder.reset_cache(use_cache=True)
        gen = model.generate_speech(dict(batch), chunk_state=model.create_chunk_state(1), end_of_text=[True],
                                    beginning_of_text=True, use_cfg=True, use_local_transformer_for_inference=True)
        model.decoder.reset_cache(use_cache=False)
    a = ref.predicted_codes[0, :, : int(ref.predicted_codes_lens[0])]
    b = gen.predicted_codes[0, :, : int(gen.predicted_codes_lens[0])]
    meta["single_chunk_cached_generate_speech_equals_infer_batch"] = bool(a.shape == b.shape and (a == b).all())


def main(out: Path):
    import nemo
    from nemo.collections.tts.models import MagpieTTSModel

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    out.mkdir(parents=True, exist_ok=True)
    codec_path = build_codec(out)
    arrays, meta = {}, {"runs": {}, "nemo_version": nemo.__version__, "max_decoder_steps": MAX_STEPS}

    model = MagpieTTSModel.restore_from(str(build_magpie(out, codec_path)), map_location="cpu").eval()
    splits(model, arrays, meta)
    single_chunk_cached_check(model, meta)
    model.inference_parameters.max_decoder_steps = MAX_STEPS
    meta["chunked_inference_config"] = {k: getattr(model.chunked_inference_config, k)
                                        for k in model.chunked_inference_config.__dataclass_fields__}
    generation(model, "s1", {"en_cfg": ("en", True, False), "en_nocfg": ("en", False, False),
                             "de_cfg": ("de", True, False), "en_cfg_cached": ("en", True, True),
                             "en_nocfg_cached": ("en", False, True)}, arrays, meta)

    s2 = MagpieTTSModel.restore_from(str(build_magpie(out, codec_path, stacked=True)), map_location="cpu").eval()
    s2.inference_parameters.max_decoder_steps = MAX_STEPS
    generation(s2, "s2", {"en_cfg": ("en", True, False), "en_nocfg": ("en", False, False),
                          "en_cfg_cached": ("en", True, True), "en_nocfg_cached": ("en", False, True)}, arrays, meta)

    np.savez(out / "chunk.npz", **arrays)
    (out / "chunk.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1, default=str))
    print(f"magpie chunk reference dump written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_chunk_reference.py OUT_DIR")
    main(Path(sys.argv[1]))
