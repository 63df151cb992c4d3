"""llama-cpp-python's ``llama_cpp.llama_chat_format`` (0.3.36) on pyllama: chat formatters
(messages -> prompt text + stop strings), the named formats (``format_llama2``,
``format_chatml``, ``format_alpaca``, ... with the same prompt text as llama-cpp-python's),
the Jinja formatter built from a model's or a Hugging Face ``tokenizer_config.json``'s chat
template, the registry of chat completion handlers (``register_chat_format``,
``register_chat_completion_handler``, ``get_chat_completion_handler``), the handler that
turns a formatter into ``create_chat_completion``, and ``guess_chat_format_from_gguf_metadata``.

``Llama(chat_format=NAME)`` renders with the formatter registered under NAME (see
:meth:`pyllama.Llama.create_chat_completion`). Templates render in pyllama's sandbox
(:class:`pyllama.chat.ChatTemplate`: jinja2's ImmutableSandboxedEnvironment with
operation, time and size limits), never in a plain jinja2 environment: a template is
untrusted input.

Not here: llama-cpp-python's handlers for multimodal models (Llava15ChatHandler, ...) and
for functionary / chatml-function-calling prompts; asking for them by name raises
NotImplementedError (pyllama's own tool calling: ``create_chat_completion(tools=...)`` with
the model's template).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Protocol, Tuple, Union

from .chat import ChatTemplate

__all__ = [
    "CHATML_CHAT_TEMPLATE", "CHATML_BOS_TOKEN", "CHATML_EOS_TOKEN", "MISTRAL_INSTRUCT_CHAT_TEMPLATE",
    "MISTRAL_INSTRUCT_BOS_TOKEN", "MISTRAL_INSTRUCT_EOS_TOKEN", "MIXTRAL_INSTRUCT_CHAT_TEMPLATE",
    "LLAMA3_INSTRUCT_CHAT_TEMPLATE",
    "ChatFormatter", "ChatFormatterResponse", "Jinja2ChatFormatter", "LlamaChatCompletionHandler",
    "LlamaChatCompletionHandlerNotFoundException", "LlamaChatCompletionHandlerRegistry",
    "chat_formatter_to_chat_completion_handler", "get_chat_completion_handler", "get_chat_format",
    "guess_chat_format_from_gguf_metadata", "hf_autotokenizer_to_chat_completion_handler",
    "hf_autotokenizer_to_chat_formatter", "hf_tokenizer_config_to_chat_completion_handler",
    "hf_tokenizer_config_to_chat_formatter", "register_chat_completion_handler", "register_chat_format",
    "format_llama2", "format_llama3", "format_alpaca", "format_qwen", "format_vicuna", "format_oasst_llama",
    "format_baichuan2", "format_baichuan", "format_openbuddy", "format_redpajama_incite", "format_snoozy",
    "format_phind", "format_intel", "format_open_orca", "format_mistrallite", "format_zephyr",
    "format_pygmalion", "format_chatml", "format_mistral_instruct", "format_chatglm3", "format_openchat",
    "format_saiga", "format_gemma",
]

log = logging.getLogger("pyllama")

CHATML_CHAT_TEMPLATE = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"  # noqa: E501
CHATML_BOS_TOKEN = "<s>"
CHATML_EOS_TOKEN = "<|im_end|>"

MISTRAL_INSTRUCT_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"  # noqa: E501
MISTRAL_INSTRUCT_BOS_TOKEN = "<s>"
MISTRAL_INSTRUCT_EOS_TOKEN = "</s>"

MIXTRAL_INSTRUCT_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"  # noqa: E501

LLAMA3_INSTRUCT_CHAT_TEMPLATE = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"  # noqa: E501


# -- chat completion handlers and their registry ------------------------------------------


class LlamaChatCompletionHandler(Protocol):
    """``handler(*, llama, messages, **create_chat_completion_arguments)`` -> a
    ``chat.completion`` dict, or an iterator of ``chat.completion.chunk`` dicts."""

    def __call__(self, *, llama: Any, messages: List[Dict[str, Any]], **kwargs: Any) -> Any: ...


class LlamaChatCompletionHandlerNotFoundException(Exception):
    pass


class LlamaChatCompletionHandlerRegistry:
    """The handlers by name (one registry per process, as llama-cpp-python's singleton)."""

    _instance: Optional["LlamaChatCompletionHandlerRegistry"] = None
    _chat_handlers: Dict[str, LlamaChatCompletionHandler] = {}

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def register_chat_completion_handler(self, name: str, chat_handler: LlamaChatCompletionHandler,
                                         overwrite: bool = False) -> None:
        if not overwrite and name in self._chat_handlers:
            raise ValueError(f"Formatter with name '{name}' is already registered. Use `overwrite=True` to "
                             "overwrite it.")
        self._chat_handlers[name] = chat_handler

    def unregister_chat_handler(self, name: str) -> None:
        if name not in self._chat_handlers:
            raise ValueError(f"No formatter registered under the name '{name}'.")
        del self._chat_handlers[name]
        _FORMATS.pop(name, None)

    def get_chat_completion_handler_by_name(self, name: str) -> LlamaChatCompletionHandler:
        try:
            return self._chat_handlers[name]
        except KeyError:
            if name in _NOT_PROVIDED:
                raise NotImplementedError(f"chat handler {name!r}: {_NOT_PROVIDED[name]}") from None
            raise LlamaChatCompletionHandlerNotFoundException(
                f"Invalid chat handler: {name} (valid formats: {list(self._chat_handlers.keys())})") from None


# llama-cpp-python's handlers pyllama does not have, and why
_FUNC_WHY = ("functionary / chatml-function-calling prompts are not implemented in pyllama; pass tools= to "
             "create_chat_completion with the model's own template (chat_format=None)")
_VISION_WHY = "multimodal (image) chat handlers are not implemented in pyllama: it runs text models only"
_NOT_PROVIDED = {"functionary": _FUNC_WHY, "functionary-v1": _FUNC_WHY, "functionary-v2": _FUNC_WHY,
                 "chatml-function-calling": _FUNC_WHY, "llava-1-5": _VISION_WHY, "llava-1-6": _VISION_WHY,
                 "moondream2": _VISION_WHY, "nanollava": _VISION_WHY, "llama-3-vision-alpha": _VISION_WHY,
                 "minicpm-v-2.6": _VISION_WHY, "qwen2.5-vl": _VISION_WHY}


def get_chat_completion_handler(name: str) -> LlamaChatCompletionHandler:
    return LlamaChatCompletionHandlerRegistry().get_chat_completion_handler_by_name(name)


def register_chat_completion_handler(name: str):
    """Decorator: register a chat completion handler under ``name``."""
    def decorator(f: LlamaChatCompletionHandler):
        LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(name, f)
        return f
    return decorator


# -- formatters -------------------------------------------------------------------------------


@dataclass
class ChatFormatterResponse:
    """A rendered prompt; ``stop`` ends the reply, ``stopping_criteria`` too;
    ``added_special``: the prompt already holds the special tokens the model adds (BOS), so
    the handler tokenizes it without adding them."""

    prompt: str
    stop: Optional[Union[str, List[str]]] = None
    stopping_criteria: Optional[Any] = None
    added_special: bool = False


class ChatFormatter(Protocol):
    def __call__(self, *, messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse: ...


class Jinja2ChatFormatter:
    """A formatter from a Jinja chat template: ``bos_token`` / ``eos_token``, ``messages``,
    ``add_generation_prompt``, ``tools`` / ``tool_choice`` (and the legacy ``functions`` /
    ``function_call``) and any other keyword are its variables; ``raise_exception`` and
    ``strftime_now`` are there too. The reply stops at ``eos_token``, and after any of
    ``stop_token_ids``. The prompt is marked ``added_special``: the template prints BOS."""

    accepts_tools = True  # the template sees tools=; the handler may pass them

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: Optional[List[int]] = None):
        self.template = template
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids is not None else None
        self._tmpl = ChatTemplate(template, bos_token=bos_token, eos_token=eos_token)

    def __call__(self, *, messages: List[Dict[str, Any]], functions=None, function_call=None, tools=None,
                 tool_choice=None, **kwargs: Any) -> ChatFormatterResponse:
        prompt = self._tmpl.render(messages, self.add_generation_prompt, polyfill=False, functions=functions,
                                   function_call=function_call, tools=tools, tool_choice=tool_choice, **kwargs)
        stopping_criteria = None
        if self.stop_token_ids is not None:
            from .llama import StoppingCriteriaList

            ids = self.stop_token_ids

            def stop_on_last_token(tokens, logits) -> bool:
                return len(tokens) > 0 and int(tokens[-1]) in ids

            stopping_criteria = StoppingCriteriaList([stop_on_last_token])
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token], stopping_criteria=stopping_criteria,
                                     added_special=True)

    def to_chat_handler(self) -> LlamaChatCompletionHandler:
        return chat_formatter_to_chat_completion_handler(self)


def hf_autotokenizer_to_chat_formatter(pretrained_model_name_or_path) -> ChatFormatter:
    """A formatter from ``transformers.AutoTokenizer.from_pretrained(...)``'s
    ``apply_chat_template`` (needs the transformers package)."""
    try:
        from transformers import AutoTokenizer  # type: ignore
    except ImportError:
        raise ImportError("hf_autotokenizer_to_chat_formatter needs the transformers package "
                          "(pip install transformers); hf_tokenizer_config_to_chat_formatter needs only "
                          "the tokenizer_config.json") from None
    tokenizer = AutoTokenizer.from_pretrained(pretrained_model_name_or_path)

    def format_autotokenizer(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
        tokenizer.use_default_system_prompt = False
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        if not isinstance(prompt, str):
            raise TypeError(f"apply_chat_template returned {type(prompt).__name__}, not the prompt text")
        return ChatFormatterResponse(prompt=prompt, stop=tokenizer.eos_token, added_special=True)

    format_autotokenizer.accepts_tools = True  # type: ignore[attr-defined]
    return format_autotokenizer


def hf_autotokenizer_to_chat_completion_handler(pretrained_model_name_or_path) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(hf_autotokenizer_to_chat_formatter(pretrained_model_name_or_path))


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: Dict[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """A formatter from a Hugging Face ``tokenizer_config.json`` (its ``chat_template``,
    ``bos_token`` and ``eos_token``). Like llama-cpp-python, an empty assistant message is
    appended when ``add_generation_prompt`` (so the template prints the reply's opening),
    and the reply stops at eos_token or bos_token."""
    if not isinstance(tokenizer_config, dict):
        raise TypeError(f"tokenizer_config must be a dict (the parsed tokenizer_config.json), "
                        f"got {type(tokenizer_config).__name__}")
    for key in ("chat_template", "bos_token", "eos_token"):
        if not isinstance(tokenizer_config.get(key), str):
            raise ValueError(f"tokenizer_config[{key!r}] must be a str, got {tokenizer_config.get(key)!r}")
    bos, eos = tokenizer_config["bos_token"], tokenizer_config["eos_token"]
    tmpl = ChatTemplate(tokenizer_config["chat_template"], bos_token=bos, eos_token=eos,
                        name="tokenizer_config chat_template")

    def format_tokenizer_config(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
        if add_generation_prompt:
            messages = [*messages, {"role": "assistant", "content": ""}]
        prompt = tmpl.render(messages, False, polyfill=False, **kwargs)
        return ChatFormatterResponse(prompt=prompt, stop=[eos, bos], added_special=True)

    format_tokenizer_config.accepts_tools = True  # type: ignore[attr-defined]
    return format_tokenizer_config


def hf_tokenizer_config_to_chat_completion_handler(tokenizer_config: Dict[str, Any],
                                                   add_generation_prompt: bool = True) -> LlamaChatCompletionHandler:
    return chat_formatter_to_chat_completion_handler(
        hf_tokenizer_config_to_chat_formatter(tokenizer_config, add_generation_prompt=add_generation_prompt))


def guess_chat_format_from_gguf_metadata(metadata: Dict[str, str]) -> Optional[str]:
    """The registered format whose template the GGUF's ``tokenizer.chat_template`` is,
    word for word (chatml, mistral-instruct, llama-3), else None."""
    tmpl = metadata.get("tokenizer.chat_template")
    if tmpl is None:
        return None
    if tmpl == CHATML_CHAT_TEMPLATE:
        return "chatml"
    if tmpl in (MISTRAL_INSTRUCT_CHAT_TEMPLATE, MIXTRAL_INSTRUCT_CHAT_TEMPLATE):
        return "mistral-instruct"
    if tmpl == LLAMA3_INSTRUCT_CHAT_TEMPLATE:
        return "llama-3"
    return None


# -- formatter -> create_chat_completion --------------------------------------------------


def _tools_of(functions, function_call, tools, tool_choice):
    """llama-cpp-python: legacy functions / function_call become tools / tool_choice."""
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, dict) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, tool_choice


def chat_formatter_to_chat_completion_handler(chat_formatter: ChatFormatter) -> LlamaChatCompletionHandler:
    """A ``create_chat_completion`` handler, as llama-cpp-python's: format the messages,
    then ``llama.create_completion`` with the format's stop strings and stopping criteria
    added; ``response_format`` json_object (with or without a schema) becomes a grammar;
    ``tool_choice={"type": "function", "function": {"name": N}}`` constrains the reply to
    N's parameters schema and returns it as a tool call; ``logprobs`` / ``top_logprobs``
    ask create_completion for log-probabilities (the Llama needs logits_all=True)."""

    def chat_completion_handler(*, llama, messages, functions=None, function_call=None, tools=None,
                                tool_choice=None, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05,
                                typical_p=1.0, stream=False, stop=[], seed=None, response_format=None,
                                max_tokens=None, presence_penalty=0.0, frequency_penalty=0.0, repeat_penalty=1.1,
                                tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1, model=None,
                                logits_processor=None, grammar=None, logit_bias=None, logprobs=None,
                                top_logprobs=None, **kwargs):
        from .llama import _response_format_grammar
        from .llama_grammar import LlamaGrammar

        tools, tool_choice = _tools_of(functions, function_call, tools, tool_choice)
        forced = isinstance(tool_choice, dict)
        if tools and not forced and not getattr(chat_formatter, "accepts_tools", False):
            raise NotImplementedError(
                f"chat format {getattr(chat_formatter, '__name__', chat_formatter)!r} does not show tools to "
                "the model; pass tool_choice={'type': 'function', 'function': {'name': ...}} to force a call, "
                "or use the model's own template (chat_format=None) for pyllama's tool calling")
        if getattr(chat_formatter, "accepts_tools", False):
            result = chat_formatter(messages=messages, functions=functions, function_call=function_call,
                                    tools=tools, tool_choice=tool_choice, **kwargs)
        else:
            result = chat_formatter(messages=messages, **kwargs)
        prompt = llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        if result.stop is not None:
            stop = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
            stop = stop + (result.stop if isinstance(result.stop, list) else [result.stop])
        grammar = _response_format_grammar("chat handler", response_format, grammar)
        tool = None
        if forced:
            if not tools:
                raise ValueError("tool_choice names a function but no tools= were given")
            name = tool_choice.get("function", {}).get("name")
            tool = next((t for t in tools if t.get("function", {}).get("name") == name), None)
            if tool is None:
                raise ValueError(f"Tool choice '{name}' not found in tools.")
            grammar = LlamaGrammar.from_json_schema(json.dumps(tool["function"].get("parameters", {})),
                                                    verbose=llama.verbose)
        out = llama.create_completion(
            prompt=prompt, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            logprobs=top_logprobs if logprobs else None, stream=stream, stop=stop, seed=seed,
            max_tokens=max_tokens, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            repeat_penalty=repeat_penalty, tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
            mirostat_eta=mirostat_eta, model=model, logits_processor=logits_processor,
            stopping_criteria=result.stopping_criteria, grammar=grammar, logit_bias=logit_bias)
        if tool is not None:
            return _convert_completion_to_chat_function(tool["function"]["name"], out, stream)
        return _convert_completion_to_chat(out, stream=stream)

    return chat_completion_handler


def _convert_text_completion_logprobs_to_chat(logprobs: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if logprobs is None:
        return None
    return {
        "content": [
            {"token": token, "bytes": None, "logprob": logprob,
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top.items()]}
            for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"])
        ],
        "refusal": None,
    }


def _convert_text_completion_to_chat(completion: Dict[str, Any]) -> Dict[str, Any]:
    ch = completion["choices"][0]
    return {
        "id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
        "model": completion["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]},
                     "logprobs": _convert_text_completion_logprobs_to_chat(ch["logprobs"]),
                     "finish_reason": ch["finish_reason"]}],
        "usage": completion["usage"],
    }


def _convert_text_completion_chunks_to_chat(chunks: Iterator[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    for i, chunk in enumerate(chunks):
        base = {"id": "chat" + chunk["id"], "model": chunk["model"], "created": chunk["created"],
                "object": "chat.completion.chunk"}
        if i == 0:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                        "finish_reason": None}]}
        ch = chunk["choices"][0]
        yield {**base, "choices": [{"index": 0,
                                    "delta": {"content": ch["text"]} if ch["finish_reason"] is None else {},
                                    "logprobs": _convert_text_completion_logprobs_to_chat(ch["logprobs"]),
                                    "finish_reason": ch["finish_reason"]}]}


def _convert_completion_to_chat(completion_or_chunks, stream: bool = False):
    if stream:
        return _convert_text_completion_chunks_to_chat(completion_or_chunks)
    return _convert_text_completion_to_chat(completion_or_chunks)


def _convert_completion_to_chat_function(tool_name: str, completion_or_chunks, stream: bool):
    """A completion constrained to a tool's arguments, as a chat completion that calls it."""
    if not stream:
        c = completion_or_chunks
        ch = c["choices"][0]
        tool_id = "call_" + "_0_" + tool_name + "_" + c["id"]
        return {
            "id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": None,
                                     "function_call": {"name": tool_name, "arguments": ch["text"]},
                                     "tool_calls": [{"id": tool_id, "type": "function",
                                                     "function": {"name": tool_name, "arguments": ch["text"]}}]},
                         "logprobs": _convert_text_completion_logprobs_to_chat(ch["logprobs"]),
                         "finish_reason": "tool_calls"}],
            "usage": c["usage"],
        }

    def gen():
        head = None
        for chunk in completion_or_chunks:
            ch = chunk["choices"][0]
            base = {"id": "chat" + chunk["id"], "object": "chat.completion.chunk", "created": chunk["created"],
                    "model": chunk["model"]}
            if head is None:
                head = base
                tool_id = "call_" + "_0_" + tool_name + "_" + chunk["id"]
                yield {**base, "choices": [{"index": 0, "finish_reason": None, "logprobs": None,
                                            "delta": {"role": "assistant", "content": None, "function_call": None,
                                                      "tool_calls": None}}]}
            yield {**base, "choices": [{
                "index": 0, "finish_reason": None,
                "logprobs": _convert_text_completion_logprobs_to_chat(ch["logprobs"]),
                "delta": {"role": None, "content": None,
                          "function_call": {"name": tool_name, "arguments": ch["text"]},
                          "tool_calls": [{"index": 0, "id": tool_id, "type": "function",
                                          "function": {"name": tool_name, "arguments": ch["text"]}}]}}]}
        if head is not None:
            yield {**head, "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                                        "delta": {"role": None, "content": None, "function_call": None,
                                                  "tool_calls": None}}]}

    return gen()


# -- the named formats (llama-cpp-python's prompt text, built the same way) ----------------


def _get_system_message(messages: List[Dict[str, Any]]) -> str:
    """The first system message's content."""
    for m in messages:
        if m["role"] == "system":
            return m["content"] or ""
    return ""


def _map_roles(messages: List[Dict[str, Any]], role_map: Dict[str, str]) -> List[Tuple[str, Optional[str]]]:
    """(mapped role, content) of the messages whose role is in ``role_map`` (content None
    when it is not a str)."""
    return [(role_map[m["role"]], m["content"] if isinstance(m.get("content"), str) else None)
            for m in messages if m["role"] in role_map]


def _format_llama2(system_message: str, messages, sep: str, sep2: str) -> str:
    seps = [sep, sep2]
    ret = system_message + sep
    for i, (role, message) in enumerate(messages):
        if system_message and i == 0:
            ret += (message or "") + seps[i % 2]
        elif message:
            ret += role + message + " " + seps[i % 2]
        else:
            ret += role + " "
    return ret


def _format_add_colon_single(system_message: str, messages, sep: str) -> str:
    ret = system_message + sep
    for role, message in messages:
        ret += role + ": " + message + sep if message else role + ":"
    return ret


def _format_add_colon_two(system_message: str, messages, sep: str, sep2: str) -> str:
    seps = [sep, sep2]
    ret = system_message + seps[0]
    for i, (role, message) in enumerate(messages):
        ret += role + ": " + message + seps[i % 2] if message else role + ":"
    return ret


def _format_no_colon_single(system_message: str, messages, sep: str) -> str:
    ret = system_message
    for role, message in messages:
        ret += role + message + sep if message else role
    return ret


def _format_add_colon_space_single(system_message: str, messages, sep: str) -> str:
    ret = system_message + sep
    for role, message in messages:
        ret += role + ": " + message + sep if message else role + ": "  # must end with a space
    return ret


def _format_chatml(system_message: str, messages, sep: str) -> str:
    ret = "" if system_message == "" else system_message + sep + "\n"
    for role, message in messages:
        ret += role + "\n" + message + sep + "\n" if message else role + "\n"
    return ret


def _format_chatglm3(system_message: str, messages, sep: str) -> str:
    ret = system_message or ""
    for role, message in messages:
        ret += role + "\n" + " " + message if message else role
    return ret


_FORMATS: Dict[str, ChatFormatter] = {}


def register_chat_format(name: str):
    """Decorator: register a formatter under ``name`` (its chat completion handler goes in
    the registry; ``Llama(chat_format=name)`` renders with it)."""
    def decorator(f: ChatFormatter) -> ChatFormatter:
        LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
            name, chat_formatter_to_chat_completion_handler(f))
        _FORMATS[name] = f
        return f
    return decorator


def get_chat_format(name: str) -> ChatFormatter:
    """The formatter registered under ``name`` with :func:`register_chat_format` (pyllama's
    addition: llama-cpp-python keeps only the handler)."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"invalid chat format {name!r} (valid formats: {sorted(_FORMATS)})") from None


# see https://github.com/huggingface/transformers/blob/main/src/transformers/models/llama/tokenization_llama.py
# system prompt is "embedded" in the first message
@register_chat_format("llama-2")
def format_llama2(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _system_template = "[INST] <<SYS>>\n{system_message}\n<</SYS>>"
    _roles = dict(user="<s>[INST]", assistant="[/INST]")
    _messages = _map_roles(messages, _roles)
    system_message = _get_system_message(messages)
    if system_message:
        system_message = _system_template.format(system_message=system_message)
    _prompt = _format_llama2(system_message, _messages, " ", "</s>") + "[/INST]"
    return ChatFormatterResponse(prompt=_prompt)


# https://github.com/meta-llama/llama3/blob/main/llama/tokenizer.py#L202-L229
@register_chat_format("llama-3")
def format_llama3(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(system="<|start_header_id|>system<|end_header_id|>\n\n",
                  user="<|start_header_id|>user<|end_header_id|>\n\n",
                  assistant="<|start_header_id|>assistant<|end_header_id|>\n\n")
    _sep = "<|eot_id|>"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_no_colon_single("", _messages, _sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)


@register_chat_format("alpaca")
def format_alpaca(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="### Instruction", assistant="### Response")
    _sep = "\n\n"
    _sep2 = "</s>"
    system_message = _get_system_message(messages)
    _messages = _map_roles(messages, _roles)
    _prompt = _format_add_colon_two(system_message, _messages, _sep, _sep2)
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("qwen")
def format_qwen(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="<|im_start|>user", assistant="<|im_start|>assistant")
    system_message = _get_system_message(messages) or "You are a helpful assistant."
    system_message = "<|im_start|>system\n{system_message}".format(system_message=system_message)
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_chatml(system_message, _messages, "<|im_end|>")
    return ChatFormatterResponse(prompt=_prompt, stop="<|endoftext|>")


@register_chat_format("vicuna")
def format_vicuna(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _system_message = ("A chat between a curious user and an artificial intelligence assistant. The assistant "
                       "gives helpful, detailed, and polite answers to the user's questions.")
    _roles = dict(user="USER", assistant="ASSISTANT")
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_add_colon_two(_system_message, _messages, " ", "</s>")
    return ChatFormatterResponse(prompt=_prompt)


format = format_vicuna  # llama-cpp-python's name for it  # noqa: A001


@register_chat_format("oasst_llama")
def format_oasst_llama(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _system_template = "[INST] <<SYS>>\n{system_message}\n<</SYS>>\n\n"
    _roles = dict(user="<|prompter|>", assistant="<|assistant|>")
    system_message = _system_template.format(system_message=_get_system_message(messages))
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_no_colon_single(system_message, _messages, "</s>")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("baichuan-2")
def format_baichuan2(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="<reserved_106>", assistant="<reserved_107>")
    system_message = _get_system_message(messages)
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_no_colon_single(system_message, _messages, "")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("baichuan")
def format_baichuan(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="<reserved_102>", assistant="<reserved_103>")
    system_message = _get_system_message(messages)
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_no_colon_single(system_message, _messages, "")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("openbuddy")
def format_openbuddy(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _system_message = """You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.
Always answer as helpfully and logically as possible, while being safe. Your answers should not include any harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure that your responses are socially unbiased and positive in nature.
If a question does not make any sense, or is not factually coherent, explain why instead of answering something not correct. If you don't know the answer to a question, please don't share false information.
You can speak fluently in many languages, for example: English, Chinese.
You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.
You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.

"""  # noqa: E501
    _roles = dict(user="User", assistant="Assistant")
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_add_colon_single(_system_message, _messages, "\n")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("redpajama-incite")
def format_redpajama_incite(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="<human>", assistant="<bot>")
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_add_colon_single(_get_system_message(messages), _messages, "\n")
    return ChatFormatterResponse(prompt=_prompt, stop="<human>")


@register_chat_format("snoozy")
def format_snoozy(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    default_system_message = ("The prompt below is a question to answer, a task to complete, or a conversation to "
                              "respond to; decide which and write an appropriate response.")
    # llama-cpp-python formats "### Instruction:\n{system_message}" and then uses the bare
    # system message: kept, so the prompt text is the same
    _system_message = _get_system_message(messages) or default_system_message
    _roles = dict(user="### Prompt", assistant="### Response")
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_add_colon_single(_system_message, _messages, "\n")
    return ChatFormatterResponse(prompt=_prompt, stop="###")


@register_chat_format("phind")
def format_phind(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="### User Message", assistant="### Assistant")
    _system_message = "### System Prompt\nYou are an intelligent programming assistant."
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_add_colon_single(_system_message, _messages, "\n\n")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("intel")
def format_intel(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="### User:", assistant="### Assistant:")
    # llama-cpp-python's text, placeholder included (it is never filled in there either)
    _system_message = "### System:\n{system_message}"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_add_colon_single(_system_message, _messages, "\n")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("open-orca")
def format_open_orca(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system_message = (
        "You are a helpful assistant. Please answer truthfully and write out your "
        "thinking step by step to be sure you get the right answer. If you make a mistake or encounter "
        "an error in your thinking, say so out loud and attempt to correct it. If you don't know or "
        "aren't sure about something, say so clearly. You will act as a professional logician, mathematician, "
        "and physicist. You will also act as the most appropriate type of expert to answer any particular "
        "question or solve the relevant problem; state which expert type your are, if so. Also think of "
        "any particular named expert that would be ideal to answer the relevant question or solve the "
        "relevant problem; name and act as them, if appropriate."
    )
    roles = ("User", "Assistant")
    sep = "<|end_of_turn|>\n"
    _messages = _map_roles(messages, dict(zip(roles, roles)))
    _messages.append((roles[1], None))
    _prompt = _format_add_colon_space_single(system_message, _messages, sep)
    return ChatFormatterResponse(prompt=_prompt, stop="User")


@register_chat_format("mistrallite")
def format_mistrallite(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _roles = dict(user="<|prompter|>", assistant="</s>\n<|assistant|>")
    system_message = "<|system|>{system_message}</s>".format(system_message=_get_system_message(messages))
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_no_colon_single(system_message, _messages, " ")
    return ChatFormatterResponse(prompt=_prompt)


@register_chat_format("zephyr")
def format_zephyr(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system_message = "<|system|>\n{system_message}".format(system_message=_get_system_message(messages))
    _roles = dict(user="<|user|>\n", assistant="<|assistant|>\n")
    _sep = "</s>"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_chatml(system_message, _messages, _sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)


@register_chat_format("pygmalion")
def format_pygmalion(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system_message = "<|system|>{system_message}".format(system_message=_get_system_message(messages))
    _roles = dict(user="<|user|>", assistant="<|model|>")
    _sep = "\n"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_chatml(system_message, _messages, _sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)


@register_chat_format("chatml")
def format_chatml(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system_message = "<|im_start|>system\n{system_message}".format(system_message=_get_system_message(messages))
    _roles = dict(user="<|im_start|>user", assistant="<|im_start|>assistant")
    _sep = "<|im_end|>"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_chatml(system_message, _messages, _sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)


@register_chat_format("mistral-instruct")
def format_mistral_instruct(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """``[INST] user [/INST]assistant</s>`` (BOS left to the tokenizer)."""
    eos = "</s>"
    prompt = ""
    for m in messages:
        if m["role"] == "user" and isinstance(m.get("content"), str):
            prompt += "[INST] " + m["content"]
        elif m["role"] == "assistant" and m.get("content") is not None:
            prompt += " [/INST]" + m["content"] + eos
    prompt += " [/INST]"
    return ChatFormatterResponse(prompt=prompt, stop=eos)


@register_chat_format("chatglm3")
def format_chatglm3(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system_message = "<|system|>\n{system_message}".format(system_message=_get_system_message(messages))
    _roles = dict(user="<|user|>", assistant="<|assistant|>")
    _sep = "</s>"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_chatglm3(system_message, _messages, _sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)


@register_chat_format("openchat")
def format_openchat(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system_message = "{system_message}<|end_of_turn|>".format(system_message=_get_system_message(messages))
    _roles = dict(user="GPT4 Correct User: ", assistant="<|end_of_turn|>GPT4 Correct Assistant: ")
    _sep = "<|end_of_turn|>"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_chatml(system_message, _messages, _sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)


# https://huggingface.co/collections/IlyaGusev/saiga2-saigamistral-6505d4ccc3d1e53166b636cd
@register_chat_format("saiga")
def format_saiga(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    _message_template = "<s>{role}\n{content}</s>"
    _roles = dict(user="user", bot="bot", system="system")
    _prompt = ""
    for role, content in _map_roles(messages, _roles):
        _prompt += _message_template.format(role=role, content=content) if content else f"<s>{role}\n"
    _prompt += "<s>bot"
    return ChatFormatterResponse(prompt=_prompt.strip())


# https://huggingface.co/collections/google/gemma-release-65d5efbccdbb8c4202ec078b
@register_chat_format("gemma")
def format_gemma(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    if _get_system_message(messages) != "":
        log.debug("`role='system'` messages are not allowed on Google's Gemma models.")
    _roles = dict(user="<start_of_turn>user\n", assistant="<start_of_turn>model\n")
    _sep = "<end_of_turn>\n"
    _messages = _map_roles(messages, _roles)
    _messages.append((_roles["assistant"], None))
    _prompt = _format_no_colon_single(system_message="", messages=_messages, sep=_sep)
    return ChatFormatterResponse(prompt=_prompt, stop=_sep)
