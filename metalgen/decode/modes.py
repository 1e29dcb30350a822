"""The names of the decode paths (docs/decode.md), kept apart so the CLI can list them."""

# "auto" picks per backend and shape; "*_v1"/"*_v2" pin a version of the decode body.
DECODE_MODES = ("auto", "plain", "compiled", "fused", "megakernel", "reference", "reference_v2",
                "megakernel_v1", "megakernel_v2", "fused_v2")
