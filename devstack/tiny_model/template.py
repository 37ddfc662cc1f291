"""Load and render the tiny model's chat template the way HF-compatible servers do: in
the Gateway's transformers-compatible Jinja environment (``gateway.prompt.jinja_env``),
which gives the text vLLM renders without importing transformers.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from typing import Any

import jinja2

from gateway.prompt.jinja_env import compile_template


def chat_template_text() -> str:
    """The template source shipped in this package."""
    return resources.files(__package__).joinpath("chat_template.jinja").read_text("utf-8")


def chat_template_sha256() -> str:
    """Stable template version for lineage (``prompt_template_version``)."""
    return hashlib.sha256(chat_template_text().encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    return compile_template(source)


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
