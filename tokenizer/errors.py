"""The one exception type the tokenizer package raises for bad files and bad input."""

from __future__ import annotations


class TokenizerError(ValueError):
    """A tokenizer folder, file or input that cannot be used.

    Subclasses ``ValueError`` so callers that already catch bad-value errors keep
    working; the message is always a single line that names the offending thing
    (the folder, the file and what is wrong in it, or the id and the vocab size).
    """
