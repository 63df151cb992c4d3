"""llama-cpp-python's ``llama_grammar`` module on pyllama: :class:`LlamaGrammar` holds GBNF
text (checked when made), ``Llama(..., grammar=...)`` turns it into a
:class:`pyllama.grammar.GrammarSampler` for the model's vocabulary. ``from_json_schema`` converts
a JSON schema with :mod:`pyllama.json_schema`."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .grammar import Grammar, GrammarError, GrammarSampler, LazyGrammarSampler

__all__ = ["LlamaGrammar", "LLAMA_GRAMMAR_DEFAULT_ROOT", "JSON_GBNF", "GrammarError"]

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"

# llama.cpp's grammars/json.gbnf
JSON_GBNF = r'''root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''


class LlamaGrammar:
    """A GBNF grammar (llama-cpp-python's class shape: ``from_string``, ``from_file``,
    ``_grammar``, ``_root``). The text is parsed here, so a bad grammar raises
    :class:`GrammarError` (line, column, what was expected) before any generation; a
    grammar with ``<token>`` references is checked again against the model's vocabulary."""

    def __init__(self, *args, _grammar: str, **kwargs):
        if not isinstance(_grammar, str):
            raise TypeError(f"LlamaGrammar: grammar text must be a str, got {type(_grammar).__name__}")
        self._grammar = _grammar
        self._root = kwargs.get("_root", LLAMA_GRAMMAR_DEFAULT_ROOT)
        try:
            self._compiled: Grammar | None = Grammar(_grammar, self._root)
        except GrammarError as e:
            if "no vocab" not in e.message:
                raise
            self._compiled = None  # <text> token references: resolved with the model's vocabulary

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> "LlamaGrammar":
        return cls(_grammar=grammar)

    @classmethod
    def lazy(cls, grammar: str, trigger_patterns: list[str]) -> "LlamaGrammar":
        """A grammar that applies only from the first match of one of ``trigger_patterns``
        (regular expressions over the generated text) on, as llama.cpp's lazy grammars
        (pyllama.grammar.LazyGrammarSampler; pyllama's addition, used for tool calls)."""
        g = cls(_grammar=grammar)
        g._triggers = list(trigger_patterns)
        return g

    @classmethod
    def from_file(cls, file: Union[str, Path], verbose: bool = True) -> "LlamaGrammar":
        try:
            with open(file, encoding="utf-8") as f:
                grammar = f.read()
        except Exception as err:
            raise Exception(f"{cls.from_file.__name__}: error reading grammar file: {err}") from err
        if grammar:
            return cls.from_string(grammar, verbose=verbose)
        raise ValueError(f"{cls.from_file.__name__}: error parsing grammar file: params_grammer is empty")

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> "LlamaGrammar":
        """GBNF for ``json_schema`` (a JSON string or dict) by :mod:`pyllama.json_schema`
        (llama.cpp's converter semantics); a keyword it does not build raises GrammarError
        naming the keyword and its JSON path."""
        from .json_schema import json_schema_to_grammar
        return cls.from_string(json_schema_to_grammar(json_schema), verbose=verbose)

    def sampler(self, vocab) -> GrammarSampler:
        """A grammar sampler for ``vocab`` (a Vocab or Model) in the start state. Samplers of
        one LlamaGrammar and vocabulary share their mask caches, so a second completion with
        the same grammar reuses the first one's masks."""
        v = getattr(vocab, "vocab", vocab)
        proto = self.__dict__.get("_proto")
        if proto is None or proto[0] is not v:
            g = self._compiled
            if g is None:
                g = Grammar(self._grammar, self._root, v)
            triggers = self.__dict__.get("_triggers")
            s = LazyGrammarSampler(v, g, trigger_patterns=triggers) if triggers else GrammarSampler(v, g)
            proto = self._proto = (v, s)
        s = proto[1].clone()
        s.reset()
        return s

    def __repr__(self) -> str:
        return f"LlamaGrammar(root={self._root!r}, {len(self._grammar)} characters)"
