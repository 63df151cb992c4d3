"""Chat templates: turn a list of messages into the prompt text a chat model was trained on.

A model's ``tokenizer.chat_template`` is a Jinja template written by whoever made the file,
so it is untrusted input: it is rendered only in jinja2's ``ImmutableSandboxedEnvironment``
(no attribute access to dunders, no mutation of the caller's objects), with the globals
and filters Hugging Face's ``apply_chat_template`` provides (``raise_exception``,
``strftime_now``, ``tojson`` with ``ensure_ascii=False``, loop controls, the
``{% generation %}`` tag). Errors come out as :class:`ChatTemplateError` naming the template.

The sandbox alone does not stop a template from running forever or filling the memory
(``{% for i in range(100000) %}{% for j in range(100000) %}``, ``'a' * 10**10``,
``10 ** (10 ** 9)``), so every render also runs on a budget (see "Limits" below): each loop
iteration, call, filter and arithmetic operator counts against :data:`MAX_OPS` and a
deadline of :data:`TIME_LIMIT` seconds, and every text, list or number the template makes
is checked against :data:`MAX_OUTPUT` characters and :data:`MAX_INT_BITS` bits -- before it
is built where an operation can make something much larger than its inputs (repetition,
powers, padding and indent widths, format widths, replace, join, JSON indentation). Going
over raises :class:`ChatTemplateError` naming the template and the limit;
``ChatTemplate(..., max_ops=, time_limit=, max_output=)`` raises them. jinja2's constant
folding no longer runs filters or these operators at compile time.

When a model has no template, or a name is given instead of one, llama.cpp's built-in
formats (src/llama-chat.cpp) are used: ``chatml`` and a few common families, detected from
the template text the way ``llm_chat_detect_template`` does.
"""

from __future__ import annotations

import contextvars
import json
import re
import time
from datetime import datetime
from typing import Any, Mapping, Sequence

from .errors import PyllamaError

__all__ = [
    "ChatTemplateError",
    "ChatTemplate",
    "BUILTIN_TEMPLATES",
    "MAX_OPS",
    "TIME_LIMIT",
    "MAX_OUTPUT",
    "MAX_INT_BITS",
    "MAX_TEMPLATE_CHARS",
    "MAX_TEMPLATE_TOKENS",
    "detect_builtin",
    "apply_builtin",
    "render_chat",
    "ChatFormat",
    "special_text",
]


class ChatTemplateError(PyllamaError, ValueError):
    """A chat template failed to compile or render (or tried something the sandbox forbids,
    or went over one of the render limits)."""


# ----------------------------------------------------------------------------------------
# Limits. Real chat templates use a few thousand operations and well under a millisecond;
# these leave a margin of hundreds of times that and stop a hostile template within about
# a second or two (the defaults; ChatTemplate's keyword arguments override them).

#: Operations one render may run: loop iterations, calls (macros, methods, globals),
#: filters and the operators ``+ - * ** %``.
MAX_OPS = 1_000_000
#: Seconds one render may take (checked at every counted operation).
TIME_LIMIT = 2.0
#: Characters any text, the output or the printed form of any list/dict made by the
#: template may have, plus twice the characters of the messages and variables passed in
#: (a long conversation is the caller's, not the template's).
MAX_OUTPUT = 4_000_000
#: Bits an integer made by the template may have (``10 ** 1000`` is fine, ``10 ** 10**9``
#: is refused before it is computed).
MAX_INT_BITS = 4096
#: Characters of template text ChatTemplate compiles (the largest of llama.cpp's templates
#: has 17k) ...
MAX_TEMPLATE_CHARS = 500_000
#: ... and tokens (compiling costs ~10 us a token, in the parser, code generator and Python's
#: compiler; the largest of llama.cpp's templates has 3.8k).
MAX_TEMPLATE_TOKENS = 50_000


class _LimitExceeded(Exception):
    """A render went over a limit. Not a ValueError/TypeError on purpose, so that no filter's
    ``except (TypeError, ValueError)`` swallows it; ChatTemplate turns it into a
    ChatTemplateError naming the template."""


class _Budget:
    """What one render (or one call outside a render) may still spend."""

    __slots__ = ("ops", "max_ops", "time_limit", "deadline", "max_output", "input_chars", "max_chars", "memo")

    def __init__(self, max_ops=None, time_limit=None, max_output=None):
        self.ops = 0
        self.max_ops = MAX_OPS if max_ops is None else max_ops
        self.time_limit = TIME_LIMIT if time_limit is None else time_limit
        self.deadline = time.monotonic() + self.time_limit
        self.max_output = MAX_OUTPUT if max_output is None else max_output
        self.input_chars = 0
        self.max_chars = self.max_output  # + 2 * input_chars, see ChatTemplate._render
        self.memo: dict = {}  # id -> (object, chars, nodes, depth sum), see _measure

    def spend(self):
        self.ops += 1
        if self.ops > self.max_ops:
            raise _LimitExceeded(
                f"the template went over its operation limit (max_ops={self.max_ops} loop "
                "iterations, calls, filters and operators)")
        if time.monotonic() > self.deadline:
            raise _LimitExceeded(f"the template went over its time limit (time_limit={self.time_limit:g} s)")


_BUDGET: contextvars.ContextVar = contextvars.ContextVar("pyllama_chat_budget", default=None)


def _budget() -> _Budget:
    b = _BUDGET.get()
    return b if b is not None else _Budget()  # outside a render: default sizes, fresh count


def _tick():
    b = _BUDGET.get()
    if b is not None:
        b.spend()


def _too_big(b: _Budget, what: str = "a text or list"):
    more = f" plus twice the {b.input_chars} of the messages and variables" if b.input_chars else ""
    raise _LimitExceeded(f"{what} would go over the output size limit (max_output={b.max_output} characters{more})")


def _int_too_big():
    raise _LimitExceeded(f"a number would go over the integer size limit (MAX_INT_BITS={MAX_INT_BITS} bits)")


def _ticking(iterable):
    """Iterate ``iterable``, spending one operation per item (every ``{% for %}`` loops over this)."""
    b = _BUDGET.get()
    if b is None:
        yield from iterable
        return
    for item in iterable:
        b.spend()
        yield item


# The size of a value, as its printed/JSON form would be: measured without building it, and
# memoized per render so that lists sharing sublists (``[x, x, x]`` nested ten deep) cost
# their unique objects, not their printed size. Every list, tuple and dict the template makes
# is measured when it is made and refused over the output limit, so comparing, hashing,
# printing or serializing anything the template holds is bounded by that limit too.

_Namespace: Any = None  # jinja2.utils.Namespace, set by _env() (jinja2 is imported lazily)
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
_CONTAINERS: tuple = (list, tuple, dict, set, frozenset) + _VIEWS
_CONTAINER_TYPES = set(_CONTAINERS)  # exact types (+ Namespace), checked before isinstance
_SMALL_SCALARS = frozenset([float, bool, type(None)])
_MEMO_MAX = 200_000


def _leaf(x):
    """Printed size of a scalar, None for a container."""
    t = type(x)
    if t is str:
        return len(x) + 2
    if t in _CONTAINER_TYPES:
        return None
    if t is int:
        return x.bit_length() * 3 // 10 + 1
    if t in _SMALL_SCALARS:
        return 4
    if isinstance(x, _CONTAINERS):
        return None
    if isinstance(x, str):
        return len(x) + 2
    if isinstance(x, (bytes, bytearray)):
        return len(x) + 3
    if isinstance(x, int):
        return x.bit_length() * 3 // 10 + 1
    return 1


def _children(x):
    t = type(x)
    if t is list or t is tuple:
        return x
    if t is dict:
        return [*x.keys(), *x.values()]
    if t is _Namespace:
        attrs = x._Namespace__attrs
        return [*attrs.keys(), *attrs.values()]
    if isinstance(x, dict):
        return [*x.keys(), *x.values()]
    if isinstance(x, (list, tuple)):
        return x
    return list(x)  # sets, dict views


def _measure(x, b: _Budget, capped: bool = True):
    """(chars, nodes, depth sum) of ``x``: roughly the length of ``str(x)`` / its JSON (a lower
    bound up to escapes), the number of elements, and the sum of their nesting depths (what
    indentation adds when pretty-printed). ``capped``: stop at the first part found over the
    output limit (then chars is just over it)."""
    leaf = _leaf(x)
    if leaf is not None:
        return leaf, 1, 0
    m = b.memo.get(id(x))
    if m is not None and m[0] is x:
        return m[1], m[2], m[3]
    return _walk(x, b, b.max_chars if capped else None)


def _flat(x):
    """_measure of a container of scalars (not a namespace), else None."""
    if type(x) is _Namespace:
        return None
    chars, nodes_, depth = 2, 1, 0
    for k in _children(x):
        leaf = _leaf(k)
        if leaf is None:
            return None
        chars += leaf + 2
        nodes_ += 1
        depth += 1
    return chars, nodes_, depth


def _walk(root, b: _Budget, cap):
    """_measure of a container, without recursion (deeply nested data is fine). Results are
    memoized in the budget (keeping the object alive, so its id is not reused) unless they
    contain a namespace, the one container a template can change. The walk spends no
    operations but keeps to the deadline."""
    memo = b.memo
    if len(memo) > _MEMO_MAX:
        memo.clear()
    r = _flat(root)  # the common case first: a list or dict of scalars
    if r is not None:
        if cap is not None and r[0] > cap:
            return cap + 1, r[1], r[2]
        memo[id(root)] = (root, *r)
        return r
    done: dict = {}  # id -> (chars, nodes, depth sum, contains a namespace), this walk only
    opened: dict = {}  # id -> [chars, nodes, depth sum, volatile, children still to add]
    keep = []  # children lists (some hold temporaries, e.g. dict_items tuples) stay alive
    stack = [root]
    steps = 0
    deadline = b.deadline
    while stack:
        obj = stack[-1]
        oid = id(obj)
        state = opened.get(oid)
        if state is None:
            if oid in done:
                stack.pop()
                continue
            m = memo.get(oid)
            if m is not None and m[0] is obj:
                stack.pop()
                continue
            # open it: add its scalars and the children already measured, push the others
            chars, nodes_, depth = 2, 1, 0
            volatile = type(obj) is _Namespace
            later = []
            kids = _children(obj)
            keep.append(kids)
            for k in kids:
                steps += 1
                if not steps & 1023 and time.monotonic() > deadline:
                    raise _LimitExceeded(f"the template went over its time limit (time_limit={b.time_limit:g} s)")
                leaf = _leaf(k)
                if leaf is not None:
                    chars += leaf + 2
                    nodes_ += 1
                    depth += 1
                    continue
                kid = id(k)
                m = memo.get(kid)
                if m is not None and m[0] is k:
                    kc, kn, kd = m[1], m[2], m[3]
                else:
                    r = done.get(kid)
                    if r is not None:
                        kc, kn, kd, v = r
                        volatile = volatile or v
                    elif kid in opened:  # being measured: a cycle (only possible through a namespace)
                        kc, kn, kd, volatile = 16, 1, 0, True
                    else:
                        r = _flat(k)
                        if r is None:
                            later.append(k)
                            stack.append(k)
                            continue
                        memo[kid] = (k, *r)
                        kc, kn, kd = r
                chars += kc + 2
                nodes_ += kn
                depth += kd + kn
            state = opened[oid] = [chars, nodes_, depth, volatile, later]
            if later:
                continue
        # close it: every child is measured now
        stack.pop()
        del opened[oid]
        chars, nodes_, depth, volatile, later = state
        for k in later:
            r = done.get(id(k))
            if r is not None:
                kc, kn, kd, v = r
                volatile = volatile or v
            else:
                m = memo[id(k)]
                kc, kn, kd = m[1], m[2], m[3]
            chars += kc + 2
            nodes_ += kn
            depth += kd + kn
        if cap is not None and chars > cap:  # so is everything containing it, root included
            return cap + 1, nodes_, depth
        done[oid] = (chars, nodes_, depth, volatile)
        if not volatile:
            memo[oid] = (obj, chars, nodes_, depth)
    r = done[id(root)]
    return r[0], r[1], r[2]


def _chars(x, b: _Budget) -> int:
    return len(x) if type(x) is str else _measure(x, b)[0]


def _check(x):
    """Refuse a value the template just made if it is over the limits; return it."""
    t = type(x)
    if t is str:
        b = _budget()
        if len(x) > b.max_chars:
            _too_big(b)
    elif t in _CONTAINER_TYPES:
        b = _budget()
        if _measure(x, b)[0] > b.max_chars:
            _too_big(b)
    elif t is int:
        if x.bit_length() > MAX_INT_BITS:
            _int_too_big()
    elif t in _SMALL_SCALARS:
        pass
    elif isinstance(x, (str, bytes, bytearray)):
        b = _budget()
        if len(x) > b.max_chars:
            _too_big(b)
    elif isinstance(x, _CONTAINERS):
        b = _budget()
        if _measure(x, b)[0] > b.max_chars:
            _too_big(b)
    elif isinstance(x, int) and x.bit_length() > MAX_INT_BITS:
        _int_too_big()
    return x


def _check_args(args, kwargs):
    """The arguments of one call together (a macro's ``varargs``, ``cycler(x, x, x)`` keep them)."""
    b = _budget()
    total = 0
    for a in args:
        total += _chars(a, b)
    for a in kwargs.values():
        total += _chars(a, b)
    if total > b.max_chars:
        _too_big(b, "the arguments of a call")


def _int_arg(v) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


# -- checks made before an operation that can make a result much larger than its inputs


def _check_mul(a, c):
    if isinstance(a, int) and isinstance(c, int):
        if a.bit_length() + c.bit_length() > MAX_INT_BITS + 1:
            _int_too_big()
        return
    if isinstance(a, int):
        a, c = c, a
    if isinstance(c, int) and c > 1 and isinstance(a, (str, bytes, bytearray, list, tuple)):
        b = _budget()
        if _chars(a, b) * c > b.max_chars:
            _too_big(b, "a repeated text or list")


def _check_pow(a, c):
    if isinstance(a, int) and isinstance(c, int) and c > 0 and a not in (0, 1, -1):
        # |a| >= 2: the result has at least c * (bits(a) - 1) + 1 bits (_check sees the exact size)
        if c * (a.bit_length() - 1) + 1 > MAX_INT_BITS:
            _int_too_big()


def _check_add(a, c):
    if type(a) is str and type(c) is str:
        b = _budget()
        if len(a) + len(c) > b.max_chars:
            _too_big(b)
    elif isinstance(a, (str, list, tuple)) and isinstance(c, (str, list, tuple)):
        b = _budget()
        if _chars(a, b) + _chars(c, b) > b.max_chars:
            _too_big(b)


_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?.", re.S)


def _check_percent(fmt: str, args):
    """``fmt % args``: widths and precisions (``%1000000000s``, ``%.*f``) and the arguments."""
    b = _budget()
    extra = stars = 0
    for m in _PRINTF.finditer(fmt):
        for g in m.groups():
            if g == "*":
                stars += 1
            elif g:
                extra += int(g) if len(g) < 10 else b.max_chars + 1
    if stars:
        vals = args if isinstance(args, tuple) else (args,)
        extra += stars * max([abs(_int_arg(v)) for v in vals] or [0])
    if len(fmt) + extra + _chars(args, b) > b.max_chars:
        _too_big(b, "a formatted text")


_SPEC_NUMBER = re.compile(r"\d+")


def _spec_chars(spec, b: _Budget) -> int:
    """Width + precision in a ``str.format`` spec such as ``>1000000000`` or ``.2f``."""
    if not isinstance(spec, str):
        return 0
    return sum(int(g) if len(g) < 10 else b.max_chars + 1 for g in _SPEC_NUMBER.findall(spec))


def _check_replace(s, old, new, count):
    b = _budget()
    n_s, n_old, n_new = _chars(s, b), _chars(old, b), _chars(new, b)
    if n_new <= n_old:
        return
    if isinstance(s, str) and isinstance(old, str):
        occurrences = s.count(old) if old else len(s) + 1
    else:
        occurrences = n_s + 1
    if isinstance(count, int) and count >= 0:
        occurrences = min(occurrences, count)
    if n_s + occurrences * (n_new - n_old) > b.max_chars:
        _too_big(b, "a replaced text")


def _check_width(width, what):
    b = _budget()
    if _int_arg(width) > b.max_chars:
        _too_big(b, what)


def _check_joined(items, sep):
    b = _budget()
    n = len(items)
    if _chars(items, b) + max(n - 1, 0) * _chars(sep, b) > b.max_chars:
        _too_big(b, "a joined text")


def _materialized(v):
    return v if isinstance(v, (str, list, tuple, dict)) else list(v)


# filters: pre-checks get the bound arguments (a dict, changes are passed on to the filter)

def _pre_center(a):
    _check_width(a["width"], "a centered text")


def _pre_indent(a):
    s, width = a["s"], a["width"]
    k = len(width) if isinstance(width, str) else _int_arg(width)
    if isinstance(s, str):
        b = _budget()
        if len(s) + k * (s.count("\n") + 2) > b.max_chars:
            _too_big(b, "an indented text")


def _pre_format(a):
    fmt = a["value"]
    if not isinstance(fmt, str):  # the filter formats str(value): check that text
        _pre_string(a)
        a["value"] = fmt = str(fmt)
    _check_percent(fmt, a["kwargs"] or a["args"])


def _pre_join(a):
    a["value"] = v = _materialized(a["value"])
    _check_joined(v, a["d"])


def _pre_replace(a):
    _check_replace(a["s"], a["old"], a["new"], a["count"])


def _pre_wordwrap(a):
    s, ws = a["s"], a["wrapstring"]
    if isinstance(s, str):
        b = _budget()
        if len(s) + (len(s) + 1) * (len(ws) if isinstance(ws, str) else 1) > b.max_chars:
            _too_big(b, "a wrapped text")


def _pre_urlize(a):
    v = a["value"]
    if isinstance(v, str):
        b = _budget()
        per_link = 64 + sum(len(a[k]) for k in ("target", "rel") if isinstance(a[k], str))
        if 3 * len(v) + len(v.split()) * per_link > b.max_chars:
            _too_big(b, "a text with links")


def _pre_tojson(a):
    b = _budget()
    chars, nodes_, depth = _measure(a["value"], b)
    indent, seps = a["indent"], a["separators"]
    if indent is not None:
        k = len(indent) if isinstance(indent, str) else _int_arg(indent)
        chars += nodes_ + max(k, 0) * depth
    if isinstance(seps, (list, tuple)):
        chars += nodes_ * sum(len(x) for x in seps if isinstance(x, str))
    if chars > b.max_chars:
        _too_big(b, "a JSON text")


def _pre_pprint(a):
    b = _budget()
    chars, nodes_, _ = _measure(a["value"], b)
    if chars + nodes_ * (chars + 1) > b.max_chars:  # lines are indented by up to a key's width
        _too_big(b, "a pretty-printed text")


def _pre_string(a):
    b = _budget()
    if _chars(next(iter(a.values())), b) > b.max_chars:  # markupsafe.soft_str(s, /)
        _too_big(b)


def _pre_batch(a):
    if a["fill_with"] is not None:
        b = _budget()
        if _int_arg(a["linecount"]) * (_chars(a["fill_with"], b) + 2) > b.max_chars:
            _too_big(b, "a batch")


def _pre_slice(a):
    b = _budget()
    fill = a["fill_with"]
    if _int_arg(a["slices"]) * (4 + (0 if fill is None else _chars(fill, b))) > b.max_chars:
        _too_big(b, "a list of slices")


def _pre_round(a):
    if abs(_int_arg(a["precision"])) > MAX_INT_BITS:
        _int_too_big()


_FILTER_CHECKS = {
    "center": _pre_center, "indent": _pre_indent, "format": _pre_format, "join": _pre_join,
    "replace": _pre_replace, "wordwrap": _pre_wordwrap, "urlize": _pre_urlize,
    "tojson": _pre_tojson, "pprint": _pre_pprint, "string": _pre_string, "batch": _pre_batch,
    "slice": _pre_slice, "round": _pre_round,
}


# methods of str/bytes (and int.to_bytes) called from the template: (self, args, kwargs) ->
# the arguments to call with (or None: unchanged)

def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _m_width(owner, args, kwargs):
    _check_width(_arg(args, kwargs, 0, "width", 0), "a padded text")


def _m_expandtabs(owner, args, kwargs):
    b = _budget()
    if len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * _int_arg(
            _arg(args, kwargs, 0, "tabsize", 8)) > b.max_chars:
        _too_big(b, "a text with expanded tabs")


def _m_replace(owner, args, kwargs):
    if len(args) >= 2:
        _check_replace(owner, args[0], args[1], _arg(args, kwargs, 2, "count", -1))


def _m_join(owner, args, kwargs):
    if args:
        items = _materialized(args[0])
        _check_joined(items, owner)
        return (items,) + tuple(args[1:])


def _m_translate(owner, args, kwargs):
    table = _arg(args, kwargs, 0, "table")
    if isinstance(table, dict) and table:
        b = _budget()
        longest = max(_chars(v, b) for v in table.values())
        if len(owner) * longest > b.max_chars:
            _too_big(b, "a translated text")


def _m_to_bytes(owner, args, kwargs):
    _check_width(_arg(args, kwargs, 0, "length", 1), "a bytes value")


_METHOD_CHECKS = {
    "center": _m_width, "ljust": _m_width, "rjust": _m_width, "zfill": _m_width,
    "expandtabs": _m_expandtabs, "replace": _m_replace, "join": _m_join,
    "translate": _m_translate, "to_bytes": _m_to_bytes,
}


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


def _checked_join(parts):
    """``environment.concat``: the whole output, and every macro / block / ``{% set %}``
    buffer, stopped as soon as it goes over the output limit."""
    b = _budget()
    limit = b.max_chars
    if type(parts) is list:
        if sum(map(len, parts)) > limit:
            _too_big(b, "the output")
        return "".join(parts)
    kept = []
    total = 0
    for p in parts:
        total += len(p)
        if total > limit:
            _too_big(b, "the output")
        kept.append(p)
    return "".join(kept)


_LOOP_FILTER = "_pyllama_loop_budget"
_ENV = None


def _env():
    """One sandboxed environment for all templates."""
    global _ENV, _Namespace
    if _ENV is None:
        from jinja2.utils import Namespace

        _Namespace = Namespace
        _CONTAINER_TYPES.add(Namespace)
        _ENV = _make_env()
    return _ENV


def _make_env():
    import inspect
    import types
    from functools import update_wrapper

    import jinja2
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, optimizeconst
    from jinja2.ext import Extension
    from jinja2.filters import make_attrgetter
    from jinja2.lexer import TokenStream
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
    from jinja2.utils import _PassArg, generate_lorem_ipsum, pass_context, pass_environment
    from markupsafe import Markup

    class _Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (HF's assistant-mask marker):
        renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    class _CodeGenerator(CodeGenerator):
        """jinja2's code generator, plus: every ``{% for %}`` iterates through a filter that
        spends one operation per item (Python loops are otherwise invisible to the sandbox),
        list/tuple/dict literals and ``~`` are size-checked."""

        def visit_Template(self, node, frame=None):
            for loop in list(node.find_all(nodes.For)):
                loop.iter = nodes.Filter(loop.iter, _LOOP_FILTER, [], [], None, None, lineno=loop.iter.lineno)
                loop.iter.set_environment(self.environment)
            super().visit_Template(node, frame)

        def _checked(self, visit, node, frame):
            self.write("environment.pyllama_check(")
            visit(node, frame)
            self.write(")")

        def visit_List(self, node, frame):
            self._checked(super().visit_List, node, frame)

        def visit_Dict(self, node, frame):
            self._checked(super().visit_Dict, node, frame)

        def visit_Tuple(self, node, frame):
            if node.ctx == "load":
                self._checked(super().visit_Tuple, node, frame)
            else:
                super().visit_Tuple(node, frame)

        @optimizeconst
        def visit_Concat(self, node, frame):  # CodeGenerator.visit_Concat through pyllama_concat
            if frame.eval_ctx.volatile:
                func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
            elif frame.eval_ctx.autoescape:
                func_name = "markup_join"
            else:
                func_name = "str_join"
            self.write(f"environment.pyllama_concat({func_name}, (")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class _FormatChecks:
        """``str.format``: each field's width/precision and value count against the output limit."""

        total = 0

        def convert_field(self, value, conversion):
            b = _budget()
            if _chars(value, b) > b.max_chars:
                _too_big(b, "a formatted text")
            return super().convert_field(value, conversion)

        def format_field(self, value, format_spec):
            b = _budget()
            self.total += _spec_chars(format_spec, b) + _chars(value, b)
            if self.total > b.max_chars:
                _too_big(b, "a formatted text")
            return _check(super().format_field(value, format_spec))

    class _Formatter(_FormatChecks, SandboxedFormatter):
        pass

    class _EscapeFormatter(_FormatChecks, SandboxedEscapeFormatter):
        pass

    class _Environment(ImmutableSandboxedEnvironment):
        """The sandbox with a budget: see the module docstring."""

        code_generator_class = _CodeGenerator
        intercepted_binops = frozenset(["+", "-", "*", "**", "%"])
        concat = staticmethod(_checked_join)

        def _tokenize(self, source, name, filename=None, state=None):
            stream = super()._tokenize(source, name, filename, state)

            def counted():
                for n, token in enumerate(stream):
                    if n >= MAX_TEMPLATE_TOKENS:
                        raise _LimitExceeded(f"the template has more than {MAX_TEMPLATE_TOKENS} tokens, over the "
                                             f"template size limit (MAX_TEMPLATE_TOKENS={MAX_TEMPLATE_TOKENS})")
                    yield token

            return TokenStream(counted(), name, filename)

        @staticmethod
        def pyllama_check(value):
            return _check(value)

        @staticmethod
        def pyllama_concat(join, parts):
            b = _budget()
            if sum(_chars(p, b) for p in parts) > b.max_chars:
                _too_big(b)
            return _check(join(parts))

        def call_binop(self, context, operator, left, right):
            _tick()
            if operator == "+":
                _check_add(left, right)
            elif operator == "*":
                _check_mul(left, right)
            elif operator == "**":
                _check_pow(left, right)
            elif operator == "%" and isinstance(left, str):
                _check_percent(left, right)
            return _check(self.binop_table[operator](left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (the sandbox's names)
            _tick()
            if args or kwargs:
                _check_args(args, kwargs)
                if type(__obj) is LoopContext and args:  # loop(children) in a recursive loop
                    args = (_ticking(args[0]),) + args[1:]
            name = getattr(__obj, "__name__", None)
            check = _METHOD_CHECKS.get(name) if type(name) is str else None
            if check is not None:
                owner = getattr(__obj, "__self__", None)
                if isinstance(owner, (str, bytes, bytearray)) or (name == "to_bytes" and isinstance(owner, int)):
                    args = check(owner, args, kwargs) or args
            return _check(super().call(__context, __obj, *args, **kwargs))

        def wrap_str_format(self, value):
            # SandboxedEnvironment.wrap_str_format with the size-checking formatters
            if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in (
                    "format", "format_map"):
                return None
            f_self = value.__self__
            if not isinstance(f_self, str):
                return None
            str_type = type(f_self)
            is_format_map = value.__name__ == "format_map"
            if isinstance(f_self, Markup):
                formatter = _EscapeFormatter(self, escape=f_self.escape)
            else:
                formatter = _Formatter(self)

            def wrapper(*args, **kwargs):
                if is_format_map:
                    if kwargs:
                        raise TypeError("format_map() takes no keyword arguments")
                    if len(args) != 1:
                        raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                    kwargs = args[0]
                    args = ()
                formatter.total = 0
                return str_type(formatter.vformat(f_self, args, kwargs))

            return update_wrapper(wrapper, value)

    def budgeted(name, func, pre=None):
        """A filter that spends an operation, runs its pre-check, and checks its result. It is
        a context filter so that jinja2 never runs it at compile time (constant folding)."""
        pass_arg = _PassArg.from_obj(func)
        # jinja2's async_variant filters take a pass argument their sync function does not
        inner = inspect.unwrap(func)
        inner_takes_it = _PassArg.from_obj(inner) is not None
        sig = inspect.signature(inner) if pre is not None else None

        def run(context, *args, **kwargs):
            _tick()
            if pass_arg is _PassArg.context:
                first = (context,)
            elif pass_arg is _PassArg.eval_context:
                first = (context.eval_ctx,)
            elif pass_arg is _PassArg.environment:
                first = (context.environment,)
            else:
                first = ()
            if pre is not None:
                bound = sig.bind(*first, *args, **kwargs) if inner_takes_it else sig.bind(*args, **kwargs)
                bound.apply_defaults()
                pre(bound.arguments)
                args, kwargs = bound.args, bound.kwargs
                if inner_takes_it:
                    return _check(func(*args, **kwargs))
            return _check(func(*first, *args, **kwargs))

        run.__name__ = run.__qualname__ = f"checked_{name}"
        run.__doc__ = func.__doc__
        return pass_context(run)

    @pass_environment
    def do_sum(environment, iterable, attribute=None, start=0):
        """jinja2's ``sum``; summing lists or tuples goes one checked ``+`` at a time."""
        if attribute is not None:
            iterable = map(make_attrgetter(environment, attribute), iterable)
        items = list(iterable)
        numbers = (int, float, complex)
        if isinstance(start, (str, bytes)) or (isinstance(start, numbers)
                                                and all(isinstance(v, numbers) for v in items)):
            return sum(items, start)
        total = start
        for v in items:
            _tick()
            _check_add(total, v)
            total = _check(total + v)
        return total

    def lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (jinja2's argument names)
        b = _budget()
        if _int_arg(n) * _int_arg(max) * 12 > b.max_chars:
            _too_big(b, "lipsum()")
        return generate_lorem_ipsum(n, html, min, max)

    env = _Environment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_Generation, "jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined,
    )
    env.filters["tojson"] = _tojson
    env.filters["sum"] = do_sum
    env.filters = {name: budgeted(name, f, _FILTER_CHECKS.get(name)) for name, f in env.filters.items()}
    env.filters[_LOOP_FILTER] = pass_context(lambda context, iterable: _ticking(iterable))
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["lipsum"] = lipsum
    return env


class ChatTemplate:
    """A compiled Jinja chat template.

    ``render(messages, add_generation_prompt=True, **extra)``: ``messages`` is a list of
    ``{"role": ..., "content": ...}`` dicts; ``extra`` reaches the template as variables
    (``tools``, ``enable_thinking``, ...). ``bos_token`` / ``eos_token`` are the model's
    special token texts (templates usually print BOS themselves). ``polyfill`` applies
    llama.cpp's message workarounds first (see :meth:`_polyfill`).

    The template is untrusted: each render may run at most ``max_ops`` operations (loop
    iterations, calls, filters, operators; default :data:`MAX_OPS`) for at most
    ``time_limit`` seconds (:data:`TIME_LIMIT`), and no text, list or output it makes may
    be longer than ``max_output`` characters (:data:`MAX_OUTPUT`) plus twice the
    characters of the messages and variables given; numbers are limited to
    :data:`MAX_INT_BITS` bits and the template text to :data:`MAX_TEMPLATE_CHARS`
    characters and :data:`MAX_TEMPLATE_TOKENS` tokens. Going over any of them raises :class:`ChatTemplateError` naming the
    template and the limit. Pass larger values to raise them (they are attributes too).
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", name: str = "chat template",
                 max_ops: int | None = None, time_limit: float | None = None, max_output: int | None = None):
        import jinja2

        if not isinstance(source, str):
            raise ChatTemplateError(f"{name}: expected the template text (str), got {type(source).__name__}")
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.max_ops = MAX_OPS if max_ops is None else max_ops
        self.time_limit = TIME_LIMIT if time_limit is None else time_limit
        self.max_output = MAX_OUTPUT if max_output is None else max_output
        self._supports_system: bool | None = None
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(f"{name}: the template is {len(source)} characters, over the template "
                                    f"size limit (MAX_TEMPLATE_CHARS={MAX_TEMPLATE_CHARS})")
        try:
            self._tmpl = _env().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{name}: syntax error at line {e.lineno}: {e.message}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"{name}: {e}") from None
        except _LimitExceeded as e:
            raise ChatTemplateError(f"{name}: cannot compile: {e}") from None
        except (RecursionError, MemoryError, SyntaxError) as e:
            # jinja2's parser and code generator recurse per nesting level, and Python refuses
            # generated code nested past its own limits (IndentationError, "too many statically
            # nested blocks", MemoryError from the parser's stack)
            raise ChatTemplateError(f"{name}: cannot compile: the template is nested too deeply "
                                    f"(over the nesting limit: {type(e).__name__}: {e})") from None
        except Exception as e:  # anything else a hostile template text makes jinja2 raise
            raise ChatTemplateError(f"{name}: cannot compile: {type(e).__name__}: {e}") from None

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
        budget = _Budget(self.max_ops, self.time_limit, self.max_output)
        budget.input_chars = _measure(variables, budget, capped=False)[0]
        budget.max_chars = self.max_output + 2 * budget.input_chars
        budget.deadline = time.monotonic() + budget.time_limit
        token = _BUDGET.set(budget)
        try:
            return self._tmpl.render(**variables)
        except _LimitExceeded as e:
            raise ChatTemplateError(f"{self.name}: rendering stopped: {e}") from None
        except SecurityError as e:
            raise ChatTemplateError(f"{self.name}: the template tried an unsafe operation: {e}") from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"{self.name}: {e}") from None
        except RecursionError as e:
            raise ChatTemplateError(f"{self.name}: rendering failed: the template recursed past Python's "
                                    f"recursion limit (RecursionError: {e})") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError,
                OverflowError, MemoryError) as e:
            raise ChatTemplateError(f"{self.name}: rendering failed: {type(e).__name__}: {e}") from None
        finally:
            _BUDGET.reset(token)


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


def special_text(vocab, token) -> str:
    """A special token's text (BOS / EOS for templates), "" for none."""
    if token is None or token < 0:
        return ""
    return vocab.token_to_piece(int(token), True).decode("utf-8", "replace")


class ChatFormat:
    """A model's chat prompt: which template renders the messages and how the text becomes
    tokens. ``template`` is a built-in name, a Jinja template's text, or None for the
    model's own template (``tokenizer.chat_template``; chatml when it has none, as llama.cpp).

    ``name`` says which template is in use (the CLI banner, the server's /props).
    ``render(messages, add_generation_prompt, **extra)`` returns the prompt text;
    ``tokens(...)`` tokenizes it with special tokens parsed and BOS added unless the
    template printed it itself.
    """

    def __init__(self, model, vocab, template: str | None = None, origin: str = "given"):
        self.vocab = vocab
        self.bos_text = special_text(vocab, vocab.bos)
        src = template if template is not None else model.chat_template()
        origin = origin if template is not None else "the model's"
        self.source = src or ""
        if src and src not in BUILTIN_TEMPLATES:
            self._tmpl: ChatTemplate | None = ChatTemplate(
                src, bos_token=self.bos_text, eos_token=special_text(vocab, vocab.eos), name="chat template")
            self._builtin = None
            family = detect_builtin(src)
            self.name = f"{origin} Jinja template" + (f" ({family} family)" if family else "")
        else:
            self._tmpl = None
            self._builtin = src or "chatml"
            self.name = f"{self._builtin} ({origin})" if src else "chatml (the model has none)"

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **extra) -> str:
        if self._tmpl is not None:
            return self._tmpl.render(messages, add_generation_prompt, **extra)
        if extra:
            raise ChatTemplateError(f"the built-in {self._builtin} template takes no template variables "
                                    f"(got {', '.join(sorted(extra))}); use a Jinja template")
        return apply_builtin(self._builtin, messages, add_generation_prompt)

    @property
    def jinja(self) -> bool:
        """Whether a Jinja template renders (built-in formats take no template variables)."""
        return self._tmpl is not None

    def tokens(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **extra) -> list[int]:
        return self.tokenize(self.render(messages, add_generation_prompt, **extra))

    def tokenize(self, text: str) -> list[int]:
        """A rendered prompt's tokens: special tokens parsed, BOS added unless the text
        starts with it (templates usually print it)."""
        add_bos = not (self.bos_text and text.startswith(self.bos_text))
        return list(self.vocab.tokenize(text, add_special=add_bos, parse_special=True))
