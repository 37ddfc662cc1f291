"""Time to render the viewer's pages: the batch page of a large batch, and the first,
a middle and the last page of one 100k-token, 200-call rollout.

A samples directory of `--rollouts` small rollouts plus one big one (`--big-calls` calls
of `--tokens-per-call` tokens after a `--prompt-tokens` prompt: 1,000 + 200 × 495 =
100,000 tokens by default) is written first (not timed). Then:

- server time: each page through the app in-process (Starlette's TestClient), cold
  (first request) and the median of `--repeat` warm requests, with the tiny model's
  tokenizer decoding each token's text, as `rollout view --tokenizer` does;
- browser time (when Debian's chromium is installed): `rollout view` as a process and
  headless Chromium loading each page, from navigation start to the load event
  (Navigation Timing), median of `--repeat`.

The goal is "opens in under 2 s" for the 100k-token rollout.

Run: `python -m bench.viewer_pages [--rollouts 1000] [--big-calls 200] [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from starlette.testclient import TestClient

from devstack.sample_batch import (
    passed_evaluation,
    result,
    rollout_rows,
    write_artifacts,
    write_manifest,
    write_rollout,
)
from devstack.tiny_model import ensure_tiny_model
from rollout_client.samples_reader import SamplesReader
from viewer.app import viewer_app
from viewer.tokens import PAGE_TOKENS, load_tokenizer

BIG = "r-big"


def make_batch(root: Path, rollouts: int, calls: int, per_call: int, prompt: int) -> Path:
    out, data = root / "b1", root / "worker"
    out.mkdir()
    results = []
    for i in range(rollouts):
        rid = f"r-{i:05d}"
        reward = float(i % 3 == 0)
        write_rollout(out, rollout_rows(rid, f"task-{i % 20}", reward=reward, seed=i))
        results.append(result(rid, f"task-{i % 20}", "ok", reward, duration_s=3.0 + i % 7))
    big = rollout_rows(BIG, "big", calls=calls, tokens_per_call=per_call, prompt_tokens=prompt)
    write_rollout(out, big)
    write_artifacts(data, BIG, passed_evaluation(), "--- a/x\n+++ b/x\n+1\n", "log\n" * 1000)
    results.append(result(BIG, "big", "ok", 1.0))
    write_manifest(out, "b1", results)
    return root


def pages(total_tokens: int) -> dict[str, str]:
    last = (total_tokens - 1) // PAGE_TOKENS
    seg = f"{BIG}-s0"
    return {
        "batch page": "/",
        "rollout, first page": f"/rollout/{BIG}",
        "rollout, middle page": f"/rollout/{BIG}?segment={seg}&page={last // 2}",
        "rollout, last page": f"/rollout/{BIG}?segment={seg}&page={last}",
        "rollout, conversation": f"/rollout/{BIG}?view=conversation",
        "evaluation": f"/rollout/{BIG}/evaluation",
    }


def server_times(root: Path, urls: dict[str, str], repeat: int) -> dict[str, tuple[float, float]]:
    model = ensure_tiny_model()
    app = viewer_app(SamplesReader(root / "b1", root / "worker"), tokenizer=load_tokenizer(model))
    client = TestClient(app, base_url="http://localhost")
    out = {}
    for name, url in urls.items():
        times = []
        for _ in range(repeat + 1):
            t0 = time.perf_counter()
            reply = client.get(url)
            times.append(time.perf_counter() - t0)
            assert reply.status_code == 200, (url, reply.status_code)
        out[name] = (times[0], statistics.median(times[1:]))
    return out


def browser_times(root: Path, urls: dict[str, str], repeat: int) -> dict[str, float] | str:
    from devstack.browser import CHROMIUM, headless_chromium, rollout_view

    if not Path(CHROMIUM).exists():
        return "chromium not installed (scripts/install_system_deps.sh)"
    model = ensure_tiny_model()
    args = (str(root / "b1"), "--artifacts", str(root / "worker"), "--tokenizer", str(model))
    out = {}
    with rollout_view(*args) as base, headless_chromium() as driver:
        for name, url in urls.items():
            times = []
            for _ in range(repeat):
                driver.get(base.rstrip("/") + url)
                ms = driver.execute_script(
                    "const t = performance.getEntriesByType('navigation')[0];"
                    "return t.loadEventEnd - t.startTime;"
                )
                times.append(ms / 1000)
            out[name] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--big-calls", type=int, default=200)
    ap.add_argument("--tokens-per-call", type=int, default=495)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    a = ap.parse_args()
    total = a.prompt_tokens + a.big_calls * a.tokens_per_call
    with tempfile.TemporaryDirectory(prefix="viewer-bench-") as tmp:
        t0 = time.perf_counter()
        root = make_batch(Path(tmp), a.rollouts, a.big_calls, a.tokens_per_call, a.prompt_tokens)
        print(
            f"batch: {a.rollouts} rollouts + one of {total:,} tokens / {a.big_calls} calls "
            f"(written in {time.perf_counter() - t0:.1f} s); {PAGE_TOKENS} tokens a page"
        )
        urls = pages(total)
        server = server_times(root, urls, a.repeat)
        browser = "skipped (--no-browser)" if a.no_browser else browser_times(root, urls, a.repeat)
    print(f"{'page':24} {'server cold s':>14} {'server warm s':>14} {'browser load s':>15}")
    for name in urls:
        cold, warm = server[name]
        shown = f"{browser[name]:.3f}" if isinstance(browser, dict) else "-"
        print(f"{name:24} {cold:14.3f} {warm:14.3f} {shown:>15}")
    if isinstance(browser, str):
        print(f"browser: {browser}")


if __name__ == "__main__":
    main()
