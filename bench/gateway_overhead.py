"""Gateway overhead against vLLM, measured side by side in one run.

(a) the same multi-turn tool conversations sent straight to vLLM's own
`/v1/chat/completions`, and (b) through the Gateway (a separate `rollout gateway`
process in front of the same vLLM). Prints the p50/p99 latency ratio b/a, and the
Gateway process's CPU time per call at the first turns vs the last turns of long
conversations: it must stay flat, because only new tokens are tokenized.

Run: `python bench/gateway_overhead.py [--conversations 8] [--turns 40] [--fsync off]`.
The tiny model never calls tools, so both paths force the reply format with vLLM
structured outputs; each path feeds its own sampled replies back.
"""

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from devstack.ports import free_port
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig

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
# vLLM's own chat endpoint needs a tool parser to accept `tools` (the Gateway parses itself).
VLLM_ARGS = ["--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
TOOL_OUTPUT = "total 8\n-rw-r--r-- 1 root root 42 hello.py\n-rw-r--r-- 1 root root 17 notes.md\n"


def clock_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (/proc, no psutil needed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Conversation:
    """One agent conversation in one protocol: builds each request, absorbs each reply."""

    path = "/chat/completions"

    def __init__(self, direct: bool = False) -> None:
        self.direct = direct
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "List the files, then inspect each one."},
        ]

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages,
            "tools": TOOLS,
            "max_tokens": 64,
        }
        if self.direct:  # the gateway applies the same params from its session policy
            body.update(temperature=1.0, seed=1, structured_outputs={"regex": REGEX})
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

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = [
            {"role": "user", "content": "List the files, then inspect each one."}
        ]

    def body(self, model: str) -> dict[str, Any]:
        tool = {"type": "function", **TOOLS[0]["function"]}
        return {
            "model": model,
            "instructions": "You are a coding agent.",
            "input": self.items,
            "tools": [tool],
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

    def __init__(self) -> None:
        self.messages = [{"role": "user", "content": "List the files, then inspect each one."}]

    def body(self, model: str) -> dict[str, Any]:
        fn = TOOLS[0]["function"]
        tool = {
            "name": fn["name"],
            "description": fn["description"],
            "input_schema": fn["parameters"],
        }
        return {
            "model": model,
            "system": "You are a coding agent.",
            "messages": self.messages,
            "tools": [tool],
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


def run_path(
    url: str,
    headers_for: list[dict[str, str]],
    model: str,
    turns: int,
    make: Callable[[], Conversation],
    pid: int | None,
) -> tuple[list[float], list[float]]:
    """Lockstep: turn t of every conversation, then turn t+1. Returns latencies and, per
    turn, the gateway CPU ms per call (empty for the direct path)."""
    conversations = [make() for _ in headers_for]
    latencies: list[float] = []
    cpu_per_turn: list[float] = []
    with httpx.Client(timeout=300) as client:
        for turn in range(turns):
            before = clock_ticks(pid) if pid else 0
            for conv, headers in zip(conversations, headers_for, strict=True):
                t0 = time.perf_counter()
                reply = client.post(f"{url}{conv.path}", json=conv.body(model), headers=headers)
                latencies.append(time.perf_counter() - t0)
                reply.raise_for_status()
                conv.absorb(reply.json(), turn)
            if pid:
                ticks = clock_ticks(pid) - before
                cpu_per_turn.append(1000 * ticks / os.sysconf("SC_CLK_TCK") / len(conversations))
    return latencies, cpu_per_turn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument(
        "--fsync", choices=["group", "off"], default="group", help="the gateway's durability"
    )
    args = parser.parse_args()
    model_dir = ensure_tiny_model()
    admin = secrets.token_urlsafe(16)
    with VllmServer(VllmServerConfig(model_dir=model_dir, extra_args=VLLM_ARGS)) as vllm:
        port, control_port = free_port(), free_port()
        data_dir = tempfile.mkdtemp(prefix="gw-bench-")
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "gateway",
                "--engine",
                vllm.url,
                "--model",
                vllm.model,
                "--tokenizer",
                str(model_dir),
                "--port",
                str(port),
                "--control-port",
                str(control_port),
                "--data-dir",
                data_dir,
                "--fsync",
                args.fsync,
            ],
            env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin),
        )
        try:
            gw = f"http://127.0.0.1:{port}"
            control = f"http://127.0.0.1:{control_port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{control}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("gateway did not start")
                time.sleep(0.2)
            rows = measure(gw, control, admin, vllm, args.conversations, args.turns, gateway.pid)
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
    print(
        f"{args.conversations} conversations x {args.turns} turns per path, fsync {args.fsync}; "
        "ratios vs vLLM chat"
    )
    header = f"{'path':<28}{'p50 ms':>9}{'p99 ms':>9}{'p50 x':>7}{'p99 x':>7}"
    print(header + f"{'CPU/call t1-5':>15}{'t' + str(args.turns - 4) + '-' + str(args.turns):>10}")
    base50, base99 = rows[0][1], rows[0][2]
    for name, p50, p99, cpu in rows:
        line = f"{name:<28}{p50 * 1000:>9.1f}{p99 * 1000:>9.1f}"
        line += f"{p50 / base50:>7.2f}{p99 / base99:>7.2f}"
        if cpu:
            line += f"{statistics.mean(cpu[:5]):>12.2f} ms{statistics.mean(cpu[-5:]):>7.2f} ms"
        print(line)


def new_sessions(control: str, admin: str, count: int) -> list[str]:
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


def measure(
    gw: str, control: str, admin: str, vllm: VllmServer, conversations: int, turns: int, pid: int
) -> list[tuple[str, float, float, list[float]]]:
    """Every path in one run: vLLM's own chat endpoint first, then each gateway protocol
    (`gw`: the agent listener; sessions are opened on the `control` listener)."""
    plain: list[dict[str, str]] = [{} for _ in range(conversations)]
    direct = f"{vllm.url}/v1"
    run_path(direct, plain[:1], vllm.model, 2, lambda: Conversation(direct=True), None)
    lat, _ = run_path(direct, plain, vllm.model, turns, lambda: Conversation(direct=True), None)
    rows = [("vLLM /v1/chat/completions", percentile(lat, 0.5), percentile(lat, 0.99), [])]
    paths: list[tuple[str, Callable[[], Conversation], str]] = [
        ("gateway /v1/chat/completions", Conversation, "Authorization"),
        ("gateway /v1/responses", ResponsesConversation, "Authorization"),
        ("gateway /v1/messages", MessagesConversation, "x-api-key"),
    ]
    for name, make, header in paths:
        tokens = new_sessions(control, admin, conversations)
        headers = [{header: f"Bearer {t}" if header == "Authorization" else t} for t in tokens]
        lat, cpu = run_path(f"{gw}/v1", headers, vllm.model, turns, make, pid)
        rows.append((name, percentile(lat, 0.5), percentile(lat, 0.99), cpu))
    return rows


if __name__ == "__main__":
    main()
