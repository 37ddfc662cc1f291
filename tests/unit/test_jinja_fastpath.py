"""The fast attribute paths of the chat-template sandbox give exactly the sandbox's results:
the same text for what it allows, the same error for what it refuses."""

import abc

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from gateway.prompt.jinja_env import compile_template
from gateway.prompt.jinja_fastpath import fast_sandbox

EXPRESSIONS = [
    "{{ m.role }}",
    "{{ m.missing is defined }}",
    "{{ m.missing }}",
    "{{ m['role'] }}",
    "{{ m.items }}",
    "{{ m.keys() | list }}",
    "{{ m.get('role') }}",
    "{{ m.pop('role') }}",
    "{{ m.clear() }}",
    "{{ m.update({'x': 1}) }}",
    "{{ m.__class__ }}",
    "{{ m.__class__.__mro__ }}",
    "{{ m.tool_calls[0].function.name }}",
    "{{ m.tool_calls.append(1) }}",
    "{{ m.tool_calls.index(m.tool_calls[0]) }}",
    "{{ m.content.startswith('he') }}",
    "{{ m.content.__class__.__base__.__subclasses__() }}",
    "{{ m.content.format }}",
    "{{ '{0.__class__.__mro__}'.format(m.content) }}",
    "{{ '{0[role]}'.format_map({'0': m}) }}",
    "{{ m.content.mro }}",
    "{{ (1).real }}",
    "{{ (1).__class__ }}",
    "{{ none.__class__ }}",
    "{{ (1, 2).count(1) }}",
    "{% for x in [1, 2] %}{{ loop.index0 }}{{ loop.__class__ }}{{ loop._after }}{% endfor %}",
    "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}{{ ns._Namespace__attrs }}",
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ range(3) | list }}{{ dict(a=1) }}{{ strftime_now is defined }}{{ joiner is defined }}",
    "{{ raise_exception('refused ' + m.role) }}",
    "{% set range = m.role %}{{ range }}",
    "{% macro f(x) %}{{ x }}{{ raise_exception is defined }}{% endmacro %}{{ f(m.content) }}",
    "{% macro f(x, y='d') %}{{ x }}{{ y }}{{ varargs }}{{ kwargs }}{% endmacro %}"
    "{% for c in 'ab' %}{{ f(c, 1, 2, z=loop.index) }}{{ f(x=c) }}{% endfor %}",
    "{% macro f() %}[{{ caller(m.role) }}]{% endmacro %}{% call(r) f() %}{{ r }}{% endcall %}",
    "{% macro f(x) %}{{ x }}{% endmacro %}{{ f() }}{{ f(1, 2) }}",
    "{% macro f() %}{{ f.__globals__ }}{% endmacro %}{{ f() }}",
]
"""Reads a template may make, allowed and refused, on every kind of value it sees."""

CONTEXT = {
    "m": {
        "role": "assistant",
        "content": "hello",
        "tool_calls": [{"function": {"name": "run", "arguments": {"cmd": "ls"}}}],
    }
}


def _outcome(template: jinja2.Template) -> tuple[str, str]:
    try:
        return "ok", template.render(**CONTEXT)
    except Exception as exc:  # the sandbox's refusal is the result compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("source", EXPRESSIONS)
def test_fast_paths_give_the_sandboxes_result(source: str) -> None:
    stock = compile_template(source)
    fast = fast_sandbox(compile_template(source))
    assert _outcome(fast) == _outcome(stock)
    assert _outcome(fast) == _outcome(fast)  # a remembered verdict, the second time


def test_the_sandbox_refuses_what_a_plain_environment_allows() -> None:
    """Control: the reads above are attacks the sandbox stops, not harmless ones."""
    source = "{{ m.content.__class__.__base__.__subclasses__() | length > 0 }}"
    assert jinja2.Environment().from_string(source).render(**CONTEXT) == "True"
    with pytest.raises(SecurityError):
        fast_sandbox(compile_template(source)).render(**CONTEXT)
    mutate = "{{ m.clear() }}{{ m | length }}"
    assert jinja2.Environment().from_string(mutate).render(m={"a": 1}) == "None0"
    with pytest.raises(SecurityError):
        fast_sandbox(compile_template(mutate)).render(m={"a": 1})


def test_verdicts_are_forgotten_when_an_abc_registers_a_class() -> None:
    """`isinstance` against an ABC can change only by a registration: then nothing
    remembered is trusted."""
    template = fast_sandbox(compile_template("{{ m.content.upper() }}"))
    assert template.render(**CONTEXT) == "HELLO"
    env = template.environment
    assert env._verdicts  # type: ignore[attr-defined]

    class Marker(abc.ABC):  # noqa: B024 (only registers a class)
        pass

    Marker.register(bytes)
    assert template.render(**CONTEXT) == "HELLO"
    assert list(env._verdicts) == [(str, "upper")]  # type: ignore[attr-defined]


def test_only_jinja_envs_sandbox_is_sped_up() -> None:
    with pytest.raises(TypeError):
        fast_sandbox(jinja2.Environment().from_string("{{ 1 }}"))


def test_a_macro_that_raises_stop_iteration_renders_as_in_the_sandbox() -> None:
    """A filter raising StopIteration inside a macro: the stock sandbox's call answers it
    with an undefined value, and so does the fast macro call."""

    def stop(value: object) -> object:
        raise StopIteration

    def compiled() -> jinja2.Template:
        env = ImmutableSandboxedEnvironment()
        env.filters["stop"] = stop
        return env.from_string("{% macro f() %}{{ 1 | stop }}{% endmacro %}[{{ f() }}]")

    stock, fast = compiled(), fast_sandbox(compiled())
    assert stock.render() == "[]"
    assert fast.render() == stock.render()
    assert type(fast.environment).__name__ == "_FastSandbox"  # the fast path ran it
