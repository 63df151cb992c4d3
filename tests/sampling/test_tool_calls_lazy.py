"""tool_choice="auto" on a Hermes template (Qwen2.5-Coder): the reply is free text until the
model opens a ``<tool_call>`` block or starts a call's bare JSON, then the call grammar
constrains it (a lazy grammar, as llama.cpp's common/chat.cpp does), and the calls are
parsed into OpenAI tool_calls."""

from __future__ import annotations

import json

import numpy as np
import pytest

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def qwen(qwen25_path):
    from pyllama import Llama

    return Llama(str(qwen25_path), n_ctx=2048, verbose=False, n_threads=2)


def test_auto_grammar_waits_for_the_opening_tag(qwen):
    from pyllama.grammar import LazyGrammarSampler
    from pyllama.llama_grammar import LlamaGrammar
    from pyllama.tool_calls import ToolCalls

    tc = ToolCalls(qwen._template_source(), WEATHER, "auto")
    assert tc.hermes and tc.grammar_triggers[0] == "<tool_call>" and len(tc.grammar_triggers) == 2
    assert ToolCalls(qwen._template_source(), WEATHER, "required").grammar_triggers == []
    s = LlamaGrammar.lazy(tc.grammar, tc.grammar_triggers).sampler(qwen._vocab)
    assert isinstance(s, LazyGrammarSampler)
    for t in qwen.tokenize(b"Let me check that. ", add_bos=False):
        assert s.allows(t)
        s.accept(t)
    assert s.awaiting_trigger and s.allowed_mask().all()
    for t in qwen.tokenize(b"<tool_call>\n", add_bos=False, special=True):
        s.accept(t)
    assert not s.awaiting_trigger
    pieces = [qwen._vocab.token_to_piece(int(t), special=True) for t in np.nonzero(s.allowed_mask())[0]]
    assert pieces and all(p.startswith(b"{") for p in pieces)  # only the call's JSON object


def test_auto_tool_call_round_trip(qwen):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = qwen.create_chat_completion(ask, tools=WEATHER, tool_choice="auto", max_tokens=80, temperature=0.0)
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    call = ch["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    # the same call written as fenced bare JSON (this model's habit) is constrained and parsed
    r = qwen.create_chat_completion([{"role": "user", "content": "Call get_weather: what is the weather in Paris "
                                                                 "right now?"}],
                                    tools=WEATHER, tool_choice="auto", max_tokens=80, temperature=0.0)
    assert r["choices"][0]["finish_reason"] == "tool_calls", r["choices"][0]
    # a question that needs no tool: free text, no call
    r = qwen.create_chat_completion([{"role": "user", "content": "Say hello in one word."}], tools=WEATHER,
                                    tool_choice="auto", max_tokens=12, temperature=0.0)
    msg = r["choices"][0]["message"]
    assert not msg.get("tool_calls") and msg["content"]
