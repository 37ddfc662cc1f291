"""Agent conversations in each protocol, shared by the Gateway benches.

Multi-turn tool loops (Chat Completions, Codex-style Responses with the whole item
history replayed, Claude-Code-style Anthropic Messages) that build each request and absorb
each reply, so every path feeds its own sampled replies back. The tiny model never calls
tools, so a direct path forces the reply format with vLLM structured outputs (`REGEX`),
and a Gateway session gets the same through its sampling policy (`new_sessions`).
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx

REGEX = (
    r'<think>\n[a-z]{2,6}\n</think>\n\n<tool_call>\n\{"name": "run", '
    r'"arguments": \{"cmd": "[a-z]{2,8}"\}\}\n</tool_call>'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
AGENT_TOOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("read_file", ("path", "offset", "limit")),
    ("write_file", ("path", "content")),
    ("edit_file", ("path", "old_string", "new_string", "replace_all")),
    ("grep", ("pattern", "path", "glob", "output_mode", "context")),
    ("glob", ("pattern", "path")),
    ("list_dir", ("path", "ignore")),
    ("web_fetch", ("url", "prompt")),
    ("web_search", ("query", "allowed_domains", "blocked_domains")),
    ("todo_write", ("todos",)),
    ("task", ("description", "prompt", "subagent_type")),
    ("notebook_edit", ("notebook_path", "cell_id", "new_source", "edit_mode")),
    ("shell_output", ("shell_id", "filter")),
    ("kill_shell", ("shell_id",)),
    ("ask_user", ("question", "options")),
)
"""Names and parameters of the tools an agent like Claude Code or Codex declares."""


def tool_list(count: int = 1) -> list[dict[str, Any]]:
    """`count` tools in Chat Completions form: `run` (the one the replies call) and then
    agent-sized ones (a description of ~1 KB, a documented schema of 1-5 parameters)."""
    if not 1 <= count <= 1 + len(AGENT_TOOLS):
        raise ValueError(f"tools must be 1..{1 + len(AGENT_TOOLS)}, got {count}")
    tools = list(TOOLS)
    for name, params in AGENT_TOOLS[: count - 1]:
        usage = (
            f"Use {name} when the task needs it; prefer it to running a shell command, check "
            "its result before going on, and never guess a value you can look up. "
        )
        properties = {
            p: {"type": "string", "description": f"The {p.replace('_', ' ')} for {name}."}
            for p in params
        }
        parameters = {"type": "object", "properties": properties, "required": [params[0]]}
        function = {"name": name, "description": usage * 6, "parameters": parameters}
        tools.append({"type": "function", "function": function})
    return tools


# vLLM's own chat endpoint needs a tool parser to accept `tools` (the Gateway parses itself).
VLLM_ARGS = [
    "--enforce-eager",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--enable-scale-out",  # /inference/v1/generate, for --engine-api generate
]
TOOL_OUTPUT = "total 8\n-rw-r--r-- 1 root root 42 hello.py\n-rw-r--r-- 1 root root 17 notes.md\n"


class Conversation:
    """One agent conversation in one protocol: builds each request, absorbs each reply."""

    path = "/chat/completions"

    def __init__(self, direct: bool = False, logprobs: bool = False, tools: int = 1) -> None:
        self.direct = direct
        self.logprobs = logprobs
        self.tools = tool_list(tools)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "List the files, then inspect each one."},
        ]

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages,
            "tools": self.tools,
            "max_tokens": 64,
        }
        if self.direct:  # the gateway applies the same params from its session policy
            body.update(temperature=1.0, seed=1, structured_outputs={"regex": REGEX})
        if self.logprobs:
            body["logprobs"] = True
        return body

    def absorb(self, reply: dict[str, Any], turn: int) -> None:
        message = reply["choices"][0]["message"]
        if not message.get("tool_calls"):
            self.messages.append({"role": "assistant", "content": message.get("content") or ""})
            self.messages.append({"role": "user", "content": TOOL_OUTPUT})
            return
        call = message["tool_calls"][0]
        self.messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": [call]}
        )
        self.messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": f"{TOOL_OUTPUT}turn {turn}"}
        )


class ResponsesConversation(Conversation):
    """Codex-style: `store: false`, the whole item history replayed every call."""

    path = "/responses"

    def __init__(self, tools: int = 1) -> None:
        self.tools = [{"type": "function", **tool["function"]} for tool in tool_list(tools)]
        self.items: list[dict[str, Any]] = [
            {"role": "user", "content": "List the files, then inspect each one."}
        ]

    def body(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "instructions": "You are a coding agent.",
            "input": self.items,
            "tools": self.tools,
            "store": False,
            "max_output_tokens": 64,
        }

    def absorb(self, reply: dict[str, Any], turn: int) -> None:
        self.items += reply["output"]
        calls = [item for item in reply["output"] if item["type"] == "function_call"]
        if calls:
            output = f"{TOOL_OUTPUT}turn {turn}"
            self.items.append(
                {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": output}
            )
        else:
            self.items.append({"role": "user", "content": TOOL_OUTPUT})


class MessagesConversation(Conversation):
    """Claude-Code-style Anthropic Messages with content blocks."""

    path = "/messages"

    def __init__(self, tools: int = 1) -> None:
        self.tools = [
            {
                "name": fn["name"],
                "description": fn["description"],
                "input_schema": fn["parameters"],
            }
            for fn in (tool["function"] for tool in tool_list(tools))
        ]
        self.messages = [{"role": "user", "content": "List the files, then inspect each one."}]

    def body(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "system": "You are a coding agent.",
            "messages": self.messages,
            "tools": self.tools,
            "max_tokens": 64,
        }

    def absorb(self, reply: dict[str, Any], turn: int) -> None:
        self.messages.append({"role": "assistant", "content": reply["content"]})
        uses = [block for block in reply["content"] if block["type"] == "tool_use"]
        if uses:
            result = {"type": "tool_result", "tool_use_id": uses[0]["id"], "content": TOOL_OUTPUT}
            self.messages.append({"role": "user", "content": [result]})
        else:
            self.messages.append({"role": "user", "content": TOOL_OUTPUT})


def new_sessions(control: str, admin: str, count: int) -> list[str]:
    """`count` Gateway sessions whose sampling forces the reply format; their tokens."""
    tokens = []
    for _ in range(count):
        created = httpx.post(
            f"{control}/sessions",
            headers={"Authorization": f"Bearer {admin}"},
            json={
                "rollout_id": secrets.token_hex(4),
                "sampling": {
                    "temperature": 1.0,
                    "seed": 1,
                    "engine_extra": {"structured_outputs": {"regex": REGEX}},
                },
            },
        ).json()
        tokens.append(created["token"])
    return tokens
