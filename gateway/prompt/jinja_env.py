"""The Jinja environment chat templates render in, set up as transformers'
`apply_chat_template` sets it up: sandboxed, `trim_blocks` and `lstrip_blocks`, loop
controls, a `tojson` that neither HTML-escapes nor sorts keys, `raise_exception` and
`strftime_now`. Rendering in it gives the text vLLM renders, without transformers.

The one such environment in the project: the Gateway's `ChatTemplate` and the tiny
model's template (devstack, also inside the vLLM environment's warm-up) compile with it,
so it imports nothing but Jinja.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson`: plain `json.dumps`, no HTML escaping, non-ASCII kept."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def compile_template(
    text: str,
    clock: Callable[[], datetime] = datetime.now,
    tojson_filter: Callable[..., str] = tojson,
) -> jinja2.Template:
    """`text` compiled in the environment; `clock` is what `strftime_now` reads, and
    `tojson_filter` must give `tojson`'s text (it may remember it). A syntax error raises
    `jinja2.TemplateSyntaxError`."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson_filter
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
    return env.from_string(text)
