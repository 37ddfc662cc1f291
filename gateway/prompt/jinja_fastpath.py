"""Faster attribute access in the chat-template sandbox, with exactly its verdicts.

A template reads message fields as attributes (`m.role`, `call.function.name`): on a dict,
Jinja's sandbox first tries `getattr(dict, "role")`, catches the AttributeError and then
reads the key, and on every attribute it finds it runs its safety checks again. Those
checks are a third of a window render's CPU. Here:

- a plain `dict` and a name that is none of dict's own attributes go straight to the key,
  which is where the sandbox's `getattr` ends up for them;
- the verdict of `is_safe_attribute` on the types templates read most is remembered per
  (type, name). For those types it depends on nothing else: the name, and `isinstance`
  checks of the object's exact type, which change only when an ABC registers a class
  (`abc.get_cache_token()` moves, and the verdicts are forgotten).

A call of one of the template's own macros (compiled template code: the sandbox finds it
safe to call, and it takes no context) goes straight to the macro. Everything else,
`str.format` wrapping included, takes the sandbox's own path.

A render also starts faster: the template's globals (a `ChainMap` of its own and the
environment's, which every render copies key by key in Python) become one plain dict,
taken once the environment is set up; nothing changes them afterwards.
"""

from __future__ import annotations

import abc
from typing import Any

import jinja2
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

__all__ = ["fast_sandbox"]

_DICT_ATTRIBUTES = frozenset(name for cls in dict.__mro__ for name in vars(cls))
"""Every attribute a plain dict instance has (it has no instance `__dict__`)."""

_VERDICT_TYPES = frozenset(
    {dict, list, tuple, str, int, float, bool, type(None), LoopContext, Namespace}
)
"""Types whose instances report their exact type to `isinstance` (no `__class__` tricks)."""

_MAX_VERDICTS = 4096


class _FastSandbox(ImmutableSandboxedEnvironment):
    """`ImmutableSandboxedEnvironment` with the fast paths above; nothing else differs."""

    _verdicts: dict[tuple[type, str], bool]
    _abc_token: object

    def getattr(self, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if type(attribute) is str:
            if kind is dict and attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except LookupError:
                    return self.undefined(obj=obj, name=attribute)
            if kind in _VERDICT_TYPES:
                try:
                    value = getattr(obj, attribute)
                except AttributeError:
                    return super().getattr(obj, attribute)
                wrapped = self.wrap_str_format(value)
                if wrapped is not None:
                    return wrapped
                if self._safe(kind, obj, attribute, value):
                    return value
                return self.unsafe_undefined(obj, attribute)
        return super().getattr(obj, attribute)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if type(obj) is Macro:
            kwargs.pop("_loop_vars", None)  # scope hints for context-taking callables
            kwargs.pop("_block_vars", None)
            try:
                return obj(*args, **kwargs)
            except StopIteration:  # as the context's own call answers it
                return self.undefined(
                    "value was undefined because a callable raised a StopIteration exception"
                )
        return super().call(context, obj, *args, **kwargs)

    def _safe(self, kind: type, obj: Any, attribute: str, value: Any) -> bool:
        token = abc.get_cache_token()
        if token != self._abc_token or len(self._verdicts) >= _MAX_VERDICTS:
            self._verdicts.clear()
            self._abc_token = token
        key = (kind, attribute)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = self.is_safe_attribute(obj, attribute, value)
        return verdict


def fast_sandbox(template: jinja2.Template) -> jinja2.Template:
    """`template` (compiled by `jinja_env.compile_template`, in an environment of its own)
    rendering with the fast paths. The environment keeps its setup; only its class gains
    the faster `getattr`, which the compiled template calls for every attribute, and the
    template its globals as one dict."""
    env = template.environment
    if type(env) is not ImmutableSandboxedEnvironment:
        raise TypeError(f"expected jinja_env's sandboxed environment, got {type(env).__name__}")
    env.__class__ = _FastSandbox
    assert isinstance(env, _FastSandbox)
    env._verdicts = {}
    env._abc_token = abc.get_cache_token()
    template.globals = dict(template.globals)
    return template
