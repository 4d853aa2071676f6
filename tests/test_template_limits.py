"""Chat templates under limits: a hostile corpus (hangs, huge strings and integers, deep
recursion, every exception type) each refused as one TokenizerError line within the time
limit and a memory bound; ordinary templates render as transformers' sandbox renders them."""

import json
import resource
import time
from datetime import datetime

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mlxgraph.interpreter.text.chat_template import TemplateLimits, render_chat
from mlxgraph.interpreter.text.tokenizer import TokenizerError

LIMITS = TemplateLimits(seconds=1.0)
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
LOOP3 = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"

HOSTILE = {
    "nested loops": LOOP3 + "{% endfor %}{% endfor %}{% endfor %}",
    "printing loops": "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}"
                      "{% endfor %}{% endfor %}",
    "huge range": "{% for a in range(10**10) %}x{% endfor %}",
    "big power": "{{ 10 ** (10 ** 10) }}",
    "bigger power": "{{ 2 ** 100000 }}",
    "int product": "{% set ns = namespace(x=3) %}{% for i in range(40) %}"
                   "{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "lipsum": "{{ lipsum(10**9) }}",
    "percent star width": "{{ '%0*d' % (10**9, 1) }}",
    "percent width": "{{ '%01000000000d' % 1 }}",
    "percent precision": "{{ '%.999999999f' % 1.0 }}",
    "percent key parens": "{{ '%(a(b))999999999s' % {'a(b)': 1} }}",
    "format filter": "{{ '%0*d'|format(10**9, 1) }}",
    "str.format width": "{{ '{:>1000000000}'.format(1) }}",
    "str.format nested width": "{{ '{:>{w}}'.format(1, w=10**9) }}",
    "string times": "{{ 'a' * 10**10 }}",
    "string times twice": "{% set x = 'a' * 1000000 %}{{ (x * 1000)|length }}",
    "list times": "{{ ([1] * 10**9)|length }}",
    "doubling ~": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling +": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                  "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "shared list compare": "{% set ns = namespace(x=[1]) %}{% for i in range(64) %}"
                           "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x == ns.x }}",
    "macro recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "recursive loop": "{% for m in [[1]] recursive %}{{ loop([m]) }}{% endfor %}",
    "str.center": "{{ 'a'.center(10**9) }}",
    "center filter": "{{ 'a'|center(10**9) }}",
    "str.replace": "{% set x = 'a' * 100000 %}{{ x.replace('a', x)|length }}",
    "replace filter": "{% set x = 'a' * 100000 %}{{ (x|replace('a', x))|length }}",
    "str.join": "{% set x = 'a' * 100000 %}{{ x.join(x)|length }}",
    "indent": "{{ ('\n' * 1000000)|indent(1000000) }}",
    "expandtabs": "{{ ('\t' * 100000).expandtabs(100000) }}",
    "tojson indent": "{{ ([[[[1]]]] * 1000)|tojson(indent=100000) }}",
    "wordwrap": "{{ ('a' * 1000000)|wordwrap(1, wrapstring='x' * 1000) }}",
    "sum of lists": "{{ ([[1] * 1000] * 10000)|sum(start=[])|length }}",
    "strftime": "{{ strftime_now('%c' * 1000000) }}",
    "big output": "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    "deep literal": "{{ " + "[" * 5000 + "]" * 5000 + " }}",
    "deep parens": "{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}",
    "namespace cycle": "{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}",
    "namespace cycle json": "{% set ns = namespace() %}{% set ns.a = [ns] %}{{ ns.a|tojson }}",
    "type error": "{{ 1 + 'a' }}",
    "zero division": "{{ 1 // 0 }}",
    "float overflow": "{{ 2.0 ** 100000 }}",
    "unknown method": "{{ 'a'.encode() }}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "syntax error": "{% for %}",
    "raise_exception": "{{ raise_exception('roles must alternate') }}",
    "too long": "x" * (LIMITS.source_chars + 1),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_is_one_tokenizer_error_in_time(name):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(TokenizerError) as e:
        render_chat(HOSTILE[name], CONVERSATION, True, {}, error=TokenizerError,
                    name="the test chat template", limits=LIMITS)
    elapsed = time.monotonic() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    message = str(e.value)
    assert message.startswith("the test chat template") and "\n" not in message, message
    assert elapsed < LIMITS.seconds + 1.0, (name, elapsed)
    assert grown < 256, (name, grown)  # MiB of peak RSS


def _transformers_render(template, **context):
    """The render transformers' apply_chat_template does (its environment, no limits)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(template).render(**context)


ORDINARY = [
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    # Llama-3-style: a system message taken apart, loop variables, strip, a tool list
    "{%- set ns = namespace(system='') -%}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = messages[0]['content'] | trim -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set rest = messages -%}{%- endif -%}{{ bos_token }}"
    "<|start_header_id|>system<|end_header_id|>\n\n{{ ns.system }}"
    "{% if tools is defined %}{{ tools | map(attribute='function') | list | tojson(indent=2) }}"
    "{% endif %}<|eot_id|>{% for m in rest %}{% if loop.first and m.role != 'user' %}"
    "{{ raise_exception('user first') }}{% endif %}<|start_header_id|>{{ m.role }}"
    "<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}",
    # Qwen3-style: reasoning split, reversed scan, string methods and tests
    "{%- set ns = namespace(last=messages|length - 1) %}{%- for m in messages[::-1] %}"
    "{%- set i = (messages|length - 1) - loop.index0 %}{%- if m.role == 'user' and "
    "m.content is string and not m.content.startswith('<tool') %}{%- set ns.last = i %}"
    "{%- break %}{%- endif %}{%- endfor %}{%- for m in messages %}{%- set c = m.content %}"
    "{%- if '</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\n') %}{%- endif %}"
    "{{ '<|im_start|>' + m.role + '\n' + c + '<|im_end|>' + '\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
    "{{ '%s:%d' % ('n', ns.last) }}{{ '{0}-{1}'.format(ns.last, 'x') }}"
    "{{ (messages|map(attribute='role')|join(',')).upper() }}{{ [1, 2] * 2 }}{{ 2 ** 10 }}",
]


@pytest.mark.parametrize("index", range(len(ORDINARY)))
def test_ordinary_templates_render_as_transformers_renders_them(index):
    template = ORDINARY[index]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for extra in ({}, {"tools": tools}):
        variables = {"bos_token": "<s>", **extra}
        ours = render_chat(template, CONVERSATION, True, variables, limits=LIMITS)
        assert ours == _transformers_render(template, messages=CONVERSATION,
                                            add_generation_prompt=True, **variables)


def test_a_long_conversation_is_not_refused_for_its_length():
    # The budget grows with the conversation: 2,000 messages of 2,000 characters render.
    messages = [{"role": "user", "content": "x" * 2000}] * 2000
    text = render_chat(ORDINARY[0], messages, True, {"bos_token": "<s>"}, limits=LIMITS)
    assert len(text) > 4_000_000
