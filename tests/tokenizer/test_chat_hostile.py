"""Hostile chat templates: a model file's template must not hang the process or fill its
memory. Each hostile template is compiled and rendered in a child process with a 2 GiB
address-space limit and a 20 s wall limit, so that a regression fails the test instead of
hanging or killing the run; the child must report a ChatTemplateError naming the limit that
stopped it. (Before the render budget, each of these hung, died of MemoryError or raised a
raw Python error.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import pyllama
from pyllama import chat
from pyllama.chat import ChatTemplate, ChatTemplateError

MEMORY_LIMIT = 2 << 30  # bytes of address space for the child
WALL_LIMIT = 20.0  # seconds for the child (interpreter start + compile + render)
RENDER_BOUND = 10.0  # seconds the compile + render itself may take (limits are ~2 s)

# What the messages of each limit say (chat.py); a case lists the ones that may stop it.
OPS = "operation limit"
TIME = "time limit"
SIZE = "output size limit"
INT = "integer size limit"
NEST = "nesting limit"
RECURSION = "recursion limit"
SOURCE = "template size limit"
BUDGET = (OPS, TIME)  # loops stop at whichever comes first on a loaded machine

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    req = json.loads(sys.stdin.read())
    from pyllama.chat import ChatTemplate, ChatTemplateError
    t0 = time.monotonic()
    try:
        tmpl = ChatTemplate(req["src"], name="hostile.jinja", **req["kwargs"])
        out = tmpl.render(req["messages"], polyfill=False)
        res = {"kind": "ok", "len": len(out)}
    except ChatTemplateError as e:
        res = {"kind": "ChatTemplateError", "msg": str(e)[:2000]}
    except BaseException as e:
        res = {"kind": type(e).__name__, "msg": str(e)[:2000]}
    res["seconds"] = time.monotonic() - t0
    sys.stdout.write(json.dumps(res) + "\\n")
""")


def render_in_child(src: str, messages=(), **kwargs) -> dict:
    """Compile and render ``src`` in a fresh interpreter under the memory and wall limits;
    returns {"kind", "msg", "seconds"} (kind "ok" / "ChatTemplateError" / another exception)."""
    env = dict(os.environ)
    root = str(Path(pyllama.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    req = json.dumps({"src": src, "messages": list(messages), "kwargs": kwargs})
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(MEMORY_LIMIT)], input=req, env=env,
                              capture_output=True, text=True, timeout=WALL_LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the render did not finish within {WALL_LIMIT} s (hang)")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the child died (rc={proc.returncode}) after {time.monotonic() - t0:.1f} s:\n"
                    f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def assert_stopped(res: dict, limits):
    if isinstance(limits, str):
        limits = (limits,)
    assert res["kind"] == "ChatTemplateError", res
    assert res["msg"].startswith("hostile.jinja: "), res  # names the template
    assert any(name in res["msg"] for name in limits), res  # and the limit that stopped it
    assert res["seconds"] < RENDER_BOUND, res


def _nest(levels: int, leaf: str = "range(1000)|list", fan: int = 10) -> str:
    """``{% set v0 = leaf %}{% set v1 = [v0, v0, ...] %}...``: a list sharing its sublists,
    whose printed (or compared) size is fan**levels times the leaf's."""
    out = [f"{{% set v0 = {leaf} %}}"]
    for i in range(1, levels + 1):
        out.append(f"{{% set v{i} = [{', '.join([f'v{i - 1}'] * fan)}] %}}")
    return "".join(out)


HOSTILE = {
    # -- never finish: the budget stops them
    "nested_range_loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                           BUDGET),
    "nested_loops_of_constants": ("{% for i in range(100000) %}{% for j in range(100000) %}{% if 1 %}"
                                  "{% endif %}{% endfor %}{% endfor %}", BUDGET),
    "loops_in_a_macro": ("{% macro m() %}{% for i in range(100000) %}{% for j in range(100000) %}"
                         "{% endfor %}{% endfor %}{% endmacro %}{{ m() }}", BUDGET),
    "recursive_loop_fanout": ("{% for x in range(10) recursive %}{% if loop.depth < 12 %}"
                              "{{ loop(range(10)) }}{% endif %}{% endfor %}", BUDGET),
    "exponential_macro_recursion": ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                                    "{% endmacro %}{{ f(60) }}", BUDGET + (SIZE,)),
    "quadratic_list_accumulation": ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                                    "{% for j in range(100) %}{% set ns.l = ns.l + [j] %}{% endfor %}{% endfor %}"
                                    "{{ ns.l|length }}", BUDGET + (SIZE,)),
    "quadratic_dict_accumulation": ("{% set ns = namespace(d={}) %}{% for i in range(100000) %}"
                                    "{% set ns.d = dict(ns.d, **{i|string: i}) %}{% endfor %}{{ ns.d|length }}",
                                    BUDGET + (SIZE,)),
    "namespace_string_accumulation": ("{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                                      "{% for j in range(100000) %}{% set ns.s = ns.s ~ 'aaaaaaaaaa' %}"
                                      "{% endfor %}{% endfor %}{{ ns.s|length }}", BUDGET + (SIZE,)),
    "compare_shared_sublists": (_nest(10, "[1]") + "{% set w0 = [1] %}"
                                + "".join(f"{{% set w{i} = [{', '.join([f'w{i - 1}'] * 10)}] %}}" for i in range(1, 11))
                                + "{{ v10 == w10 }}", SIZE),
    # -- huge numbers: refused before they are computed (at compile time jinja2 folded them)
    "pow_at_compile_time": ("{{ (10 ** 1000000000) > 1 }}", INT),
    "pow_tower": ("{{ 9 ** (9 ** 9) }}", INT),  # jinja2's ** groups to the left
    "repeated_squaring": ("{% set n = namespace(x=2) %}{% for i in range(64) %}{% set n.x = n.x * n.x %}"
                          "{% endfor %}{{ n.x > 0 }}", INT),
    "round_to_a_huge_precision": ("{{ 5|round(-1000000000) }}", INT),
    # -- huge texts and lists: refused before they are built
    "str_repeat": ("{{ 'a' * 10**10 }}", SIZE),
    "str_repeat_literal": ("{{ 'a' * 10000000000 }}", SIZE),
    "list_repeat": ("{{ [1] * 10**9 }}", SIZE),
    "center": ("{{ 'a'|center(10**10) }}", SIZE),
    "indent": ("{{ 'a\\nb'|indent(10**9) }}", SIZE),
    "tojson_indent": ("{{ [1]|tojson(indent=10**9) }}", SIZE),
    "str_format_width": ("{{ '{:>1000000000}'.format('a') }}", SIZE),
    "str_format_nested_width": ("{{ '{:{}}'.format('a', 10**9) }}", SIZE),
    "percent_width": ("{{ '%1000000000s' % 'a' }}", SIZE),
    "percent_star_precision": ("{{ '%.*f' % (10**9, 1.0) }}", SIZE),
    "format_filter_width": ("{{ '%1000000000s'|format('a') }}", SIZE),
    "ljust_method": ("{{ 'a'.ljust(10**10) }}", SIZE),
    "zfill_method": ("{{ '1'.zfill(10**10) }}", SIZE),
    "expandtabs_method": ("{{ 'a\\tb'.expandtabs(10**9) }}", SIZE),
    "to_bytes_method": ("{{ (1).to_bytes(10**10, 'big')|length }}", SIZE),
    "namespace_doubling": ("{% set ns = namespace(x='a') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}"
                           "{% endfor %}{{ ns.x|length }}", SIZE),
    "namespace_doubling_plus": ("{% set ns = namespace(x='a') %}{% for i in range(40) %}"
                                "{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}", SIZE),
    "macro_doubling": ("{% macro d(x, n) %}{% if n %}{{ d(x ~ x, n - 1) }}{% else %}{{ x|length }}{% endif %}"
                       "{% endmacro %}{{ d('a', 40) }}", SIZE),
    "join_of_huge_ranges_in_a_loop": ("{% for i in range(100000) %}{{ range(100000)|join(',') }}{% endfor %}",
                                      (SIZE,) + BUDGET),
    "output_of_a_loop": ("{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                         "{% endfor %}{% endfor %}", (SIZE,) + BUDGET),
    "macro_buffer": ("{% macro m() %}{% for i in range(100000) %}{{ range(100000)|join }}{% endfor %}"
                     "{% endmacro %}{{ m()|length }}", (SIZE,) + BUDGET),
    "string_of_a_huge_list": (_nest(6) + "{{ v6|string|length }}", SIZE),
    "print_huge_list": (_nest(6) + "{{ v6 }}", SIZE),
    "tojson_huge_list": (_nest(6) + "{{ v6|tojson|length }}", SIZE),
    "concat_huge_list": (_nest(6) + "{{ (v6 ~ '')|length }}", SIZE),
    "cycler_args_nesting": ("{% set c0 = cycler(*(range(1000)|list)) %}"
                            + "".join(f"{{% set c{i} = cycler({', '.join([f'c{i - 1}.items'] * 10)}) %}}"
                                      for i in range(1, 7)) + "{{ c6.items|length }}{{ c6.items }}", SIZE),
    "replace_filter": ("{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", SIZE),
    "replace_empty": ("{{ ('a' * 1000000)|replace('', 'xxxxxxxxxx') }}", SIZE),
    "replace_method": ("{{ ('a' * 100000).replace('a', 'b' * 100000) }}", SIZE),
    "join_method": ("{{ ('a' * 1000000).join(range(100000)|map('string')) }}", SIZE),
    "join_filter_separator": ("{{ range(100000)|join('a' * 1000000) }}", SIZE),
    "translate_method": ("{{ ('a' * 100000).translate({97: 'b' * 100000}) }}", SIZE),
    "wordwrap_huge_wrapstring": ("{{ ('a ' * 100000)|wordwrap(1, wrapstring='-' * 100000) }}", SIZE),
    "batch_fill": ("{{ [1]|batch(10**9, 0)|list|length }}", SIZE),
    "slice_count": ("{{ [1]|slice(10**9)|list|length }}", SIZE),
    "sum_of_lists": ("{% set l = range(100000)|batch(1)|list %}{{ (l + l)|sum(start=[])|length }}",
                     BUDGET + (SIZE,)),
    "lipsum": ("{{ lipsum(100000, max=100000)|length }}", SIZE),
    # -- compile: deep nesting is a ChatTemplateError, not a raw RecursionError/SyntaxError
    "nested_ifs": ("{% if 1 %}" * 10000 + "x" + "{% endif %}" * 10000, NEST),
    "nested_ifs_indentation": ("{% if 1 %}" * 120 + "x" + "{% endif %}" * 120, NEST),
    "nested_fors": ("{% for x in [1] %}" * 30 + "x" + "{% endfor %}" * 30, NEST),
    "nested_parens": ("{{ " + "(" * 10000 + "1" + ")" * 10000 + " }}", NEST),
    "nested_lists": ("{{ " + "[" * 10000 + "1" + "]" * 10000 + " }}", NEST),
    "huge_template": ("{{ 'x' }}" * 200_000, SOURCE),
    "many_tokens": ("{{ [" + ",".join(["1"] * 200_000) + "]|length }}", SOURCE),  # 400k characters: 4 s to compile
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_stopped(name):
    src, limits = HOSTILE[name]
    assert_stopped(render_in_child(src), limits)


def test_infinite_macro_recursion_names_the_recursion_limit():
    res = render_in_child("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
    assert_stopped(res, RECURSION)


def test_limits_can_be_raised_and_lowered():
    loop = "{% for i in range(3000) %}{% endfor %}ok"
    with pytest.raises(ChatTemplateError, match=r"t\.jinja: .*operation limit \(max_ops=1000 "):
        ChatTemplate(loop, name="t.jinja", max_ops=1000).render([])
    assert ChatTemplate(loop, max_ops=10_000).render([]) == "ok"
    text = "{{ 'a' * 5000 }}"
    with pytest.raises(ChatTemplateError, match=r"output size limit \(max_output=1000 characters plus twice"):
        ChatTemplate(text, max_output=1000).render([])
    assert len(ChatTemplate(text, max_output=5000).render([])) == 5000
    with pytest.raises(ChatTemplateError, match=r"time limit \(time_limit=0\.05 s\)"):
        ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     time_limit=0.05, max_ops=10**12).render([])
    # the module constants are the defaults
    t = ChatTemplate("x")
    assert (t.max_ops, t.time_limit, t.max_output) == (chat.MAX_OPS, chat.TIME_LIMIT, chat.MAX_OUTPUT)


def test_long_conversations_are_not_refused():
    # the output limit grows with the caller's own input: a 10 MB document still renders
    doc = "word " * 2_000_000
    src = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
           "{{ messages | tojson | length }}")
    out = ChatTemplate(src).render([{"role": "user", "content": doc}])
    assert out.startswith("<|im_start|>user\nword word") and len(out) > len(doc)


@pytest.mark.parametrize("src,expected", [
    # what the limits leave alone: big but bounded values render exactly as before
    ("{{ (10 ** 1000) > 1 }} {{ (2 ** 4000) % 7 }} {{ 3 ** 3 ** 2 }}", "True 2 729"),
    ("{{ ('a b c ' * 3)|wordwrap(10**10) }}", "a b c a b c a b c"),
    ("{{ 'ab'|center(6) }}|{{ 'x\ny'|indent(2) }}|{{ [1, [2]]|tojson(indent=1) }}", "  ab  |x\n  y|[\n 1,\n [\n  2\n ]\n]"),
    ("{{ '{:>5}|{:.2f}'.format('a', 1) }}|{{ '%5s|%.3d' % ('b', 7) }}|{{ '%s-%s'|format(1, 2) }}", "    a|1.00|    b|007|1-2"),
    ("{{ [1, 2] * 2 }} {{ 'ab' * 2 }} {{ [[1], [2]]|sum(start=[]) }} {{ [1, 2.5]|sum }} {{ 2.5|round(1) }}",
     "[1, 2, 1, 2] abab [1, 2] 3.5 2.5"),
    ("{{ ('a' * 3).replace('a', 'bc') }} {{ 'x'.join(['1', '2']) }} {{ [1, 2, 3]|batch(2, 0)|list }}"
     " {{ [1, 2, 3]|slice(2)|list }}", "bcbcbc 1x2 [[1, 2], [3, 0]] [[1, 2], [3]]"),
    ("{% set x = 'a' %}{% for i in range(40) %}{% set x = x ~ x %}{% endfor %}{{ x }}", "a"),  # set is loop-scoped
    ("{% set ns = namespace(n=0) %}{% for i in range(10000) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
     "49995000"),
    ("{% for x in [[1, [2]], [3]] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}{% endif %}"
     "{% endfor %}", "(1(2))(3)"),
    ("{% set ns = namespace(a=1) %}{% set ns.self = [ns] %}{{ [ns]|length }} {{ {'k': [1, 2]}|string }}",
     "1 {'k': [1, 2]}"),
])
def test_bounded_templates_render_as_before(src, expected):
    assert ChatTemplate(src).render([]) == expected


def test_compile_error_message():
    with pytest.raises(ChatTemplateError, match=r"deep\.jinja: cannot compile: the template is nested too deeply"):
        ChatTemplate("{% if 1 %}" * 5000 + "{% endif %}" * 5000, name="deep.jinja")


# -- a larger sweep: every amplifier in every context (slow: a minute or more; runs with
# `-m slow` or PYLLAMA_SLOW=1)

AMPLIFIERS = {
    "str_repeat": ("'a' * 10**10", SIZE),
    "list_repeat": ("[1, 2] * 10**9", SIZE),
    "center": ("'a'|center(10**10)", SIZE),
    "indent": ("'a\\nb\\nc'|indent(10**9)", SIZE),
    "tojson": ("[[1]]|tojson(indent=10**9)", SIZE),
    "tojson_separators": ("(range(1000)|list)|tojson(separators=(',' * 100000, ':'))", SIZE),
    "str_format": ("'{:>1000000000}'.format('a')", SIZE),
    "percent": ("'%1000000000d' % 1", SIZE),
    "format_filter": ("'%.1000000000f'|format(1.5)", SIZE),
    "ljust": ("'a'.rjust(10**10)", SIZE),
    "replace": ("('ab' * 100000)|replace('b', 'c' * 100000)", SIZE),
    "join_sep": ("(range(100000)|map('string'))|join('x' * 100000)", SIZE),
    "to_bytes": ("(7).to_bytes(10**10, 'little')", SIZE),
    "batch": ("[1, 2]|batch(10**9, 'x')|list", SIZE),
    "slice": ("[1, 2]|slice(10**9, 'x')|list", SIZE),
    "pow": ("7 ** (10 ** 9)", INT),
    "mul_int": ("(10 ** 4000) * (10 ** 4000)", INT),
    "round": ("12|round(-10**9)", INT),
    "lipsum": ("lipsum(10**6)", SIZE),
    "expandtabs": ("('\\t' * 1000).expandtabs(10**9)", SIZE),
    "wordwrap": ("('a ' * 10000)|wordwrap(1, wrapstring='x' * 10**6)", SIZE),
    "urlize": ("('a.com ' * 100000)|urlize(target='t' * 100000)", SIZE),
    "pprint": ("({'k' * 100000: range(100000)|list})|pprint", SIZE),
    "nested_list": ("[[[[[[range(100)|list] * 10] * 10] * 10] * 10] * 10] * 10", SIZE),
}

CONTEXTS = {
    "output": "{{{{ {e} }}}}",
    "set": "{{% set x = {e} %}}{{{{ x }}}}",
    "macro": "{{% macro m() %}}{{{{ {e} }}}}{{% endmacro %}}{{{{ m() }}}}",
    "macro_arg": "{{% macro m(v) %}}{{{{ v }}}}{{% endmacro %}}{{{{ m({e}) }}}}",
    "namespace_in_loop": "{{% set ns = namespace(v=0) %}}{{% for i in range(3) %}}{{% set ns.v = {e} %}}"
                         "{{% endfor %}}{{{{ ns.v }}}}",
    "filter_block": "{{% filter upper %}}{{{{ {e} }}}}{{% endfilter %}}",
    "call_block": "{{% macro w() %}}{{{{ caller() }}}}{{% endmacro %}}{{% call w() %}}{{{{ {e} }}}}{{% endcall %}}",
    "recursive_loop": "{{% for x in [1, [2]] recursive %}}{{% if x is iterable %}}{{{{ loop(x) }}}}{{% else %}}"
                      "{{{{ {e} }}}}{{% endif %}}{{% endfor %}}",
    "set_block": "{{% set x %}}{{{{ {e} }}}}{{% endset %}}{{{{ x|length }}}}",
    "concat": "{{{{ ({e}) ~ '' }}}}",
    "in_list": "{{{{ [{e}]|length }}}}",
    "conditional": "{{{{ ({e}) if messages is defined else '' }}}}",
}

_BATCH_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    srcs = json.loads(sys.stdin.read())
    from pyllama.chat import ChatTemplate, ChatTemplateError
    for src in srcs:
        t0 = time.monotonic()
        try:
            out = ChatTemplate(src, name="hostile.jinja").render([], polyfill=False)
            res = {"kind": "ok", "len": len(out)}
        except ChatTemplateError as e:
            res = {"kind": "ChatTemplateError", "msg": str(e)[:2000]}
        except BaseException as e:
            res = {"kind": type(e).__name__, "msg": str(e)[:2000]}
        res["seconds"] = time.monotonic() - t0
        sys.stdout.write(json.dumps(res) + "\\n")
        sys.stdout.flush()
""")


def _slow_enabled(config) -> bool:
    return os.environ.get("PYLLAMA_SLOW") == "1" or "slow" in (config.getoption("markexpr", "") or "")


@pytest.mark.slow
@pytest.mark.parametrize("amplifier", list(AMPLIFIERS))
def test_sweep_amplifier_in_every_context(request, amplifier):
    if not _slow_enabled(request.config):
        pytest.skip("slow sweep: run with -m slow or PYLLAMA_SLOW=1")
    expr, limit = AMPLIFIERS[amplifier]
    srcs = [ctx.format(e=expr) for ctx in CONTEXTS.values()]
    env = dict(os.environ)
    root = str(Path(pyllama.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    timeout = WALL_LIMIT + RENDER_BOUND * len(srcs)
    try:
        proc = subprocess.run([sys.executable, "-c", _BATCH_CHILD, str(MEMORY_LIMIT)], input=json.dumps(srcs),
                              env=env, capture_output=True, text=True, timeout=timeout)
        lines = proc.stdout.strip().splitlines()
    except subprocess.TimeoutExpired as e:
        lines = (e.stdout or b"").decode().strip().splitlines() if isinstance(e.stdout, bytes) else (
            (e.stdout or "").strip().splitlines())
    results = [json.loads(line) for line in lines]
    for ctx, res in zip(CONTEXTS, results):
        try:
            assert_stopped(res, (limit,) + BUDGET)
        except AssertionError as e:
            raise AssertionError(f"{amplifier} in {ctx}: {e}") from None
    if len(results) < len(srcs):
        pytest.fail(f"{amplifier} in {list(CONTEXTS)[len(results)]}: the child hung or died:\n"
                    f"{proc.stderr[-3000:] if 'proc' in locals() else ''}")
