"""Magpie TTS model modules: the NanoCodec decoder and the Magpie transformer stacks."""
