"""Token ids of NeMo's own Mandarin front end (ChinesePhonemesTokenizer + ChineseG2p, NeMo 3.0.0, with jieba,
pypinyin and pypinyin-dict) for metalgen's parity tests (tests/test_magpie_zh.py).

Runs inside the reference venv made by tests/magpie_ref/setup_venv.sh, never in the test environment:

    HF_HUB_OFFLINE=1 tests/magpie_ref/.venv/bin/python tests/magpie_ref/make_zh_reference.py OUT_DIR

The published pinyin dictionary (ipa_dict_nv23.05.txt) cannot be fetched here, so this writes one of the
same format (`syllable<TAB>phonemes`, `;;;` comments, a repeated syllable) covering the sentences' syllables
but two (so NeMo's "syllable not in the dictionary" skip is exercised), names it in a Magpie-style config
through a `nemo:<32 hex>_<file>` path, packs it into a tiny `.nemo`-style tar, and lets NeMo's
`setup_tokenizers` build the tokenizers from it (the path pointed at the unpacked file).

OUT_DIR/zh.nemo    model_config.yaml + the pinyin dictionary (no weights)
OUT_DIR/zh.json    versions of jieba/pypinyin/pypinyin-dict; per tokenizer: offset, vocabulary; text BOS/EOS;
                   per tokenizer and sentence: NeMo's G2P output, the ids, the syllables NeMo skipped and
                   the symbols it dropped (both only logged by NeMo)
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
ZH_G2P = "nemo.collections.tts.g2p.models.zh_cn_pinyin.ChineseG2p"
NEMO_VERSION = "2.6.0"

# Syllables the dictionary holds; each is written as initial + final (a made-up but well-formed IPA-ish
# split: the real file's phonemes do not matter, only that NeMo and metalgen read them the same way).
SYLLABLES = """
a ai an bai ban bao bei ben bu cai chang cheng chi chu da dao de di dian dong dou du fa feng ge gei gen
gong gou guo hai hang hao he hen hong hou hua huan hui ji jia jian jiang jiao jie jin jing jiu ju kai kan
kao ke kong lao le li liang lou lv lvu ma mai man mao me men mei ming mu n na nan ne ni nv peng pin ping
qi qian qing qu ren ru shang shen sheng shi shu shui shuo si ta tai tang tian tou wai wan wang wei wen
wo xi xia xian xiang xiao xie xin xing xu xue xun yao ye yi yin ying you yu yuan zai zhang zhe zhi
zhong zhu zi zuo hm ng yan yue zou ti chong meng er en kuo guang zhou nian
"""
# Left out on purpose: NeMo skips them (with an error log), metalgen raises naming them.
MISSING = ("xiong", "lan")
INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z",
            "c", "s", "y", "w")
IPA = {"zh": "ʈʂ", "ch": "ʈʂʰ", "sh": "ʂ", "j": "tɕ", "q": "tɕʰ", "x": "ɕ", "z": "ts", "c": "tsʰ", "r": "ʐ",
       "b": "p", "p": "pʰ", "d": "t", "t": "tʰ", "g": "k", "k": "kʰ", "h": "x"}


def pronunciation(syllable: str) -> str:
    for ini in INITIALS:
        if syllable.startswith(ini) and len(syllable) > len(ini):
            return f"{IPA.get(ini, ini)} {syllable[len(ini):].replace('v', 'y').replace('ng', 'ŋ')}"
    return syllable.replace("ng", "ŋ")


def pinyin_dictionary() -> str:
    lines = [";;; made-up pinyin dictionary for the reference (syllable TAB phonemes)"]
    for s in SYLLABLES.split():
        assert s not in MISSING
        lines.append(f"{s.upper() if s == 'ma' else s}\t{pronunciation(s)}")  # syllables are lower-cased
    lines.append("")
    lines.append("hao\tx   AU")  # a repeated syllable replaces the earlier line; extra spaces split away
    lines.append("shi\tʂ ʐ̩\textra field")  # only the second tab field counts
    return "\n".join(lines) + "\n"


FILES = {"zh_dict": ("ipa_dict_tiny.txt", pinyin_dictionary())}
HEX = {key: f"{i + 0xab:032x}" for i, key in enumerate(FILES)}


def nemo_ref(key: str) -> str:
    return f"nemo:{HEX[key]}_{FILES[key][0]}"


TOKENIZERS = {
    "english": {"_target_": TT + "EnglishCharsTokenizer", "punct": True, "apostrophe": True, "pad_with_space": False},
    # As the published Mandarin entry (docs/magpie.md 3.1).
    "mandarin_phoneme": {
        "_target_": TT + "ChinesePhonemesTokenizer", "punct": True, "apostrophe": True, "pad_with_space": True,
        "g2p": {"_target_": ZH_G2P, "phoneme_dict": nemo_ref("zh_dict"), "word_segmenter": "jieba",
                "phoneme_prefix": "", "phoneme_case": "lower", "tone_prefix": "#", "ascii_letter_prefix": "",
                "ascii_letter_case": "upper"},
    },
    # NeMo's defaults and the other switches: prefixed upper-case phonemes, lower-case letters, no segmenter,
    # a silence token, a blank last, no apostrophe, a short punctuation list.
    "mandarin_plain": {
        "_target_": TT + "ChinesePhonemesTokenizer", "punct": True, "apostrophe": False, "silence": "<sil>",
        "add_blank_at": "last", "non_default_punct_list": ["，", "。", ",", "."],
        "g2p": {"_target_": ZH_G2P, "phoneme_dict": nemo_ref("zh_dict"), "ascii_letter_prefix": "@"},
    },
}

SENTENCES = [
    "你好，世界！",
    "我今天去了Apple Store，买了一个iPhone。",
    "银行行长在长城上行走。",
    "他说：“我们都是好朋友。”",
    "这个问题很重要，我们需要重新考虑。",
    "2024年我们有3个孩子。",
    "妈妈骂马吗？",
    "一个人，一只猫。",
    "《红楼梦》是一本小说。",
    "我喜欢吃苹果、香蕉和橙子；你呢？",
    "女儿去旅游了。",
    "嗯，好的。",
    "Hello world.",
    "你好  世界",
    "  前后空格   ",
    "「引号」和【括号】以及（圆括号）。",
    "他的名字叫O'Brien。",
    "好好学习，天天向上！",
    "东西不见了。",
    "熊猫很可爱，兰花也很美。",
    "为什么？Why not?",
    "ＡＢＣ和abc。",
    "你好~世界#",
    "北京-上海 / 广州",
]


def write_nemo(out: Path, cfg: dict) -> None:
    import yaml

    def add(tar, name, data: bytes):
        info = tarfile.TarInfo("./" + name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(out / "zh.nemo", "w") as tar:
        add(tar, "model_config.yaml", yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False).encode("utf-8"))
        for key, (name, text) in FILES.items():
            add(tar, f"{HEX[key]}_{name}", text.encode("utf-8"))


class Recorder:
    """Stands in for nemo.utils.logging in the Mandarin modules: keeps what NeMo logs."""

    def __init__(self, real):
        self.real = real
        self.errors, self.warnings = [], []

    def error(self, msg, *a, **k):
        self.errors.append(str(msg))

    def warning(self, msg, *a, **k):
        self.warnings.append(str(msg))

    def __getattr__(self, name):
        return getattr(self.real, name)


def main(out: Path) -> None:
    import importlib.metadata as md
    import re

    from omegaconf import OmegaConf

    import nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers as tts_mod
    import nemo.collections.tts.g2p.models.zh_cn_pinyin as zh_mod
    from nemo.collections.tts.data.text_to_speech_dataset_lhotse import setup_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    cfg = {"nemo_version": NEMO_VERSION, "text_tokenizers": TOKENIZERS,
           "language_to_tokenizer_mapping": {"en": "english", "zh": "mandarin_phoneme", "zh_plain": "mandarin_plain"}}
    write_nemo(out, cfg)
    unpacked = out / "unpacked"
    unpacked.mkdir(exist_ok=True)
    for key, (name, text) in FILES.items():
        (unpacked / f"{HEX[key]}_{name}").write_text(text, encoding="utf-8")
    resolved = json.loads(json.dumps(TOKENIZERS))
    for tc in resolved.values():
        g = tc.get("g2p")
        if g and str(g.get("phoneme_dict", "")).startswith("nemo:"):
            g["phoneme_dict"] = str(unpacked / g["phoneme_dict"][len("nemo:"):])
    conf = OmegaConf.create({"text_tokenizers": resolved})
    agg = setup_tokenizers(conf.text_tokenizers, mode="test", cfg_nemo_version=NEMO_VERSION)

    rec = Recorder(zh_mod.logging)
    zh_mod.logging = rec
    tts_mod.logging = rec
    info = {
        "versions": {p: md.version(p) for p in ("jieba", "pypinyin", "pypinyin-dict")},
        "tokenizer_order": list(agg.tokenizer_names),
        "offsets": dict(agg.tokenizer_offsets),
        "pad_ids": dict(agg.tokenizer_pad_ids),
        "tokens": {n: list(t.tokens) for n, t in agg.tokenizers.items()},
        "text_bos_id": agg.vocab_size,
        "text_eos_id": agg.vocab_size + 1,
        "sentences": {},
    }
    for name in ("mandarin_phoneme", "mandarin_plain"):
        tok = agg.tokenizers[name]
        entries = []
        for text in SENTENCES:
            g2p_out = tok.g2p(tok.text_preprocessing_func(text))
            rec.errors.clear()
            rec.warnings.clear()
            ids = agg.encode(text, name)
            skipped = [m.group(1) for e in rec.errors for m in [re.search(r"Syllable <(.*?)> does not exist", e)] if m]
            dropped = [m.group(1) for w in rec.warnings
                       for m in [re.search(r"contains unknown char/phoneme: \[(.*?)\]\.", w, re.S)] if m]
            entries.append({"text": text, "g2p": list(g2p_out), "ids": ids, "skipped": skipped, "dropped": dropped})
        info["sentences"][name] = entries
    (out / "zh.json").write_text(json.dumps(info, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
