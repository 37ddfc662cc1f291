"""The Gateway's own time to first streamed event, per model family, side by side in one run.

Running vLLM for every family would take an hour, and vLLM's decode time would drown the
Gateway's, so each family gets a scripted engine (`devstack.scripted_engine`, a FAKE
engine speaking vLLM's token API, answering at once) with the family's tiny model
tokenizer, and a `rollout gateway` process in front of it reading the family's tiny model
directory. The engine's answer is a short reply in the family's own format, written by
`bench.output_parsers.Family` (reasoning, content and one tool call; its "source" column
says how each family's text is written), streamed one token per chunk.

The same multi-turn tool conversations as `gateway_streaming.py` go through every
family's gateway in each protocol, every call streamed, the paths taking turns call by
call so a load that comes and goes on a shared box hits them alike, after two turns of
warm-up that are not measured. TTFT is the time
from sending a request to the first event with sampled text. Next to each family's
gateways, the bench streams each call's prompt straight to the family's engine ("engine"):
its first chunk is the floor the Gateway adds to.

With `--before TREE` a gateway from another source tree (e.g. `git archive <commit> | tar
-x -C TREE`) serves the qwen3 family too, and every TTFT is also printed as a ratio to
that gateway's in the same protocol.

Run: `python -m bench.gateway_first_event [--conversations 2] [--turns 10] [--before TREE]
[--families qwen3,gpt-oss]`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

import httpx

from bench.common import percentile, wait_healthy
from bench.conversations import TOOLS, Conversation, MessagesConversation, ResponsesConversation
from bench.gateway_streaming import Path, sse_data
from bench.output_parsers import SIBLING, Family
from devstack.ports import free_port
from devstack.scripted_engine import read_log
from devstack.tiny_families import ensure_family_model
from gateway.canonical import Tool
from gateway.parsers.registry import parser_names

RUN = Tool(
    name=TOOLS[0]["function"]["name"],
    description=TOOLS[0]["function"]["description"],
    parameters=TOOLS[0]["function"]["parameters"],
)
PROTOCOLS: list[tuple[str, Callable[[], Conversation], str]] = [
    ("chat", Conversation, "Authorization"),
    ("responses", ResponsesConversation, "Authorization"),
    ("messages", MessagesConversation, "x-api-key"),
]
BEFORE_FAMILY = "qwen3"
WARMUP = 2
"""Turns of every conversation run before the measured ones (imports, caches, first
connections)."""


def scripted_reply(family: Family) -> tuple[str, str]:
    """(the reply the engine samples, its end-of-turn token): the family's text for a
    short reply with one `run` call, cut at the end marker it closes with."""
    text = family.reply(16, 1, lambda index, prose: {"cmd": "ls"})
    if text is None:
        raise SystemExit(f"{family.name}: no reply with its tool call parsed")
    ends = [(text.rfind(m), m) for m in family.files.end_of_turn if m in text]
    if not ends:  # a template that closes the turn only when another message follows
        return text, family.files.eos_token
    at, marker = max(ends)
    return text[:at], marker


class Child:
    """A child process on a free port, stopped by its own pid."""

    def __init__(
        self,
        argv: list[str],
        health: str,
        env: dict[str, str] | None = None,
        cwd: FsPath | None = None,
    ) -> None:
        self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
        self.health = health

    def wait(self) -> None:
        wait_healthy(self.health, self.process, timeout_s=180)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Engine:
    """One family's scripted engine process and its answer log."""

    family: str
    model: str
    url: str
    log: FsPath
    child: Child

    @classmethod
    def start(cls, family: Family, work: FsPath) -> Engine:
        reply, eos = scripted_reply(family)
        script = work / f"{family.name}.script.json"
        script.write_text(json.dumps({"default_reply": reply}), encoding="utf-8")
        log = work / f"{family.name}.log.jsonl"
        port = free_port()
        model = f"tiny-{family.name}"
        argv = [sys.executable, "-m", "devstack.scripted_engine", "--script", str(script)]
        argv += ["--tokenizer", str(family.files.tokenizer_path), "--model", model]
        argv += ["--port", str(port), "--log", str(log), "--eos-token", eos]
        url = f"http://127.0.0.1:{port}"
        return cls(family.name, model, url, log, Child(argv, url))


@dataclass
class Gateway:
    """A `rollout gateway` process (of this tree, or of `tree`) in front of one engine."""

    label: str
    url: str
    control: str
    admin: str
    child: Child

    @classmethod
    def start(cls, label: str, engine: Engine, family: str, tree: FsPath | None = None) -> Gateway:
        admin = secrets.token_urlsafe(16)
        port, control_port = free_port(), free_port()
        env = dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin)
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        model_dir = ensure_family_model(SIBLING.get(family, family))
        argv = [sys.executable, "-m", "workers.cli", "gateway", "--engine", engine.url]
        argv += ["--model", engine.model, "--tokenizer", str(model_dir)]
        argv += ["--port", str(port), "--control-port", str(control_port)]
        argv += ["--data-dir", tempfile.mkdtemp(prefix="gw-first-event-")]
        if family in SIBLING:
            argv += ["--family", family]
        control = f"http://127.0.0.1:{control_port}"
        child = Child(argv, control, env=env, cwd=tree)
        return cls(label, f"http://127.0.0.1:{port}", control, admin, child)

    def sessions(self, count: int) -> list[str]:
        tokens = []
        for _ in range(count):
            created = httpx.post(
                f"{self.control}/sessions",
                headers={"Authorization": f"Bearer {self.admin}"},
                json={"rollout_id": secrets.token_hex(4)},
            )
            created.raise_for_status()
            tokens.append(created.json()["token"])
        return tokens


@dataclass
class EnginePath:
    """The prompt the engine last received, streamed to it straight: its first chunk."""

    name: str
    engine: Engine
    ttfts: list[float] = field(default_factory=list)

    def turn(self, client: httpx.Client, model: str, turn: int) -> None:
        prompt = read_log(self.engine.log)[-1].prompt_ids
        body = {"model": self.engine.model, "prompt": prompt, "max_tokens": 64, "stream": True}
        t0 = time.perf_counter()
        with client.stream("POST", f"{self.engine.url}/v1/completions", json=body) as r:
            r.raise_for_status()
            first = None
            for chunk in sse_data(r.iter_lines()):
                if first is None and chunk.get("choices"):
                    first = time.perf_counter()
        assert first is not None
        self.ttfts.append(first - t0)


@dataclass
class FamilyRun:
    family: str
    engine: Engine
    gateways: list[Gateway] = field(default_factory=list)
    paths: list[Any] = field(default_factory=list)


def measure(runs: list[FamilyRun], conversations: int, turns: int) -> None:
    """Turn t of every path (every family's gateways in each protocol, then its engine
    straight), then turn t+1."""
    with httpx.Client(timeout=120) as client:
        for run in runs:
            for protocol, make, header in PROTOCOLS:
                for gw in run.gateways:
                    tokens = gw.sessions(conversations)
                    headers = [
                        {header: f"Bearer {t}" if header == "Authorization" else t} for t in tokens
                    ]
                    path = Path(f"{gw.label} {protocol}", f"{gw.url}/v1", headers, make)
                    run.paths.append(path)
            run.paths.append(EnginePath("engine", run.engine))
        for turn in range(WARMUP + turns):
            for run in runs:
                for path in run.paths:
                    path.turn(client, run.engine.model, turn)
    for run in runs:  # the first turns warm each process up: not measured
        for path in run.paths:
            path.ttfts[: WARMUP * len(getattr(path, "conversations", [None]))] = []


def report(runs: list[FamilyRun], conversations: int, turns: int) -> None:
    print(
        f"{conversations} conversations x {turns} turns per path, every call streamed; "
        "TTFT p50 (p99) ms; x before: p50 / the before gateway's p50 in that protocol"
    )
    before: dict[str, float] = {}
    for run in runs:
        for path in run.paths:
            if path.name.startswith("before "):
                before[path.name.removeprefix("before ")] = percentile(path.ttfts, 0.5)
    head = f"{'family':<26}{'gateway':<9}{'engine':>8}"
    for protocol, _, _ in PROTOCOLS:
        head += f"{protocol:>18}" + (f"{'x before':>9}" if before else "")
    print(head)
    for run in runs:
        engine = next(p for p in run.paths if isinstance(p, EnginePath))
        for gw in run.gateways:
            line = f"{run.family:<26}{gw.label:<9}{percentile(engine.ttfts, 0.5) * 1e3:>8.2f}"
            for protocol, _, _ in PROTOCOLS:
                path = next(p for p in run.paths if p.name == f"{gw.label} {protocol}")
                p50, p99 = percentile(path.ttfts, 0.5), percentile(path.ttfts, 0.99)
                line += f"{p50 * 1e3:>9.2f} ({p99 * 1e3:>6.1f})"
                if before:
                    line += f"{p50 / before[protocol]:>9.2f}"
            print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--before", type=FsPath, default=None, help="also run this tree's gateway")
    ap.add_argument("--families", default=None, help="comma-separated; default: every family")
    args = ap.parse_args()
    names = args.families.split(",") if args.families else parser_names()
    work = FsPath(tempfile.mkdtemp(prefix="gw-first-event-"))
    runs: list[FamilyRun] = []
    children: list[Child] = []
    try:
        for name in names:
            engine = Engine.start(Family.load(name, RUN), work)
            children.append(engine.child)
            runs.append(FamilyRun(name, engine))
        for child in children:
            child.wait()
        for run in runs:
            if args.before is not None and run.family == BEFORE_FAMILY:
                gw = Gateway.start("before", run.engine, run.family, args.before)
                run.gateways.append(gw)
                children.append(gw.child)
            run.gateways.append(Gateway.start("after", run.engine, run.family))
            children.append(run.gateways[-1].child)
        for run in runs:
            for gw in run.gateways:
                gw.child.wait()
        measure(runs, args.conversations, args.turns)
    finally:
        for child in children:
            child.stop()
    report(runs, args.conversations, args.turns)


if __name__ == "__main__":
    main()
