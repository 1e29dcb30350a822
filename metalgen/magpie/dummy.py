"""`dummy:magpie-*`: Magpie TTS and NanoCodec with seeded random weights, made in memory.

    magpie-357m        the current published revision (v2602): frame stacking 2, 16 audio tables,
                       a 2-layer 768-wide 12-head local transformer without in-projection, a
                       217-frame baked context, a 3359-entry text vocabulary
    magpie-357m-v2512  the older revision: no frame stacking, 8 tables, a 1-layer 256-wide 1-head
                       local transformer behind an in-projection, 110 context frames, 2380 entries
    magpie-tiny        small enough for tests: 32 wide, frame stacking 2, a 16 samples-a-frame codec

The 357M shapes are docs/magpie.md's table (third-party listings of the checkpoints); both take
the real NanoCodec decoder (8 FSQ groups of [8, 7, 6, 6], a 32-dim latent, 864 channels, up rates
8-8-4-2-2: 1024 samples a frame at 22050 Hz). The configs are dicts in model_config.yaml's layout,
read by the same `MagpieArgs.from_config` and `NanoCodecArgs.from_config` as a `.nemo`, and the
model's shapes come from them and from the tensor shapes, as at load. The five baked speakers
carry the model card's names. The text front end is NeMo's character tokenizers (English,
Spanish, German, French, Italian, Vietnamese, Hindi) and the published Japanese entry (which encodes
where pyopenjtalk is installed); a trailing Brazilian Portuguese phoneme tokenizer whose dictionary the
dummy lacks stands for the phoneme vocabularies that fill the rest of the published text table, so the
text ids end where the real ones do (BOS = rows - 2, EOS = rows - 1). The speech is noise.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MetalgenError
from ..loading import parse_dtype

# The model card's speakers in the order a third party reports for the .nemo's speakers.json
# (docs/magpie.md 1.3; the real names come from the file at load).
SPEAKERS = ["Aria", "Jason", "John", "Leo", "Sofia"]
N_SPECIAL = 8  # special audio ids per codebook (NeMo's SpecialAudioToken)

_TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
_CODEC = "nemo.collections.tts.modules.audio_codec_modules."
# (config name, class): the names NeMo's LANGUAGE_TOKENIZER_MAP looks for.
_CHAR_TOKENIZERS = [
    ("english", "EnglishCharsTokenizer"),
    ("spanish", "SpanishCharsTokenizer"),
    ("german", "GermanCharsTokenizer"),
    ("french_chartokenizer", "FrenchCharsTokenizer"),
    ("italian", "ItalianCharsTokenizer"),
    ("vietnamese", "VietnameseCharsTokenizer"),
    ("hindi_chartokenizer", "HindiCharsTokenizer"),
]


def _tokenizers() -> Dict[str, Any]:
    section = {name: {"_target_": _TT + cls, "punct": True, "apostrophe": True, "pad_with_space": False}
               for name, cls in _CHAR_TOKENIZERS}
    # The published Japanese entry (its vocabulary needs only this config; encoding needs pyopenjtalk).
    section["japanese_phoneme"] = {
        "_target_": _TT + "JapanesePhonemeTokenizer", "punct": True, "apostrophe": False, "pad_with_space": True,
        "g2p": {"_target_": "nemo.collections.tts.g2p.models.ja_jp_ipa.JapaneseKatakanaAccentG2p",
                "ascii_letter_prefix": "", "ascii_letter_case": "upper"}}
    # Last, so that no other tokenizer's offset depends on its vocabulary size, which stays unknown (its
    # dictionary is not in the dummy) and so fills the rest of the published table.
    section["portuguese_Brazilian_phoneme"] = {
        "_target_": _TT + "IPATokenizer", "locale": "pt-BR", "punct": True, "apostrophe": True,
        "pad_with_space": True,
        "g2p": {"_target_": "nemo.collections.tts.g2p.models.i18n_ipa.IpaG2p", "locale": "pt-BR",
                "phoneme_dict": "nemo:pt_br_prondict-v1.0.dict"}}
    return section


def _stack(n_layers: int, d: int, heads: int, kernel: int, positions: int, xattn: bool = False,
           xa_head: int = 128) -> Dict[str, Any]:
    """One `transformer_2501.Transformer` entry as the published configs write it."""
    stack = dict(n_layers=n_layers, d_model=d, d_ffn=4 * d, sa_n_heads=heads, kernel_size=kernel, p_dropout=0.0,
                 p_dropout_out=0.0, has_xattn=xattn, is_causal=True, apply_norm_out=True,
                 max_length_causal_mask=positions, use_learnable_pos_emb=True)
    if xattn:
        stack.update(xa_d_memory=d, xa_n_heads=1, xa_d_head=xa_head, apply_norm_to_cond=True)
    return stack


def _inference(current: bool, max_frames: int, estimate=(4, 5, 8, 9), apply=tuple(range(2, 11))) -> Dict[str, Any]:
    """inference_parameters: the current checkpoint's reported values (docs/magpie.md 2.1) or NeMo's
    defaults for the older one. Random weights seldom draw the audio EOS, so the frame limit is
    short (as the Qwen3-TTS dummies' is)."""
    ip = dict(max_decoder_steps=max_frames, topk=80, cfg_scale=2.5, attention_prior_epsilon=0.1,
              min_generated_frames=4, eos_detection_method="argmax_or_multinomial_any")
    if current:
        ip.update(temperature=0.6, attention_prior_lookahead_window=6,
                  estimate_alignment_from_layers=list(estimate), apply_prior_to_layers=list(apply))
    else:
        ip.update(temperature=0.7, attention_prior_lookahead_window=5)
    return ip


def _magpie(d: int, enc_layers: int, dec_layers: int, heads: int, stacking: int, lt_layers: int, lt_heads: int,
            lt_hidden: int, positions: int, xa_head: int, inference: Dict[str, Any]) -> Dict[str, Any]:
    return dict(
        model_type="decoder_ce",
        embedding_dim=d,
        codecmodel_path="nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps",
        frame_stacking_factor=stacking,
        use_text_conditioning_encoder=False,
        use_kv_cache_for_inference=False,
        local_transformer_type="autoregressive",
        local_transformer_n_layers=lt_layers,
        local_transformer_n_heads=lt_heads,
        local_transformer_hidden_dim=lt_hidden,
        text_tokenizers=_tokenizers(),
        encoder=_stack(enc_layers, d, heads, 3, positions),
        decoder=_stack(dec_layers, d, heads, 1, positions, xattn=True, xa_head=xa_head),
        inference_parameters=inference,
    )


def _codec(rates: List[int], channels: int, sample_rate: int, kernels=(3, 7, 11),
           dilations=(1, 3, 5)) -> Dict[str, Any]:
    """The codec's model_config.yaml: GroupFiniteScalarQuantizer + CausalHiFiGANDecoder."""
    samples = 1
    for r in rates:
        samples *= r
    return dict(
        sample_rate=sample_rate,
        samples_per_frame=samples,
        vector_quantizer={"_target_": _CODEC + "GroupFiniteScalarQuantizer", "num_groups": 8,
                          "num_levels_per_group": [8, 7, 6, 6]},
        audio_decoder={"_target_": _CODEC + "CausalHiFiGANDecoder", "up_sample_rates": list(rates),
                       "input_dim": 32, "base_channels": channels, "activation": "half_snake",
                       "output_activation": "clamp", "pad_mode": "zeros", "n_groups_equal_to_out_channels": True,
                       "resblock_kernel_sizes": list(kernels), "resblock_dilation_sizes": list(dilations)},
    )


NANOCODEC = _codec([8, 8, 4, 2, 2], 864, 22050)

# name -> model config, codec config, text vocabulary rows, baked context frames
SHAPES: Dict[str, Dict[str, Any]] = {
    "magpie-357m": dict(
        config=_magpie(768, 6, 12, 12, stacking=2, lt_layers=2, lt_heads=12, lt_hidden=768, positions=2048,
                       xa_head=128, inference=_inference(True, 64)),
        codec=NANOCODEC, text_vocab=3359, context_frames=217),
    "magpie-357m-v2512": dict(
        config=_magpie(768, 6, 12, 12, stacking=1, lt_layers=1, lt_heads=1, lt_hidden=256, positions=2048,
                       xa_head=128, inference=_inference(False, 64)),
        codec=NANOCODEC, text_vocab=2380, context_frames=110),
    # 16 samples a frame at 344 Hz: NanoCodec's 21.5 frames a second, so durations read true.
    "magpie-tiny": dict(
        config=_magpie(32, 2, 2, 2, stacking=2, lt_layers=2, lt_heads=2, lt_hidden=32, positions=512, xa_head=16,
                       inference=_inference(True, 32, estimate=(0, 1), apply=(0, 1))),
        codec=_codec([2, 2, 4], 16, 344, kernels=(3, 5), dilations=(1, 3)), text_vocab=720, context_frames=8),
}
SHAPES["magpie-357m-v2602"] = SHAPES["magpie-357m"]


def tensor_shapes(shape: str) -> Dict[str, Tuple[int, ...]]:
    """The state-dict shapes MagpieArgs reads besides the config: the audio tables (C, V), the
    text table and the baked speakers. Nothing is allocated."""
    spec = _spec(shape)
    cfg, vq = spec["config"], spec["codec"]["vector_quantizer"]
    d = cfg["embedding_dim"]
    tables = vq["num_groups"] * cfg["frame_stacking_factor"]
    codebook = 1
    for level in vq["num_levels_per_group"]:
        codebook *= level
    shapes = {f"audio_embeddings.{j}.weight": (codebook + N_SPECIAL, d) for j in range(tables)}
    shapes["text_embedding.weight"] = (spec["text_vocab"], d)
    shapes["baked_context_embedding.weight"] = (len(SPEAKERS), spec["context_frames"] * d)
    return shapes


def _spec(shape: str) -> Dict[str, Any]:
    if shape not in SHAPES:
        raise MetalgenError(f"unknown dummy Magpie shape '{shape}' (known: {', '.join(SHAPES)})")
    return SHAPES[shape]


def dummy_args(shape: str):
    """MagpieArgs of `dummy:<shape>`, from its config and tensor shapes alone."""
    from ..models.magpie.model import MagpieArgs

    return MagpieArgs.from_config(_spec(shape)["config"], shapes=tensor_shapes(shape))


def _randomize(module, seed: int, dtype, init) -> None:
    """Replace every parameter by `init(name, shape, key)` cast to `dtype` (integer parameters
    keep theirs)."""
    params = tree_flatten(module.parameters())
    keys = mx.random.split(mx.random.key(seed), len(params))
    new = []
    for (name, p), k in zip(params, keys):
        v = init(name, p.shape, k)
        new.append((name, v.astype(p.dtype if not mx.issubdtype(p.dtype, mx.floating) else dtype)))
    module.update(tree_unflatten(new))
    module.eval()
    mx.eval(module.parameters())


def _model_init(context_frames: int):
    from ..tts.dummy import _normal

    def init(name: str, shape, key):
        path, _, leaf = name.rpartition(".")
        if name == "baked_context_embedding_len":
            return mx.full(shape, context_frames, dtype=mx.int32)
        if leaf == "bias":
            return mx.zeros(shape)
        if leaf == "weight" and path.rsplit(".", 1)[-1].startswith("norm"):
            return mx.ones(shape)  # LayerNorm scales
        return 0.02 * _normal(shape, key)

    return init


def _codec_init(name: str, shape, key):
    """Conv weights N(0, 1 / fan_in), so the signal keeps its scale through the stages; Snake's
    raw alpha 1 (it divides by alpha); zero biases."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "alpha":
        return mx.ones(shape)
    if leaf == "bias":
        return mx.zeros(shape)
    fan_in = 1
    for dim in shape[1:]:
        fan_in *= int(dim)
    return mx.random.normal(shape, key=key) / (fan_in ** 0.5)


def load_dummy(shape: str, dtype=None, seed: int = 0):
    """Build `dummy:<shape>` as a MagpieTTS: the transformer in `dtype` (float32 by default, as the
    published `.nemo` stores it), the codec in float32."""
    from ..models.magpie.codec import NanoCodec, NanoCodecArgs
    from ..models.magpie.model import Model
    from .api import MagpieTTS
    from .text import MagpieText

    spec = _spec(shape)
    args = dummy_args(shape)
    model = Model(args)
    _randomize(model, seed, parse_dtype(dtype) or mx.float32, _model_init(spec["context_frames"]))
    codec = NanoCodec(NanoCodecArgs.from_config(spec["codec"]))
    _randomize(codec, seed + 1, mx.float32, _codec_init)
    config = spec["config"]
    text = MagpieText.from_config(config, text_vocab_size=args.text_vocab_size)
    return MagpieTTS(model, codec, text, config, list(SPEAKERS), f"dummy:{shape}")


def lt_check_model(dtype=mx.float32, seed: int = 0):
    """A Model of the 357M shapes (v2602) whose local transformer and audio tables are random, the rest
    left as built, for the LT kernel's checks and benchmarks: weights scaled 3 / sqrt(fan-in), positions
    and tables unit normal, norm scales near 1, so the LT's logits spread over a few units as a trained
    LT's do and top-k draws are not near-ties."""
    from ..models.magpie.model import Model

    model = Model(dummy_args("magpie-357m"))
    rng = np.random.default_rng(seed)
    new = []
    for name, p in tree_flatten(model.parameters()):
        if not (name.startswith("local_transformer") or name.startswith("audio_embeddings")):
            continue
        if "norm" in name:
            v = 1.0 + 0.1 * rng.standard_normal(p.shape)
        elif name.endswith("bias"):
            v = 0.1 * rng.standard_normal(p.shape)
        elif "position" in name or "audio_embeddings" in name:
            v = rng.standard_normal(p.shape)
        else:
            v = 3.0 * rng.standard_normal(p.shape) / np.sqrt(p.shape[-1])
        new.append((name, mx.array(v.astype(np.float32)).astype(dtype)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())
    return model

