"""GBNF grammars (llama.cpp's src/llama-grammar.cpp): the parser, the pushdown matcher and
the grammar sampler that masks tokens a grammar cannot accept (issue 13, step 15 of the
pipeline: a sampler in the chain).

Parsing gives llama.cpp's rule elements, so the parser tests compare with llama.cpp's own
expected element lists. All rules are laid out in one flat element list; a *position* is
an index into it (llama.cpp's ``const llama_grammar_element *``) and a *stack* is a tuple
of positions, top last. Stacks are advanced until their top is a terminal (a char class or
a token) or they are empty (the grammar may end there).

The sampler keeps each vocabulary token's code points (decoded from its bytes once per
vocabulary) in a trie ordered so that every trie node's tokens are one contiguous range of
a sorted token order; a token mask is one walk of that trie against the stacks, cached per
set of stacks. llama.cpp walks each candidate on its own; the verdicts are the same.

Two engines run the matcher with the same semantics: the Rust one (pyllama._core's
GrammarRules / GrammarState / TokenTrie, rust/core/src/grammar.rs; the default) and the
Python one here, kept as the reference the Rust masks are tested against bit for bit.
``engine="py"`` (or the environment variable ``PYLLAMA_GRAMMAR=py``) selects the Python one.
"""

from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from typing import Iterable, Optional, Sequence

import numpy as np

from .errors import PyllamaError
from .sampling import Sampler

__all__ = [
    "GrammarError", "Grammar", "GrammarMatcher", "GrammarSampler", "LazyGrammarSampler", "parse_grammar",
    "END", "ALT", "RULE_REF", "CHAR", "CHAR_NOT", "CHAR_RNG_UPPER", "CHAR_ALT", "CHAR_ANY",
    "TOKEN", "TOKEN_NOT", "GRETYPE_NAMES", "ENGINES",
]

ENGINES = ("rust", "py")


def _engine_name(engine: str | None) -> str:
    """The matcher engine: ``engine``, else $PYLLAMA_GRAMMAR, else "rust"."""
    e = engine if engine is not None else (os.environ.get("PYLLAMA_GRAMMAR") or "rust")
    if e not in ENGINES:
        raise ValueError(f"grammar engine must be one of {ENGINES} (engine= or PYLLAMA_GRAMMAR), got {e!r}")
    return e

# llama_gretype
END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = range(10)
GRETYPE_NAMES = ["END", "ALT", "RULE_REF", "CHAR", "CHAR_NOT", "CHAR_RNG_UPPER", "CHAR_ALT", "CHAR_ANY",
                 "TOKEN", "TOKEN_NOT"]

MAX_REPETITION_THRESHOLD = 2000
_UINT64_MAX = (1 << 64) - 1


class GrammarError(PyllamaError, ValueError):
    """A grammar llama.cpp refuses: ``line`` and ``column`` (1-based, None when the
    problem is not at one place, e.g. an undefined rule) and ``expected``."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 expected: str | None = None):
        self.message, self.line, self.column, self.expected = message, line, column, expected
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"grammar: {message}{where}")


# ---------------------------------------------------------------------------------------
# parser (llama_grammar_parser)


def _is_word_char(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "-" or ("0" <= c <= "9")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class _Parser:
    def __init__(self, src: str, vocab=None):
        nul = src.find("\0")
        self.src = src if nul < 0 else src[:nul]  # a C string ends at NUL
        self.vocab = vocab
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[list[tuple[int, int]]] = []

    # -- helpers ---------------------------------------------------------------
    def at(self, i: int) -> str:
        return self.src[i] if i < len(self.src) else ""

    def fail(self, msg: str, pos: int | None, expected: str | None = None):
        if pos is None:
            raise GrammarError(msg, expected=expected)
        line = self.src.count("\n", 0, pos) + 1
        col = pos - (self.src.rfind("\n", 0, pos) + 1) + 1
        raise GrammarError(msg, line, col, expected)

    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.src
        n = len(s)
        while pos < n:
            c = s[pos]
            if c == " " or c == "\t":
                pos += 1
            elif c == "#":
                while pos < n and s[pos] not in "\r\n":
                    pos += 1
            elif newline_ok and (c == "\r" or c == "\n"):
                pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while _is_word_char(self.at(end)):
            end += 1
        if end == pos:
            self.fail("expecting name", pos, "name")
        return end

    def integer(self, pos: int) -> int:
        end = pos
        while _is_digit(self.at(end)):
            end += 1
        if end == pos:
            self.fail("expecting integer", pos, "integer")
        return end

    def hex(self, pos: int, size: int) -> tuple[int, int]:
        value, p, end = 0, pos, pos + size
        while p < end and self.at(p):
            c = self.at(p)
            if c in "0123456789abcdefABCDEF":
                value = (value << 4) + int(c, 16)
                p += 1
            else:
                break
        if p != end:
            self.fail(f"expecting {size} hex chars", pos, f"{size} hex digits")
        return value, p

    def char(self, pos: int) -> tuple[int, int]:
        c = self.at(pos)
        if c == "\\":
            e = self.at(pos + 1)
            if e == "x":
                return self.hex(pos + 2, 2)
            if e == "u":
                return self.hex(pos + 2, 4)
            if e == "U":
                return self.hex(pos + 2, 8)
            if e in ("t", "r", "n"):
                return {"t": 9, "r": 13, "n": 10}[e], pos + 2
            if e and e in '\\"[]-':
                return ord(e), pos + 2
            self.fail("unknown escape", pos, "one of \\x \\u \\U \\t \\r \\n \\\\ \\\" \\[ \\] \\-")
        if c:
            return ord(c), pos + 1
        self.fail("unexpected end of input", pos, "a character")

    def token(self, pos: int) -> tuple[int, int]:
        start = pos
        if self.at(pos) != "<":
            self.fail("expecting '<'", pos, "'<'")
        pos += 1
        if self.at(pos) == "[":
            pos += 1
            end = self.integer(pos)
            tid = int(self.src[pos:end])
            if tid > 0xFFFFFFFF:
                self.fail("parsed token id is too big", pos, "a token id below 2**32")
            pos = end
            if self.at(pos) != "]":
                self.fail("expecting ']'", pos, "']'")
            pos += 1
            if self.at(pos) != ">":
                self.fail("expecting '>'", pos, "'>'")
            return tid, pos + 1
        if self.vocab is None:
            self.fail("no vocab to parse token", start, "<[id]> (a <text> token needs a vocabulary)")
        while self.at(pos) and self.at(pos) != ">":
            pos += 1
        if self.at(pos) != ">":
            self.fail("expecting '>'", pos, "'>'")
        pos += 1
        text = self.src[start:pos]
        toks = self.vocab.tokenize(text, add_special=False, parse_special=True)
        if len(toks) != 1:
            self.fail(f"invalid token '{text}' (it must be exactly one token)", start, "a single token")
        return int(toks[0]), pos

    def get_symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol_id(self, base: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: list) -> None:
        while len(self.rules) <= rule_id:
            self.rules.append([])
        self.rules[rule_id] = rule

    # -- grammar -----------------------------------------------------------------
    def alternates(self, pos: int, rule_name: str, rule_id: int, nested: bool) -> int:
        rule: list[tuple[int, int]] = []
        pos = self.sequence(pos, rule_name, rule, nested)
        while self.at(pos) == "|":
            rule.append((ALT, 0))
            pos = self.space(pos + 1, True)
            pos = self.sequence(pos, rule_name, rule, nested)
        rule.append((END, 0))
        self.add_rule(rule_id, rule)
        return pos

    def sequence(self, pos: int, rule_name: str, rule: list, nested: bool) -> int:
        last_sym_start = len(rule)
        n_prev_rules = 1

        def repetitions(min_times: int, max_times: int) -> None:
            nonlocal n_prev_rules
            no_max = max_times == _UINT64_MAX
            if last_sym_start == len(rule):
                self.fail("expecting preceding item to */+/?/{", pos, "an item before */+/?/{")
            prev = rule[last_sym_start:]
            total = 1
            if not no_max and max_times > 0:
                total = max_times
            elif min_times > 0:
                total = min_times
            if n_prev_rules * total > MAX_REPETITION_THRESHOLD:
                self.fail("number of rules that are going to be repeated multiplied by the new repetition "
                          f"exceeds {MAX_REPETITION_THRESHOLD}", pos, "fewer repetitions")
            if min_times == 0:
                del rule[last_sym_start:]
            else:
                for _ in range(1, min_times):
                    rule.extend(prev)
            last_rec = 0
            n_opt = 1 if no_max else max_times - min_times
            for i in range(n_opt):
                rec = list(prev)
                rec_id = self.generate_symbol_id(rule_name)
                if i > 0 or no_max:
                    rec.append((RULE_REF, rec_id if no_max else last_rec))
                rec.append((ALT, 0))
                rec.append((END, 0))
                self.add_rule(rec_id, rec)
                last_rec = rec_id
            if n_opt > 0:
                rule.append((RULE_REF, last_rec))
            n_prev_rules *= total

        while True:
            c = self.at(pos)
            if not c:
                break
            if c == '"':
                pos += 1
                last_sym_start, n_prev_rules = len(rule), 1
                while self.at(pos) != '"':
                    if not self.at(pos):
                        self.fail("unexpected end of input", pos, "'\"'")
                    ch, pos = self.char(pos)
                    rule.append((CHAR, ch))
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                start_type = CHAR
                if self.at(pos) == "^":
                    pos += 1
                    start_type = CHAR_NOT
                last_sym_start, n_prev_rules = len(rule), 1
                while self.at(pos) != "]":
                    if not self.at(pos):
                        self.fail("unexpected end of input", pos, "']'")
                    ch, pos = self.char(pos)
                    rule.append((CHAR_ALT if last_sym_start < len(rule) else start_type, ch))
                    if self.at(pos) == "-" and self.at(pos + 1) != "]":
                        if not self.at(pos + 1):
                            self.fail("unexpected end of input", pos + 1, "']'")
                        ch, pos = self.char(pos + 1)
                        rule.append((CHAR_RNG_UPPER, ch))
                pos = self.space(pos + 1, nested)
            elif c == "<" or c == "!":
                typ = TOKEN
                if c == "!":
                    typ = TOKEN_NOT
                    pos += 1
                tid, pos = self.token(pos)
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append((typ, tid))
                pos = self.space(pos, nested)
            elif _is_word_char(c):
                end = self.name(pos)
                ref = self.get_symbol_id(self.src[pos:end])
                pos = self.space(end, nested)
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append((RULE_REF, ref))
            elif c == "(":
                pos = self.space(pos + 1, True)
                n_before = len(self.symbol_ids)
                sub = self.generate_symbol_id(rule_name)
                pos = self.alternates(pos, rule_name, sub, True)
                n_prev_rules = max(1, len(self.symbol_ids) - n_before)
                last_sym_start = len(rule)
                rule.append((RULE_REF, sub))
                if self.at(pos) != ")":
                    self.fail("expecting ')'", pos, "')'")
                pos = self.space(pos + 1, nested)
            elif c == ".":
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append((CHAR_ANY, 0))
                pos = self.space(pos + 1, nested)
            elif c == "*":
                pos = self.space(pos + 1, nested)
                repetitions(0, _UINT64_MAX)
            elif c == "+":
                pos = self.space(pos + 1, nested)
                repetitions(1, _UINT64_MAX)
            elif c == "?":
                pos = self.space(pos + 1, nested)
                repetitions(0, 1)
            elif c == "{":
                pos = self.space(pos + 1, nested)
                if not _is_digit(self.at(pos)):
                    self.fail("expecting an int", pos, "an integer")
                end = self.integer(pos)
                min_times = int(self.src[pos:end])
                pos = self.space(end, nested)
                max_times = _UINT64_MAX
                if self.at(pos) == "}":
                    max_times = min_times
                    pos = self.space(pos + 1, nested)
                elif self.at(pos) == ",":
                    pos = self.space(pos + 1, nested)
                    if _is_digit(self.at(pos)):
                        end = self.integer(pos)
                        max_times = int(self.src[pos:end])
                        pos = self.space(end, nested)
                    if self.at(pos) != "}":
                        self.fail("expecting '}'", pos, "'}'")
                    pos = self.space(pos + 1, nested)
                else:
                    self.fail("expecting ','", pos, "',' or '}'")
                if min_times > MAX_REPETITION_THRESHOLD:
                    self.fail(f"number of repetitions exceeds {MAX_REPETITION_THRESHOLD}", pos,
                              f"at most {MAX_REPETITION_THRESHOLD} repetitions")
                if max_times != _UINT64_MAX and max_times > MAX_REPETITION_THRESHOLD:
                    max_times = _UINT64_MAX  # as llama.cpp: a large bound becomes no bound
                if max_times < min_times:
                    # llama.cpp's unsigned n_opt would wrap around and loop ~forever
                    self.fail(f"repetition {{{min_times},{max_times}}} has max < min", pos, "max >= min")
                repetitions(min_times, max_times)
            else:
                break
        return pos

    def rule(self, pos: int) -> int:
        end = self.name(pos)
        name = self.src[pos:end]
        p = self.space(end, False)
        rule_id = self.get_symbol_id(name)
        if self.src[p:p + 3] != "::=":
            self.fail("expecting ::=", p, "'::='")
        p = self.space(p + 3, True)
        p = self.alternates(p, name, rule_id, False)
        c = self.at(p)
        if c == "\r":
            p += 2 if self.at(p + 1) == "\n" else 1
        elif c == "\n":
            p += 1
        elif c:
            self.fail("expecting newline or end", p, "a newline or the end of the grammar")
        return self.space(p, True)

    def parse(self) -> None:
        pos = self.space(0, True)
        while pos < len(self.src):
            pos = self.rule(pos)
        names = {v: k for k, v in self.symbol_ids.items()}
        for rule in self.rules:
            if not rule:
                raise GrammarError("Undefined rule")
            for typ, val in rule:
                if typ == RULE_REF and (val >= len(self.rules) or not self.rules[val]):
                    raise GrammarError(f"Undefined rule identifier '{names[val]}'",
                                       expected=f"a definition of rule '{names[val]}'")


def parse_grammar(text: str, vocab=None) -> tuple[dict[str, int], list[list[tuple[int, int]]]]:
    """llama_grammar_parser::parse: ``(symbol_ids, rules)``, each rule a list of
    ``(type, value)`` ending in ``(END, 0)``; raises GrammarError where llama.cpp fails."""
    if not isinstance(text, str):
        raise TypeError(f"grammar text must be a str, got {type(text).__name__}")
    p = _Parser(text, vocab)
    try:
        p.parse()
    except RecursionError:
        raise GrammarError("grammar nests too deeply", expected="less nesting") from None
    return p.symbol_ids, p.rules


# ---------------------------------------------------------------------------------------
# the compiled grammar and its matcher


def decode_utf8(data: bytes, partial: tuple[int, int] = (0, 0)) -> tuple[list[int], tuple[int, int]]:
    """llama.cpp's decode_utf8(string, partial_start): code points (without the terminating
    0) and the partial state ``(value, n_remain)``; n_remain -1 marks an invalid sequence
    (then no code points count). A NUL byte ends the input, as in a C string."""
    nul = data.find(b"\0")
    if nul >= 0:
        data = data[:nul]
    cps: list[int] = []
    value, n_remain = partial
    i, n = 0, len(data)
    while i < n and n_remain > 0:
        b = data[i]
        if b >> 6 != 2:
            return [], (0, -1)
        value = (value << 6) + (b & 0x3F)
        i += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        cps.append(value)
    while i < n:
        b = data[i]
        n_remain = _UTF8_LOOKUP[b >> 4] - 1
        if n_remain < 0:
            return [], (0, n_remain)
        value = b & ((1 << (7 - n_remain)) - 1)
        i += 1
        while i < n and n_remain > 0:
            value = (value << 6) + (data[i] & 0x3F)
            i += 1
            n_remain -= 1
        if n_remain == 0:
            cps.append(value)
    # llama.cpp keeps the last value when nothing is pending; it is never read then
    return cps, ((value, n_remain) if n_remain else (0, 0))


_UTF8_LOOKUP = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)


class Grammar:
    """A parsed and checked grammar: flat elements, the start stacks, and the memoized
    expansions the matcher needs. Immutable; matchers share it."""

    def __init__(self, text: str, root: str = "root", vocab=None):
        symbol_ids, rules = parse_grammar(text, vocab)
        if not rules:
            raise GrammarError("empty grammar", expected="at least one rule")
        if root not in symbol_ids:
            raise GrammarError(f"grammar does not contain a '{root}' symbol", expected=f"a rule named '{root}'")
        self.text, self.root, self.symbol_ids, self.rules = text, root, symbol_ids, rules
        _check_left_recursion(rules, {v: k for k, v in symbol_ids.items()})
        # flat layout: position -> (type, value); rule_start[rule id] -> first position
        self.types: list[int] = []
        self.values: list[int] = []
        self.rule_start: list[int] = []
        for rule in rules:
            self.rule_start.append(len(self.types))
            for t, v in rule:
                self.types.append(t)
                self.values.append(v)
        self._closure: dict[int, tuple[tuple[tuple[int, ...], ...], bool]] = {}
        self._classes: dict[int, tuple] = {}
        self.start_stacks = self._start_stacks(self.rule_start[symbol_ids[root]])

    @classmethod
    def from_string(cls, text: str, root: str = "root", vocab=None) -> "Grammar":
        return cls(text, root, vocab)

    def _is_eos(self, pos: int) -> bool:
        t = self.types[pos]
        return t == END or t == ALT

    def _alternatives(self, pos: int) -> Iterable[int]:
        """First positions of the alternatives starting at ``pos`` (a rule's first element)."""
        while True:
            yield pos
            while not self._is_eos(pos):
                pos += 1
            if self.types[pos] == ALT:
                pos += 1
            else:
                return

    def _start_stacks(self, pos: int) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for alt in self._alternatives(pos):
            self.advance(() if self._is_eos(alt) else (alt,), out)
        return out

    def char_class(self, pos: int) -> tuple:
        """``(positive, ranges, any, next position)`` of the char element at ``pos``."""
        cc = self._classes.get(pos)
        if cc is None:
            types, values = self.types, self.values
            positive = types[pos] in (CHAR, CHAR_ANY)
            ranges, any_ = [], False
            p = pos
            while True:
                if types[p + 1] == CHAR_RNG_UPPER:
                    ranges.append((values[p], values[p + 1]))
                    p += 2
                elif types[p] == CHAR_ANY:
                    any_ = True
                    p += 1
                else:
                    ranges.append((values[p], values[p]))
                    p += 1
                if types[p] != CHAR_ALT:
                    break
            cc = self._classes[pos] = (positive, tuple(ranges), any_, p)
        return cc

    def match_char(self, pos: int, chr_: int) -> bool:
        positive, ranges, any_, _ = self.char_class(pos)
        found = any_
        if not found:
            for lo, hi in ranges:
                if lo <= chr_ <= hi:
                    found = True
                    break
        return found == positive

    def match_partial_char(self, pos: int, partial: tuple[int, int]) -> bool:
        positive, ranges, any_, _ = self.char_class(pos)
        value, n_remain = partial
        if n_remain < 0 or (n_remain == 1 and value < 2):
            return False
        low = value << (n_remain * 6)
        high = low | ((1 << (n_remain * 6)) - 1)
        if low == 0:
            if n_remain == 2:
                low = 1 << 11
            elif n_remain == 3:
                low = 1 << 16
        if any_:
            # llama.cpp returns true at the '.' (ranges before it in the class are checked first)
            for lo, hi in ranges:
                if lo <= high and low <= hi:
                    return positive
            return True
        for lo, hi in ranges:
            if lo <= high and low <= hi:
                return positive
        return not positive

    def closure(self, pos: int) -> tuple[tuple[tuple[int, ...], ...], bool]:
        """llama_grammar_advance_stack for a stack whose top is ``pos``, relative to the rest:
        the suffixes (ending at a terminal) that replace ``pos``, and whether ``pos`` can be
        consumed entirely (then the stack below is advanced too)."""
        c = self._closure.get(pos)
        if c is not None:
            return c
        types, values, rule_start = self.types, self.values, self.rule_start
        out: list[tuple[int, ...]] = []
        out_set: set = set()
        nullable = False
        todo = [(pos,)]
        seen: set = set()
        while todo:
            st = todo.pop()
            if st in seen:
                continue
            seen.add(st)
            if not st:
                nullable = True
                continue
            top = st[-1]
            t = types[top]
            if t == RULE_REF:
                base = st[:-1]
                if not self._is_eos(top + 1):
                    base = base + (top + 1,)
                for alt in self._alternatives(rule_start[values[top]]):
                    todo.append(base if self._is_eos(alt) else base + (alt,))
            elif t in (CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT):
                if st not in out_set:
                    out_set.add(st)
                    out.append(st)
            else:  # pragma: no cover - the parser never leaves a stack on these
                raise AssertionError(f"grammar stack on element {GRETYPE_NAMES[t]}")
        c = self._closure[pos] = (tuple(out), nullable)
        return c

    def advance(self, stack: tuple[int, ...], out: list) -> None:
        """Append to ``out`` the stacks ``stack`` expands to (no duplicates)."""
        while True:
            if not stack:
                if () not in out:
                    out.append(())
                return
            suffixes, nullable = self.closure(stack[-1])
            base = stack[:-1]
            for s in suffixes:
                ns = base + s
                if ns not in out:
                    out.append(ns)
            if not nullable:
                return
            stack = base

    def after_char(self, stack: tuple[int, ...], out: list) -> None:
        """Advance ``stack`` (top: a char element that matched) past its char class."""
        nxt = self.char_class(stack[-1])[3]
        base = stack[:-1]
        self.advance(base if self._is_eos(nxt) else base + (nxt,), out)

    def accept_chr(self, stacks: Sequence[tuple[int, ...]], chr_: int) -> list[tuple[int, ...]]:
        """llama_grammar_accept: the stacks after one code point."""
        out: list[tuple[int, ...]] = []
        types = self.types
        for st in stacks:
            if not st:
                continue
            t = types[st[-1]]
            if t == TOKEN or t == TOKEN_NOT:
                continue
            if self.match_char(st[-1], chr_):
                self.after_char(st, out)
        return out

    @property
    def rules_core(self):
        """The grammar checked and compiled by the Rust engine (built on first use)."""
        rc = self.__dict__.get("_rules_core")
        if rc is None:
            from . import _core

            root_pos = self.symbol_ids[self.root]
            try:
                rc = _core.GrammarRules(self.types, self.values, self.rule_start, root_pos)
            except (ValueError, OverflowError) as e:
                raise GrammarError(str(e).removeprefix("grammar: ")) from None
            self._rules_core = rc
        return rc

    def matcher(self, engine: str | None = None) -> "GrammarMatcher | RustGrammarMatcher":
        """A matcher in the start state, on ``engine`` ("rust" or "py"; default: see
        the module docstring)."""
        if _engine_name(engine) == "py":
            return GrammarMatcher(self)
        return RustGrammarMatcher(self)


def _check_left_recursion(rules, names) -> None:
    n = len(rules)
    visited, in_progress, may_be_empty = [False] * n, [False] * n, [False] * n

    def eos(e):
        return e[0] == END or e[0] == ALT

    def detect(i: int) -> bool:
        if in_progress[i]:
            return True
        in_progress[i] = True
        rule = rules[i]
        at_start = True
        for e in rule:
            if eos(e):
                if at_start:
                    may_be_empty[i] = True
                    break
                at_start = True
            else:
                at_start = False
        recurse = True
        for e in rule:
            if e[0] == RULE_REF and recurse:
                if detect(e[1]):
                    return True
                if not may_be_empty[e[1]]:
                    recurse = False
            elif eos(e):
                recurse = True
            else:
                recurse = False
        in_progress[i] = False
        visited[i] = True
        return False

    for i in range(n):
        if not visited[i]:
            try:
                found = detect(i)
            except RecursionError:
                raise GrammarError("grammar nests too deeply", expected="less nesting") from None
            if found:
                raise GrammarError(f"unsupported grammar, left recursion detected for nonterminal "
                                   f"'{names.get(i, i)}' (rule index {i})", expected="no left recursion")


class GrammarMatcher:
    """The mutable part of llama_grammar: stacks and the partial UTF-8 state."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.stacks: list[tuple[int, ...]] = list(grammar.start_stacks)
        self.partial: tuple[int, int] = (0, 0)

    def reset(self) -> None:
        self.stacks = list(self.grammar.start_stacks)
        self.partial = (0, 0)

    def copy(self) -> "GrammarMatcher":
        m = GrammarMatcher.__new__(GrammarMatcher)
        m.grammar, m.stacks, m.partial = self.grammar, list(self.stacks), self.partial
        return m

    @property
    def can_end(self) -> bool:
        """An empty stack: the grammar may end here (end-of-generation is allowed)."""
        return any(not st for st in self.stacks)

    @property
    def failed(self) -> bool:
        return not self.stacks

    def state_key(self) -> tuple:
        """Equal for two states of one grammar exactly when they are the same state."""
        return (tuple(sorted(self.stacks)), self.partial)

    def accept_token(self, token: int, piece: bytes) -> None:
        """llama_grammar_accept_token; raises GrammarError (leaving the state unchanged) when
        no stack survives, as llama.cpp throws."""
        new = self.next_stacks(token, piece)
        if not new[0]:
            raise GrammarError(f"unexpected empty grammar stack after accepting piece {piece!r} ({token})")
        self.stacks, self.partial = new

    def next_stacks(self, token: int, piece: bytes) -> tuple[list, tuple[int, int]]:
        g = self.grammar
        cps, partial = decode_utf8(piece, self.partial)
        out: list[tuple[int, ...]] = []
        for st in self.stacks:
            if not st:
                continue
            top = st[-1]
            t = g.types[top]
            if t == TOKEN or t == TOKEN_NOT:
                if (g.values[top] == token) == (t == TOKEN):
                    base = st[:-1]
                    g.advance(base if g._is_eos(top + 1) else base + (top + 1,), out)
                continue
            cur = [st]
            for cp in cps:
                cur = g.accept_chr(cur, cp)
                if not cur:
                    break
            for s in cur:
                if s not in out:
                    out.append(s)
        return out, partial

    def accept_string(self, text: str | bytes) -> None:
        """llama_grammar_accept_str (text only, no token ids)."""
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        cps, partial = decode_utf8(data, self.partial)
        for cp in cps:
            self.stacks = self.grammar.accept_chr(self.stacks, cp)
        self.partial = partial
        if not self.stacks:
            raise GrammarError(f"unexpected empty grammar stack after accepting {text!r}")

    def allows(self, token: int, piece: bytes) -> bool:
        """llama_grammar_reject_candidates for one candidate (not end-of-generation)."""
        if not piece or piece[0] == 0:
            return False
        cps, partial = decode_utf8(piece, self.partial)
        return any(self._allows_stack(st, token, cps, 0, partial) for st in self.stacks)

    def _allows_stack(self, st, token, cps, i, partial) -> bool:
        g = self.grammar
        if not st:
            return i == len(cps) and partial[1] == 0
        top = st[-1]
        t = g.types[top]
        if t == TOKEN or t == TOKEN_NOT:
            if i == len(cps):
                return partial[1] == 0
            return (g.values[top] == token) == (t == TOKEN)
        if i == len(cps):
            return partial[1] == 0 or g.match_partial_char(top, partial)
        if not g.match_char(top, cps[i]):
            return False
        nxt: list = []
        g.after_char(st, nxt)
        return any(self._allows_stack(s, token, cps, i + 1, partial) for s in nxt)


class RustGrammarMatcher:
    """GrammarMatcher's interface on the Rust engine (pyllama._core.GrammarState): the
    same verdicts, stacks and errors."""

    __slots__ = ("grammar", "_s")

    def __init__(self, grammar: Grammar, state=None):
        from . import _core

        self.grammar = grammar
        self._s = state if state is not None else _core.GrammarState(grammar.rules_core)

    @property
    def stacks(self) -> list[tuple[int, ...]]:
        return [tuple(st) for st in self._s.stacks]

    @property
    def partial(self) -> tuple[int, int]:
        return self._s.partial

    @property
    def can_end(self) -> bool:
        return self._s.can_end

    @property
    def failed(self) -> bool:
        return self._s.failed

    def reset(self) -> None:
        self._s.reset()

    def copy(self) -> "RustGrammarMatcher":
        return RustGrammarMatcher(self.grammar, self._s.copy())

    def state_key(self) -> tuple:
        return self._s.state_key()

    def accept_token(self, token: int, piece: bytes) -> None:
        if not self._s.accept_token(token, piece):
            raise GrammarError(f"unexpected empty grammar stack after accepting piece {piece!r} ({token})")

    def accept_string(self, text: str | bytes) -> None:
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if not self._s.accept_bytes(data):
            raise GrammarError(f"unexpected empty grammar stack after accepting {text!r}")

    def allows(self, token: int, piece: bytes) -> bool:
        return self._s.allows(token, piece)

    def mask(self, trie) -> np.ndarray:
        """bool [n_vocab] for a _core.TokenTrie (end-of-generation included)."""
        return self._s.mask(trie)


def match_string(grammar: Grammar, items: Iterable[tuple[int, bytes]], engine: str | None = None) -> bool:
    """test-grammar-integration's match_string: accept each (token, piece); True iff some
    stack is empty at the end."""
    m = grammar.matcher(engine)
    for token, piece in items:
        try:
            m.accept_token(token, piece)
        except GrammarError:
            return False
    return m.can_end


# ---------------------------------------------------------------------------------------
# the sampler


class _VocabTrie:
    """Every token's code points (decoded from the start state), as a trie whose nodes
    cover contiguous ranges of ``order`` (tokens sorted by code points)."""

    def __init__(self, pieces: list[bytes], eog: set[int]):
        n = len(pieces)
        self.n_vocab = n
        self.pieces = pieces
        self.eog = np.zeros(n, bool)
        for t in eog:
            if 0 <= t < n:
                self.eog[t] = True
        # valid candidates: not EOG, non-empty, first byte not NUL, decodes without error
        keys = []
        first = np.zeros(n, np.uint8)
        for t, p in enumerate(pieces):
            if p:
                first[t] = p[0]
            if self.eog[t] or not p or p[0] == 0:
                continue
            if b"\0" not in p:
                try:
                    # valid UTF-8 decodes as llama.cpp's decoder does; the rest goes the slow way
                    keys.append((tuple(map(ord, p.decode("utf-8"))), (0, 0), t))
                    continue
                except UnicodeDecodeError:
                    pass
            cps, partial = decode_utf8(p)
            if partial[1] < 0:
                continue
            keys.append((tuple(cps), partial, t))
        keys.sort()
        self.first_byte = first
        self.order = np.array([k[2] for k in keys], np.int32)
        # node: [children {cp: node} or None, lo, hi, n_complete_end, [(partial, idx)...] partial ends]
        root = [{}, 0, len(keys), 0, (), 0]
        self.root = root
        # keys are sorted, so a node's tokens are contiguous: keep the path to the previous
        # key, close (set hi of) the nodes it leaves, open nodes for the new suffix
        # sub (node[5]): what lies strictly below a node, for the mask's shortcut: bit c for
        # each ASCII code point c on an edge below, _SUB_NONASCII for any other code point,
        # _SUB_PARTIAL for a token ending in a partial UTF-8 sequence below
        path = [root]
        prev: tuple = ()

        def close(idx: int) -> None:
            node = path.pop()
            node[2] = idx
            cp = prev[len(path) - 1]
            bits = node[5] | ((1 << cp) if cp < 128 else _SUB_NONASCII)
            if node[4]:
                bits |= _SUB_PARTIAL
            path[-1][5] |= bits

        for idx, (cps, partial, _t) in enumerate(keys):
            k, m = 0, min(len(prev), len(cps))
            while k < m and prev[k] == cps[k]:
                k += 1
            while len(path) > k + 1:
                close(idx)
            for d in range(len(path) - 1, len(cps)):
                ch = [None, idx, idx, 0, (), 0]  # leaves (most nodes) get no dict or list
                parent = path[-1]
                if parent[0] is None:
                    parent[0] = {}
                parent[0][cps[d]] = ch
                path.append(ch)
            node = path[-1]
            if partial[1] == 0:
                node[3] += 1  # complete ends sort first at a node: (cps, (0, 0)) is smallest
            elif node[4]:
                node[4].append((partial, idx))
            else:
                node[4] = [(partial, idx)]
            prev = cps
        while len(path) > 1:
            close(len(keys))


class GrammarSampler(Sampler):
    """llama_sampler_init_grammar: ``apply`` sets the logits of tokens the grammar rejects
    to -inf (end-of-generation tokens only where the grammar can end), ``accept`` advances
    the grammar. Usable in a SamplerChain (it has the Sampler interface). ``engine``:
    "rust" (the default) or "py" (the reference; also $PYLLAMA_GRAMMAR); both give the
    same verdicts and masks."""

    name = "grammar"
    _MASK_CACHE = 256

    def __init__(self, vocab, grammar_str: str | Grammar, grammar_root: str = "root", engine: str | None = None):
        self.vocab = vocab
        v = getattr(vocab, "vocab", vocab)  # a Model carries its Vocab
        self.engine = _engine_name(engine)
        self.grammar = grammar_str if isinstance(grammar_str, Grammar) else Grammar(grammar_str, grammar_root, v)
        self.matcher = self.grammar.matcher(self.engine)
        self._trie = _trie_for(vocab, self.engine)
        self._masks: OrderedDict = OrderedDict()
        # interned stack sets: {stacks: id}, [(char stacks, token stacks)], [{code point: next id}]
        self._sets: tuple[dict, list, list] = ({}, [], [])
        self._fixes: list = []  # per stack-set id: fix_of's bits (None until asked)

    # Sampler interface
    def apply(self, cur) -> None:
        mask = self.allowed_mask()
        keep = mask[cur.ids]
        if keep.all():
            return
        logits = np.array(cur.logits, dtype=np.float32)
        logits[~keep] = -np.inf
        cur.logits = logits

    def accept(self, token: int) -> None:
        tr = self._trie
        if tr.eog[token]:
            if self.matcher.can_end:
                return
            raise GrammarError(f"end-of-generation token {token} accepted where the grammar cannot end")
        self.matcher.accept_token(int(token), tr.pieces[token])

    def reset(self) -> None:
        self.matcher.reset()

    def clone(self) -> "GrammarSampler":
        c = GrammarSampler.__new__(GrammarSampler)
        c.vocab, c.grammar, c._trie, c._masks, c._sets = self.vocab, self.grammar, self._trie, self._masks, self._sets
        c._fixes, c.engine = self._fixes, self.engine
        c.matcher = self.matcher.copy()
        return c

    def __deepcopy__(self, memo):
        return self.clone()

    def __repr__(self) -> str:
        return "<GrammarSampler grammar>"

    # checks
    def allows(self, token: int) -> bool:
        """The verdict on one token without building a mask (grammar-first sampling)."""
        tr = self._trie
        if tr.eog[token]:
            return self.matcher.can_end
        return self.matcher.allows(int(token), tr.pieces[token])

    def allowed_mask(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar accepts now (cached per grammar state)."""
        m = self.matcher
        key = m.state_key()
        mask = self._masks.get(key)
        if mask is not None:
            self._masks.move_to_end(key)
            return mask
        tr = self._trie
        if self.engine == "rust":
            mask = m.mask(tr.core)
        else:
            # (n_remain -1, an invalid sequence, decodes like a fresh start: the trie's way)
            mask = self._mask_slow() if m.partial[1] > 0 else self._mask_trie()
            if m.can_end:
                mask |= tr.eog
        mask.flags.writeable = False
        self._masks[key] = mask
        if len(self._masks) > self._MASK_CACHE:
            self._masks.popitem(last=False)
        return mask

    def _mask_slow(self) -> np.ndarray:
        """After a token that ended inside a UTF-8 sequence: only tokens that start with
        continuation bytes can follow; check those one by one (llama.cpp's way)."""
        tr = self._trie
        mask = np.zeros(tr.n_vocab, bool)
        cand = np.nonzero((tr.first_byte >> 6) == 2)[0]
        for t in cand:
            t = int(t)
            if not tr.eog[t] and self.matcher.allows(t, tr.pieces[t]):
                mask[t] = True
        return mask

    def _mask_trie(self) -> np.ndarray:
        """One walk of the vocabulary trie. Stack sets are interned as ids, and each id's
        code point -> next id transitions are kept (across tokens: they depend on the
        grammar only), so a node costs a dict lookup per child; allowed ranges are
        collected and set in one numpy pass at the end."""
        g = self.grammar
        tr = self._trie
        types, values = g.types, g.values
        ids, infos, tmaps = self._sets
        if len(infos) > 200_000:  # bound the memory of long generations with deep stacks
            ids.clear(), infos.clear(), tmaps.clear(), self._fixes.clear()

        fixes = self._fixes

        def fix_of(sid: int) -> int:
            """ASCII code points c after which the stack set ``sid`` is itself again (bits),
            and _SUB_NONASCII when every code point >= 128 leads back to it too (its char
            classes do not tell those apart, so code point 128 speaks for all); 0 where the
            set has token stacks (the shortcut does not apply)."""
            while len(fixes) <= sid:
                fixes.append(None)
            f = fixes[sid]
            if f is None:
                f = 0
                char_stacks, token_stacks, uniform = infos[sid]
                if not token_stacks:
                    tmap = tmaps[sid]
                    for cp in range(128):
                        nsid = tmap.get(cp)
                        if nsid is None:
                            nxt: list = []
                            for st in char_stacks:
                                if g.match_char(st[-1], cp):
                                    g.after_char(st, nxt)
                            nsid = tmap[cp] = intern(nxt) if nxt else -1
                        if nsid == sid:
                            f |= 1 << cp
                    if uniform:
                        nsid = tmap.get(128)
                        if nsid is None:
                            nxt = []
                            for st in char_stacks:
                                if g.match_char(st[-1], 128):
                                    g.after_char(st, nxt)
                            nsid = tmap[128] = intern(nxt) if nxt else -1
                        if nsid == sid:
                            f |= _SUB_NONASCII
                fixes[sid] = f
            return f

        def intern(stacks) -> int:
            key = tuple(sorted(stacks))  # a set: the same stacks in another order are the same state
            sid = ids.get(key)
            if sid is None:
                sid = ids[key] = len(infos)
                char_stacks = tuple(st for st in key if st and types[st[-1]] not in (TOKEN, TOKEN_NOT))
                token_stacks = tuple(st for st in key if st and types[st[-1]] in (TOKEN, TOKEN_NOT))
                uniform = all(_uniform_above_ascii(g.char_class(st[-1])) for st in char_stacks)
                infos.append((char_stacks, token_stacks, uniform))
                tmaps.append({})
            return sid

        starts: list[int] = []
        ends: list[int] = []
        singles: list[int] = []
        token_ids = _token_positions(tr)
        todo = [(tr.root, intern(self.matcher.stacks))]
        while todo:
            node, sid = todo.pop()
            children, lo, hi, n_complete, partial_ends, sub = node
            # tokens that end here with no partial sequence: any live stack accepts them
            if n_complete:
                starts.append(lo)
                ends.append(lo + n_complete)
            char_stacks, token_stacks, uniform = infos[sid]
            for st in token_stacks:
                # every token below continues with a code point: only the id decides
                top = st[-1]
                rest_lo = lo + n_complete + len(partial_ends)
                p = token_ids.get(values[top])
                inside = p is not None and rest_lo <= p < hi
                if types[top] == TOKEN:
                    if inside:
                        singles.append(p)
                elif inside:
                    starts += (rest_lo, p + 1)
                    ends += (p, hi)
                else:
                    starts.append(rest_lo)
                    ends.append(hi)
            if not char_stacks:
                continue
            for partial, idx in partial_ends:
                for st in char_stacks:
                    if g.match_partial_char(st[-1], partial):
                        singles.append(idx)
                        break
            if not children:
                continue
            if sub & ~fix_of(sid) == 0:
                # every path below spells only code points that lead back to this very stack
                # set, and every token below ends complete: all of them are allowed
                rest_lo = lo + n_complete + len(partial_ends)
                starts.append(rest_lo)
                ends.append(hi)
                continue
            tmap = tmaps[sid]
            for cp, child in children.items():
                if uniform and cp > 128:
                    cp = 128  # the classes cannot tell code points >= 128 apart
                nsid = tmap.get(cp)
                if nsid is None:
                    nxt: list = []
                    for st in char_stacks:
                        if g.match_char(st[-1], cp):
                            g.after_char(st, nxt)
                    nsid = tmap[cp] = intern(nxt) if nxt else -1
                if nsid >= 0:
                    todo.append((child, nsid))
        n = len(tr.order)
        diff = np.zeros(n + 1, np.int32)
        if starts:
            np.add.at(diff, np.asarray(starts), 1)
            np.add.at(diff, np.asarray(ends), -1)
        allowed = np.cumsum(diff[:n]) > 0
        if singles:
            allowed[np.asarray(singles)] = True
        mask = np.zeros(tr.n_vocab, bool)
        mask[tr.order[allowed]] = True
        return mask


_TRIES: dict = {}
_SUB_NONASCII = 1 << 128
_SUB_PARTIAL = 1 << 129


def _uniform_above_ascii(cc) -> bool:
    """A char class (Grammar.char_class) gives one verdict for every code point >= 128
    (the decoder can produce values up to 2**31 from malformed bytes)."""
    positive, ranges, any_, _ = cc
    return any_ or all(hi < 128 or (lo <= 128 and hi >= 0x7FFFFFFF) for lo, hi in ranges)


def _pieces_of(vocab) -> tuple[list[bytes], set[int]]:
    v = getattr(vocab, "vocab", vocab)  # a Model carries its Vocab
    n = len(v)
    pieces = [v.token_to_piece(t, special=True) for t in range(n)]
    return pieces, set(int(t) for t in v.eog_ids)


class _RustVocabTrie:
    """The Rust engine's trie (pyllama._core.TokenTrie) and the pieces the sampler reads."""

    def __init__(self, pieces: list[bytes], eog: set[int]):
        from . import _core

        n = len(pieces)
        self.n_vocab = n
        self.pieces = pieces
        self.eog = np.zeros(n, bool)
        ids = [t for t in eog if 0 <= t < n]
        self.eog[ids] = True
        self.core = _core.TokenTrie(pieces, ids)


def _trie_for(vocab, engine: str = "rust") -> "_VocabTrie | _RustVocabTrie":
    """One trie per vocabulary object and engine (weakly keyed would be nicer; vocabularies
    live as long as their models and are few)."""
    v = getattr(vocab, "vocab", vocab)
    key = (id(v), engine)
    hit = _TRIES.get(key)
    if hit is not None and hit[0] is v:
        return hit[1]
    pieces, eog = _pieces_of(vocab)
    tr = _VocabTrie(pieces, eog) if engine == "py" else _RustVocabTrie(pieces, eog)
    _TRIES[key] = (v, tr)
    return tr


def _token_positions(tr: _VocabTrie) -> dict[int, int]:
    pos = getattr(tr, "_positions", None)
    if pos is None:
        pos = tr._positions = {int(t): i for i, t in enumerate(tr.order)}
    return pos


class LazyGrammarSampler(GrammarSampler):
    """llama_sampler_init_grammar_lazy_patterns: a grammar that constrains nothing until a
    trigger appears in the output, as llama.cpp's lazy grammars (llama-grammar.cpp
    llama_grammar_accept_impl). Accepted tokens are buffered; when one of
    ``trigger_tokens`` is accepted the grammar starts with that token; when the buffered
    text matches one of ``trigger_patterns`` (a full match for a pattern written
    ``^...$``, else a search; byte-level regular expressions) the grammar is fed the
    buffered text from the first non-empty capture group (or the match) onwards, and
    constrains every token after that. ``reset`` waits for a trigger again."""

    def __init__(self, vocab, grammar_str: str | Grammar, grammar_root: str = "root",
                 trigger_patterns: Sequence[str] = (), trigger_tokens: Sequence[int] = (),
                 engine: str | None = None):
        super().__init__(vocab, grammar_str, grammar_root, engine)
        self.trigger_tokens = [int(t) for t in trigger_tokens]
        self.trigger_patterns = []
        for p in trigger_patterns:
            try:
                self.trigger_patterns.append((p, re.compile(p.encode("utf-8"))))
            except re.error as e:
                raise GrammarError(f"trigger pattern {p!r} is not a valid regular expression: {e}") from None
        self._await()

    def _await(self) -> None:
        self.awaiting_trigger = True
        self.trigger_buffer = b""
        self.trigger_positions: list[tuple[int, int, int]] = []  # (token, start, end) in the buffer

    def apply(self, cur) -> None:
        if not self.awaiting_trigger:
            super().apply(cur)

    def allows(self, token: int) -> bool:
        return True if self.awaiting_trigger else super().allows(token)

    def allowed_mask(self) -> np.ndarray:
        if self.awaiting_trigger:
            return np.ones(self._trie.n_vocab, bool)
        return super().allowed_mask()

    def _find(self, p: str, rx) -> Optional[int]:
        m = rx.fullmatch(self.trigger_buffer) if p[:1] == "^" and p[-1:] == "$" else None
        if m is None:
            m = rx.search(self.trigger_buffer)
        if m is None:
            return None
        for i in range(1, m.re.groups + 1):
            if m.start(i) != -1 and m.end(i) > m.start(i):
                return m.start(i)
        return m.start(0)

    def accept(self, token: int) -> None:
        if not self.awaiting_trigger:
            super().accept(token)
            return
        piece = self._trie.pieces[token]
        if token in self.trigger_tokens:
            self.awaiting_trigger = False
            self.trigger_buffer = b""
            self.trigger_positions = []
            self.matcher.accept_token(int(token), piece)
            return
        n = len(self.trigger_buffer)
        self.trigger_positions.append((int(token), n, n + len(piece)))
        self.trigger_buffer += piece
        for p, rx in self.trigger_patterns:
            start = self._find(p, rx)
            if start is None:
                continue
            self.awaiting_trigger = False
            # replay the buffered tokens that overlap [start, end), the first one cut
            for tok, t0, t1 in self.trigger_positions:
                if t1 <= start:
                    continue
                self.matcher.accept_token(tok, self.trigger_buffer[max(t0, start):t1])
            self.trigger_buffer = b""
            self.trigger_positions = []
            return

    def reset(self) -> None:
        super().reset()
        self._await()

    def clone(self) -> "LazyGrammarSampler":
        c = LazyGrammarSampler.__new__(LazyGrammarSampler)
        c.__dict__.update(self.__dict__)
        c.matcher = self.matcher.copy()
        c.trigger_positions = list(self.trigger_positions)
        return c

    def __repr__(self) -> str:
        return f"<LazyGrammarSampler grammar awaiting_trigger={self.awaiting_trigger}>"
