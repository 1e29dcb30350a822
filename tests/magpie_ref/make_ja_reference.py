"""Token ids of NeMo's own Japanese front end (JapanesePhonemeTokenizer + JapaneseKatakanaAccentG2p, NeMo 3.0.0,
over pyopenjtalk and the open_jtalk 1.11 UTF-8 dictionary) for metalgen's parity tests (tests/test_magpie_ja.py).

Runs inside the reference venv made by tests/magpie_ref/setup_venv.sh, with pyopenjtalk and its dictionary put
there by tests/magpie_ref/setup_ja.sh; never in the test environment:

    HF_HUB_OFFLINE=1 tests/magpie_ref/.venv/bin/python tests/magpie_ref/make_ja_reference.py OUT_DIR

NeMo's `setup_tokenizers` builds, from a Magpie-style config: an English character tokenizer (so the Japanese
ids carry an offset), the published Japanese entry, and one with its switches flipped (lower-case `#`-prefixed
letters, apostrophe, silence, blank last, no padding, a short punctuation list).

OUT_DIR/ja.nemo    model_config.yaml (no weights)
OUT_DIR/ja.json    pyopenjtalk's version and the dictionary files' SHA-256; per tokenizer: offset, vocabulary;
                   text BOS/EOS; per tokenizer and sentence: NeMo's G2P output, the ids, the symbols its G2P
                   replaced by a space and those its tokenizer dropped (both only logged by NeMo)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
JA_G2P = "nemo.collections.tts.g2p.models.ja_jp_ipa.JapaneseKatakanaAccentG2p"
NEMO_VERSION = "2.6.0"

TOKENIZERS = {
    "english": {"_target_": TT + "EnglishCharsTokenizer", "punct": True, "apostrophe": True, "pad_with_space": False},
    # As the published checkpoint's Japanese entry (docs/magpie.md 3.5).
    "japanese_phoneme": {
        "_target_": TT + "JapanesePhonemeTokenizer", "punct": True, "apostrophe": False, "pad_with_space": True,
        "g2p": {"_target_": JA_G2P, "ascii_letter_prefix": "", "ascii_letter_case": "upper"},
    },
    # The other switches: lower-case prefixed letters, an apostrophe, a silence token, a blank last, no padding,
    # a short punctuation list (so NeMo's tokenizer drops marks its G2P kept).
    "japanese_plain": {
        "_target_": TT + "JapanesePhonemeTokenizer", "punct": True, "apostrophe": True, "silence": "<sil>",
        "add_blank_at": "last", "non_default_punct_list": ["、", "。", ",", ".", "？"],
        "g2p": {"_target_": JA_G2P, "ascii_letter_prefix": "#", "ascii_letter_case": "lower"},
    },
}

SENTENCES = [
    "こんにちは、世界。",
    "今日はいい天気ですね。",
    "東京都に住んでいます。",
    "私はコーヒーが好きです。",
    "コンピューターとインターネットの時代。",
    "2024年3月15日に会いましょう。",
    "価格は1,980円です。",
    "電話番号は03-1234-5678です。",
    "AIとIoTの時代。",
    "NVIDIAのGPUを使います。",
    "Appleの新しいiPhoneを買った。",
    "ＡＢＣとｘｙｚ。",
    "「こんにちは」と彼は言った。",
    "『吾輩は猫である』は小説です。",
    "本当ですか？はい！",
    "本当ですか?はい!",
    "えーと、あのー……",
    "東京・大阪・名古屋",
    "これは　全角スペース　です。",
    "半角  スペース   複数",
    "  前後の空白   ",
    "橋と箸と端。",
    "生麦生米生卵",
    "隣の客はよく柿食う客だ。",
    "ひらがなだけのぶんしょうです。",
    "カタカナダケノブンショウデス。",
    "走った、食べた、飲んだ。",
    "100パーセント確実です。",
    "午後3時30分に出発します。",
    "【重要】お知らせ※必ずお読みください。",
    "〜から〜まで",
    "メールはtest@example.comまで。",
    "#タグ & 記号 ~ テスト",
    "😀絵文字もあります。",
    "ヴァイオリンとヴィオラ。",
    "彼女は「Hello, world!」と言った。",
    "Let's go!と叫んだ。",
    "一石二鳥、七転び八起き。",
    "第1章：はじめに",
    "3.14は円周率です。",
    "日本語の音声合成システムを作っています。",
    "ｶﾀｶﾅの半角文字。",
    "お茶を飲みながら、ゆっくり話しましょう。",
    "(括弧)と[角括弧]と{波括弧}",
    "Hello world",
    "ゐゑの文字と𠮷野家。",
]


def write_nemo(out: Path, cfg: dict) -> None:
    import yaml

    data = yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False).encode("utf-8")
    with tarfile.open(out / "ja.nemo", "w") as tar:
        info = tarfile.TarInfo("./model_config.yaml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


class Recorder:
    """Stands in for nemo.utils.logging in the Japanese modules: keeps what NeMo logs."""

    def __init__(self, real):
        self.real = real
        self.warnings = []

    def warning(self, msg, *a, **k):
        self.warnings.append(str(msg))

    def __getattr__(self, name):
        return getattr(self.real, name)


def dictionary_digest() -> dict:
    import pyopenjtalk

    folder = Path(pyopenjtalk.OPEN_JTALK_DICT_DIR.decode("utf-8"))
    return {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in ("sys.dic", "matrix.bin", "char.bin",
                                                                              "unk.dic")}


def main(out: Path) -> None:
    import importlib.metadata as md

    from omegaconf import OmegaConf

    import nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers as tts_mod
    import nemo.collections.tts.g2p.models.ja_jp_ipa as ja_mod
    from nemo.collections.tts.data.text_to_speech_dataset_lhotse import setup_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    cfg = {"nemo_version": NEMO_VERSION, "text_tokenizers": TOKENIZERS,
           "language_to_tokenizer_mapping": {"en": "english", "ja": "japanese_phoneme", "ja_plain": "japanese_plain"}}
    write_nemo(out, cfg)
    conf = OmegaConf.create({"text_tokenizers": json.loads(json.dumps(TOKENIZERS))})
    agg = setup_tokenizers(conf.text_tokenizers, mode="test", cfg_nemo_version=NEMO_VERSION)

    rec = Recorder(ja_mod.logging)
    ja_mod.logging = rec
    tts_mod.logging = rec
    info = {
        "versions": {"pyopenjtalk": md.version("pyopenjtalk")},
        "dictionary": dictionary_digest(),
        "tokenizer_order": list(agg.tokenizer_names),
        "offsets": dict(agg.tokenizer_offsets),
        "pad_ids": dict(agg.tokenizer_pad_ids),
        "tokens": {n: list(t.tokens) for n, t in agg.tokenizers.items()},
        "text_bos_id": agg.vocab_size,
        "text_eos_id": agg.vocab_size + 1,
        "sentences": {},
    }
    for name in ("japanese_phoneme", "japanese_plain"):
        tok = agg.tokenizers[name]
        entries = []
        for text in SENTENCES:
            rec.warnings.clear()
            g2p_out = tok.g2p(tok.text_preprocessing_func(text))
            spaced = [m.group(1) for w in rec.warnings
                      for m in [re.search(r"Unknown symbol '(.*?)' \(pos=", w, re.S)] if m]
            rec.warnings.clear()
            ids = agg.encode(text, name)
            dropped = [m.group(1) for w in rec.warnings
                       for m in [re.search(r"contains unknown char/phoneme: \[(.*?)\]\.", w, re.S)] if m]
            entries.append({"text": text, "g2p": list(g2p_out), "ids": ids, "spaced": spaced, "dropped": dropped})
        info["sentences"][name] = entries
    (out / "ja.json").write_text(json.dumps(info, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
