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

Every path takes its turn before any path goes on to the next turn (the order rotating
from turn to turn), so load from anything else on the machine falls on all paths alike.
With `--before TREE` the same paths also run through a gateway started from another
source tree (e.g. `git archive <commit> | tar -x -C TREE`), interleaved with this tree's,
and the report adds this tree's figures divided by the other's: a change measured side
by side in one run.

With `--engine-api both` two gateways of this tree run side by side, one calling vLLM's
`/v1/completions`, one its token-in/token-out `/inference/v1/generate`.

Run: `python -m bench.gateway_overhead [--conversations 8] [--turns 40] [--fsync off]
[--before TREE] [--tools N] [--engine-api completions|generate|both] [--py-spy DIR]
[--engine scripted [--engine-latency-ms MS]]`.
`--tools N` sends N tools per request (`run`, then agent-sized ones). With `--py-spy`
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


def scrape_spans(control: str, admin: str, protocol: str | None = None) -> Spans:
    """The gateway's per-call span histograms (`gateway.observability.spans`) as they stand
    now, of one protocol's calls (its span label) or summed over all."""
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
            if protocol is not None and sample.labels.get("protocol") != protocol:
                continue
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


class Lane:
    """One path's conversations (vLLM direct, or one protocol through one gateway) and what
    it measured. `turn` sends turn t of every conversation; lanes take turns, so load from
    anything else on the machine falls on all of them alike."""

    def __init__(
        self,
        name: str,
        url: str,
        headers_for: list[dict[str, str]],
        make: Callable[[], Conversation],
        pid: int | None = None,
        scrape: Callable[[], Spans] | None = None,
    ) -> None:
        self.name, self.url, self.headers_for = name, url, headers_for
        self.conversations = [make() for _ in headers_for]
        self.pid, self.scrape = pid, scrape
        self.latencies: list[float] = []
        self.cpu_per_turn: list[float] = []  # the gateway's CPU ms per call, per turn
        self.marks: dict[int, Spans] = {}

    def turn(self, client: httpx.Client, model: str, turn: int, marks: tuple[int, ...]) -> None:
        if self.scrape is not None and turn in marks:
            self.marks[turn] = self.scrape()  # outside the turn's CPU window
        before = cpu_ns(self.pid) if self.pid else 0
        for conv, headers in zip(self.conversations, self.headers_for, strict=True):
            t0 = time.perf_counter()
            reply = client.post(f"{self.url}{conv.path}", json=conv.body(model), headers=headers)
            self.latencies.append(time.perf_counter() - t0)
            reply.raise_for_status()
            conv.absorb(reply.json(), turn)
        if self.pid:
            self.cpu_per_turn.append((cpu_ns(self.pid) - before) / 1e6 / len(self.conversations))

    def row(self, early: int, late: int) -> "Row":
        """With `scrape`: the spans over the whole run, turns 1-5 and the last five turns."""
        spans: list[Spans] = []
        if self.scrape is not None:
            end = self.scrape()
            self.marks.setdefault(early, end)  # 5 turns or fewer: early is the whole run
            spans = [
                span_delta(end, self.marks[0]),
                span_delta(self.marks[early], self.marks[0]),
                span_delta(end, self.marks[late]),
            ]
        return self.name, self.latencies, self.cpu_per_turn, spans


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
        "--engine-latency-ms",
        type=float,
        default=0.0,
        help="scripted only: the engine answers each call this much later (its idle wait "
        "shows what the gateway's own timers cost a call that waits on a real engine)",
    )
    parser.add_argument(
        "--engine-api",
        choices=["completions", "generate", "both"],
        default="completions",
        help="how the gateway calls vLLM; both: two gateways of this tree side by side",
    )
    parser.add_argument(
        "--tools", type=int, default=1, help="tools per request (`bench.conversations.tool_list`)"
    )
    parser.add_argument(
        "--py-spy", type=Path, default=None, help="write a py-spy profile of each gateway here"
    )
    parser.add_argument("--py-spy-format", choices=["flamegraph", "raw"], default="flamegraph")
    args = parser.parse_args()
    if args.engine_latency_ms and args.engine != "scripted":
        parser.error("--engine-latency-ms needs --engine scripted")
    model_dir = ensure_tiny_model()
    engine = (
        VllmServer(VllmServerConfig(model_dir=model_dir, extra_args=VLLM_ARGS))
        if args.engine == "vllm"
        else ScriptedEngineProcess(model_dir, args.engine_latency_ms)
    )
    apis = ["completions", "generate"] if args.engine_api == "both" else [args.engine_api]
    with engine:
        gateways: list[tuple[str, GatewayProcess]] = []
        suffix = ".svg" if args.py_spy_format == "flamegraph" else ".txt"
        try:
            if args.before:
                gateways.append(
                    ("before", GatewayProcess(engine, model_dir, args.fsync, args.before))
                )
            for api in apis:
                gw = GatewayProcess(engine, model_dir, args.fsync, None, api)
                gateways.append(("gateway" if len(apis) == 1 else f"gw {api}", gw))
            with contextlib.ExitStack() as profiles:
                for label, gw in gateways:
                    name = f"{label.replace(' ', '-')}{suffix}"
                    out = args.py_spy / name if args.py_spy else None
                    profiles.enter_context(py_spy(gw.process.pid, out, args.py_spy_format))
                rows = measure(engine, gateways, args.conversations, args.turns, args.tools)
        finally:
            for _, gw in gateways:
                gw.stop()
    report(rows, args.conversations, args.turns, args.fsync, args.tools)


SCRIPTED_REPLY = (
    '<think>\nok\n</think>\n\n<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n'
    "</tool_call>"
)


class ScriptedEngineProcess:
    """`python -m devstack.scripted_engine` (a FAKE engine: every answer is one tool call,
    `latency_ms` after the call) on a free port, with the `url` and `model` of a
    `VllmServer`."""

    model = "tiny-qwen3"

    def __init__(self, model_dir: Path, latency_ms: float = 0.0) -> None:
        self.model_dir = model_dir
        self.latency_ms = latency_ms
        self.url = f"http://127.0.0.1:{free_port()}"

    def __enter__(self) -> "ScriptedEngineProcess":
        script = Path(tempfile.mkdtemp(prefix="gw-bench-script-")) / "script.json"
        script.write_text(json.dumps({"default_reply": SCRIPTED_REPLY}))
        argv = [sys.executable, "-m", "devstack.scripted_engine", "--script", str(script)]
        argv += ["--tokenizer", str(self.model_dir / "tokenizer.json"), "--model", self.model]
        argv += ["--delay-ms", str(self.latency_ms)]
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


def report(rows: list[Row], conversations: int, turns: int, fsync: str, tools: int = 1) -> None:
    print(f"{conversations} conversations x {turns} turns per path, {tools} tools, fsync {fsync}")
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
    compare_trees(rows)


def compare_trees(rows: list[Row]) -> None:
    """This tree's gateway ÷ the `--before` tree's, per protocol: latency, process CPU per
    call and event-loop CPU per call (the spans' sum), over the whole run."""
    by_name = {row[0]: row for row in rows}
    pairs = [
        (protocol, by_name[f"before {protocol}"], by_name[f"gateway {protocol}"])
        for protocol, *_ in PROTOCOLS
        if f"before {protocol}" in by_name and f"gateway {protocol}" in by_name
    ]
    if not pairs:
        return
    print("\nThis tree ÷ before (whole run):")
    print(f"{'protocol':<12}{'p50':>8}{'p99':>8}{'process CPU':>13}{'span CPU':>10}")

    def span_cpu(spans: list[Spans]) -> float:
        return sum(cpu / count for count, _, cpu in spans[0].values() if count)

    for protocol, before, after in pairs:
        cells = [
            percentile(after[1], 0.5) / percentile(before[1], 0.5),
            percentile(after[1], 0.99) / percentile(before[1], 0.99),
            statistics.mean(after[2]) / statistics.mean(before[2]),
            span_cpu(after[3]) / span_cpu(before[3]),
        ]
        widths = (8, 8, 13, 10)
        print(
            f"{protocol:<12}" + "".join(f"{c:>{w}.3f}" for c, w in zip(cells, widths, strict=True))
        )


PROTOCOLS: list[tuple[str, Callable[[], Conversation], str, str]] = [
    ("chat", Conversation, "Authorization", "openai_chat"),
    ("responses", ResponsesConversation, "Authorization", "openai_responses"),
    ("messages", MessagesConversation, "x-api-key", "anthropic_messages"),
]
"""(row name, conversation, auth header, span label) of each protocol."""


def measure(
    vllm: VllmServer | ScriptedEngineProcess,
    gateways: list[tuple[str, GatewayProcess]],
    conversations: int,
    turns: int,
    tools: int = 1,
) -> list[Row]:
    """Every path in one run, interleaved: turn t of vLLM's own chat endpoint (plain and
    with logprobs) and of each protocol through each gateway, the lanes' order rotating
    from turn to turn, then turn t+1."""
    plain: list[dict[str, str]] = [{} for _ in range(conversations)]
    direct = f"{vllm.url}/v1"
    lanes: list[Lane] = []
    if isinstance(vllm, VllmServer):
        with httpx.Client(timeout=300) as client:  # warm-up, not measured
            warm = Lane("warm-up", direct, plain[:1], lambda: Conversation(direct=True))
            for turn in range(2):
                warm.turn(client, vllm.model, turn, ())
        for name, logprobs in (("vLLM chat", False), ("vLLM chat + logprobs", True)):
            make = lambda lp=logprobs: Conversation(direct=True, logprobs=lp, tools=tools)  # noqa: E731
            lanes.append(Lane(name, direct, plain, make))
    for protocol, make, header, label in PROTOCOLS:
        for gw_label, gw in gateways:
            tokens = new_sessions(gw.control, gw.admin, conversations)
            headers = [{header: f"Bearer {t}" if header == "Authorization" else t} for t in tokens]
            scrape = lambda gw=gw, label=label: scrape_spans(gw.control, gw.admin, label)  # noqa: E731
            name = f"{gw_label} {protocol}"
            lane_make = lambda make=make: make(tools=tools)  # noqa: E731
            lanes.append(Lane(name, f"{gw.url}/v1", headers, lane_make, gw.process.pid, scrape))
    early, late = min(5, turns), max(0, turns - 5)  # a short run: its windows overlap
    with httpx.Client(timeout=300) as client:
        for turn in range(turns):
            shift = turn % len(lanes)
            for lane in lanes[shift:] + lanes[:shift]:
                lane.turn(client, vllm.model, turn, (0, early, late))
    return [lane.row(early, late) for lane in lanes]


if __name__ == "__main__":
    main()
