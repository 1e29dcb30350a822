"""Reference dump for Magpie voice cloning (a reference clip -> NanoCodec codes -> context encoder ->
the decoder's first rows), made by NeMo 3.0.0 itself on tiny random models.

Runs inside the reference venv of tests/magpie_ref/ (see setup_venv.sh), never in the test
environment; the tiny configs come from make_reference.py:

    HF_HUB_OFFLINE=1 tests/magpie_ref/.venv/bin/python tests/magpie_ref/make_clone_reference.py OUT_DIR

OUT_DIR/codec_replicate.nemo  tiny codec with a non-causal HiFiGANEncoder, pad_mode replicate (the
                              published nanocodec's encoder); the clone models use it
OUT_DIR/codec_reflect.nemo    the same with HiFiGANEncoder's default pad_mode (reflect)
OUT_DIR/codec_causal.nemo     the same with a CausalHiFiGANEncoder (make_reference.py's codec)
OUT_DIR/clone.nemo            tiny decoder_ce MagpieTTSModel without baked speakers (it keeps its
                              2-layer context encoder), frame stacking 1
OUT_DIR/clone_s2tc.nemo       the same with frame stacking 2 and use_text_conditioning_encoder
OUT_DIR/clip.wav, clip_long.wav  the reference clips (float WAV at the codec's rate)
OUT_DIR/clone.npz, clone.json the arrays and what they are
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

from make_reference import SENTENCES, codec_config, magpie_config, np32, randomize, text_batch  # noqa: E402

GREEDY_FRAMES = 16
TEACHER_FRAMES = 6
# The tiny codec makes 1378 frames a second (16 samples a frame), so the context is kept short:
# 0.15 s is 206 frames, 208 context rows with the context BOS and EOS (the position tables hold 256).
CONTEXT_SECONDS = 0.15
SR = 22050
LOW_SR = 160
M = "nemo.collections.tts.modules.audio_codec_modules."


def make_clips():
    """Two fixed clips: `clip` (2430 samples, shorter than the context, so NeMo's dataset tiles it)
    and `clip_long` (1543 samples, not a whole number of frames, so the codec pads it)."""
    g = np.random.default_rng(7)

    def clip(n):
        t = np.arange(n) / SR
        env = np.minimum(1.0, t * 200.0) * np.exp(-t * 8.0)
        x = 0.4 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 1375 * t + 0.3) + 0.05 * g.standard_normal(n)
        return (env * x).astype(np.float32)

    return clip(2430), clip(1543)


def build_codecs(out: Path):
    """One tiny codec per encoder variant; the decoders are identical (same seed). "lowrate" is the
    replicate codec at 160 Hz (10 frames a second): NeMo wants at least 5 s x frame stacking of
    context with text conditioning, which the tiny models' position tables only hold at that rate."""
    from nemo.collections.tts.models import AudioCodecModel
    from omegaconf import OmegaConf

    variants = {
        "replicate": {"_target_": M + "HiFiGANEncoder", "pad_mode": "replicate"},
        "reflect": {"_target_": M + "HiFiGANEncoder"},
        "causal": {"_target_": M + "CausalHiFiGANEncoder"},
        "lowrate": {"_target_": M + "HiFiGANEncoder", "pad_mode": "replicate"},
    }
    paths = {}
    for tag, enc in variants.items():
        cfg = OmegaConf.to_container(codec_config(LOW_SR if tag == "lowrate" else SR))
        base = cfg["audio_encoder"]
        # Two kernels and dilations, so the residual layers' averaging and dilated padding are exercised.
        cfg["audio_encoder"] = dict(enc, down_sample_rates=base["down_sample_rates"], encoded_dim=base["encoded_dim"],
                                    base_channels=8, activation="lrelu", resblock_kernel_sizes=[3, 5],
                                    resblock_dilation_sizes=[1, 2])
        torch.manual_seed(0)
        codec = AudioCodecModel(cfg=OmegaConf.create(cfg)).eval()
        randomize(codec.audio_decoder, 1, scale=0.3)
        randomize(codec.audio_encoder, 2, scale=0.3)
        paths[tag] = out / f"codec_{tag}.nemo"
        codec.save_to(str(paths[tag]))
    return paths


def dump_encoders(paths, clip_long, arrays, meta):
    from nemo.collections.tts.models import AudioCodecModel

    meta["encoders"] = {}
    audio = torch.tensor(clip_long)[None]
    lens = torch.tensor([len(clip_long)])
    for tag, path in paths.items():
        if tag == "lowrate":
            continue
        codec = AudioCodecModel.restore_from(str(path), map_location="cpu").eval()
        with torch.no_grad():
            latent, latent_len = codec.encode_audio(audio=audio, audio_len=lens)
            codes, codes_len = codec.encode(audio=audio, audio_len=lens)
        arrays[f"enc_{tag}_latent"] = np32(latent)
        arrays[f"enc_{tag}_codes"] = codes.numpy().astype(np.int64)
        meta["encoders"][tag] = dict(frames=int(codes_len[0]), config=dict(codec.cfg.audio_encoder))


def clone_config(codec_path: Path, stacked: bool):
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(magpie_config(str(codec_path), stacked=stacked))
    seconds = 5.0 * 2 if stacked else CONTEXT_SECONDS
    cfg.update(context_duration_min=seconds, context_duration_max=seconds)
    cfg["context_encoder"]["n_layers"] = 2
    cfg["inference_parameters"] = dict(cfg["inference_parameters"], max_decoder_steps=GREEDY_FRAMES)
    if stacked:
        # The text-conditioning flag changes how the audio context is padded (see reference_context).
        cfg.update(use_text_conditioning_encoder=True, text_conditioning_tokenizer_name="english")
    return OmegaConf.create(cfg)


def build_clone(out: Path, codec_path: Path, stacked: bool, seed: int) -> Path:
    """A decoder_ce model that keeps its context encoder (no baked speakers), random weights."""
    from nemo.collections.tts.models import MagpieTTSModel

    torch.manual_seed(0)
    model = MagpieTTSModel(cfg=clone_config(codec_path, stacked)).eval()
    for i, (name, child) in enumerate(model.named_children()):
        if name != "_codec_model":
            randomize(child, seed + i, scale=0.3)
    assert not model.has_baked_context_embedding
    path = out / ("clone_s2tc.nemo" if stacked else "clone.nemo")
    model.save_to(str(path))
    return path


def context_window(wav: np.ndarray, sample_rate: int, spf: int, seconds: float) -> np.ndarray:
    """What NeMo's MagpieTTSDataset feeds the model for a context clip at inference when the
    context duration is fixed (min == max): a whole number of codec frames of audio, the clip tiled
    when it is shorter (a longer clip gets a random window, which no reference can pin down)."""
    from nemo.collections.tts.data.text_to_speech_dataset import MagpieTTSDataset

    holder = type("Holder", (), {"codec_model_samples_per_frame": spf})()
    n = MagpieTTSDataset.get_num_audio_samples_to_slice(holder, seconds, sample_rate)
    assert n >= len(wav), "the reference clip is meant to be shorter than the context"
    return np.tile(wav, int(np.ceil(n / len(wav))))[:n]


def clone_batch(model, context: np.ndarray):
    batch = text_batch(model, SENTENCES["en"], 0)
    del batch["speaker_indices"]
    batch["context_audio"] = torch.tensor(context)[None]
    batch["context_audio_lens"] = torch.tensor([len(context)])
    batch["context_sample_rate"] = model.output_sample_rate
    if model.use_text_conditioning_encoder:
        # The dataset's "no text context" entry, padded to the fixed context length as decoder_ce does.
        name = model.text_conditioning_tokenizer_name
        tokens = model.tokenizer.encode("[NO TEXT CONTEXT]", name)
        need = int(model.cfg.context_duration_max * model.output_sample_rate / model.codec_model_samples_per_frame) + 2
        tokens = (tokens + [model.tokenizer.tokenizer_pad_ids[name]] * need)[:need]
        batch["context_text_tokens"] = torch.tensor([tokens])
        batch["context_text_tokens_lens"] = torch.tensor([len(tokens)])
        batch["has_text_context"] = torch.tensor([False])
    return batch


def dump_clone(model, prefix: str, clip: np.ndarray, arrays: dict, greedy: bool) -> dict:
    from nemo.collections.tts.parts.utils.helpers import get_mask_from_lengths

    context = context_window(clip, model.output_sample_rate, model.codec_model_samples_per_frame,
                             float(model.cfg.context_duration_max))
    batch = clone_batch(model, context)
    arrays[f"{prefix}context_audio"] = context.astype(np.float32)
    arrays[f"{prefix}text_ids"] = batch["text"].numpy().astype(np.int64)
    with torch.no_grad():
        model.decoder.reset_cache(use_cache=False)
        ctx = model.prepare_context_tensors(batch)
        arrays[f"{prefix}context_codes"] = ctx.context_audio_codes.numpy().astype(np.int64)  # with BOS / EOS
        embedded, _ = model._get_context_embeddings(batch, ctx.context_audio_codes, ctx.context_audio_codes_lens)
        arrays[f"{prefix}context_embedded"] = np32(embedded)
        arrays[f"{prefix}context_encoder_out"] = np32(ctx.additional_decoder_input)
        arrays[f"{prefix}context_mask"] = ctx.additional_decoder_mask.numpy().astype(np.int64)

        # Teacher-forced decoder on [context | BOS, codes], as make_reference.py does for baked speakers.
        g = torch.Generator().manual_seed(11)
        C = model.num_audio_codebooks
        codes = torch.randint(0, model.codebook_size, (1, C, TEACHER_FRAMES), generator=g)
        dec_codes = torch.cat([torch.full((1, C, 1), model.audio_bos_id), codes[:, :, :-1]], dim=2)
        emb, emb_lens = model.embed_audio_tokens(dec_codes, torch.tensor([TEACHER_FRAMES]))
        dec_in = torch.cat([ctx.additional_decoder_input, emb], dim=1)
        dec_mask = torch.cat([ctx.additional_decoder_mask, get_mask_from_lengths(emb_lens)], dim=1)
        logits, _, _, _ = model.forward(dec_in, dec_mask, ctx.cond, ctx.cond_mask, None, None)
        arrays[f"{prefix}teacher_decoder_input_codes"] = dec_codes.numpy().astype(np.int64)
        arrays[f"{prefix}decoder_input_embedded"] = np32(dec_in)
        arrays[f"{prefix}decoder_logits"] = np32(logits)

    runs = {}
    if greedy:
        for use_cfg in (False, True):
            tag = "cfg" if use_cfg else "nocfg"
            model.decoder.reset_cache(use_cache=False)
            res = model.infer_batch(batch, use_cfg=use_cfg, use_local_transformer_for_inference=True)
            n = int(res.predicted_codes_lens[0])
            arrays[f"{prefix}greedy_codes_{tag}"] = res.predicted_codes[0, :, :n].numpy().astype(np.int64)
            runs[tag] = {"frames": n}
            # NeMo's KV-cached decoder mode, which metalgen's fast loop (metalgen/magpie/frames.py) follows.
            model.use_kv_cache_for_inference = True
            res = model.infer_batch(batch, use_cfg=use_cfg, use_local_transformer_for_inference=True)
            model.use_kv_cache_for_inference = False
            model.decoder.reset_cache(use_cache=False)
            n = int(res.predicted_codes_lens[0])
            arrays[f"{prefix}greedy_codes_cached_{tag}"] = res.predicted_codes[0, :, :n].numpy().astype(np.int64)
            runs[tag]["cached_frames"] = n
    return runs


def main(out: Path):
    import nemo
    from nemo.collections.tts.models import MagpieTTSModel
    from omegaconf import OmegaConf

    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    out.mkdir(parents=True, exist_ok=True)
    import soundfile as sf

    clip, clip_long = make_clips()
    sf.write(str(out / "clip.wav"), clip, SR, subtype="FLOAT")
    sf.write(str(out / "clip_long.wav"), clip_long, SR, subtype="FLOAT")
    arrays = {"clip": clip, "clip_long": clip_long}
    meta = {"sample_rate": SR, "context_seconds": CONTEXT_SECONDS, "greedy_frames": GREEDY_FRAMES}

    paths = build_codecs(out)
    dump_encoders(paths, clip_long, arrays, meta)

    models = {}
    # The 160 Hz model's context is 10 s = 1600 samples: its clip is the first 700 samples of `clip`.
    arrays["s2tc_clip"] = clip[:700]
    for prefix, stacked, seed in (("", False, 20), ("s2tc_", True, 40)):
        path = build_clone(out, paths["lowrate" if stacked else "replicate"], stacked, seed)
        model = MagpieTTSModel.restore_from(str(path), map_location="cpu").eval()
        assert not model.has_baked_context_embedding
        assert any(k.startswith("context_encoder.") for k in model.state_dict())
        runs = dump_clone(model, prefix, arrays[f"{prefix}clip"], arrays, greedy=not stacked)
        models[prefix or "plain"] = dict(
            file=path.name, greedy=runs,
            magpie_config=OmegaConf.to_container(model.cfg, resolve=True),
            state_dict_keys={k: list(v.shape) for k, v in model.state_dict().items()
                             if not k.startswith("_codec_model.")},
            ids=dict(context_audio_bos_id=model.context_audio_bos_id,
                     context_audio_eos_id=model.context_audio_eos_id),
        )
    meta.update(
        nemo_version=nemo.__version__, torch_version=torch.__version__, models=models,
        shapes={k: list(v.shape) for k, v in arrays.items()},
    )
    np.savez(out / "clone.npz", **arrays)
    (out / "clone.json").write_text(json.dumps(meta, indent=1, default=str))
    print(f"magpie clone reference dump written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_clone_reference.py OUT_DIR")
    main(Path(sys.argv[1]))
