"""Chat-template rendering is bounded (issue 18 item 4): every way a template from a model file
can make a huge value or loop forever is a TemplateLimitError, fast and without the memory; a
template that does not compile leaves completions working."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.chat_template import ChatTemplate, TemplateError, TemplateLimitError

REPO = Path(__file__).resolve().parents[2]
REAL = (REPO / "tests/fixtures/templates/Qwen3.5-4B.jinja").read_text(encoding="utf-8")
MSGS = [{"role": "user", "content": "hi"}]

GROWS = {
    "lipsum": "{{ lipsum(100000) }}",                         # was 34 s a request
    "tilde_doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                      "{% endfor %}{{ ns.s }}",               # was 3.3 GB
    "plus_doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}",
    "list_doubling": "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}",
    "tojson_indent": "{{ messages|tojson(indent=10**9) }}",   # was 3 GB
    "repeat": "{{ 'x' * 10**9 }}",
    "center": "{{ 'x'|center(1000000000) }}",
    "percent_width": "{{ '%1000000000s' % 'x' }}",
    "format_width": "{{ '{:>1000000000}'.format('x') }}",
    "format_filter": "{{ '%1000000000s'|format('x') }}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
    "replace": "{% set s = 'a' * 1000 %}{{ s.replace('a', s).replace('a', s) }}",
    "replace_filter": "{% set s = 'a' * 1000 %}{{ s|replace('a', s)|replace('a', s) }}",
    "power": "{{ 10 ** 1000000000 }}",
    "output": "{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}",
    "set_block": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set t %}{{ ns.s }}{{ ns.s }}"
                 "{% endset %}{% set ns.s = t %}{% endfor %}",
    "join": "{% set l = ['x' * 100000] * 1000 %}{{ l|join('') }}",
}
LOOPS = {
    "silent_nested_loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    "macro_fanout": "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}",
}


@pytest.mark.parametrize("name", sorted(GROWS))
def test_growth_is_refused_before_it_is_made(name):
    t = time.perf_counter()
    with pytest.raises(TemplateLimitError, match="TEMPLATE_MAX_CHARS"):
        ChatTemplate(GROWS[name]).render(MSGS)
    assert time.perf_counter() - t < 0.5


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_loops_stop_at_the_time_limit(name):
    t = time.perf_counter()
    with pytest.raises(TemplateLimitError, match="TEMPLATE_TIME_S"):
        ChatTemplate(LOOPS[name], time_limit_s=0.3).render(MSGS)
    assert 0.25 < time.perf_counter() - t < 1.5


def test_the_timer_never_fires_after_a_render():
    # many quick renders with a tight limit: a stray asynchronous exception would surface here
    tpl = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", time_limit_s=0.2)
    for _ in range(100):
        assert tpl.render(MSGS) == "hi"
    time.sleep(0.3)                        # past every timer's deadline
    assert sum(range(100000)) > 0


def test_budget_is_shared_across_renders():
    tpl = ChatTemplate("{% for i in range(1000) %}{% for j in range(100) %}{% endfor %}{% endfor %}x",
                       time_limit_s=0.5)
    t = time.perf_counter()
    while time.perf_counter() - t < 0.8:       # separate renders: each has its own 0.5 s
        assert tpl.render(MSGS) == "x"
    t = time.perf_counter()
    with pytest.raises(TemplateLimitError):
        with tpl.budget():                     # one 0.5 s for all of them together
            while time.perf_counter() - t < 5.0:
                tpl.render(MSGS)
    assert time.perf_counter() - t < 1.5


def test_limits_do_not_change_real_renders():
    tpl = ChatTemplate(REAL)
    msgs = []
    for i in range(250):
        msgs += [{"role": "user", "content": f"question {i} " * 20}, {"role": "assistant", "content": f"answer {i}"}]
    t = time.perf_counter()
    out = tpl.render(msgs + [{"role": "user", "content": "last"}])
    assert time.perf_counter() - t < 0.5 and out.count("<|im_start|>") == 502
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert json.dumps(tools[0], ensure_ascii=False) in tpl.render(MSGS, tools=tools)
    with pytest.raises(TemplateLimitError):
        ChatTemplate(REAL, max_chars=1000).render(msgs)


def test_compile_failures_are_template_errors():
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% if %}")
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")     # RecursionError in the parser


def test_peak_memory_of_a_doubling_template_is_bounded():
    code = ("import resource; from engine.chat_template import ChatTemplate, TemplateLimitError\n"
            f"src = {GROWS['tilde_doubling']!r}\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n    ChatTemplate(src).render([{'role': 'user', 'content': 'x'}])\n"
            "except TemplateLimitError: pass\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    grew_kb = int(out.stdout.strip())
    assert grew_kb < 64 * 1024, grew_kb        # was 3.3 GB; the limit is 1 Mi characters


def _broken_template_model(src: Path, dst: Path) -> Path:
    data = bytearray(src.read_bytes())
    key = b"tokenizer.chat_template"
    at = data.index(key) + len(key) + 4 + 8      # key, value type (u32), string length (u64)
    broken = b"{% if %}"                          # same length overwrite: a syntax error
    data[at:at + len(broken)] = broken
    dst.write_bytes(bytes(data))
    return dst


def test_a_template_that_does_not_compile_leaves_completions_working(tiny_model_path, tmp_path):
    from engine.generate import Engine
    from engine.settings import Settings
    eng = Engine.load(str(_broken_template_model(tiny_model_path, tmp_path / "broken-template.gguf")),
                      settings=Settings(threads=2))
    assert eng.chat_template is None and "does not compile" in (eng.chat_template_error or "")
    r = eng.generate("The warm Lambda", max_tokens=3)
    assert r.completion_tokens >= 1
    with pytest.raises(TemplateError, match="/v1/completions"):
        eng.chat_prompt(MSGS)


def test_the_function_answers_chat_400_and_completions_200_with_a_broken_template(tiny_model_path, tmp_path):
    from function.runtime import Runtime
    from function.settings import FunctionSettings
    path = _broken_template_model(tiny_model_path, tmp_path / "broken-template.gguf")
    rt = Runtime(FunctionSettings(model_path=str(path), init_budget_s=300))
    rt.start_init()

    def post(route, body):
        ev = {"version": "2.0", "rawPath": route, "headers": {},
              "requestContext": {"http": {"method": "POST", "path": route}}, "body": json.dumps(body)}
        resp = rt.handle(ev)
        return resp["statusCode"], json.loads(resp["body"])

    status, body = post("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "messages" and "/v1/completions" in body["error"]["message"]
    status, body = post("/v1/completions", {"prompt": "The warm Lambda", "max_tokens": 2})
    assert status == 200 and body["choices"][0]["text"] is not None


def test_a_template_overrun_is_a_400_naming_messages(tiny_model_path, monkeypatch):
    from function.runtime import Runtime
    from function.settings import FunctionSettings
    rt = Runtime(FunctionSettings(model_path=str(tiny_model_path), init_budget_s=300))
    rt.start_init()
    rt.engine.chat_template = ChatTemplate(LOOPS["silent_nested_loop"], time_limit_s=0.2)
    ev = {"version": "2.0", "rawPath": "/v1/chat/completions", "headers": {},
          "requestContext": {"http": {"method": "POST", "path": "/v1/chat/completions"}},
          "body": json.dumps({"messages": MSGS})}
    t = time.perf_counter()
    resp = rt.handle(ev)
    assert time.perf_counter() - t < 1.0
    err = json.loads(resp["body"])["error"]
    assert resp["statusCode"] == 400 and err["param"] == "messages" and err["code"] == "template_limit_exceeded"
