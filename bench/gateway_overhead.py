"""Gateway overhead against vLLM, measured side by side in one run.

(a) the same multi-turn tool conversations sent straight to vLLM's own
`/v1/chat/completions`, plain and with `logprobs` on (what a peer that re-tokenizes must
ask for to train on the samples), and (b) through the Gateway (a separate `rollout
gateway` process in front of the same vLLM), in each protocol. Prints the p50/p99 latency
ratios against both vLLM baselines, the Gateway process's CPU time per call at the first
turns vs the last turns of long conversations (it must stay flat: only new content is
parsed and tokenized), and where each millisecond of a gateway call goes: the mean of
each per-call span from the gateway's `/metrics` (`gateway.observability.spans`), and what is left
outside the app (HTTP server, network, client) as client latency minus the spans' sum.

With `--before TREE` the same paths also run through a gateway started from another
source tree (e.g. `git archive <commit> | tar -x -C TREE`), each protocol's "before"
right next to its "after", so a change is measured side by side in one run.

With `--engine-api both` two gateways of this tree run side by side, one calling vLLM's
`/v1/completions`, one its token-in/token-out `/inference/v1/generate`.

Run: `python -m bench.gateway_overhead [--conversations 8] [--turns 40] [--fsync off]
[--before TREE] [--engine-api completions|generate|both] [--py-spy DIR]`. With `--py-spy`
each gateway process is sampled by py-spy for the whole run (`DIR/<label>.svg`, or
collapsed stacks with `--py-spy-format raw`). The tiny model never calls
tools, so every path forces the reply format with vLLM structured outputs; each path feeds
its own sampled replies back.
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import GatewayProcess, percentile, py_spy, wait_healthy
from bench.conversations import (
    VLLM_ARGS,
    Conversation,
    MessagesConversation,
    ResponsesConversation,
    new_sessions,
)
from devstack.ports import free_port
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer, VllmServerConfig
from gateway.observability.spans import SPANS


def cpu_ns(pid: int) -> int:
    """CPU time of a process's threads in ns (/proc schedstat: finer than the 10 ms ticks
    of /proc/<pid>/stat, which made the per-call figures of a few calls coarse)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


Spans = dict[str, tuple[float, float, float]]
"""span → (count, wall seconds sum, CPU seconds sum), summed over the protocols."""


def scrape_spans(control: str, admin: str) -> Spans:
    """The gateway's per-call span histograms (`gateway.observability.spans`) as they stand now."""
    text = httpx.get(f"{control}/metrics", headers={"Authorization": f"Bearer {admin}"}).text
    sums: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (
            "rollout_gateway_call_span_seconds",
            "rollout_gateway_call_span_cpu_seconds",
        ):
            continue
        cpu = family.name.endswith("_cpu_seconds")
        for sample in family.samples:
            entry = sums.setdefault(sample.labels["span"], [0.0, 0.0, 0.0])
            if sample.name.endswith("_count") and not cpu:
                entry[0] += sample.value
            elif sample.name.endswith("_sum"):
                entry[2 if cpu else 1] += sample.value
    return {span: (c, w, p) for span, (c, w, p) in sums.items()}


def span_delta(after: Spans, before: Spans) -> Spans:
    zero = (0.0, 0.0, 0.0)
    return {
        span: tuple(a - b for a, b in zip(now, before.get(span, zero), strict=True))  # type: ignore[misc]
        for span, now in after.items()
    }


def run_path(
    url: str,
    headers_for: list[dict[str, str]],
    model: str,
    turns: int,
    make: Callable[[], Conversation],
    pid: int | None,
    scrape: Callable[[], Spans] | None = None,
) -> tuple[list[float], list[float], list[Spans]]:
    """Lockstep: turn t of every conversation, then turn t+1. Returns latencies, per turn
    the gateway CPU ms per call (empty for the direct path) and, with `scrape`, the
    gateway's spans over the whole run, turns 1-5 and the last five turns."""
    conversations = [make() for _ in headers_for]
    latencies: list[float] = []
    cpu_per_turn: list[float] = []
    marks: dict[int, Spans] = {}
    early, late = min(5, turns), max(0, turns - 5)  # a short run: its windows overlap
    with httpx.Client(timeout=300) as client:
        for turn in range(turns):
            if scrape is not None and turn in (0, early, late):
                marks[turn] = scrape()  # outside the turn's CPU window
            before = cpu_ns(pid) if pid else 0
            for conv, headers in zip(conversations, headers_for, strict=True):
                t0 = time.perf_counter()
                reply = client.post(f"{url}{conv.path}", json=conv.body(model), headers=headers)
                latencies.append(time.perf_counter() - t0)
                reply.raise_for_status()
                conv.absorb(reply.json(), turn)
            if pid:
                cpu_per_turn.append((cpu_ns(pid) - before) / 1e6 / len(conversations))
    spans: list[Spans] = []
    if scrape is not None:
        end = scrape()
        marks.setdefault(early, end)  # 5 turns or fewer: the early window is the whole run
        spans = [
            span_delta(end, marks[0]),
            span_delta(marks[early], marks[0]),
            span_delta(end, marks[late]),
        ]
    return latencies, cpu_per_turn, spans


Row = tuple[str, list[float], list[float], list[Spans]]
"""(path, latencies s, gateway CPU ms per call per turn, spans: whole run, early, late)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument(
        "--fsync", choices=["group", "off"], default="group", help="the gateway's durability"
    )
    parser.add_argument(
        "--before", type=Path, default=None, help="also run a gateway from this source tree"
    )
    parser.add_argument(
        "--engine",
        choices=["vllm", "scripted"],
        default="vllm",
        help="scripted: a FAKE engine answering every call at once with one tool call, for "
        "the gateway's own CPU per call and spans without vLLM (no vLLM rows, no ratios)",
    )
    parser.add_argument(
        "--engine-api",
        choices=["completions", "generate", "both"],
        default="completions",
        help="how the gateway calls vLLM; both: two gateways of this tree side by side",
    )
    parser.add_argument(
        "--py-spy", type=Path, default=None, help="write a py-spy profile of each gateway here"
    )
    parser.add_argument("--py-spy-format", choices=["flamegraph", "raw"], default="flamegraph")
    args = parser.parse_args()
    model_dir = ensure_tiny_model()
    engine = (
        VllmServer(VllmServerConfig(model_dir=model_dir, extra_args=VLLM_ARGS))
        if args.engine == "vllm"
        else ScriptedEngineProcess(model_dir)
    )
    apis = ["completions", "generate"] if args.engine_api == "both" else [args.engine_api]
    with engine:
        # (label, gateway, scrape its spans): `before` runs another tree, whose metrics
        # may differ, so only this tree's gateways are scraped.
        gateways: list[tuple[str, GatewayProcess, bool]] = []
        suffix = ".svg" if args.py_spy_format == "flamegraph" else ".txt"
        try:
            if args.before:
                before = GatewayProcess(engine, model_dir, args.fsync, args.before)
                gateways.append(("before", before, False))
            for api in apis:
                gw = GatewayProcess(engine, model_dir, args.fsync, None, api)
                gateways.append(("gateway" if len(apis) == 1 else f"gw {api}", gw, True))
            with contextlib.ExitStack() as profiles:
                for label, gw, _ in gateways:
                    name = f"{label.replace(' ', '-')}{suffix}"
                    out = args.py_spy / name if args.py_spy else None
                    profiles.enter_context(py_spy(gw.process.pid, out, args.py_spy_format))
                rows = measure(engine, gateways, args.conversations, args.turns)
        finally:
            for _, gw, _ in gateways:
                gw.stop()
    report(rows, args.conversations, args.turns, args.fsync)


SCRIPTED_REPLY = (
    '<think>\nok\n</think>\n\n<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n'
    "</tool_call>"
)


class ScriptedEngineProcess:
    """`python -m devstack.scripted_engine` (a FAKE engine: every answer is one tool call)
    on a free port, with the `url` and `model` of a `VllmServer`."""

    model = "tiny-qwen3"

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.url = f"http://127.0.0.1:{free_port()}"

    def __enter__(self) -> "ScriptedEngineProcess":
        script = Path(tempfile.mkdtemp(prefix="gw-bench-script-")) / "script.json"
        script.write_text(json.dumps({"default_reply": SCRIPTED_REPLY}))
        argv = [sys.executable, "-m", "devstack.scripted_engine", "--script", str(script)]
        argv += ["--tokenizer", str(self.model_dir / "tokenizer.json"), "--model", self.model]
        self.process = subprocess.Popen([*argv, "--port", self.url.rsplit(":", 1)[1]])
        try:
            wait_healthy(self.url, self.process, timeout_s=60)
        except SystemExit:
            self.process.kill()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def report(rows: list[Row], conversations: int, turns: int, fsync: str) -> None:
    print(f"{conversations} conversations x {turns} turns per path, fsync {fsync}")
    late = f"t{turns - 4}-{turns}"
    print(
        f"{'path':<36}{'p50 ms':>8}{'p99 ms':>8}{'p50 x chat':>11}{'x lp':>6}"
        f"{'p99 x chat':>11}{'x lp':>6}{'CPU/call t1-5':>15}{late:>9}{'ratio':>7}"
    )
    base = [(percentile(r[1], 0.5), percentile(r[1], 0.99)) for r in rows if not r[2]]
    for name, lat, cpu, _ in rows:
        p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        line = f"{name:<36}{p50 * 1000:>8.1f}{p99 * 1000:>8.1f}"
        if base:
            line += f"{p50 / base[0][0]:>11.2f}{p50 / base[1][0]:>6.2f}"
            line += f"{p99 / base[0][1]:>11.2f}{p99 / base[1][1]:>6.2f}"
        else:
            line += " " * 34
        if cpu:
            early_cpu, late_cpu = statistics.mean(cpu[:5]), statistics.mean(cpu[-5:])
            line += f"{early_cpu:>12.2f} ms{late_cpu:>6.2f} ms{late_cpu / early_cpu:>7.2f}"
        print(line)
    measured = [row for row in rows if row[3]]
    if not measured:
        return
    print("\nWhere a gateway call's time goes: mean wall ms per call by span (gateway /metrics);")
    print("'outside' = mean client latency - sum of spans (HTTP server, loopback, client).")
    names = [s for s in SPANS if any(s in row[3][0] for row in measured)]
    print(f"{'path':<36}" + "".join(f"{s[:12]:>13}" for s in [*names, "outside", "client"]))
    for name, lat, _, spans in measured:
        whole = spans[0]
        means = [
            1000 * whole[s][1] / whole[s][0] if s in whole and whole[s][0] else 0.0 for s in names
        ]
        client = 1000 * statistics.mean(lat)
        cells = [*means, client - sum(means), client]
        print(f"{name:<36}" + "".join(f"{v:>13.2f}" for v in cells))
    print("\nEvent-loop CPU ms per call by span, turns 1-5 -> last 5 turns:")
    print(f"{'path':<36}" + "".join(f"{s[:12]:>13}" for s in [*names, "sum"]))
    for name, _, _, spans in measured:
        cells = []
        totals = [0.0, 0.0]
        for s in names:
            pair = []
            for i, part in enumerate(spans[1:]):
                count, _, cpu_sum = part.get(s, (0.0, 0.0, 0.0))
                value = 1000 * cpu_sum / count if count else 0.0
                totals[i] += value
                pair.append(value)
            cells.append(f"{pair[0]:.2f}>{pair[1]:.2f}")
        cells.append(f"{totals[0]:.2f}>{totals[1]:.2f}")
        print(f"{name:<36}" + "".join(f"{c:>13}" for c in cells))


def measure(
    vllm: VllmServer | ScriptedEngineProcess,
    gateways: list[tuple[str, GatewayProcess, bool]],
    conversations: int,
    turns: int,
) -> list[Row]:
    """Every path in one run: vLLM's own chat endpoint (plain, then with logprobs) first,
    then each gateway protocol through each gateway in turn."""
    plain: list[dict[str, str]] = [{} for _ in range(conversations)]
    direct = f"{vllm.url}/v1"
    rows: list[Row] = []
    if isinstance(vllm, VllmServer):
        run_path(direct, plain[:1], vllm.model, 2, lambda: Conversation(direct=True), None)
    for name, logprobs in (("vLLM chat", False), ("vLLM chat + logprobs", True)):
        if not isinstance(vllm, VllmServer):
            break
        make = lambda lp=logprobs: Conversation(direct=True, logprobs=lp)  # noqa: E731
        lat, _, _ = run_path(direct, plain, vllm.model, turns, make, None)
        rows.append((name, lat, [], []))
    paths: list[tuple[str, Callable[[], Conversation], str]] = [
        ("chat", Conversation, "Authorization"),
        ("responses", ResponsesConversation, "Authorization"),
        ("messages", MessagesConversation, "x-api-key"),
    ]
    for protocol, make, header in paths:
        for label, gw, scraped in gateways:
            tokens = new_sessions(gw.control, gw.admin, conversations)
            headers = [{header: f"Bearer {t}" if header == "Authorization" else t} for t in tokens]
            scrape = (lambda gw=gw: scrape_spans(gw.control, gw.admin)) if scraped else None
            lat, cpu, spans = run_path(
                f"{gw.url}/v1", headers, vllm.model, turns, make, gw.process.pid, scrape
            )
            rows.append((f"{label} {protocol}", lat, cpu, spans))
    return rows


if __name__ == "__main__":
    main()
