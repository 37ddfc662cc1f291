"""Gateway CPU per call, this tree against another, interleaved turn by turn in one run.

Two `rollout gateway` processes (another source tree's, `--before TREE`, and this one's)
in front of one stand-in engine (`devstack.scripted_engine`, a FAKE that answers every
call at once with one tool call), each with its own sessions of the same tool
conversations. Every turn runs on both gateways back to back, in alternating order, so
load from other jobs on a shared machine falls on both alike; `gateway_overhead --before`
runs the trees one after the other, where that load decides more than a small change
does. Per protocol it prints each process's CPU per call (from /proc: everything the
process did, HTTP server included) at turns 1-5, the last five and overall, the median
over `--rounds`, and the event-loop CPU per call of each span from both gateways'
`/metrics` (`gateway.observability.spans`).

Run: `python -m bench.gateway_cpu_ab --before TREE [--rounds 3] [--conversations 8]
[--turns 40] [--protocols chat,responses,messages] [--tools 15]` (`--tools`: tools per
request, `run` and agent-sized ones).
"""

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.common import GatewayProcess
from bench.conversations import (
    Conversation,
    MessagesConversation,
    ResponsesConversation,
    new_sessions,
)
from bench.gateway_overhead import ScriptedEngineProcess, Spans, cpu_ns, scrape_spans, span_delta
from devstack.tiny_model import ensure_tiny_model
from gateway.observability.spans import SPANS

PROTOCOLS: dict[str, tuple[Callable[..., Conversation], str]] = {
    "chat": (Conversation, "Authorization"),
    "responses": (ResponsesConversation, "Authorization"),
    "messages": (MessagesConversation, "x-api-key"),
}
LABELS = ("before", "after")


def one_round(
    client: httpx.Client,
    engine: ScriptedEngineProcess,
    gateways: dict[str, GatewayProcess],
    protocol: str,
    conversations: int,
    turns: int,
    first: int,
    tools: int = 1,
) -> tuple[dict[str, list[float]], dict[str, Spans]]:
    """Per gateway: CPU ms per call at each turn, and its spans over the round."""
    make, header = PROTOCOLS[protocol]
    state = {}
    for label, gw in gateways.items():
        tokens = new_sessions(gw.control, gw.admin, conversations)
        headers = [{header: f"Bearer {t}" if header == "Authorization" else t} for t in tokens]
        state[label] = (headers, [make(tools=tools) for _ in tokens])
    start = {label: scrape_spans(gw.control, gw.admin) for label, gw in gateways.items()}
    cpu: dict[str, list[float]] = {label: [] for label in gateways}
    for turn in range(turns):
        order = list(gateways) if (turn + first) % 2 == 0 else list(gateways)[::-1]
        for label in order:
            gw = gateways[label]
            headers, convs = state[label]
            before = cpu_ns(gw.process.pid)
            for conv, sent in zip(convs, headers, strict=True):
                reply = client.post(
                    f"{gw.url}/v1{conv.path}", json=conv.body(engine.model), headers=sent
                )
                reply.raise_for_status()
                conv.absorb(reply.json(), turn)
            cpu[label].append((cpu_ns(gw.process.pid) - before) / 1e6 / conversations)
    spans = {
        label: span_delta(scrape_spans(gw.control, gw.admin), start[label])
        for label, gw in gateways.items()
    }
    return cpu, spans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, required=True, help="the other source tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--protocols", default="chat,responses,messages")
    parser.add_argument(
        "--tools", type=int, default=1, help="tools per request (`bench.conversations.tool_list`)"
    )
    args = parser.parse_args()
    protocols = args.protocols.split(",")
    model_dir = ensure_tiny_model()
    cpu: dict[tuple[str, str], list[list[float]]] = {}
    spans: dict[tuple[str, str], list[Spans]] = {}
    with ScriptedEngineProcess(model_dir) as engine, httpx.Client(timeout=300) as client:
        gateways: dict[str, GatewayProcess] = {}
        try:
            gateways["before"] = GatewayProcess(engine, model_dir, "group", args.before)
            gateways["after"] = GatewayProcess(engine, model_dir, "group", None)
            for r in range(args.rounds):
                for protocol in protocols:
                    per_turn, measured = one_round(
                        client,
                        engine,
                        gateways,
                        protocol,
                        args.conversations,
                        args.turns,
                        r,
                        args.tools,
                    )
                    for label in LABELS:
                        cpu.setdefault((protocol, label), []).append(per_turn[label])
                        spans.setdefault((protocol, label), []).append(measured[label])
        finally:
            for gw in gateways.values():
                gw.stop()
    report(cpu, spans, protocols, args)


def report(
    cpu: dict[tuple[str, str], list[list[float]]],
    spans: dict[tuple[str, str], list[Spans]],
    protocols: list[str],
    args: argparse.Namespace,
) -> None:
    print(
        f"{args.conversations} conversations x {args.turns} turns, {args.tools} tools, "
        f"{args.rounds} rounds; "
        "medians over rounds; before = --before tree, after = this tree"
    )
    print("\nGateway process CPU ms per call:")
    print(f"{'protocol':<11}{'tree':<8}{'turns 1-5':>10}{'last 5':>9}{'all':>8}{'late/early':>11}")
    for protocol in protocols:
        figures = {}
        for label in LABELS:
            rounds = cpu[(protocol, label)]
            median = [statistics.median(turn) for turn in zip(*rounds, strict=True)]
            early, late = statistics.mean(median[:5]), statistics.mean(median[-5:])
            figures[label] = (early, late, statistics.mean(median))
            print(
                f"{protocol:<11}{label:<8}{early:>10.2f}{late:>9.2f}{figures[label][2]:>8.2f}"
                f"{late / early:>11.2f}"
            )
        ratios = [a / b for a, b in zip(figures["after"], figures["before"], strict=True)]
        widths = (10, 9, 8)
        cells = "".join(f"{x:>{w}.3f}" for x, w in zip(ratios, widths, strict=True))
        print(f"{'':<11}{'ratio':<8}{cells}")
    print("\nEvent-loop CPU ms per call by span (before > after):")
    names = [s for s in SPANS if s != "engine_queue"]
    print(f"{'protocol':<11}" + "".join(f"{s[:12]:>14}" for s in names))
    for protocol in protocols:
        cells = []
        for s in names:
            pair = []
            for label in LABELS:
                values = []
                for measured in spans[(protocol, label)]:
                    count, _, cpu_s = measured.get(s, (0.0, 0.0, 0.0))
                    values.append(1000 * cpu_s / count if count else 0.0)
                pair.append(statistics.median(values))
            cells.append(f"{pair[0]:.2f}>{pair[1]:.2f}")
        print(f"{protocol:<11}" + "".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
