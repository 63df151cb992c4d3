"""Chat templates: turn a list of messages into the prompt text a chat model was trained on.

A model's ``tokenizer.chat_template`` is a Jinja template written by whoever made the file,
so it is untrusted input: it is rendered only in jinja2's ``ImmutableSandboxedEnvironment``
(no attribute access to dunders, no mutation of the caller's objects), with the globals
and filters Hugging Face's ``apply_chat_template`` provides (``raise_exception``,
``strftime_now``, ``tojson`` with ``ensure_ascii=False``, loop controls, the
``{% generation %}`` tag). Errors come out as :class:`ChatTemplateError` naming the template.

When a model has no template, or a name is given instead of one, llama.cpp's built-in
formats (src/llama-chat.cpp) are used: ``chatml`` and a few common families, detected from
the template text the way ``llm_chat_detect_template`` does.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

from .errors import PyllamaError

__all__ = [
    "ChatTemplateError",
    "ChatTemplate",
    "BUILTIN_TEMPLATES",
    "detect_builtin",
    "apply_builtin",
    "render_chat",
]


class ChatTemplateError(PyllamaError, ValueError):
    """A chat template failed to compile or render (or tried something the sandbox forbids)."""


# ----------------------------------------------------------------------------------------
# jinja2 templates


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


_ENV = None


def _env():
    """One sandboxed environment for all templates (compiled templates are cached per text)."""
    global _ENV
    if _ENV is None:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class _Generation(Extension):
            """``{% generation %}...{% endgeneration %}`` (HF's assistant-mask marker):
            renders its body unchanged."""

            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return nodes.Scope(body, lineno=lineno)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[_Generation, "jinja2.ext.loopcontrols"],
            undefined=jinja2.Undefined,
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        _ENV = env
    return _ENV


class ChatTemplate:
    """A compiled Jinja chat template.

    ``render(messages, add_generation_prompt=True, **extra)``: ``messages`` is a list of
    ``{"role": ..., "content": ...}`` dicts; ``extra`` reaches the template as variables
    (``tools``, ``enable_thinking``, ...). ``bos_token`` / ``eos_token`` are the model's
    special token texts (templates usually print BOS themselves). ``polyfill`` applies
    llama.cpp's message workarounds first (see :meth:`_polyfill`).
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", name: str = "chat template"):
        import jinja2

        if not isinstance(source, str):
            raise ChatTemplateError(f"{name}: expected the template text (str), got {type(source).__name__}")
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._supports_system: bool | None = None
        try:
            self._tmpl = _env().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{name}: syntax error at line {e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"{name}: {e}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               *, polyfill: bool = True, **extra) -> str:
        msgs = _check_messages(messages)
        if polyfill:
            msgs = self._polyfill(msgs)
        return self._render(msgs, add_generation_prompt, **extra)

    @property
    def supports_system_role(self) -> bool:
        """Whether the template prints a system message (llama.cpp's capability probe:
        render [system, user] and see if the system text was used)."""
        if self._supports_system is None:
            marker = "System message 8f3a1c"
            try:
                out = self._render([{"role": "system", "content": marker},
                                    {"role": "user", "content": "User message"}], False)
                self._supports_system = marker in out
            except ChatTemplateError:
                self._supports_system = False
        return self._supports_system

    def _polyfill(self, msgs: list[dict]) -> list[dict]:
        """llama.cpp's workarounds (common/chat.cpp): "developer" becomes "system" (except
        for gpt-oss style templates), and a system message the template cannot show is
        merged into the next message ("system\nuser") or dropped when it is alone."""
        if "<|channel|>" not in self.source:
            msgs = [dict(m, role="system") if m.get("role") == "developer" else m for m in msgs]
        if msgs and msgs[0].get("role") == "system" and not self.supports_system_role:
            if len(msgs) > 1:
                merged = dict(msgs[1])
                merged["content"] = f"{msgs[0].get('content', '')}\n{msgs[1].get('content', '')}"
                msgs = [merged] + msgs[2:]
            else:
                msgs = msgs[1:]
        return msgs

    def _render(self, msgs: list[dict], add_generation_prompt: bool, **extra) -> str:
        import jinja2
        from jinja2.sandbox import SecurityError

        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        variables.update(extra)
        variables["messages"] = msgs
        variables["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            return self._tmpl.render(**variables)
        except SecurityError as e:
            raise ChatTemplateError(f"{self.name}: the template tried an unsafe operation: {e}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"{self.name}: {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError,
                RecursionError, OverflowError) as e:
            raise ChatTemplateError(f"{self.name}: rendering failed: {type(e).__name__}: {e}") from None


def _check_messages(messages) -> list[dict]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ChatTemplateError(f"messages[{i}] must be a dict with a 'role' (and 'content'), got {m!r:.80}")
        out.append(dict(m))
    return out


# ----------------------------------------------------------------------------------------
# llama.cpp's built-in formats (src/llama-chat.cpp)


BUILTIN_TEMPLATES = ("chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v7", "phi3", "zephyr", "gemma", "llama3")


def detect_builtin(tmpl: str | None) -> str | None:
    """``llm_chat_detect_template`` for the formats implemented here: a built-in name is
    taken as is; otherwise markers in a Jinja template's text pick the family (None if none)."""
    if not tmpl:
        return None
    if tmpl in BUILTIN_TEMPLATES:
        return tmpl

    def has(s):
        return s in tmpl

    if has("<|im_start|>"):
        if has("<|im_sep|>") or has("<end_of_utterance>"):
            return None  # phi4 / smolvlm: not chatml, not implemented here
        return "chatml"
    if tmpl.startswith("mistral") or has("[INST]"):
        if has("[SYSTEM_PROMPT]"):
            return "mistral-v7"
        if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
            return None
        if has("content.strip()"):
            return "llama2-sys-strip"
        if has("bos_token + '[INST]"):
            return "llama2-sys-bos"
        return "llama2-sys" if has("<<SYS>>") else "llama2"
    if has("<|assistant|>") and has("<|end|>"):
        return "phi3"
    if has("<|user|>") and has("<|endoftext|>"):
        return "zephyr"
    if has("<start_of_turn>"):
        return "gemma"
    if has("<|start_header_id|>") and has("<|end_header_id|>"):
        return "llama3"
    return None


def apply_builtin(name: str, messages: Sequence[Mapping[str, Any]], add_ass: bool = True) -> str:
    """Render ``messages`` in the built-in format ``name`` (text identical to llama.cpp's)."""
    msgs = _check_messages(messages)
    out: list[str] = []
    if name == "chatml":
        for m in msgs:
            out.append(f"<|im_start|>{m['role']}\n{m.get('content', '')}<|im_end|>\n")
        if add_ass:
            out.append("<|im_start|>assistant\n")
    elif name == "mistral-v7":
        for m in msgs:
            role, content = m["role"], m.get("content", "")
            if role == "system":
                out.append(f"[SYSTEM_PROMPT] {content}[/SYSTEM_PROMPT]")
            elif role == "user":
                out.append(f"[INST] {content}[/INST]")
            else:
                out.append(f" {content}</s>")
    elif name in ("llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip"):
        support_system = name != "llama2"
        bos_inside = name == "llama2-sys-bos"
        strip = name == "llama2-sys-strip"
        inside = True  # no BOS before the first turn
        out.append("[INST] ")
        for m in msgs:
            role, content = m["role"], str(m.get("content", ""))
            if strip:
                content = content.strip()
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if support_system else f"{content}\n")
            elif role == "user":
                out.append(f"{content} [/INST]")
            else:
                out.append(f"{content}</s>")
                inside = False
    elif name == "phi3":
        for m in msgs:
            out.append(f"<|{m['role']}|>\n{m.get('content', '')}<|end|>\n")
        if add_ass:
            out.append("<|assistant|>\n")
    elif name == "zephyr":
        for m in msgs:
            out.append(f"<|{m['role']}|>\n{m.get('content', '')}<|endoftext|>\n")
        if add_ass:
            out.append("<|assistant|>\n")
    elif name == "gemma":
        system = ""
        for m in msgs:
            role = m["role"]
            if role == "system":
                system += str(m.get("content", "")).strip()
                continue
            role = "model" if role == "assistant" else role
            out.append(f"<start_of_turn>{role}\n")
            if system and role != "model":
                out.append(f"{system}\n\n")
                system = ""
            out.append(f"{str(m.get('content', '')).strip()}<end_of_turn>\n")
        if add_ass:
            out.append("<start_of_turn>model\n")
    elif name == "llama3":
        for m in msgs:
            out.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
                       f"{str(m.get('content', '')).strip()}<|eot_id|>")
        if add_ass:
            out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    else:
        raise ChatTemplateError(
            f"unknown built-in chat template {name!r}; known: {', '.join(BUILTIN_TEMPLATES)}"
        )
    return "".join(out)


def render_chat(messages: Sequence[Mapping[str, Any]], template: str | None = None, *,
                add_generation_prompt: bool = True, bos_token: str = "", eos_token: str = "",
                **extra) -> str:
    """Render with ``template``: a built-in name, a Jinja template text, or None (chatml,
    llama.cpp's fallback for models without a template)."""
    if template is None or template == "":
        return apply_builtin("chatml", messages, add_generation_prompt)
    if template in BUILTIN_TEMPLATES:
        return apply_builtin(template, messages, add_generation_prompt)
    return ChatTemplate(template, bos_token=bos_token, eos_token=eos_token).render(
        messages, add_generation_prompt, **extra)
