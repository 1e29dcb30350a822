"""Qwen3-Omni (`model_type` qwen3_omni_moe): thinker, audio encoder, talker, code predictor, Code2Wav."""
