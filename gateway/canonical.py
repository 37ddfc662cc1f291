"""The one canonical request and reply every wire protocol converts to and from.

The protocols (`gateway.protocols`: Chat Completions, Responses, Messages) only
translate; the Gateway core — templating, incremental tokenization, engine calls,
recording — sees nothing else.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.sampling import SamplingParams


class CanonicalModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(CanonicalModel):
    """A function call. `arguments` is JSON text exactly as produced or echoed."""

    id: str
    name: str
    arguments: str


class Message(CanonicalModel):
    """One chat message in the model's terms.

    A developer message is a system one with `developer` set: templates know system only,
    but a developer message in the conversation changes how vLLM renders its system
    messages (`ChatTemplate.folds_system_messages`).
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    developer: bool = False


class Tool(CanonicalModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class CanonicalRequest(CanonicalModel):
    """What the agent asked for, protocol-independent.

    `sampling` holds what the agent requested; the session policy is applied later.
    `template_kwargs` are chat-template variables such as `enable_thinking`.
    """

    protocol: str
    """The name the protocol registered under (`gateway.protocols.registry`)."""
    path: str
    model: str
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: Any = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
    include_usage: bool = False
    template_kwargs: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)


class ParsedOutput(CanonicalModel):
    """Sampled text split for the agent. `parse_error` flags a malformed tool call,
    which is then left in `content` as text rather than dropped or crashing."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    parse_error: str | None = None


class Reply(CanonicalModel):
    """What the gateway sends back for one finished call, for its protocol to render."""

    call_id: str
    model: str
    created: int
    output: ParsedOutput
    finish_reason: Literal["stop", "length", "tool_calls"]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    output_ids: list[int]
    output_logprobs: list[float]
