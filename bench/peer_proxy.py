"""The Gateway against a pass-through proxy in front of the same vLLM, side by side.

A LiteLLM proxy (it forwards calls and captures nothing) and our Gateway (a session per
conversation, every token and logprob recorded) both sit in front of one vLLM CPU server;
vLLM's own chat endpoint, plain and with logprobs, is the floor. Three workloads, all
Chat Completions: `short` (8-turn chat, 24 tokens a reply), `tools` (the tool
conversations of `gateway_overhead`, reply format forced by vLLM structured outputs) and
`stream` (the short chat streamed: whole call, and time to the first sampled text). The
paths take turns call by call, so a load that comes and goes on a shared box hits them
alike; `--runs` repeats the whole set. Prints p50/p95 per path, each ÷ vLLM chat with
logprobs, and the Gateway ÷ the proxy.

LiteLLM is installed for this bench only, in its own venv under the cache dir
(`environments.cache`), never into the project's; its cost map is the packaged one, so
the proxy sends nothing beyond loopback.

Run: `python -m bench.peer_proxy [--runs 3] [--conversations 4] [--turns 8]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import GatewayProcess, percentile, stop_process
from bench.conversations import VLLM_ARGS, Conversation, new_sessions
from devstack.ports import free_port
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig
from environments.cache import default_cache_dir

LITELLM_VERSION = "1.106.12"
"""The newest release whose `proxy` extra installs from PyPI (later ones pin an unpublished
`litellm-proxy`)."""

SAMPLING = {"temperature": 1.0, "seed": 1}
SHORT_TOKENS = 24
WORKLOADS = ("short", "tools", "stream")


# ----------------------------------------------------------------------- LiteLLM


def ensure_litellm(cache_dir: Path | None = None) -> Path:
    """The `litellm` command of a venv of its own (made on first use, kept under the cache
    dir with a ready marker, like the vLLM venv)."""
    venv = (cache_dir or default_cache_dir()) / f"litellm-{LITELLM_VERSION}"
    marker = venv / ".ready"
    if not marker.exists():
        print(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
        marker.write_text(LITELLM_VERSION)
    return venv / "bin" / "litellm"


@contextlib.contextmanager
def litellm_proxy(litellm: Path, vllm: VllmServer, key: str) -> Iterator[str]:
    """A LiteLLM proxy on a free loopback port forwarding `vllm.model` to vLLM, callers
    authenticated by the master `key` (it refuses to start without one); its URL."""
    workdir = Path(tempfile.mkdtemp(prefix="litellm-bench-"))
    config = workdir / "config.json"  # JSON is YAML: no YAML writer needed here
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": vllm.model,
                        "litellm_params": {
                            "model": f"hosted_vllm/{vllm.model}",
                            "api_base": f"{vllm.url}/v1",
                        },
                    }
                ],
                "litellm_settings": {"telemetry": False},
            }
        )
    )
    port = free_port()
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False")
    env["LITELLM_MASTER_KEY"] = key
    env.pop("PYTHONPATH", None)
    argv = [str(litellm), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with (workdir / "proxy.log").open("wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"litellm proxy exited; see {workdir / 'proxy.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"litellm proxy did not start; see {workdir / 'proxy.log'}")
            time.sleep(0.5)
        yield url
    finally:
        stop_process(proc)


# ----------------------------------------------------------------------- calls


class ShortChat:
    """A chat without tools: each reply (up to 24 tokens) is echoed, then a user turn."""

    path = "/chat/completions"

    def __init__(self, sampled_here: bool, logprobs: bool = False) -> None:
        self.sampled_here, self.logprobs = sampled_here, logprobs
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Tell me about the sea."},
        ]

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": self.messages}
        body["max_tokens"] = SHORT_TOKENS
        if self.sampled_here:  # the Gateway applies the same from its session policy
            body.update(SAMPLING)
        if self.logprobs:
            body["logprobs"] = True
        return body

    def absorb(self, reply: dict[str, Any], turn: int) -> None:
        message = reply["choices"][0]["message"]
        self.messages.append({"role": "assistant", "content": message.get("content") or ""})
        self.messages.append({"role": "user", "content": f"Go on ({turn})."})


def streamed(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, Any], float]:
    """A streamed chat call: the reply rebuilt from its chunks, and when the first chunk
    with sampled text (content or reasoning) arrived."""
    first: float | None = None
    content = ""
    with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content") or ""
                if first is None and (
                    text or delta.get("reasoning_content") or delta.get("reasoning")
                ):
                    first = time.perf_counter()
                content += text
    if first is None:
        raise SystemExit(f"{url}: a stream without sampled text")
    return {"choices": [{"message": {"content": content}}]}, first


class PathRun:
    """One path's conversations of one workload and what they measured."""

    def __init__(
        self, name: str, url: str, headers_for: list[dict[str, str]], make: Callable[[], Any]
    ) -> None:
        self.name, self.url, self.headers_for = name, url, headers_for
        self.conversations = [make() for _ in headers_for]
        self.latencies: list[float] = []
        self.first: list[float] = []
        self.tool_replies = 0  # replies that call a tool: the forced format got through

    def turn(self, client: httpx.Client, model: str, turn: int, stream: bool) -> None:
        for conv, headers in zip(self.conversations, self.headers_for, strict=True):
            url = f"{self.url}{conv.path}"
            t0 = time.perf_counter()
            if stream:
                reply, first = streamed(client, url, conv.body(model), headers)
                self.first.append(first - t0)
            else:
                answer = client.post(url, json=conv.body(model), headers=headers)
                answer.raise_for_status()
                reply = answer.json()
            self.latencies.append(time.perf_counter() - t0)
            self.tool_replies += bool(reply["choices"][0]["message"].get("tool_calls"))
            conv.absorb(reply, turn)


def session_headers(gw: GatewayProcess, count: int, tools: bool) -> list[dict[str, str]]:
    """`count` Gateway sessions (the tool ones force the reply format, `new_sessions`)."""
    if tools:
        tokens = new_sessions(gw.control, gw.admin, count)
    else:
        tokens = []
        for _ in range(count):
            created = httpx.post(
                f"{gw.control}/sessions",
                headers={"Authorization": f"Bearer {gw.admin}"},
                json={"rollout_id": secrets.token_hex(4), "sampling": SAMPLING},
            )
            created.raise_for_status()
            tokens.append(created.json()["token"])
    return [{"Authorization": f"Bearer {t}"} for t in tokens]


def run_workload(
    workload: str,
    vllm: VllmServer,
    proxy: tuple[str, str],
    gw: GatewayProcess,
    conversations: int,
    turns: int,
) -> list[PathRun]:
    """Every path through `turns` turns of `conversations` conversations, turn by turn."""
    tools = workload == "tools"
    plain: list[dict[str, str]] = [{} for _ in range(conversations)]

    def direct(logprobs: bool) -> Callable[[], Any]:
        if tools:
            return lambda: Conversation(direct=True, logprobs=logprobs)
        return lambda: ShortChat(sampled_here=True, logprobs=logprobs)

    paths = [
        PathRun("vLLM chat", f"{vllm.url}/v1", plain, direct(False)),
        PathRun("vLLM chat + logprobs", f"{vllm.url}/v1", plain, direct(True)),
        PathRun(
            "LiteLLM proxy",
            f"{proxy[0]}/v1",
            [{"Authorization": f"Bearer {proxy[1]}"} for _ in plain],
            direct(False),
        ),
        PathRun(
            "gateway",
            f"{gw.url}/v1",
            session_headers(gw, conversations, tools),
            Conversation if tools else lambda: ShortChat(sampled_here=False),
        ),
    ]
    with httpx.Client(timeout=300) as client:
        for turn in range(turns):
            for path in paths:
                path.turn(client, vllm.model, turn, workload == "stream")
    return paths


def report(run: int, results: dict[str, list[PathRun]]) -> None:
    print(f"\nrun {run}: p50 / p95 ms, and ÷ vLLM chat + logprobs")
    print(f"{'workload':<9}{'path':<22}{'p50':>8}{'p95':>8}{'p50 x lp':>10}{'p95 x lp':>10}"
          f"{'first p50':>11}{'first p95':>11}")  # fmt: skip
    for workload, paths in results.items():
        base = paths[1]
        b50, b95 = percentile(base.latencies, 0.5), percentile(base.latencies, 0.95)
        for path in paths:
            p50, p95 = percentile(path.latencies, 0.5), percentile(path.latencies, 0.95)
            line = f"{workload:<9}{path.name:<22}{p50 * 1e3:>8.1f}{p95 * 1e3:>8.1f}"
            line += f"{p50 / b50:>10.2f}{p95 / b95:>10.2f}"
            if path.first:
                line += f"{percentile(path.first, 0.5) * 1e3:>11.1f}"
                line += f"{percentile(path.first, 0.95) * 1e3:>11.1f}"
            print(line)
        proxy, gw = paths[2], paths[3]
        ratios = [percentile(gw.latencies, q) / percentile(proxy.latencies, q) for q in (0.5, 0.95)]
        print(f"{workload:<9}{'gateway ÷ proxy':<22}{ratios[0]:>8.2f}{ratios[1]:>8.2f}")
        if workload == "tools":
            calls = [f"{p.name} {p.tool_replies}/{len(p.latencies)}" for p in paths]
            print(f"{'':<9}replies with a tool call: {', '.join(calls)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    litellm = ensure_litellm()
    model_dir = ensure_tiny_model()
    with VllmServer(VllmServerConfig(model_dir=model_dir, extra_args=VLLM_ARGS)) as vllm:
        gw = GatewayProcess(vllm, model_dir)
        try:
            key = f"sk-{secrets.token_hex(32)}"
            with litellm_proxy(litellm, vllm, key) as url:
                proxy = (url, key)
                run_workload("short", vllm, proxy, gw, 1, 2)  # warm-up: every path once
                for run in range(1, args.runs + 1):
                    results = {
                        w: run_workload(w, vllm, proxy, gw, args.conversations, args.turns)
                        for w in workloads
                    }
                    report(run, results)
        finally:
            gw.stop()
    print(
        f"\n{args.conversations} conversations x {args.turns} turns per path and workload; "
        f"LiteLLM {LITELLM_VERSION}; 'first': time to the first streamed sampled text"
    )


if __name__ == "__main__":
    main()
