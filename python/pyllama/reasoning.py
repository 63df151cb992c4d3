"""Thinking ("reasoning") text in chat replies: llama-server's ``--reasoning-format``.

A reasoning model writes its chain of thought between ``<think>`` and ``</think>`` before
the answer (DeepSeek-R1, Qwen3, QwQ, SmolLM3 ...), or its template opens the tag itself at
the end of the prompt ("thinking forced open": the reply starts inside the thoughts). As
llama.cpp's chat parser does, the reply is split into ``reasoning_content`` (the thoughts,
stripped of surrounding white space; absent when empty) and ``content`` (what follows
``</think>``, leading white space removed). Formats:

- ``none``: no split, the tags stay in ``content``;
- ``auto`` (llama-server's default) and ``deepseek``: thoughts in ``reasoning_content``;
- ``deepseek-legacy``: thoughts in ``reasoning_content`` and the whole reply, tags and all,
  in ``content`` (streamed: the thoughts stay inline in the content deltas, as llama-server).

The tag must open the reply (or the prompt must end with it); an unclosed tag makes the
whole reply thoughts, as llama.cpp allows. Only ``<think>`` tags are recognised (not the
channel markers of gpt-oss or Magistral's ``[THINK]``).
"""

from __future__ import annotations

from typing import Optional

FORMATS = ("auto", "none", "deepseek", "deepseek-legacy")
OPEN, CLOSE = "<think>", "</think>"


def check_format(value, where: str = "reasoning_format") -> str:
    if value not in FORMATS:
        raise ValueError(f"{where} must be one of {', '.join(FORMATS)}, got {value!r}")
    return value


def forced_open(prompt_text: str) -> bool:
    """Whether the rendered prompt ends inside an open thinking tag."""
    return prompt_text.rstrip().endswith(OPEN)


def split(text: str, fmt: str, opened: bool = False) -> tuple[Optional[str], str]:
    """(reasoning_content or None, content) of a whole reply."""
    if fmt == "none":
        return None, text
    if opened:
        body = text
    elif text.startswith(OPEN):
        body = text[len(OPEN):]
    else:
        return None, text
    end = body.find(CLOSE)
    if end < 0:
        thoughts, rest = body, ""
    else:
        thoughts, rest = body[:end], body[end + len(CLOSE):].lstrip()
    reasoning = thoughts.strip() or None
    if fmt == "deepseek-legacy":
        return reasoning, text
    return reasoning, rest


class StreamSplitter:
    """The same split for a reply that arrives in pieces: ``feed(text)`` returns the
    (reasoning, content) deltas that are certain so far (a piece that could be the start of
    a tag is held back until the next one decides it), ``finish()`` the rest. Concatenated,
    the deltas give :func:`split`'s result up to white space at the edges of the thoughts."""

    def __init__(self, fmt: str, opened: bool = False):
        self.fmt = fmt
        # "start": before the reply's first characters (an opening tag may come);
        # "think": inside the thoughts; "after": after </think> (leading white space is dropped);
        # "content": plain content from here on
        self.state = "content" if fmt in ("none", "deepseek-legacy") else ("think" if opened else "start")
        self.buf = ""
        self.started = False  # any reasoning sent yet (leading white space of thoughts is dropped)
        self.pending_ws = ""  # white space inside the thoughts, sent only if more thoughts follow

    def _think(self, s: str, out: list) -> None:
        if not self.started:
            s = s.lstrip()
            if not s:
                return
            self.started = True
        body = s.rstrip()
        if body:
            out.append(("reasoning", self.pending_ws + body))
            self.pending_ws = s[len(body):]
        else:
            self.pending_ws += s

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self.buf += text
        while self.buf:
            if self.state == "content":
                out.append(("content", self.buf))
                self.buf = ""
            elif self.state == "start":
                if self.buf.startswith(OPEN):
                    self.buf = self.buf[len(OPEN):]
                    self.state = "think"
                elif OPEN.startswith(self.buf):
                    break  # maybe the tag: wait for more
                else:
                    self.state = "content"
            elif self.state == "think":
                end = self.buf.find(CLOSE)
                if end >= 0:
                    self._think(self.buf[:end], out)
                    self.buf = self.buf[end + len(CLOSE):]
                    self.state = "after"
                    continue
                # hold back a tail that could begin </think>
                keep = 0
                for k in range(min(len(CLOSE) - 1, len(self.buf)), 0, -1):
                    if CLOSE.startswith(self.buf[-k:]):
                        keep = k
                        break
                self._think(self.buf[:len(self.buf) - keep], out)
                self.buf = self.buf[len(self.buf) - keep:]
                break
            else:  # after
                s = self.buf.lstrip()
                self.buf = ""
                if s:
                    self.state = "content"
                    out.append(("content", s))
        return out

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.buf:
            if self.state == "think":
                self._think(self.buf, out)
            elif self.state == "start":
                out.append(("content", self.buf))
            elif self.state == "after":
                s = self.buf.lstrip()
                if s:
                    out.append(("content", s))
            else:
                out.append(("content", self.buf))
            self.buf = ""
        return out
