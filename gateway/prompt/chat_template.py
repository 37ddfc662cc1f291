"""Render a model's chat template the way transformers does, normalised to that template.

The Gateway renders prompts itself and sends token ids to the engine, so it must reproduce
what `tokenizer.apply_chat_template` would produce: the same Jinja environment, the same
`tojson`, `raise_exception` and `strftime_now` helpers, and the same message dicts.
Real templates disagree on input details: some crash on an assistant `content` of None,
some silently drop tool calls unless it is None, some need tool-call `arguments` as a
mapping and others as a JSON string. At construction we probe the template once and
remember the variant it renders correctly.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2

from gateway import json_text
from gateway.canonical import Message, Tool, ToolCall
from gateway.prompt.jinja_env import compile_template, tojson
from gateway.prompt.jinja_fastpath import fast_sandbox
from gateway.prompt.tool_dicts import ToolDicts, tool_dict

__all__ = [
    "RESERVED_TEMPLATE_VARIABLES",
    "TOOL_CALL_STYLES",
    "ChatTemplate",
    "TemplateRenderError",
    "ToolCallStyle",
    "probe_call_id",
]


RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "tools",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "raise_exception",
        "strftime_now",
    }
)
"""Template variables the renderer sets itself; a client's template kwargs may not name
them (they would collide with `render`'s own arguments or replace what we render)."""


class TemplateRenderError(ValueError):
    """The template rejected the input; the message is the template's own (→ HTTP 400)."""


@dataclass(frozen=True)
class ToolCallStyle:
    """How an assistant message with tool calls is handed to the template."""

    content_none: bool
    """Empty assistant content is passed as None (True) or as "" (False)."""
    arguments_as_dict: bool
    """Tool-call arguments are passed parsed (dict) or as the JSON text."""

    def describe(self) -> str:
        content = "None" if self.content_none else '""'
        arguments = "dict" if self.arguments_as_dict else "JSON string"
        return f"content={content}, arguments={arguments}"


TOOL_CALL_STYLES: tuple[ToolCallStyle, ...] = (
    ToolCallStyle(content_none=False, arguments_as_dict=True),
    ToolCallStyle(content_none=False, arguments_as_dict=False),
    ToolCallStyle(content_none=True, arguments_as_dict=True),
    ToolCallStyle(content_none=True, arguments_as_dict=False),
)
"""Probe order. "" before None: None crashes several templates or renders as the text
"None". dict before string: templates that apply `tojson` encode a string a second time."""

_developer = operator.attrgetter("developer")
"""Read in C: the fold is decided over the whole conversation on every call."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Message fields templates read reasoning from (Qwen/GLM/Kimi/MiniMax, gpt-oss, others)."""


def probe_call_id(n: int) -> str:
    """A tool-call id for probe conversations that every template accepts: 9 alphanumerics
    (Mistral templates reject any other length)."""
    return f"prb{n:06d}"


# The probe conversation: distinctive strings so their presence in the output is meaningful.
_PROBE_ID = probe_call_id(1)
_PROBE_TOOL = "probe_lookup_tool"
_PROBE_KEY = "probe_key_q7"
_PROBE_VALUE = "probe-value-z9"
_PROBE_QUESTION = "probe question x3"
_PROBE_SYSTEM = "probe system prompt"
_PROBE_LATE_SYSTEM = "probe late system w4"


def _arguments(text: str, as_dict: bool) -> Any:
    """Parse arguments for dict-style templates; keep the text if it is not a JSON object."""
    if not as_dict:
        return text
    if not text.strip():
        return {}
    try:
        parsed = json_text.loads(text, allow_nan=True)
    except ValueError:  # not JSON, or JSON we cannot hold (lone surrogates, deep nesting)
        return text
    return parsed if isinstance(parsed, dict) else text


def _tool_call_dict(call: ToolCall, as_dict: bool) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": _arguments(call.arguments, as_dict)},
    }


class ChatTemplate:
    """One model's chat template, rendered with transformers semantics.

    `version` (sha256 of the text) is the `prompt_template_version` of samples.
    `tool_call_style` is the input variant the probe found; `supports_tools` is False when
    no variant made a tool call visible in the output. `tool_names_via_ids` is True for
    templates that render a call by its id only (Kimi-K2-Thinking: the model's own ids are
    `functions.<name>:<n>`, so the name survives only while ids keep that form).
    `one_system_message` is True for templates that take a leading system message only and
    refuse (Qwen3.5, Mistral) or silently drop (gpt-oss, MiniMax-M2) a later one: agents
    send those (Claude Code its environment after the first user turn, Codex two developer
    messages), so every system message is folded into one leading message, in order.
    `developer_role` is True when the template names the developer role (vLLM's test: the
    quoted word). Without it, vLLM folds the same way whenever a developer message is in
    the conversation; `folds_system_messages` decides both.
    `reasoning_beside_content` is False for templates that refuse an assistant message with
    content, reasoning and tool calls together (gpt-oss: "Cannot pass both content and
    thinking"); such a message is handed over without its reasoning, as vLLM hands it
    (vLLM passes reasoning as `reasoning`, a field that template never reads).
    """

    def __init__(
        self,
        template_text: str,
        *,
        bos_token: str | None,
        eos_token: str,
        extra_context: Mapping[str, Any] | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.text = template_text
        self.bos_token = bos_token or ""
        self.eos_token = eos_token
        self.version = hashlib.sha256(template_text.encode("utf-8")).hexdigest()
        self._extra = dict(extra_context or {})
        self._clock = clock or datetime.now
        self._tools = ToolDicts(tojson)
        self._template = self._compile(template_text)
        self.reasoning_fields = tuple(
            f for f in _REASONING_FIELDS if re.search(rf"\b{f}\b", template_text)
        )
        self.developer_role = any(f"{q}developer{q}" in template_text for q in "'\"")
        self.one_system_message = False
        self.one_system_message = self._takes_one_system_message()
        self.reasoning_beside_content = True
        self.tool_call_style, self.supports_tools, self.tool_names_via_ids = self._probe()
        self.reasoning_beside_content = self._takes_reasoning_beside_content()

    def _compile(self, text: str) -> jinja2.Template:
        try:
            return fast_sandbox(compile_template(text, self._clock, self._tools.tojson))
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateRenderError(f"chat template syntax error: {exc}") from exc

    # -- conversion -------------------------------------------------------------------

    def folds_system_messages(self, messages: Sequence[Message]) -> bool:
        """Whether every system message of this conversation goes into one leading one.

        Decided over the whole conversation: a window rendering part of it must be told."""
        if self.one_system_message:
            return True
        return not self.developer_role and any(map(_developer, messages))

    def message_dicts(
        self,
        messages: Sequence[Message],
        style: ToolCallStyle | None = None,
        fold: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Canonical messages as the dicts this template expects (`fold`: None decides
        from `messages`)."""
        style = style or self.tool_call_style
        if self.folds_system_messages(messages) if fold is None else fold:
            messages = _fold_system_messages(messages)
        return [self._message_dict(m, style) for m in messages]

    def _message_dict(self, message: Message, style: ToolCallStyle) -> dict[str, Any]:
        # Keys are added only when meaningful: templates test `'tool_calls' in message`,
        # `"thinking" in message` or `message.get('name')`, and an empty value breaks them.
        out: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.role == "assistant" and message.tool_calls:
            if not message.content:
                out["content"] = None if style.content_none else ""
            out["tool_calls"] = [
                _tool_call_dict(c, style.arguments_as_dict) for c in message.tool_calls
            ]
        elif out["content"] is None:
            out["content"] = ""
        refused = bool(message.content and message.tool_calls) and not self.reasoning_beside_content
        if message.role == "assistant" and message.reasoning is not None and not refused:
            for field in self.reasoning_fields:
                out[field] = message.reasoning
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
        return out

    # -- rendering --------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] = (),
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render canonical messages; raises `TemplateRenderError` with the template's reason."""
        return self.render_with_fold(messages, tools, add_generation_prompt, None, template_kwargs)

    def render_with_fold(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        add_generation_prompt: bool,
        fold: bool | None,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        """`render` with the fold decided by the caller (`message_dicts`): a window renders
        part of a conversation whose whole decides it. The kwargs come as one mapping so
        that a template variable can never be taken for `fold`."""
        return self.render_dicts(
            self.message_dicts(messages, fold=fold),
            self._tools.dicts(tools),
            add_generation_prompt,
            **template_kwargs,
        )

    def render_dicts(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        **template_kwargs: Any,
    ) -> str:
        """Render already-converted dicts. No tools is passed as None, as transformers does:
        templates test `tools is not none`, and an empty list would announce a tool mode."""
        reserved = RESERVED_TEMPLATE_VARIABLES.intersection(template_kwargs)
        if reserved:
            raise TemplateRenderError(
                f"template kwargs may not set {sorted(reserved)}: the renderer sets them"
            )
        context = {**self._extra, **template_kwargs}
        context.update(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            return self._template.render(**context)
        except jinja2.TemplateError as exc:
            raise TemplateRenderError(str(exc) or type(exc).__name__) from exc
        except (
            TypeError,
            ValueError,
            AttributeError,
            KeyError,
            IndexError,
            ArithmeticError,
            RecursionError,
        ) as exc:
            raise TemplateRenderError(f"{type(exc).__name__}: {exc}") from exc

    # -- probe ------------------------------------------------------------------------

    def _takes_one_system_message(self) -> bool:
        """Whether a system message after the first user turn is refused, dropped or drops
        the first one while a leading one renders (the conversation Claude Code sends)."""

        def conversation(*turns: tuple[str, str]) -> list[dict[str, Any]]:
            return [{"role": role, "content": content} for role, content in turns]

        head = (("system", _PROBE_SYSTEM), ("user", _PROBE_QUESTION))
        try:
            self.render_dicts(conversation(*head), None, True)
        except TemplateRenderError:
            return False  # not even a leading one: folding cannot help
        late = (("system", _PROBE_LATE_SYSTEM), ("assistant", "probe answer"), ("user", "more"))
        try:
            text = self.render_dicts(conversation(*head, *late), None, True)
        except TemplateRenderError:
            return True
        # dropped: the later text, or the earlier one it replaced (DeepSeek-R1 keeps the last)
        return _PROBE_LATE_SYSTEM not in text or _PROBE_SYSTEM not in text

    def _takes_reasoning_beside_content(self) -> bool:
        """Whether content, reasoning and tool calls in one assistant message render."""
        if not (self.supports_tools and self.reasoning_fields):
            return True
        messages = _probe_messages()
        messages[2] = messages[2].model_copy(
            update={"content": "probe preamble", "reasoning": "probe thought"}
        )
        try:
            self.render_dicts(self.message_dicts(messages), [_probe_tool()], True)
        except TemplateRenderError:
            return False
        return True

    def _probe(self) -> tuple[ToolCallStyle, bool, bool]:
        """Pick the first style that renders and shows the tool call's name and arguments.

        A template showing the call's id instead of its name is accepted as a second
        choice (see `tool_names_via_ids`)."""
        first_rendering: ToolCallStyle | None = None
        by_id: ToolCallStyle | None = None
        for style in TOOL_CALL_STYLES:
            try:
                text = self.render_dicts(
                    self.message_dicts(_probe_messages(), style), [_probe_tool()], True
                )
            except TemplateRenderError:
                continue
            first_rendering = first_rendering or style
            if _tool_call_visible(text, _PROBE_TOOL):
                return style, True, False
            if by_id is None and _tool_call_visible(text, _PROBE_ID):
                by_id = style
        if by_id is not None:
            return by_id, True, True
        return first_rendering or TOOL_CALL_STYLES[0], False, False


def _fold_system_messages(messages: Sequence[Message]) -> Sequence[Message]:
    """Every system message's text, in order, as one leading system message (empty ones
    skipped, as vLLM merges them)."""
    systems = [m for m in messages if m.role == "system"]
    if not systems or (len(systems) == 1 and messages[0].role == "system"):
        return messages
    folded = Message(role="system", content="\n\n".join(m.content for m in systems if m.content))
    return [folded, *(m for m in messages if m.role != "system")]


def _probe_messages() -> list[Message]:
    call = ToolCall(
        id=_PROBE_ID, name=_PROBE_TOOL, arguments=json.dumps({_PROBE_KEY: _PROBE_VALUE})
    )
    return [
        Message(role="system", content=_PROBE_SYSTEM),
        Message(role="user", content=_PROBE_QUESTION),
        Message(role="assistant", content=None, tool_calls=[call]),
        Message(role="tool", content="probe result r5", tool_call_id=_PROBE_ID),
    ]


def _probe_tool() -> dict[str, Any]:
    schema = {"type": "object", "properties": {_PROBE_KEY: {"type": "string"}}}
    return tool_dict(Tool(name=_PROBE_TOOL, description="Probe tool.", parameters=schema))


def _tool_call_visible(text: str, handle: str) -> bool:
    """The call must appear after the user turn (tool declarations come before it)."""
    at = text.rfind(_PROBE_QUESTION)
    tail = text[at + len(_PROBE_QUESTION) :] if at >= 0 else text
    shown = all(s in tail for s in (handle, _PROBE_KEY, _PROBE_VALUE))
    return shown and "None" not in tail
