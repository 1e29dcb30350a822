"""The sampling flags that `generate`, `chat` and `bench` share, spelled as mlx_lm.generate spells them."""

from __future__ import annotations


def add_sampling_flags(p, repetition_penalty=None) -> None:
    """--temp, --top-k, --top-p, --min-p, --repetition-penalty, --repetition-context-size on `p` (a parser or
    an argument group); `repetition_penalty` is the penalty's default (None or 1.0: none)."""
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 disables")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 disables")
    p.add_argument("--min-p", type=float, default=0.0, help="0.0 disables")
    p.add_argument("--repetition-penalty", type=float, default=repetition_penalty,
                   help=None if repetition_penalty is None else "1.0 disables")
    p.add_argument("--repetition-context-size", type=int, default=20)
