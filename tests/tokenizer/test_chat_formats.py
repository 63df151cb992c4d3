"""pyllama.llama_chat_format against llama-cpp-python 0.3.36's: every named format's prompt
text, stop strings and added_special equal its own (tests/data/chat_formats_llama_cpp_python.json,
made by tools/make_chat_format_reference.py from its sdist); the handler registry; the
Jinja and tokenizer_config formatters; Llama(chat_format=...) choosing as it does."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pyllama import Llama
from pyllama import llama_chat_format as lcf

REF = json.loads((Path(__file__).parents[1] / "data" / "chat_formats_llama_cpp_python.json").read_text())
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.mark.parametrize("name", sorted(REF["expected"]))
def test_named_format_equals_llama_cpp_python(name):
    for cname, msgs in REF["conversations"].items():
        r = lcf.get_chat_format(name)(messages=msgs)
        assert {"prompt": r.prompt, "stop": r.stop, "added_special": r.added_special} == REF["expected"][name][cname]


def test_every_registered_name_has_a_reference_and_a_handler():
    assert set(lcf._FORMATS) == set(REF["expected"])
    for name in REF["expected"]:
        assert callable(lcf.get_chat_completion_handler(name))
    assert lcf.format_vicuna is lcf.format and lcf.format_llama2 is lcf.get_chat_format("llama-2")


def test_registry_semantics():
    reg = lcf.LlamaChatCompletionHandlerRegistry()
    assert reg is lcf.LlamaChatCompletionHandlerRegistry()
    with pytest.raises(lcf.LlamaChatCompletionHandlerNotFoundException, match="Invalid chat handler"):
        lcf.get_chat_completion_handler("no-such-handler")
    with pytest.raises(NotImplementedError, match="functionary"):
        lcf.get_chat_completion_handler("functionary-v2")
    with pytest.raises(NotImplementedError, match="multimodal"):
        lcf.get_chat_completion_handler("llava-1-5")
    with pytest.raises(ValueError, match="already registered"):
        lcf.register_chat_format("chatml")(lcf.format_chatml)

    @lcf.register_chat_format("test-shout")
    def shout(messages, **kwargs):
        return lcf.ChatFormatterResponse(prompt="".join(m["content"].upper() + "\n" for m in messages) + "> ",
                                         stop="\n")
    try:
        assert lcf.get_chat_format("test-shout") is shout
        assert callable(lcf.get_chat_completion_handler("test-shout"))
    finally:
        reg.unregister_chat_handler("test-shout")
    with pytest.raises(ValueError, match="invalid chat format"):
        lcf.get_chat_format("test-shout")
    with pytest.raises(ValueError, match="No formatter registered"):
        reg.unregister_chat_handler("test-shout")


def test_jinja_formatter_and_tokenizer_config():
    f = lcf.Jinja2ChatFormatter(lcf.MISTRAL_INSTRUCT_CHAT_TEMPLATE, eos_token="</s>", bos_token="<s>",
                                stop_token_ids=[2])
    r = f(messages=[{"role": "user", "content": "Hi"}])
    assert r.prompt == "<s>[INST] Hi [/INST]" and r.stop == ["</s>"] and r.added_special
    assert r.stopping_criteria([1, 2], None) and not r.stopping_criteria([2, 1], None)
    with pytest.raises(ValueError, match="alternate"):
        f(messages=[{"role": "assistant", "content": "x"}])
    g = lcf.Jinja2ChatFormatter("{% for t in tools %}{{ t.function.name }};{% endfor %}{{ messages[0].content }}",
                                eos_token="", bos_token="")
    assert g(messages=CHAT, tools=[{"type": "function", "function": {"name": "f"}}]).prompt == "f;Say hello."
    h = lcf.hf_tokenizer_config_to_chat_formatter({"chat_template": lcf.CHATML_CHAT_TEMPLATE, "bos_token": "<s>",
                                                   "eos_token": "<|im_end|>"})
    r = h(messages=CHAT)
    assert r.prompt == "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
    assert r.stop == ["<|im_end|>", "<s>"] and r.added_special
    with pytest.raises(ValueError, match="chat_template"):
        lcf.hf_tokenizer_config_to_chat_formatter({"bos_token": "", "eos_token": ""})


def test_guess_from_metadata():
    g = lcf.guess_chat_format_from_gguf_metadata
    assert g({}) is None and g({"tokenizer.chat_template": "{{ x }}"}) is None
    assert g({"tokenizer.chat_template": lcf.CHATML_CHAT_TEMPLATE}) == "chatml"
    assert g({"tokenizer.chat_template": lcf.MIXTRAL_INSTRUCT_CHAT_TEMPLATE}) == "mistral-instruct"
    assert g({"tokenizer.chat_template": lcf.LLAMA3_INSTRUCT_CHAT_TEMPLATE}) == "llama-3"


@pytest.fixture(scope="module")
def smol_chatml(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=256, chat_format="chatml", verbose=False)


def test_llama_chat_format_name_uses_the_registered_formatter(smol_chatml):
    llm = smol_chatml
    want = lcf.format_chatml(messages=CHAT).prompt
    assert llm._render_chat(CHAT) == want
    # the prompt is what the handler would decode, and the format's stop string applies
    r = llm.create_chat_completion(CHAT, max_tokens=12, temperature=0.0)
    h = lcf.get_chat_completion_handler("chatml")(llama=llm, messages=CHAT, max_tokens=12, temperature=0.0,
                                                  repeat_penalty=1.0)
    assert r["choices"][0]["message"]["content"] == h["choices"][0]["message"]["content"]
    assert r["usage"]["prompt_tokens"] == h["usage"]["prompt_tokens"]


def test_handler_forced_tool_choice_and_bad_tools(smol_chatml):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string", "maxLength": 10}}, "required": ["tz"]}}}]
    h = lcf.get_chat_completion_handler("chatml")
    r = h(llama=smol_chatml, messages=CHAT, tools=tools, max_tokens=30, temperature=0.0,
          tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = r["choices"][0]["message"]["tool_calls"][0]
    assert r["choices"][0]["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_time"
    assert set(json.loads(call["function"]["arguments"])) == {"tz"}
    with pytest.raises(NotImplementedError, match="does not show tools"):
        h(llama=smol_chatml, messages=CHAT, tools=tools, max_tokens=1)
    with pytest.raises(ValueError, match="not found in tools"):
        h(llama=smol_chatml, messages=CHAT, tools=tools, tool_choice={"type": "function", "function": {"name": "x"}})


def test_llama_chat_format_choices(smollm2_path, caplog):
    # SmolLM2's template is no registered one word for word: the template itself
    m = Llama(str(smollm2_path), n_ctx=256, verbose=False)
    assert m.chat_format == "chat_template.default"
    assert m._render_chat(CHAT).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    for name, marker in (("alpaca", "### Instruction: Say hello."), ("vicuna", "USER: Say hello."),
                         ("phi-3", "<|user|>\nSay hello.<|end|>"), ("gemma", "<start_of_turn>user\n")):
        m.chat_format = name
        assert marker in m._render_chat(CHAT)
    m.chat_format = "functionary"
    with pytest.raises(NotImplementedError, match="functionary"):
        m.create_chat_completion(CHAT, max_tokens=1)
    # a GGUF without a chat template (here: SmolLM2's overridden to none): llama-cpp-python's
    # "llama-2", with a warning naming it
    t = Llama(str(smollm2_path), vocab_only=True, verbose=False, kv_overrides={"tokenizer.chat_template": ""})
    assert t.chat_format == "llama-2"
    with caplog.at_level(logging.WARNING, logger="pyllama"):
        assert t._render_chat(CHAT) == lcf.format_llama2(messages=CHAT).prompt
        t._render_chat(CHAT)
    msgs = [r.getMessage() for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(msgs) == 1 and "'llama-2'" in msgs[0]


def test_chat_logprobs_as_llama_cpp_python(smollm2_path):
    """logprobs=True / top_logprobs=N: OpenAI's chat shape of create_completion's
    log-probabilities for the same prompt (logits_all=True needed, as in llama-cpp-python)."""
    llm = Llama(str(smollm2_path), n_ctx=256, logits_all=True, verbose=False)
    r = llm.create_chat_completion(CHAT, max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=2)
    content = r["choices"][0]["logprobs"]["content"]
    prompt = llm._chat_prompt_tokens(CHAT)
    c = llm.create_completion(prompt, max_tokens=6, temperature=0.0, logprobs=2)["choices"][0]
    assert "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"] == c["text"]
    assert [e["logprob"] for e in content] == c["logprobs"]["token_logprobs"]
    assert [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in content] == c["logprobs"]["top_logprobs"]
    assert all(len(e["top_logprobs"]) in (2, 3) for e in content)
    r0 = llm.create_chat_completion(CHAT, max_tokens=2, temperature=0.0, logprobs=True)
    assert len(r0["choices"][0]["logprobs"]["content"]) == 2
    assert llm.create_chat_completion(CHAT, max_tokens=1, logprobs=False)["choices"][0]["logprobs"] is None
    with pytest.raises(ValueError, match="needs logprobs=True"):
        llm.create_chat_completion(CHAT, max_tokens=1, top_logprobs=2)
    with pytest.raises(NotImplementedError, match="stream"):
        llm.create_chat_completion(CHAT, max_tokens=1, logprobs=True, stream=True)
    plain = Llama(str(smollm2_path), n_ctx=256, verbose=False)
    with pytest.raises(ValueError, match="logits_all"):
        plain.create_chat_completion(CHAT, max_tokens=1, logprobs=True)
