"""llama-cpp-python's ``llama_cpp.llama_chat_format``, the parts pyllama has: chat
formatters (messages -> prompt text + stop strings), the Jinja formatter built from a model's
or a Hugging Face ``tokenizer_config.json``'s chat template, a registry of named formats
and the handler that turns a formatter into ``create_chat_completion``.

Templates render in pyllama's sandbox (:class:`pyllama.chat.ChatTemplate`: jinja2's
ImmutableSandboxedEnvironment with operation, time and size limits), never in a plain
jinja2 environment: a template is untrusted input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Union

from .chat import ChatTemplate, apply_builtin

__all__ = [
    "ChatFormatter",
    "ChatFormatterResponse",
    "Jinja2ChatFormatter",
    "LlamaChatCompletionHandler",
    "chat_formatter_to_chat_completion_handler",
    "format_mistral_instruct",
    "get_chat_completion_handler",
    "get_chat_format",
    "hf_tokenizer_config_to_chat_formatter",
    "register_chat_completion_handler",
    "register_chat_format",
]


@dataclass
class ChatFormatterResponse:
    """A rendered prompt; ``stop`` ends the reply, ``added_special``: the prompt already
    holds the BOS token (do not add another when tokenizing)."""

    prompt: str
    stop: Optional[Union[str, List[str]]] = None
    stopping_criteria: Optional[Any] = None
    added_special: bool = False


class ChatFormatter(Protocol):
    def __call__(self, *, messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse: ...


LlamaChatCompletionHandler = Callable[..., Any]

_FORMATS: Dict[str, ChatFormatter] = {}
_HANDLERS: Dict[str, LlamaChatCompletionHandler] = {}


def register_chat_format(name: str):
    """Decorator: register a formatter under ``name`` (and its completion handler)."""
    def deco(f: ChatFormatter) -> ChatFormatter:
        _FORMATS[name] = f
        return f
    return deco


def register_chat_completion_handler(name: str):
    def deco(f: LlamaChatCompletionHandler) -> LlamaChatCompletionHandler:
        _HANDLERS[name] = f
        return f
    return deco


def get_chat_format(name: str) -> ChatFormatter:
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"invalid chat format {name!r} (valid formats: {sorted(_FORMATS)})") from None


def get_chat_completion_handler(name: str) -> LlamaChatCompletionHandler:
    if name in _HANDLERS:
        return _HANDLERS[name]
    if name in _FORMATS:
        return chat_formatter_to_chat_completion_handler(_FORMATS[name])
    raise ValueError(f"invalid chat handler {name!r} (valid: {sorted(set(_HANDLERS) | set(_FORMATS))})")


class Jinja2ChatFormatter:
    """A formatter from a Jinja chat template (``bos_token`` / ``eos_token`` are its
    variables; ``stop_token_ids`` end generation besides ``eos_token``)."""

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
        return ChatFormatterResponse(prompt=prompt, stop=[self.eos_token],
                                     added_special=bool(self.bos_token) and prompt.startswith(self.bos_token))

    def to_chat_handler(self) -> LlamaChatCompletionHandler:
        return chat_formatter_to_chat_completion_handler(self)


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: Dict[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """A formatter from a Hugging Face ``tokenizer_config.json`` (its ``chat_template``,
    ``bos_token`` and ``eos_token``). Like llama-cpp-python, an empty assistant message is
    appended when ``add_generation_prompt`` (so the template prints the reply's opening)."""
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
        return ChatFormatterResponse(prompt=prompt, stop=eos)

    return format_tokenizer_config


@register_chat_format("mistral-instruct")
def format_mistral_instruct(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """``[INST] user [/INST]assistant</s>`` (BOS left to the tokenizer)."""
    eos = "</s>"
    parts = []
    for m in messages:
        if m["role"] == "user" and isinstance(m.get("content"), str):
            parts.append("[INST] " + m["content"])
        elif m["role"] == "assistant" and m.get("content") is not None:
            parts.append(" [/INST]" + m["content"] + eos)
    return ChatFormatterResponse(prompt="".join(parts) + " [/INST]", stop=eos)


def _builtin(name: str, stop: Optional[str]):
    def fmt(messages: List[Dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
        return ChatFormatterResponse(prompt=apply_builtin(name, messages, True), stop=stop)
    fmt.__name__ = f"format_{name.replace('-', '_')}"
    return fmt


# llama-cpp-python's names for the formats pyllama renders exactly as llama.cpp does
for _name, _builtin_name, _stop in (("chatml", "chatml", "<|im_end|>"), ("llama-2", "llama2", "</s>"),
                                    ("llama-3", "llama3", "<|eot_id|>"), ("gemma", "gemma", "<end_of_turn>"),
                                    ("phi-3", "phi3", "<|end|>"), ("zephyr", "zephyr", "</s>")):
    register_chat_format(_name)(_builtin(_builtin_name, _stop))


def chat_formatter_to_chat_completion_handler(chat_formatter: ChatFormatter) -> LlamaChatCompletionHandler:
    """A ``create_chat_completion`` handler: format, then ``llama.create_completion`` with the
    format's stop strings added; the result reshaped as a chat completion."""
    def handler(*, llama, messages, functions=None, function_call=None, tools=None, tool_choice=None,
                temperature=0.2, top_p=0.95, top_k=40, min_p=0.05, typical_p=1.0, stream=False, stop=None,
                seed=None, response_format=None, max_tokens=None, presence_penalty=0.0, frequency_penalty=0.0,
                repeat_penalty=1.0, tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0, mirostat_eta=0.1, model=None,
                logits_processor=None, grammar=None, logit_bias=None, logprobs=None, top_logprobs=None,
                **kwargs):
        if tools or functions:
            raise NotImplementedError("chat handlers: tools / functions need tool calling, not implemented "
                                      "in pyllama yet (issue 13)")
        from .llama import _response_format_grammar
        grammar = _response_format_grammar("chat handler", response_format, grammar)
        if logprobs or top_logprobs:
            raise NotImplementedError("chat handlers: logprobs are not implemented in pyllama yet")
        r = chat_formatter(messages=messages, **kwargs)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        stops += [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
        prompt = llama.tokenize(r.prompt.encode("utf-8"), add_bos=not r.added_special, special=True)
        out = llama.create_completion(
            prompt=prompt, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            stream=stream, stop=stops, seed=seed, max_tokens=max_tokens, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty, tfs_z=tfs_z,
            mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
            logits_processor=logits_processor, stopping_criteria=r.stopping_criteria, grammar=grammar,
            logit_bias=logit_bias)
        return _chat_stream(out) if stream else _chat_result(out)
    return handler


def _chat_result(c: Dict[str, Any]) -> Dict[str, Any]:
    ch = c["choices"][0]
    return {"id": "chat" + c["id"], "object": "chat.completion", "created": c["created"], "model": c["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ch["text"]}, "logprobs": None,
                         "finish_reason": ch["finish_reason"]}], "usage": c["usage"]}


def _chat_stream(chunks):
    first = True
    for c in chunks:
        base = {"id": "chat" + c["id"], "model": c["model"], "created": c["created"], "object": "chat.completion.chunk"}
        if first:
            yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                        "finish_reason": None}]}
            first = False
        ch = c["choices"][0]
        if ch["finish_reason"] is None or ch["text"]:
            yield {**base, "choices": [{"index": 0, "delta": {"content": ch["text"]}, "logprobs": None,
                                        "finish_reason": None}]}
        if ch["finish_reason"] is not None:
            yield {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": ch["finish_reason"]}]}
