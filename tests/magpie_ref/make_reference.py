"""Build a tiny random Magpie TTS model (and its tiny NanoCodec) with NeMo's own classes, save both
as .nemo files, and dump the reference tensors metalgen's Magpie parity tests compare against.

Runs inside the reference venv made by tests/magpie_ref/setup_venv.sh (torch CPU, nemo-toolkit
3.0.0), never in the test environment itself:

    tests/magpie_ref/.venv/bin/python tests/magpie_ref/make_reference.py OUT_DIR

OUT_DIR/codec.nemo        tiny AudioCodecModel (NanoCodec layout: causal HiFi-GAN, 8 x FSQ [8,7,6,6])
OUT_DIR/magpie.nemo       tiny MagpieTTSModel (decoder_ce, baked speakers, AR local transformer)
OUT_DIR/magpie.npz        reference tensors (names listed in tests/magpie_ref/README.md)
OUT_DIR/magpie.json       the configs, inputs, special ids and inference parameters used
OUT_DIR/tokenizers.json   token ids for one sentence per language + each tokenizer's vocabulary
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

GREEDY_FRAMES = 32
TEACHER_FRAMES = 12
N_SPEAKERS = 2
BAKED_T = 6  # frames of baked speaker context (110 in the published model)
EMB = 32  # embedding_dim / d_model (768 in the published model)

SENTENCES = {
    "en": "Hello world, this is Magpie speaking.",
    "es": "Hola mundo, ¿qué tal estás hoy?",
    "de": "Guten Tag, wie geht es Ihnen heute?",
    "fr": "Bonjour le monde, ça va très bien.",
    "it": "Ciao mondo, come stai oggi?",
    "vi": "Xin chào thế giới, hôm nay bạn khỏe không?",
    "hi": "नमस्ते दुनिया, आप कैसे हैं?",
    "zh": "你好世界，今天天气很好。",
    "ja": "こんにちは世界、今日はいい天気です。",
}

# Character tokenizers that need no downloaded files. Names follow NeMo's LANGUAGE_TOKENIZER_MAP
# (tts_dataset_utils.py), which falls back from e.g. "english_phoneme" to "english".
CHAR_TOKENIZERS = {
    "english": ("en", "EnglishCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
    "spanish": ("es", "SpanishCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
    "german": ("de", "GermanCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
    "french_chartokenizer": ("fr", "FrenchCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
    "italian": ("it", "ItalianCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
    "vietnamese": ("vi", "VietnameseCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
    "hindi_chartokenizer": ("hi", "HindiCharsTokenizer", dict(punct=True, apostrophe=True, pad_with_space=False)),
}
# What the published multilingual model uses instead, and what each needs that is not offline here.
UNAVAILABLE = {
    "english_phoneme": "IPATokenizer + IpaG2p: needs ipa_cmudict-0.7b_nv23.01.txt and heteronyms-052722",
    "spanish_phoneme": "IPATokenizer + IpaG2p(es-ES): needs es_ES_nv230301.dict",
    "german_phoneme": "IPATokenizer + IpaG2p(de-DE): needs de_nv230119.dict and .heteronym",
    "italian_phoneme": "IPATokenizer + IpaG2p(it-IT): needs the Italian IPA dictionary",
    "vietnamese_phoneme": "IPATokenizer + IpaG2p(vi-VN): needs the Vietnamese IPA dictionary",
    "mandarin_phoneme": "ChinesePhonemesTokenizer + ChineseG2p: needs ipa_dict_nv23.05.txt, jieba, pypinyin",
    "japanese_phoneme": "JapanesePhonemeTokenizer: needs pyopenjtalk and its dictionary",
}
TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."


def codec_config(sample_rate=22050):
    """Tiny NanoCodec: same module classes as nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps."""
    from omegaconf import OmegaConf

    down = [2, 2, 4]  # the published codec has 1024 samples per frame
    num_codebooks, levels = 8, [8, 7, 6, 6]
    latent = num_codebooks * len(levels)
    M = "nemo.collections.tts.modules.audio_codec_modules."
    cfg = dict(
        sample_rate=sample_rate,
        samples_per_frame=int(np.prod(down)),
        mel_loss_l1_scale=1.0, mel_loss_l2_scale=0.0, stft_loss_scale=0.0, time_domain_loss_scale=0.0,
        codebook_loss_scale=0.0, commit_loss_scale=0.0,
        loss_resolutions=[[32, 8, 32], [64, 16, 64]], mel_loss_dims=[5, 10], mel_loss_log_guard=1.0,
        stft_loss_log_guard=1.0, feature_loss_type="absolute",
        audio_encoder={"_target_": M + "CausalHiFiGANEncoder", "down_sample_rates": down, "encoded_dim": latent,
                       "base_channels": 8, "activation": "lrelu", "resblock_kernel_sizes": [3],
                       "resblock_dilation_sizes": [1]},
        vector_quantizer={"_target_": M + "GroupFiniteScalarQuantizer", "num_groups": num_codebooks,
                          "num_levels_per_group": levels},
        audio_decoder={"_target_": M + "CausalHiFiGANDecoder", "up_sample_rates": list(reversed(down)),
                       "input_dim": latent, "base_channels": 32, "activation": "lrelu",
                       "output_activation": "tanh", "resblock_kernel_sizes": [3, 7],
                       "resblock_dilation_sizes": [1, 3]},
        discriminator={"_target_": M + "Discriminator",
                       "discriminators": []},  # training only; Magpie deletes it
        generator_loss={"_target_": "nemo.collections.tts.losses.audio_codec_loss.GeneratorSquaredLoss"},
        discriminator_loss={"_target_": "nemo.collections.tts.losses.audio_codec_loss.DiscriminatorSquaredLoss"},
    )
    return OmegaConf.create(cfg)


def magpie_config(codec_path: str, stacked: bool = False):
    """Tiny decoder_ce Magpie model in the structure of the published model_config.yaml. `stacked`:
    the current published revision's layout instead (frame stacking 2, a local transformer as wide
    as the decoder with 2 layers and no in-projection) and a later minimum frame count."""
    from omegaconf import OmegaConf

    tokenizers = {name: {"_target_": TT + cls, **kw} for name, (_, cls, kw) in CHAR_TOKENIZERS.items()}
    cfg = dict(
        model_type="decoder_ce",
        use_text_conditioning_encoder=False,
        context_duration_min=5.0,
        context_duration_max=5.0,
        embedding_dim=EMB,
        codecmodel_path=codec_path,
        frame_stacking_factor=1,
        prior_scaling_factor=None,
        prior_end_step=0,
        prior_scaledown_start_step=0,
        alignment_loss_scale=0.0,
        cfg_unconditional_prob=0.1,
        # False: NeMo 3.0.0's KV-cached infer_batch applies the attention prior differently from the
        # uncached loop (codes diverge after a few frames); do_tts/generate_speech never turn the
        # cache on, so the uncached loop is the published behaviour.
        use_kv_cache_for_inference=False,
        local_transformer_type="autoregressive",
        local_transformer_n_layers=1,
        local_transformer_n_heads=1,
        local_transformer_hidden_dim=16,  # != d_model, so local_transformer_in_projection is a Linear
        text_tokenizers=tokenizers,
        encoder=dict(n_layers=2, d_model=EMB, d_ffn=4 * EMB, sa_n_heads=2, kernel_size=3, p_dropout=0.0,
                     p_dropout_out=0.0, has_xattn=False, is_causal=True, apply_norm_out=True,
                     max_length_causal_mask=256, use_learnable_pos_emb=True),
        context_encoder=dict(n_layers=1, d_model=EMB, d_ffn=4 * EMB, sa_n_heads=2, kernel_size=3, p_dropout=0.0,
                             p_dropout_out=0.0, has_xattn=False, is_causal=False, apply_norm_out=True,
                             max_length_causal_mask=256, use_learnable_pos_emb=True),
        decoder=dict(n_layers=2, d_model=EMB, d_ffn=4 * EMB, sa_n_heads=2, kernel_size=1, p_dropout=0.0,
                     p_dropout_out=0.0, has_xattn=True, xa_d_memory=EMB, xa_n_heads=1, xa_d_head=16,
                     is_causal=True, apply_norm_to_cond=True, apply_norm_out=True,
                     max_length_causal_mask=256, use_learnable_pos_emb=True),
        inference_parameters=dict(max_decoder_steps=GREEDY_FRAMES, temperature=0.0, topk=80, cfg_scale=2.5),
        optim={"_target_": "torch.optim.Adam", "lr": 2e-4},
    )
    if stacked:
        cfg.update(frame_stacking_factor=2, local_transformer_n_layers=2, local_transformer_n_heads=2,
                   local_transformer_hidden_dim=EMB)
        cfg["inference_parameters"] = dict(cfg["inference_parameters"], min_generated_frames=8)
    return OmegaConf.create(cfg)


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.2):
    """Random weights everywhere (NeMo zero-initialises some biases/norms; parity wants them all live)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 and name.endswith("weight") and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def build_codec(out: Path) -> Path:
    from nemo.collections.tts.models import AudioCodecModel

    torch.manual_seed(0)
    codec = AudioCodecModel(cfg=codec_config()).eval()
    randomize(codec.audio_decoder, 1, scale=0.3)
    randomize(codec.audio_encoder, 2, scale=0.3)
    path = out / "codec.nemo"
    codec.save_to(str(path))
    return path


def build_magpie(out: Path, codec_path: Path, stacked: bool = False) -> Path:
    from nemo.collections.tts.models import MagpieTTSModel

    torch.manual_seed(0)
    model = MagpieTTSModel(cfg=magpie_config(str(codec_path), stacked)).eval()
    skip = ("_codec_model",)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(skip):
                continue
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    # Bake speaker context the way NeMo's bake step stores it: the context encoder's output for each
    # speaker, flattened to (N, T*D), plus T, D and per-speaker lengths. load_state_dict then drops
    # the context encoder (its weights are excluded from the saved checkpoint).
    ctx_in = 0.5 * torch.randn(N_SPEAKERS, BAKED_T, EMB, generator=g)
    mask = torch.ones(N_SPEAKERS, BAKED_T, dtype=torch.bool)
    with torch.no_grad():
        baked = model.context_encoder(ctx_in, mask, cond=None, cond_mask=None)["output"]
    sd = {k: v for k, v in model.state_dict().items()}
    sd["baked_context_embedding.weight"] = baked.reshape(N_SPEAKERS, BAKED_T * EMB).clone()
    sd["_baked_embedding_T"] = torch.tensor(BAKED_T)
    sd["_baked_embedding_D"] = torch.tensor(EMB)
    # All speakers full length: with a shorter length NeMo (3.0.0) builds a mask shorter than the
    # (N, T, D) embedding it concatenates it with, and its own decoder call fails.
    sd["baked_context_embedding_len"] = torch.tensor([BAKED_T] * N_SPEAKERS)
    if stacked:
        # Random weights never end an utterance: a large final_proj bias on AUDIO_EOS for stacked
        # frame 1, codebook 3 makes the argmax stream end it as soon as EOS is allowed, in the
        # middle of a stacked step (so the frame before it is kept and the one after it dropped).
        V = model.num_all_tokens_per_codebook
        block = 1 * model.num_audio_codebooks + 3
        sd["final_proj.bias"][block * V + model.audio_eos_id] += 50.0
    model.load_state_dict(sd, strict=True)
    assert model.has_baked_context_embedding
    path = out / ("magpie_s2.nemo" if stacked else "magpie.nemo")
    model.save_to(str(path))
    return path


def np32(t):
    return t.detach().to(torch.float32).cpu().numpy()


def text_batch(model, sentence: str, speaker: int):
    ids = model.tokenizer.encode(text=sentence, tokenizer_name="english") + [model.eos_id]
    text = torch.tensor([ids], dtype=torch.long)
    return {"text": text, "text_lens": torch.tensor([len(ids)]), "speaker_indices": speaker}


def dump_model(model, arrays: dict, meta: dict):
    from nemo.collections.tts.parts.utils.helpers import get_mask_from_lengths

    speaker = 1  # not the default speaker 0, so speaker selection is exercised
    batch = text_batch(model, SENTENCES["en"], speaker)
    arrays["text_ids"] = batch["text"].numpy().astype(np.int64)
    meta["text"] = SENTENCES["en"]
    meta["speaker_index"] = speaker

    with torch.no_grad():
        model.decoder.reset_cache(use_cache=False)
        ctx = model.prepare_context_tensors(batch)
        arrays["text_embedded"] = np32(ctx.text_embedded)
        arrays["text_encoder_out"] = np32(ctx.text_encoder_out)
        arrays["baked_context"] = np32(ctx.additional_decoder_input)
        arrays["baked_context_mask"] = ctx.additional_decoder_mask.numpy().astype(np.int64)

        # Teacher-forced decoder: [baked context | BOS, codes[0..T-2]] -> logits at every position.
        g = torch.Generator().manual_seed(11)
        codes = torch.randint(0, model.codebook_size, (1, model.num_audio_codebooks, TEACHER_FRAMES), generator=g)
        bos = torch.full((1, model.num_audio_codebooks, 1), model.audio_bos_id)
        dec_codes = torch.cat([bos, codes[:, :, :-1]], dim=2)
        lens = torch.tensor([TEACHER_FRAMES])
        emb, emb_lens = model.embed_audio_tokens(dec_codes, lens)
        dec_in = torch.cat([ctx.additional_decoder_input, emb], dim=1)
        dec_mask = torch.cat([ctx.additional_decoder_mask, get_mask_from_lengths(emb_lens)], dim=1)
        logits, _, dec_out, _ = model.forward(dec_in, dec_mask, ctx.cond, ctx.cond_mask, None, None)
        arrays["teacher_codes"] = codes.numpy().astype(np.int64)
        arrays["teacher_decoder_input_codes"] = dec_codes.numpy().astype(np.int64)
        arrays["decoder_input_embedded"] = np32(dec_in)
        arrays["decoder_out"] = np32(dec_out)
        arrays["decoder_logits"] = np32(logits)

        # The CFG unconditional branch on the same inputs (NeMo's prepare_dummy_cond_for_cfg).
        dcond, dmask, dctx, dctx_mask, _ = model.prepare_dummy_cond_for_cfg(
            ctx.cond, ctx.cond_mask, ctx.additional_decoder_input, ctx.additional_decoder_mask)
        u_in = dec_in.clone()
        u_in[:, : dctx.size(1)] = dctx
        u_mask = dec_mask.clone()
        u_mask[:, : dctx_mask.size(1)] = dctx_mask
        u_logits, _, _, _ = model.forward(u_in, u_mask, dcond, dmask, None, None)
        arrays["decoder_logits_uncond"] = np32(u_logits)

        # Local transformer, teacher-forced on the same codes, from the audio positions' decoder output.
        n_ctx = ctx.additional_decoder_input.size(1)
        lt_logits = model._lt_helper.compute_logits(dec_out[:, n_ctx:, :], codes)
        arrays["local_transformer_logits"] = np32(lt_logits)

    # Greedy generation through NeMo's own loop, with and without CFG.
    runs = {}
    for use_cfg in (False, True):
        tag = "cfg" if use_cfg else "nocfg"
        out = model.infer_batch(batch, use_cfg=use_cfg, use_local_transformer_for_inference=True)
        n = int(out.predicted_codes_lens[0])
        arrays[f"greedy_codes_{tag}"] = out.predicted_codes[0, :, :n].numpy().astype(np.int64)
        arrays[f"greedy_audio_{tag}"] = np32(out.predicted_audio[0, : int(out.predicted_audio_lens[0])])
        runs[tag] = {"frames": n}
        # generate_speech (the path do_tts takes) for a single chunk.
        # generate_speech never resets the decoder cache (infer_batch does); a freshly loaded model's
        # decoder runs uncached, which is what do_tts gets, so put it back in that state.
        model.decoder.reset_cache(use_cache=False)
        state = model.create_chunk_state(batch_size=1)
        gen = model.generate_speech(batch, chunk_state=state, end_of_text=[True], beginning_of_text=True,
                                    use_cfg=use_cfg, use_local_transformer_for_inference=True)
        m = int(gen.predicted_codes_lens[0])
        gcodes = gen.predicted_codes[0, :, :m].numpy().astype(np.int64)
        arrays[f"generate_speech_codes_{tag}"] = gcodes
        runs[tag]["generate_speech_frames"] = m
        same = gcodes.shape == arrays[f"greedy_codes_{tag}"].shape and bool(
            (gcodes == arrays[f"greedy_codes_{tag}"]).all())
        runs[tag]["generate_speech_matches_infer_batch"] = same
        # NeMo's KV-cached decoder mode (use_kv_cache_for_inference): each position keeps the
        # hidden state computed under its own step's prior; metalgen's fast loop is this mode.
        model.use_kv_cache_for_inference = True
        out = model.infer_batch(batch, use_cfg=use_cfg, use_local_transformer_for_inference=True)
        model.use_kv_cache_for_inference = False
        model.decoder.reset_cache(use_cache=False)
        n = int(out.predicted_codes_lens[0])
        arrays[f"greedy_codes_cached_{tag}"] = out.predicted_codes[0, :, :n].numpy().astype(np.int64)
        runs[tag]["cached_frames"] = n
    meta["greedy"] = runs


def dump_stacked(out: Path, codec_path: Path, arrays: dict, meta: dict):
    """The frame-stacking-2 model: greedy codes (uncached and cached, CFG on and off), which end
    with EOS inside a stacked step."""
    from nemo.collections.tts.models import MagpieTTSModel

    path = build_magpie(out, codec_path, stacked=True)
    model = MagpieTTSModel.restore_from(str(path), map_location="cpu").eval()
    batch = text_batch(model, SENTENCES["en"], 0)
    runs = {}
    for use_cfg in (False, True):
        for cached in (False, True):
            tag = ("cached_" if cached else "") + ("cfg" if use_cfg else "nocfg")
            model.use_kv_cache_for_inference = cached
            with torch.no_grad():
                res = model.infer_batch(batch, use_cfg=use_cfg, use_local_transformer_for_inference=True)
            n = int(res.predicted_codes_lens[0])
            arrays[f"s2_greedy_codes_{tag}"] = res.predicted_codes[0, :, :n].numpy().astype(np.int64)
            runs[tag] = {"frames": n}
    model.use_kv_cache_for_inference = False
    meta["stacked"] = dict(runs=runs, speaker_index=0,
                           magpie_config=__import__("omegaconf").OmegaConf.to_container(model.cfg, resolve=True))


def dump_codec(model, arrays: dict):
    codec = model._codec_model
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, model.codebook_size, (1, model.num_audio_codebooks, GREEDY_FRAMES), generator=g)
    lens = torch.tensor([GREEDY_FRAMES])
    with torch.no_grad():
        latent = codec.dequantize(tokens=codes, tokens_len=lens)
        audio, audio_len = codec.decode(tokens=codes, tokens_len=lens)
    arrays["codec_codes"] = codes.numpy().astype(np.int64)
    arrays["codec_latent"] = np32(latent)
    arrays["codec_audio"] = np32(audio[0, : int(audio_len[0])])


def dump_tokenizers(model, out: Path):
    agg = model.tokenizer
    from nemo.collections.tts.parts.utils.tts_dataset_utils import get_tokenizer_for_language

    langs = {}
    for lang, sentence in SENTENCES.items():
        name = get_tokenizer_for_language(lang, list(agg.tokenizers.keys()))
        served = any(code == lang for code, _, _ in CHAR_TOKENIZERS.values()) and name in CHAR_TOKENIZERS
        entry = {"text": sentence, "tokenizer": name if served else None}
        if served:
            # Exactly what do_tts feeds the model: tokenizer ids (already offset) + text EOS.
            entry["ids"] = list(agg.encode(text=sentence, tokenizer_name=name)) + [model.eos_id]
        else:
            entry["why_not"] = "no offline tokenizer for this language (see unavailable)"
        langs[lang] = entry
    info = {
        "tokenizer_order": list(agg.tokenizer_names),
        "offsets": dict(agg.tokenizer_offsets),
        "num_tokens": dict(agg.num_tokens_per_tokenizer),
        "pad_ids": {k: int(v) for k, v in agg.tokenizer_pad_ids.items()},
        "tokens": {name: list(t.tokens) for name, t in agg.tokenizers.items()},
        "classes": {name: type(t).__name__ for name, t in agg.tokenizers.items()},
        "text_bos_id": model.bos_id,
        "text_eos_id": model.eos_id,
        "vocab_size_with_bos_eos": len(agg.tokens) + 2,
        "languages": langs,
        "unavailable": UNAVAILABLE,
    }
    (out / "tokenizers.json").write_text(json.dumps(info, ensure_ascii=False, indent=1))


def main(out: Path):
    import nemo
    from nemo.collections.tts.models import MagpieTTSModel
    from omegaconf import OmegaConf

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    out.mkdir(parents=True, exist_ok=True)
    codec_path = build_codec(out)
    magpie_path = build_magpie(out, codec_path)
    # Everything below runs on the model as restored from the .nemo, like a user would load it.
    model = MagpieTTSModel.restore_from(str(magpie_path), map_location="cpu").eval()
    assert model.has_baked_context_embedding and not any(
        k.startswith("context_encoder.") for k in model.state_dict())

    arrays, meta = {}, {}
    dump_model(model, arrays, meta)
    dump_codec(model, arrays)
    dump_tokenizers(model, out)
    dump_stacked(out, codec_path, arrays, meta)

    ip = model.inference_parameters
    meta.update(
        nemo_version=nemo.__version__,
        torch_version=torch.__version__,
        magpie_config=OmegaConf.to_container(model.cfg, resolve=True),
        codec_config=OmegaConf.to_container(model._codec_model.cfg, resolve=True),
        inference_parameters={k: getattr(ip, k) for k in ip.__dataclass_fields__},
        ids=dict(
            codebook_size=model.codebook_size, num_codebooks=model.num_audio_codebooks,
            num_all_tokens_per_codebook=model.num_all_tokens_per_codebook,
            audio_bos_id=model.audio_bos_id, audio_eos_id=model.audio_eos_id,
            context_audio_bos_id=model.context_audio_bos_id, context_audio_eos_id=model.context_audio_eos_id,
            mask_token_id=model.mask_token_id, text_bos_id=model.bos_id, text_eos_id=model.eos_id,
        ),
        codec=dict(sample_rate=model.sample_rate, output_sample_rate=model.output_sample_rate,
                   samples_per_frame=model.codec_model_samples_per_frame),
        shapes={k: list(v.shape) for k, v in arrays.items()},
        dtypes={k: str(v.dtype) for k, v in arrays.items()},
        state_dict_keys={k: list(v.shape) for k, v in model.state_dict().items()
                         if not k.startswith("_codec_model.")},
    )
    np.savez(out / "magpie.npz", **arrays)
    (out / "magpie.json").write_text(json.dumps(meta, indent=1, default=str))
    print(f"magpie reference dump written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_reference.py OUT_DIR")
    main(Path(sys.argv[1]))
