"""metalgen: an inference engine for Qwen-family decoders on MLX.

    import metalgen
    model, tokenizer = metalgen.load("dummy:qwen3-0.6b")
    for r in metalgen.stream(model, tokenizer, [{"role": "user", "content": "Hi"}]):
        print(r.text, end="", flush=True)
"""

from .api import generate, load, stream
from .batch import BatchGenerator, batch_generate
from .cache import KVCache, LinearAttnCache, load_prompt_cache, make_prompt_cache, save_prompt_cache
from .chat import ChatSession
from .errors import MetalgenError
from .generate import GenerationResponse, generate_step, stream_generate
from .sampling import make_logits_processors, make_sampler

__version__ = "0.1.0"


def __getattr__(name):
    # metalgen.tts (speech) is imported on first use, so text-only users do not pay for it.
    if name == "tts":
        import importlib

        return importlib.import_module(f"{__name__}.tts")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "MetalgenError",
    "load",
    "stream",
    "generate",
    "batch_generate",
    "BatchGenerator",
    "GenerationResponse",
    "generate_step",
    "stream_generate",
    "make_sampler",
    "make_logits_processors",
    "KVCache",
    "LinearAttnCache",
    "make_prompt_cache",
    "ChatSession",
    "save_prompt_cache",
    "load_prompt_cache",
]
