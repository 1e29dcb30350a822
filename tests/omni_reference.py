"""A tiny random Qwen3-Omni checkpoint saved by transformers' own `save_pretrained`: the
reference for tests/test_omni_*.py (transformers 5 defines `qwen3_omni_moe`).

The shapes are tiny but keep what the real model's arithmetic depends on: the published
special-token and codec ids (so the real Qwen tokenizer and chat template drive it), 16 code
groups, 128 mel bins, the audio encoder's windows (n_window 50, n_window_infer 800) and
Code2Wav's upsampling (1920 samples a frame at 24 kHz). Every parameter is random, norms
and biases included, which transformers would otherwise leave at constants.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 152064
THINKER_LAYERS = 4
ACCEPT_HIDDEN_LAYER = 2
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
CODEC_IDS = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155,
                 codec_think_bos_id=2156, codec_think_eos_id=2157)
TOKEN_IDS = dict(im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                 tts_bos_token_id=151672, tts_eos_token_id=151673, system_token_id=8948, user_token_id=872,
                 assistant_token_id=77091)
MEDIA_IDS = dict(audio_token_id=151675, image_token_id=151655, video_token_id=151656,
                 audio_start_token_id=151669, audio_end_token_id=151670, vision_start_token_id=151652)
ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 1, 1], "interleaved": True,
        "mrope_interleaved": True}
# router logits spread wide enough that float32 noise never swaps two experts at the top-k edge
ROUTER_SCALE = 0.5


def tiny_config_dict() -> dict:
    """The nested config (Hugging Face field names) of the tiny reference model."""
    thinker_text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=THINKER_LAYERS,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True, rms_norm_eps=1e-6,
                        max_position_embeddings=4096, rope_parameters=dict(ROPE))
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
                 output_dim=32, downsample_hidden_size=16, max_source_positions=1500, n_window=50,
                 n_window_infer=800, conv_chunksize=500)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                  deepstack_visual_indexes=[0], num_position_embeddings=64, patch_size=4)
    talker_text = dict(vocab_size=3072, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                       norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=4096,
                       rope_parameters=dict(ROPE))
    predictor = dict(vocab_size=2048, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_code_groups=16,
                     rms_norm_eps=1e-6, max_position_embeddings=4096,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    talker = dict(text_config=talker_text, code_predictor_config=predictor, num_code_groups=16,
                  thinker_hidden_size=32, accept_hidden_layer=ACCEPT_HIDDEN_LAYER, speaker_id=dict(SPEAKERS),
                  spatial_merge_size=2, **CODEC_IDS, **MEDIA_IDS)
    code2wav = dict(codebook_size=2048, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                    intermediate_size=64, num_hidden_layers=2, sliding_window=8, num_quantizers=16,
                    upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=32,
                    max_position_embeddings=8000, rms_norm_eps=1e-5,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    thinker = dict(text_config=thinker_text, audio_config=audio, vision_config=vision, **MEDIA_IDS,
                   user_token_id=872)
    return dict(thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, **TOKEN_IDS)


def build_tiny_omni(seed: int = 0):
    """The tiny Qwen3OmniMoeForConditionalGeneration, fp32, eval mode, every parameter random."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen3OmniMoeConfig(**tiny_config_dict())
    config._attn_implementation = "eager"
    for sub in (config.thinker_config, config.talker_config, config.code2wav_config):
        sub._attn_implementation = "eager"
    model = Qwen3OmniMoeForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("ln_post.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(ROUTER_SCALE * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model.float().eval()


def save_tiny_omni(folder: Path, seed: int = 0):
    """Build the tiny model, save it into `folder` (config.json + safetensors) with the Qwen
    tokenizer files beside it, and return the torch model."""
    import shutil

    from metalgen.dummy import tokenizer_folder

    model = build_tiny_omni(seed)
    folder = Path(folder)
    model.save_pretrained(folder)
    for f in tokenizer_folder().iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    return model


def reference_run(model, ids, speaker: str = "Ethan", thinker_tokens: int = 8, frames: int = 32,
                  input_features=None, feature_attention_mask=None) -> dict:
    """transformers' greedy `generate` on thinker input `ids`, with what it passes between the parts:
    the thinker's tokens, the talker's prompt embeddings, trailing text and tts_pad embedding (as
    handed to `talker.generate`), the talker's raw logits per frame, the code predictor's raw logits
    per frame (G-1, V), the codes (frames, G) and the waveform. Everything as numpy float32 / int."""
    import numpy as np
    import torch

    captured, cp_logits = {}, []
    talker = model.talker
    original = talker.generate

    def capture(**kwargs):
        captured.update({k: kwargs[k] for k in ("inputs_embeds", "trailing_text_hidden", "tts_pad_embed")})
        result = original(**kwargs)
        captured["result"] = result
        return result

    def record(module, args, output):
        cp_logits.append(output.logits[0, -1].detach().float().numpy())

    talker.generate = capture
    hook = talker.code_predictor.register_forward_hook(record)
    extra = {}
    if input_features is not None:
        extra = dict(input_features=input_features, feature_attention_mask=feature_attention_mask)
    try:
        with torch.no_grad():
            sequences, wav = model.generate(
                input_ids=torch.tensor([list(ids)]), speaker=speaker, thinker_max_new_tokens=thinker_tokens,
                thinker_do_sample=False, talker_do_sample=False, talker_max_new_tokens=frames,
                talker_output_logits=True, **extra)
    finally:
        talker.generate = original
        hook.remove()
    result = captured["result"]
    codes = torch.stack([h[-1] for h in result.hidden_states if h[-1] is not None], dim=1)[0]  # (frames, G)
    groups = model.config.talker_config.num_code_groups
    cp = np.stack(cp_logits).reshape(-1, groups - 1, cp_logits[0].shape[-1])
    return dict(
        tokens=sequences[0, len(ids):].tolist(),
        talker_embeds=captured["inputs_embeds"][0].float().numpy(),
        trailing=captured["trailing_text_hidden"][0].float().numpy(),
        tts_pad=captured["tts_pad_embed"][0, 0].float().numpy(),
        talker_logits=torch.stack(result.logits, dim=1)[0].float().numpy(),
        cp_logits=cp,
        codes=codes.numpy(),
        wav=wav.reshape(-1).float().numpy(),
    )
