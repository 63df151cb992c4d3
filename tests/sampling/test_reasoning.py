"""Thoughts (<think> ... </think>) in chat replies: pyllama.reasoning's split, its streaming
twin, and `pyllama serve`'s reasoning_content (llama-server's --reasoning-format)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyllama.reasoning import FORMATS, StreamSplitter, forced_open, split


@pytest.mark.parametrize("text, fmt, opened, want", [
    ("<think>\nI add.\n</think>\n\nFour.", "auto", False, ("I add.", "Four.")),
    ("<think>\nI add.\n</think>\n\nFour.", "deepseek", False, ("I add.", "Four.")),
    ("<think>\nI add.\n</think>\n\nFour.", "none", False, (None, "<think>\nI add.\n</think>\n\nFour.")),
    ("<think>\nI add.\n</think>\n\nFour.", "deepseek-legacy", False,
     ("I add.", "<think>\nI add.\n</think>\n\nFour.")),
    ("Four.", "auto", False, (None, "Four.")),
    (" <think>x</think>y", "auto", False, (None, " <think>x</think>y")),  # the tag must open the reply
    ("<think>still thinking", "auto", False, ("still thinking", "")),     # unclosed: all thoughts
    ("<think> \n </think>Four.", "auto", False, (None, "Four.")),          # empty thoughts: absent
    ("I add.</think>Four.", "auto", True, ("I add.", "Four.")),            # forced open by the prompt
    ("I add.", "auto", True, ("I add.", "")),
])
def test_split(text, fmt, opened, want):
    assert split(text, fmt, opened) == want


def test_forced_open():
    assert forced_open("<|im_start|>assistant\n<think>\n")
    assert not forced_open("<|im_start|>assistant\n")


def _stream(text: str, cuts: list[int], fmt: str, opened: bool) -> tuple[str, str]:
    sp = StreamSplitter(fmt, opened)
    parts = []
    prev = 0
    for c in sorted(set(cuts)) + [len(text)]:
        parts += sp.feed(text[prev:c])
        prev = c
    parts += sp.finish()
    assert all(t for _, t in parts), parts  # no empty deltas
    return ("".join(t for k, t in parts if k == "reasoning"), "".join(t for k, t in parts if k == "content"))


@settings(max_examples=300, deadline=None)
@given(pre=st.sampled_from(["", "<think>", "<think>\n", "<thi", " <think>"]),
       thoughts=st.text(alphabet="ab <>/\nthink", max_size=20),
       close=st.sampled_from(["", "</think>", "</think>\n\n", "</thin"]),
       rest=st.text(alphabet="xy <>/\n", max_size=12),
       fmt=st.sampled_from(FORMATS), opened=st.booleans(), data=st.data())
def test_stream_splitter_gives_split(pre, thoughts, close, rest, fmt, opened, data):
    """Whatever the chunking, the streamed deltas add up to the whole-reply split."""
    text = pre + thoughts + close + rest
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    r, c = split(text, fmt, opened)
    if fmt == "deepseek-legacy":
        r = None  # streamed, llama-server keeps legacy thoughts inline in the content
    assert _stream(text, cuts, fmt, opened) == (r or "", c)


# ----------------------------------------------------------------------------- the server

GRAMMAR = 'root ::= "<think>\\nI add 2 and 2.\\n</think>\\n\\nFour."'


def _chat(server, stream: bool, **extra):
    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 40, "temperature": 0,
            "grammar": GRAMMAR, "stream": stream, **extra}
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["message"]
    thoughts, content = [], []
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                d = ch["delta"]
                thoughts.append(d.get("reasoning_content") or "")
                content.append(d.get("content") or "")
    return {"reasoning_content": "".join(thoughts) or None, "content": "".join(content)}


@pytest.fixture(scope="module")
def rserver(smollm2_path):
    from test_server import Server

    s = Server(smollm2_path, "-np", "2", "-c", "1024")
    yield s
    s.close()


@pytest.mark.parametrize("stream", [False, True])
def test_server_reasoning_content(rserver, stream):
    m = _chat(rserver, stream)
    assert m["reasoning_content"] == "I add 2 and 2."
    assert m["content"] == "Four."
    m = _chat(rserver, stream, reasoning_format="none")
    assert m.get("reasoning_content") is None
    assert m["content"] == "<think>\nI add 2 and 2.\n</think>\n\nFour."


def test_server_reasoning_forced_open_and_bad_format(rserver):
    # a prefilled assistant message ending in <think> opens the thoughts in the prompt
    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "<think>\n"}],
            "max_tokens": 40, "temperature": 0, "grammar": 'root ::= "I add.\\n</think>\\nFour."'}
    m = rserver.post("/v1/chat/completions", body).json()["choices"][0]["message"]
    assert (m["reasoning_content"], m["content"]) == ("I add.", "Four.")
    r = rserver.post("/v1/chat/completions", {**body, "reasoning_format": "r1"})
    assert r.status_code == 400 and "reasoning_format" in r.json()["error"]["message"]


def test_server_reasoning_format_flag(smollm2_path):
    from test_server import Server

    s = Server(smollm2_path, "-np", "1", "-c", "512", "--reasoning-format", "none")
    try:
        m = _chat(s, False)
        assert m.get("reasoning_content") is None and m["content"].startswith("<think>")
        assert _chat(s, False, reasoning_format="deepseek")["reasoning_content"] == "I add 2 and 2."
    finally:
        s.close()
