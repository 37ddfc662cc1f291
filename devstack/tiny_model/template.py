"""Load and render the tiny model's chat template the way HF-compatible servers do.

vLLM renders chat templates through transformers, whose Jinja environment differs from
Jinja's defaults (sandboxed, ``trim_blocks``/``lstrip_blocks``, a ``tojson`` that does not
HTML-escape or sort keys, ``raise_exception``). Rendering here with the same settings
gives the same text without importing transformers.
"""

from __future__ import annotations

import functools
import hashlib
import json
from datetime import datetime
from importlib import resources
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def chat_template_text() -> str:
    """The template source shipped in this package."""
    return resources.files(__package__).joinpath("chat_template.jinja").read_text("utf-8")


def chat_template_sha256() -> str:
    """Stable template version for lineage (``prompt_template_version``)."""
    return hashlib.sha256(chat_template_text().encode("utf-8")).hexdigest()


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    template: str | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` (OpenAI chat shape) with the tiny template or ``template``.

    Extra keyword arguments (e.g. ``enable_thinking=False``) become template variables,
    as ``chat_template_kwargs`` do in vLLM.
    """
    compiled = _compile(template if template is not None else chat_template_text())
    return compiled.render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
