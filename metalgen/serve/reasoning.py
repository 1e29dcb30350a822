"""Qwen3's and Qwen3.5's thinking block, split from the answer as `reasoning_content`.

The model writes `<think>` ... `</think>` before its answer (Qwen3.5's template, and Qwen3's with thinking
on, may open the block in the prompt itself, so the reply starts inside it). `ReasoningSplitter` takes the
reply's text as it streams and hands back (kind, text) pieces, holding back what could still be the start
of a tag."""

from __future__ import annotations

from typing import List, Tuple

OPEN, CLOSE = "<think>", "</think>"


def partial_tail(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Feed the reply's text; get ("reasoning" | "content", text) pieces. `in_reasoning`: the prompt
    opened the block already."""

    def __init__(self, in_reasoning: bool = False):
        self.state = "reasoning" if in_reasoning else "start"
        self.buf = ""

    def feed(self, text: str) -> List[Tuple[str, str]]:
        self.buf += text
        out: List[Tuple[str, str]] = []
        while self.buf:
            if self.state == "start":  # only leading whitespace may come before an opening tag
                stripped = self.buf.lstrip()
                if stripped.startswith(OPEN):
                    self.buf, self.state = stripped[len(OPEN):], "reasoning"
                    continue
                if stripped and not OPEN.startswith(stripped):
                    self.state = "content"
                    continue
                break  # whitespace or a partial "<think": wait
            if self.state == "reasoning":
                i = self.buf.find(CLOSE)
                if i >= 0:
                    if i:
                        out.append(("reasoning", self.buf[:i]))
                    self.buf, self.state = self.buf[i + len(CLOSE):], "after"
                    continue
                keep = partial_tail(self.buf, CLOSE)
                if len(self.buf) > keep:
                    out.append(("reasoning", self.buf[:len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep:]
                break
            if self.state == "after":  # the newlines between the block and the answer are neither
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    break
                self.state = "content"
            out.append(("content", self.buf))
            self.buf = ""
        return out

    def finish(self) -> List[Tuple[str, str]]:
        """What is still held back, at the end of the reply."""
        rest, self.buf = self.buf, ""
        if not rest:
            return []
        if self.state == "after":
            rest = rest.lstrip("\n")
        return [("reasoning" if self.state == "reasoning" else "content", rest)] if rest else []


def opens_in_prompt(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves the thinking block open (the reply starts inside it)."""
    tail = prompt_text.rstrip()
    return tail.endswith(OPEN)
