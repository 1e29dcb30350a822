"""Magpie TTS (NeMo MagpieTTSModel + NanoCodec): checkpoint reading, loading and synthesis."""
