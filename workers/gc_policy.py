"""The garbage-collector policy of the long-running processes: gateways and workers.

A gateway holds every live session's history in memory (messages, held segments, token id
lists): hundreds of thousands of tracked objects. CPython's default thresholds (700, 10,
10) rescan them over and over while calls allocate, and under load that cost more than
any single part of a call: at 1,000 sessions (`bench/gateway_load.py`) the collector took
≈ 11.6 s of a ≈ 50 s run, ≈ 25 % of the process's CPU. Reference counting frees almost
everything a call allocates; the collector is only needed for the rare cycle, so it can
run much less often, and the objects that live as long as the process (modules, the
tokenizer, the template, the apps) need never be scanned at all. A worker holds every
running rollout's workflow state: there the collector took 1.2–1.4 s per 300 rollouts
(`bench/orchestration.py --n 300`), 0.3–0.4 s with this policy.
"""

from __future__ import annotations

import gc

#: Allocations between young collections (CPython's default: 700), then how many young
#: collections per middle one and middle ones per full one. Cyclic garbage waits at most
#: ~50,000 allocations longer: kilobytes to a few MB, against ~25 % of the CPU.
SERVING_THRESHOLDS = (50_000, 20, 100)


def tune_gc_for_serving() -> None:
    """Call once the process is built and before it serves: everything allocated so far
    is moved out of the collector's reach for good (`gc.freeze`), and the thresholds are
    raised to `SERVING_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_THRESHOLDS)
