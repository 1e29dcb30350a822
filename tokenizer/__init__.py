"""metalgen's tokenizer: the Qwen-family byte-level BPE, in pure Python.

Gives the ids Hugging Face ``tokenizers`` gives for the same files, renders chat
templates as transformers does, and decodes generated ids incrementally. Depends only
on the standard library, ``regex`` and ``jinja2``.

    >>> tok = Tokenizer.from_pretrained("path/to/model")
    >>> ids = tok.encode("Hello world")
    >>> tok.decode(ids)
    'Hello world'
"""

from .added_tokens import AddedToken
from .core import Tokenizer
from .detokenizer import StreamingDetokenizer
from .errors import TokenizerError

__all__ = ["AddedToken", "StreamingDetokenizer", "Tokenizer", "TokenizerError"]
