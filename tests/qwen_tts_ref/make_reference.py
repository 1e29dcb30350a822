"""Build tiny random Qwen3-TTS checkpoints with qwen-tts' own config classes, save them in the
published layout, and dump the reference tensors metalgen's parity tests compare against.

Runs inside the reference venv (tests/qwen_tts_ref/.venv: torch CPU, transformers 4.57.3,
qwen-tts 0.1.1), never in the test environment itself:

    tests/qwen_tts_ref/.venv/bin/python tests/qwen_tts_ref/make_reference.py OUT_DIR

OUT_DIR/<case>/          a checkpoint folder (config.json, model.safetensors, generation_config.json,
                         text tokenizer files, speech_tokenizer/{config.json, model.safetensors,
                         preprocessor_config.json})
OUT_DIR/<case>.npz       reference tensors (see `dump_*` below for the names)
OUT_DIR/<case>.json      the inputs the tensors came from (text, speaker, language, instruct...)
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ASSET_TOKENIZER = REPO / "metalgen" / "assets" / "qwen3-tokenizer"

GREEDY_FRAMES = 32
SPEAKERS = {"alice": 2900, "bob": 2901, "eric": 2902}
DIALECTS = {"alice": False, "bob": False, "eric": "sichuan_dialect"}
LANGUAGES = {"chinese": 2050, "english": 2051, "german": 2052, "sichuan_dialect": 2060}
CODEC_IDS = dict(
    codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
    codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
)


def tiny_tts_config(model_type: str):
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    talker = dict(
        vocab_size=3072, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=4096,
        rope_scaling={"mrope_section": [8, 4, 4], "interleaved": True, "rope_type": "default"},
        num_code_groups=16, text_hidden_size=48, text_vocab_size=151936,
        spk_id=dict(SPEAKERS) if model_type == "custom_voice" else {},
        spk_is_dialect=dict(DIALECTS) if model_type == "custom_voice" else {},
        codec_language_id=dict(LANGUAGES),
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=40, intermediate_size=80, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            rope_theta=10000.0, max_position_embeddings=64, num_code_groups=16,
        ),
        **CODEC_IDS,
    )
    speaker_encoder = dict(
        mel_dim=128, enc_dim=64, enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1],
        enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16, enc_res2net_scale=4,
        enc_se_channels=16, sample_rate=24000,
    )
    return Qwen3TTSConfig(
        talker_config=talker, speaker_encoder_config=speaker_encoder,
        tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="1b7", tts_model_type=model_type,
    )


def tiny_speech_tokenizer_config():
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config

    decoder = dict(
        codebook_size=2048, hidden_size=32, latent_dim=32, codebook_dim=16, max_position_embeddings=8000,
        rope_theta=10000, num_attention_heads=2, num_key_value_heads=2, attention_bias=False,
        head_dim=32,  # heads * head_dim != hidden_size, as in the published decoder (16 x 64 over 512)
        sliding_window=4, intermediate_size=64, hidden_act="silu", layer_scale_initial_scale=0.01,
        rms_norm_eps=1e-5, num_hidden_layers=2, num_quantizers=16, upsample_rates=[2, 2],
        upsampling_ratios=[2, 2], decoder_dim=32,
    )
    encoder = dict(
        sampling_rate=24000, frame_rate=12.5, audio_channels=1, hidden_size=32, num_filters=4,
        num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3,
        residual_kernel_size=3, dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant",
        compress=2, trim_right_ratio=1.0, codebook_size=2048, codebook_dim=16, num_quantizers=32,
        use_conv_shortcut=False, vector_quantization_hidden_dimension=16, num_semantic_quantizers=1,
        upsample_groups=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, hidden_act="gelu", max_position_embeddings=8000,
        rope_theta=10000.0, sliding_window=20, norm_eps=1e-5, layer_scale_initial_scale=0.01,
        use_cache=False,
    )
    return Qwen3TTSTokenizerV2Config(
        encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=16,
        input_sample_rate=24000, output_sample_rate=24000, decode_upsample_rate=16,
        encode_downsample_rate=1920,
    )


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random, including the ones initialized to constants (norm scales, biases,
    layer scales, SnakeBeta exponents, codebook usage), so that the parity tests see them all."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("cluster_usage"):
                p.copy_(0.5 + r.abs())
            elif name.endswith(("norm.weight", "layernorm.weight")) or ".norm." in name and name.endswith("weight") and p.ndim == 1:
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith(("alpha", "beta")) and p.ndim == 1:
                p.copy_(0.2 * r)
            elif name.endswith("embedding_sum"):
                p.copy_(r)
            else:
                p.copy_(0.1 * r)
        for name, b in module.named_buffers():
            if name.endswith("embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("cluster_usage"):
                b.copy_(0.5 + torch.randn(b.shape, generator=g).abs())
            elif name.endswith("initialized"):
                b.fill_(1.0)


def save_text_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor

    tok = AutoTokenizer.from_pretrained(str(ASSET_TOKENIZER))
    processor = Qwen3TTSProcessor(tokenizer=tok)
    processor.save_pretrained(str(folder))
    return processor


def strip_speaker_encoder_model_type(folder: Path) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.get("speaker_encoder_config", {}).pop("model_type", None)
    path.write_text(json.dumps(config, indent=2))


GENERATE_CONFIG = dict(
    do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
    subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
    max_new_tokens=8192,
)


def build_checkpoint(folder: Path, model_type: str, seed: int):
    from transformers import EncodecFeatureExtractor

    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    torch.manual_seed(seed)
    config = tiny_tts_config(model_type)
    config._attn_implementation = "eager"
    config.talker_config._attn_implementation = "eager"
    config.talker_config.code_predictor_config._attn_implementation = "eager"
    model = Qwen3TTSForConditionalGeneration(config).eval()
    randomize(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    strip_speaker_encoder_model_type(folder)
    (folder / "generation_config.json").write_text(json.dumps(GENERATE_CONFIG, indent=2))
    processor = save_text_tokenizer(folder)

    st_config = tiny_speech_tokenizer_config()
    st_config._attn_implementation = "eager"
    st_config.decoder_config._attn_implementation = "eager"
    st_config.encoder_config._attn_implementation = "eager"
    speech = Qwen3TTSTokenizerV2Model(st_config).eval()
    randomize(speech, seed + 1)
    st_folder = folder / "speech_tokenizer"
    speech.save_pretrained(str(st_folder), safe_serialization=True)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(str(st_folder))
    return model, processor, speech


class Recorder:
    """Forward hooks on the talker and the code predictor: the last position's logits of every
    call, in call order, and the talker's prefill input embeddings."""

    def __init__(self, model):
        self.talker_logits, self.cp_logits, self.prefill = [], [], []
        model.talker.register_forward_hook(self._talker, with_kwargs=True)
        model.talker.code_predictor.register_forward_hook(self._cp, with_kwargs=True)

    def _talker(self, module, args, kwargs, out):
        emb = kwargs.get("inputs_embeds")
        if emb is not None and emb.shape[1] > 1:
            self.prefill.append(emb[0].float().numpy().copy())
        self.talker_logits.append(out.logits[0, -1].float().numpy().copy())

    def _cp(self, module, args, kwargs, out):
        self.cp_logits.append(out.logits[0, -1].float().numpy().copy())


def tokenize(processor, text: str):
    return processor(text=text, return_tensors="pt", padding=True)["input_ids"]


def greedy_case(model, processor, case: dict, frames: int, **extra):
    rec = Recorder(model)
    input_ids = tokenize(processor, f"<|im_start|>assistant\n{case['text']}<|im_end|>\n<|im_start|>assistant\n")
    instruct_ids = [None]
    if case.get("instruct"):
        instruct_ids = [tokenize(processor, f"<|im_start|>user\n{case['instruct']}<|im_end|>\n")]
    if "voice_clone_prompt" not in extra:
        extra["speakers"] = [case.get("speaker")]
    codes, _ = model.generate(
        input_ids=[input_ids], instruct_ids=instruct_ids, languages=[case["language"]],
        non_streaming_mode=case.get("non_streaming_mode", True),
        max_new_tokens=frames + 1, do_sample=False, subtalker_dosample=False,
        repetition_penalty=case.get("repetition_penalty", 1.05), **extra,
    )
    out = {
        "input_ids": input_ids[0].numpy().astype(np.int64),
        "codes": codes[0].numpy().astype(np.int64),  # (frames, 16)
        "prefill_embeds": rec.prefill[0],
        "talker_logits": np.stack(rec.talker_logits),  # (frames + 1, 3072)
        "cp_logits": np.stack(rec.cp_logits).reshape(-1, 15, rec.cp_logits[0].shape[-1]),
    }
    if instruct_ids[0] is not None:
        out["instruct_ids"] = instruct_ids[0][0].numpy().astype(np.int64)
    return out


def decoder_case(speech, codes: np.ndarray, chunk: int, left: int):
    """codes: (T, 16). Whole decode, the reference's chunked_decode with small chunks, and the
    tokenizer's own decode (its default chunking, trimmed to T * upsample)."""
    c = torch.from_numpy(codes.T[None].astype(np.int64))
    with torch.no_grad():
        whole = speech.decoder(c)[0, 0].numpy()
        chunked = speech.decoder.chunked_decode(c, chunk_size=chunk, left_context_size=left)[0, 0].numpy()
        api = speech.decode(torch.from_numpy(codes[None].astype(np.int64)))
        api = (api[0] if isinstance(api, tuple) else api.audio_values)[0].numpy()
    return whole, chunked, api


def test_clip(sr: int = 24000, seconds: float = 0.9, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    wav = 0.3 * np.sin(2 * math.pi * 220 * t) + 0.2 * np.sin(2 * math.pi * 523 * t + 0.5)
    wav = wav * (0.6 + 0.4 * np.sin(2 * math.pi * 3 * t)) + 0.02 * rng.standard_normal(t.shape)
    return wav.astype(np.float32)


def main(out: Path) -> None:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out.mkdir(parents=True, exist_ok=True)

    # CustomVoice: named speakers, languages, dialect speakers, an instruction.
    folder = out / "custom_voice"
    model, processor, speech = build_checkpoint(folder, "custom_voice", seed=1234)
    cases = {
        "a": dict(text="Hello world, this is metalgen speaking.", speaker="alice", language="english"),
        "b": dict(text="Guten Tag!", speaker="eric", language="auto", instruct="Speak slowly and warmly."),
        "c": dict(text="Streaming text input.", speaker="bob", language="chinese", non_streaming_mode=False,
                  repetition_penalty=1.3),
    }
    arrays = {}
    for key, case in cases.items():
        got = greedy_case(model, processor, case, GREEDY_FRAMES)
        arrays.update({f"{key}_{k}": v for k, v in got.items()})

    rng = np.random.default_rng(7)
    rand_codes = rng.integers(0, 2048, size=(41, 16))
    whole, chunked, api = decoder_case(speech, rand_codes, chunk=12, left=5)
    arrays.update(dec_codes=rand_codes, dec_whole=whole, dec_chunked=chunked, dec_api=api)
    gen_codes = arrays["a_codes"]
    whole, chunked, api = decoder_case(speech, gen_codes, chunk=7, left=3)
    arrays.update(gen_whole=whole, gen_chunked=chunked, gen_api=api)

    clip = test_clip()
    with torch.no_grad():
        enc = speech.encode(torch.from_numpy(clip[None]), padding_mask=torch.ones(1, clip.shape[0], dtype=torch.long))
    arrays.update(enc_clip=clip, enc_codes=enc.audio_codes[0].numpy().astype(np.int64))

    np.savez(out / "custom_voice.npz", **arrays)
    (out / "custom_voice.json").write_text(json.dumps(
        {"cases": cases, "frames": GREEDY_FRAMES, "speakers": SPEAKERS, "languages": LANGUAGES,
         "decoder": {"rand": [12, 5], "gen": [7, 3]}}, indent=2))

    # VoiceDesign: no speaker, the voice described by the instruction.
    folder = out / "voice_design"
    model, processor, _ = build_checkpoint(folder, "voice_design", seed=99)
    cases = {"d": dict(text="A designed voice.", language="english", instruct="A deep, calm male voice.")}
    arrays = {}
    for key, case in cases.items():
        got = greedy_case(model, processor, case, GREEDY_FRAMES)
        arrays.update({f"{key}_{k}": v for k, v in got.items()})
    np.savez(out / "voice_design.npz", **arrays)
    (out / "voice_design.json").write_text(json.dumps({"cases": cases, "frames": GREEDY_FRAMES}, indent=2))

    # Base: a voice cloned from a reference clip, in context (ref text + codes) or from the
    # speaker embedding alone (x-vector only).
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    folder = out / "base"
    model, processor, speech = build_checkpoint(folder, "base", seed=555)
    clip = test_clip(seed=11)
    with torch.no_grad():
        mel = mel_spectrogram(torch.from_numpy(clip)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                              hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)[0]
        spk = model.extract_speaker_embedding(clip, 24000)
        enc = speech.encode(torch.from_numpy(clip[None]), padding_mask=torch.ones(1, clip.shape[0], dtype=torch.long))
    ref_codes = enc.audio_codes[0]
    ref_text = "This is the reference clip."
    ref_ids = tokenize(processor, f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")
    arrays = dict(clip=clip, mel=mel.numpy(), spk=spk.float().numpy(), ref_codes=ref_codes.numpy().astype(np.int64))
    cases = {
        "icl": dict(text="Cloned in context.", language="english", non_streaming_mode=False, ref_text=ref_text),
        "xvec": dict(text="Cloned from the embedding.", language="auto", non_streaming_mode=False),
    }
    got = greedy_case(model, processor, cases["icl"], GREEDY_FRAMES, ref_ids=[ref_ids], voice_clone_prompt=dict(
        ref_code=[ref_codes], ref_spk_embedding=[spk], x_vector_only_mode=[False], icl_mode=[True]))
    arrays.update({f"icl_{k}": v for k, v in got.items()})
    got = greedy_case(model, processor, cases["xvec"], GREEDY_FRAMES, ref_ids=[None], voice_clone_prompt=dict(
        ref_code=[None], ref_spk_embedding=[spk], x_vector_only_mode=[True], icl_mode=[False]))
    arrays.update({f"xvec_{k}": v for k, v in got.items()})
    np.savez(out / "base.npz", **arrays)
    (out / "base.json").write_text(json.dumps({"cases": cases, "frames": GREEDY_FRAMES}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
