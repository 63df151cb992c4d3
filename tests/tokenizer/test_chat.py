"""Chat templates: llama.cpp's own test cases (tests/test-chat-template.cpp, extracted into
tests/data/templates/llama_cpp_cases.json by extract_cases.py), every template in
llama.cpp's models/templates rendered in the sandbox, and the sandbox's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyllama import chat
from pyllama.chat import ChatTemplate, ChatTemplateError

DATA = Path(__file__).parents[1] / "data" / "templates"
CASES = json.loads((DATA / "llama_cpp_cases.json").read_text(encoding="utf-8"))
CONV = CASES["conversation"]


def _jinja_cases():
    for c in CASES["cases"]:
        if c["template_str"] and c["supported_with_jinja"] and not c["has_extra_conversation"]:
            yield pytest.param(c, id=c["name"][:50])


@pytest.mark.parametrize("case", list(_jinja_cases()))
def test_jinja_render_matches_llama_cpp(case):
    tmpl = ChatTemplate(case["template_str"], bos_token=case["bos_token"], eos_token=case["eos_token"])
    expected = case["expected_output_jinja"] or case["expected_output"]
    assert tmpl.render(CONV, add_generation_prompt=True) == expected


def _builtin_cases():
    for c in CASES["cases"]:
        name = chat.detect_builtin(c["template_str"])
        if name and c["expected_output"] and not c["has_extra_conversation"]:
            yield pytest.param(name, c, id=f"{name}:{c['name'][:40]}")


@pytest.mark.parametrize("name,case", list(_builtin_cases()))
def test_builtin_formats_match_llama_cpp(name, case):
    assert chat.apply_builtin(name, CONV, add_ass=True) == case["expected_output"]


def test_builtins_cover_the_common_families():
    covered = {name for name, _ in (p.values for p in _builtin_cases())}
    assert {"chatml", "llama2", "gemma", "llama3", "phi3", "mistral-v7"} <= covered


def test_chatml_is_the_fallback():
    out = chat.render_chat([{"role": "user", "content": "Hi"}], None)
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert chat.render_chat([{"role": "user", "content": "Hi"}], "", add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n")


MODEL_TEMPLATES = sorted((DATA / "models").glob("*.jinja"))
# Templates that cannot render a plain conversation without extra variables the caller must
# pass (HF would fail the same way): they must fail with ChatTemplateError, nothing else.
NEEDS_EXTRA = {"fireworks-ai-llama-3-firefunction-v2.jinja": "functions"}


@pytest.mark.parametrize("path", MODEL_TEMPLATES, ids=[p.name for p in MODEL_TEMPLATES])
def test_real_templates_render(path):
    src = path.read_text(encoding="utf-8")
    tmpl = ChatTemplate(src, bos_token="<s>", eos_token="</s>", name=path.name)
    if path.name in NEEDS_EXTRA:
        with pytest.raises(ChatTemplateError, match=NEEDS_EXTRA[path.name]):
            tmpl.render(CONV)
        return
    out = tmpl.render(CONV, add_generation_prompt=True)
    # every user turn survives (system may be merged), the reply turn is opened last
    for m in CONV:
        if m["role"] == "user":
            assert m["content"] in out
    assert "You are a helpful assistant" in out
    without = tmpl.render(CONV, add_generation_prompt=False)
    assert len(without) <= len(out)


def test_real_model_count():
    assert len(MODEL_TEMPLATES) >= 60


@pytest.mark.parametrize("src", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% for m in messages %}{{ m.__class__ }}{% endfor %}{{ cycler.__init__.__globals__.os }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
])
def test_untrusted_templates_fail_safely(src):
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ChatTemplateError, match="unsafe|undefined|rendering failed"):
        ChatTemplate(src).render(msgs)
    assert msgs == [{"role": "user", "content": "Hi"}]


def test_errors_name_the_template_and_problem():
    with pytest.raises(ChatTemplateError, match=r"my.jinja: syntax error at line 2"):
        ChatTemplate("ok\n{% for %}", name="my.jinja")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render([])
    with pytest.raises(ChatTemplateError, match="messages"):
        ChatTemplate("x").render("hello")
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]"):
        ChatTemplate("x").render([{"role": "user", "content": "a"}, "b"])
    with pytest.raises(ChatTemplateError, match="unknown built-in"):
        chat.apply_builtin("nope", [])


def test_hf_globals_and_filters():
    t = ChatTemplate("{{ strftime_now('%Y') | length }} {{ {'a': 'é'} | tojson }} "
                     "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
                     "{% generation %}G{% endgeneration %}")
    assert t.render([]) == '4 {"a": "é"} 01G'


def test_system_role_polyfill():
    # a template that ignores system messages gets it merged into the first user turn
    t = ChatTemplate("{% for m in messages %}{% if m.role != 'system' %}[{{ m.role }}:{{ m.content }}]"
                     "{% endif %}{% endfor %}")
    assert not t.supports_system_role
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert t.render(msgs) == "[user:S\nU]"
    assert t.render(msgs, polyfill=False) == "[user:U]"
    assert t.render(msgs[:1]) == ""
    ok = ChatTemplate("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}")
    assert ok.supports_system_role
    assert ok.render([{"role": "developer", "content": "D"}]) == "[system:D]"


def test_llama_chat_apply_template_llama_h_style():
    from pyllama import llama_api as L

    case = next(c for c in CASES["cases"] if c["name"] == "teknium/OpenHermes-2.5-Mistral-7B")
    msgs = [L.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in CONV]
    need = L.llama_chat_apply_template(case["template_str"].encode(), msgs, len(msgs), True, None, 0)
    expected = case["expected_output"].encode()
    assert need == len(expected)
    buf = bytearray(10)
    assert L.llama_chat_apply_template(None, msgs, len(msgs), True, buf, len(buf)) == need  # None = chatml
    assert bytes(buf) == expected[:10]
    buf = bytearray(need)
    L.llama_chat_apply_template(case["template_str"], msgs, len(msgs), True, buf, need)
    assert bytes(buf) == expected
    # a Jinja template outside the built-in families: -1, as llama.h
    assert L.llama_chat_apply_template("{{ messages }}", msgs, len(msgs), True, None, 0) == -1
    assert "chatml" in L.llama_chat_builtin_templates()
