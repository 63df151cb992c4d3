"""OpenAI tool calls on a chat template: how the tools reach the prompt, which grammar keeps
the reply well formed, and how the reply becomes ``tool_calls`` (llama.cpp's common/chat.cpp,
two of its formats).

- **Hermes** (templates that print ``<tool_call>``: Qwen 2.5 / 3, Hermes, ...): the template
  renders ``tools`` itself; the model answers ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`` blocks, possibly after some text. With ``tool_choice`` "required"
  or a named function the reply is constrained to such blocks by a grammar; with "auto"
  the grammar is lazy, as llama.cpp's (common_chat_params_init_hermes_2_pro): the text is
  free until the model writes ``<tool_call>``, or starts its reply as the bare JSON of a
  call (``{"name": "<a tool>"``, maybe in a ```json fence: small Qwen models answer so);
  from there on the call is constrained (``grammar_triggers``,
  pyllama.grammar.LazyGrammarSampler) and parsed in either shape.
- **Generic** (every other template): a system message describes the tools and the reply is
  constrained to a JSON object, ``{"tool_call": {"name", "arguments"}}`` (or
  ``{"tool_calls": [...]}`` with parallel calls) or ``{"response": "..."}`` (not with
  "required"), exactly llama.cpp's generic handler.

Function parameter schemas go through :mod:`pyllama.json_schema`; a keyword it cannot
build is refused by name.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Optional

__all__ = ["ToolCalls", "ToolCallError", "reply_message"]


class ToolCallError(ValueError):
    """Tools or tool_choice that cannot be used (bad shape, unknown function)."""


_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _check_tools(tools: Any) -> list:
    if not isinstance(tools, list) or not tools:
        raise ToolCallError("'tools' must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise ToolCallError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")
        f = t["function"]
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise ToolCallError(f"tools[{i}].function.name must be a non-empty string")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolCallError(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": {**f, "parameters": params}})
    return out


def with_object_arguments(messages: list) -> list:
    """The conversation with earlier assistant tool calls' ``arguments`` as JSON objects
    where OpenAI's shape has them as JSON text (templates print them with ``tojson``), as
    llama.cpp parses them for every chat request, tools offered or not. Other messages and
    arguments that are not valid JSON are left as they are."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(calls, list):
            fixed = []
            for c in calls:
                f = dict(c.get("function", c)) if isinstance(c, dict) else {}
                if isinstance(f.get("arguments"), str):
                    try:
                        f["arguments"] = json.loads(f["arguments"])
                    except json.JSONDecodeError:
                        pass
                fixed.append({**c, "function": f} if isinstance(c, dict) and "function" in c else f)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


class ToolCalls:
    """Tool calling for one request: ``messages()`` / ``template_vars()`` shape the prompt,
    ``grammar`` (GBNF or None) constrains the reply (only from the first match of one of
    the ``grammar_triggers`` regular expressions on, when there are some), ``parse(text)``
    returns ``(content, tool_calls)``."""

    def __init__(self, template_source: str, tools: Any, tool_choice: Any = "auto", parallel: bool = False):
        from .json_schema import json_schema_to_grammar

        self.tools = _check_tools(tools)
        names = [t["function"]["name"] for t in self.tools]
        if tool_choice is None:
            tool_choice = "auto"
        if isinstance(tool_choice, dict):
            fn = tool_choice.get("function", {}) if tool_choice.get("type") == "function" else None
            if not isinstance(fn, dict) or fn.get("name") not in names:
                raise ToolCallError(f"tool_choice {tool_choice!r} names no function of 'tools' ({', '.join(names)})")
            self.tools = [t for t in self.tools if t["function"]["name"] == fn["name"]]
            tool_choice = "required"
        if tool_choice not in ("auto", "required", "none"):
            raise ToolCallError(f"tool_choice must be 'auto', 'required', 'none' or a function, got {tool_choice!r}")
        self.choice = tool_choice
        self.parallel = bool(parallel)
        self.hermes = "<tool_call>" in (template_source or "")
        call = {"anyOf": [{"type": "object", "properties": {
            "name": {"const": t["function"]["name"]}, "arguments": t["function"]["parameters"]},
            "required": ["name", "arguments"]} for t in self.tools]}
        self.grammar: Optional[str] = None
        self.grammar_triggers: list[str] = []
        try:
            if self.hermes:
                if self.choice != "none":
                    g = json_schema_to_grammar(call).replace("root ::=", "tool-call-json ::=", 1)
                    block = '"<tool_call>\\n" tool-call-json "\\n</tool_call>"'
                    more = f' ("\\n" {block})*' if self.parallel else ""
                    if self.choice == "required":
                        self.grammar = f"root ::= {block}{more}\n{g}"
                    else:
                        # free text until a trigger; the grammar takes over from the opening
                        # tag, or from the "{" of a reply that starts as a call's bare JSON
                        self.grammar = f'root ::= {block}{more} | tool-call-json ("\\n"? "```")?\n{g}'
                        alts = "|".join(re.escape(n) for n in names)
                        self.grammar_triggers = [
                            "<tool_call>",
                            f'^\\s*(?:```(?:json)?\\s*)?(\\{{\\s*"name"\\s*:\\s*"(?:{alts})")[\\s\\S]*$']
            elif self.choice != "none":
                if self.parallel:
                    calls = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": call,
                                                                            "minItems": 1}},
                             "required": ["tool_calls"]}
                else:
                    calls = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
                schema = calls if self.choice == "required" else {"anyOf": [calls, {
                    "type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}]}
                self.grammar = json_schema_to_grammar(schema)
                self._schema = schema
        except ValueError as e:  # GrammarError / a schema keyword the converter refuses
            raise ToolCallError(f"tools: {e}") from None

    # -- the prompt -------------------------------------------------------------------

    def messages(self, messages: list) -> list:
        """The conversation as the template should see it: earlier assistant tool calls
        with their arguments as objects (Hermes templates print them with tojson); in the
        generic format, a system message saying how to answer, and tool calls / results as
        JSON text."""
        out = []
        for m in with_object_arguments(messages):
            m = dict(m)
            calls = m.get("tool_calls")
            if m.get("role") == "assistant" and isinstance(calls, list):
                if not self.hermes:  # Hermes templates render tool_calls themselves
                    body = [{"name": f.get("function", f).get("name"), "arguments": f.get("function", f).get("arguments")}
                            for f in calls]
                    m.pop("tool_calls")
                    m["content"] = json.dumps({"tool_calls": body} if len(body) > 1 else {"tool_call": body[0]},
                                              ensure_ascii=False, indent=2)
            elif m.get("role") == "tool" and not self.hermes:
                m = {"role": "user", "content": json.dumps({"tool_response": {
                    "tool": m.get("name", ""), "tool_call_id": m.get("tool_call_id", ""),
                    "content": m.get("content")}}, ensure_ascii=False, indent=2)}
            out.append(m)
        if not self.hermes and self.choice != "none":
            note = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
                    "reply to the user's request" if self.choice != "required"
                    else "Respond in JSON format with `tool_call` (a request to call tools)")
            desc = json.dumps(self.tools, ensure_ascii=False, indent=2)
            text = f"You can call these tools:\n{desc}\n\n{note}"
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}"}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out

    def template_vars(self) -> dict:
        return {"tools": self.tools} if self.hermes and self.choice != "none" else {}

    # -- the reply --------------------------------------------------------------------

    def parse(self, text: str) -> tuple:
        """(content or None, [OpenAI tool_call dicts])."""
        if self.choice == "none":
            return text, []
        if self.hermes:
            calls = []
            for mt in _HERMES_BLOCK.finditer(text):
                try:
                    obj = json.loads(mt.group(1))
                except json.JSONDecodeError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                    calls.append(self._call(obj["name"], obj.get("arguments", {})))
            if not calls:
                # a reply that is one call's bare JSON (maybe fenced), as the lazy grammar allows
                m = re.fullmatch(r"\s*(?:```(?:json)?\s*)?(\{.*\})\s*(?:```)?\s*", text, re.S)
                try:
                    obj = json.loads(m.group(1)) if m else None
                except json.JSONDecodeError:
                    obj = None
                names = {t["function"]["name"] for t in self.tools}
                if isinstance(obj, dict) and obj.get("name") in names:
                    return None, [self._call(obj["name"], obj.get("arguments", {}))]
                return text, []
            content = _HERMES_BLOCK.sub("", text).strip()
            return (content or None), calls
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        if isinstance(obj, dict):
            if isinstance(obj.get("tool_call"), dict):
                c = obj["tool_call"]
                return None, [self._call(c.get("name", ""), c.get("arguments", {}))]
            if isinstance(obj.get("tool_calls"), list):
                return None, [self._call(c.get("name", ""), c.get("arguments", {}))
                              for c in obj["tool_calls"] if isinstance(c, dict)]
            if "response" in obj:
                r = obj["response"]
                return (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)), []
        return text, []

    @staticmethod
    def _call(name: str, arguments: Any) -> dict:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                "function": {"name": name, "arguments": args}}


def reply_message(text: str, tools: Optional[ToolCalls]) -> tuple:
    """(OpenAI assistant message, "tool_calls" or None): the reply, parsed into tool calls
    when the request had tools."""
    if tools is None:
        return {"role": "assistant", "content": text}, None
    content, calls = tools.parse(text)
    if calls:
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": content}, None
