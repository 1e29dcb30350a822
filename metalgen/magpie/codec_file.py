"""Reading a NanoCodec `.nemo` into metalgen.models.magpie.codec.NanoCodec (the model layer reads no
files). The decoder is always loaded; the encoder, which only reference-audio cloning needs, on
request or later with `load_encoder`."""

from __future__ import annotations

from pathlib import Path
from typing import Union

import mlx.core as mx
import mlx.nn as nn

from ..errors import MetalgenError
from ..loading import check_weights
from ..models.magpie.codec import NanoCodec, NanoCodecArgs, sanitize
from .nemo_file import read_nemo


def load_codec(path: Union[str, Path], encoder: bool = False) -> NanoCodec:
    """A NanoCodec `.nemo` -> NanoCodec with its decoder weights (and its encoder's with `encoder`),
    checked strictly: every missing, unexpected or misshapen tensor is a one-line MetalgenError
    naming it and the file. The codec remembers `path` (its `source`) for `load_encoder`."""
    path = Path(path)
    config, weights = read_nemo(path)
    args = NanoCodecArgs.from_config(config)
    codec = NanoCodec(args, encoder=encoder)
    params = sanitize(args, weights, str(path), encoder=encoder)
    check_weights(codec, params, {k: str(path) for k in params}, path)
    codec.load_weights(list(params.items()), strict=True)
    mx.eval(codec.parameters())
    codec.source = str(path)
    return codec


def load_encoder(codec: NanoCodec) -> NanoCodec:
    """Add the encoder's weights to a codec loaded without them, from the file it was loaded from
    (a no-op when it has them). Returns `codec`."""
    if codec.has_encoder:
        return codec
    source = getattr(codec, "source", None)
    if not source:
        raise MetalgenError("this codec was not loaded from a file, so its encoder cannot be added")
    path = Path(source)
    if not path.is_file():
        raise MetalgenError(f"the codec's file {path} is gone, so its encoder cannot be loaded")
    _, weights = read_nemo(path)
    codec.add_encoder()
    try:
        params = sanitize(codec.args, weights, str(path), decoder=False, encoder=True)
        # Checked against the encoder alone (the decoder's weights are in place), under its full names.
        holder = nn.Module()
        holder.audio_encoder = codec.audio_encoder
        check_weights(holder, params, {k: str(path) for k in params}, path)
        codec.load_weights(list(params.items()), strict=False)
    except Exception:
        del codec["audio_encoder"]  # leave no encoder with unloaded weights behind
        raise
    mx.eval(codec.audio_encoder.parameters())
    return codec
