"""The chaos suite, short: rollouts through the real stack while every part is SIGKILLed.

`bench/chaos.py` runs it with 200 rollouts and prints the table; this is its CI variant
(fewer rollouts, fewer fuzz requests, same faults and the same checks): Temporal dev
server, two `rollout worker` processes, `rollout gateway --processes 2`, the scripted
engine as its own process, local bubblewrap sandboxes, an agent making several calls with
pauses. While the rollouts run: SIGKILL a worker (twice), one gateway process, the
Temporal dev server and the engine, each restarted; meanwhile generated malformed
requests hit the live gateway.
"""

import asyncio
import os

import pytest
from rich.console import Console

from stress.chaos import DEFAULT_FAULTS, ChaosConfig, Report, render, run_chaos

pytestmark = [pytest.mark.e2e, pytest.mark.needs("base_image")]

#: Requests per protocol. `bench/chaos.py` sends 10,000 per protocol; at the ~30-100
#: requests/s this 2-core machine manages alongside the rollouts that alone would take
#: longer than CI allows, so CI sends fewer unless told otherwise.
FUZZ_EXAMPLES = int(os.environ.get("ROLLOUT_CHAOS_FUZZ_EXAMPLES", "1500"))


@pytest.fixture(scope="module")
def report() -> Report:
    # The five faults (each down a few seconds, then restarted) fire one after another as
    # rollouts finish. The 6 rollouts of one task hold their last call until the last
    # fault has fired, so each fault finds conversations under way however fast the
    # other 18 go (12 of them finished fire all five).
    config = ChaosConfig(
        n=24,
        seed=7,
        faults=list(DEFAULT_FAULTS),
        fuzz_examples=FUZZ_EXAMPLES,
        turns=3,
        pause_s=0.3,
        held_tasks=1,
        max_sandboxes=6,
        # A held rollout can lose two attempts to the two worker kills by design; a
        # heartbeat missed on a loaded box must not cost it the third (seen at 5 s).
        heartbeat_s=10,
        reaper_interval_s=5,
        deadline_s=600,
    )  # its own work dir under /tmp: the sandbox uid must traverse it (pytest's is 0700)
    result = asyncio.run(run_chaos(config))
    render(result, Console(width=120))
    return result


def test_every_fault_hit_work_in_flight(report: Report) -> None:
    """Each kill found its target busy: sandboxes on the worker, a conversation under way
    on the gateway process or at the engine (the held rollouts were still open)."""
    assert [(f.fault, f.note) for f in report.faults] == [(f, "") for f in DEFAULT_FAULTS]


def test_no_rollout_lost(report: Report) -> None:
    """Every rollout ends with an explicit status and, when its agent ran, its samples;
    no agent gave up (each rode out the restarts with SDK-style retries); a retried
    attempt is a new create_session in the workflow's history."""
    assert report.lost == [], report.details
    assert report.failed == [], report.details
    assert report.gave_up == [], report.details
    assert report.attempts_in_history, report.details


def test_samples_exact_and_not_duplicated(report: Report) -> None:
    """Each sampled span of each sample is, token for token, an answer the engine logged
    for exactly that prompt; no segment or turn is recorded twice; no turn is missing."""
    assert report.samples > 0, report.details
    assert report.duplicated == 0, report.details
    assert report.tokens_differ == 0, report.details
    assert report.turns_missing == 0, report.details


def test_nothing_left_behind(report: Report) -> None:
    assert report.sandboxes_left == 0, report.details
    assert report.sandbox_processes_left == 0, report.details
    assert report.sessions_left == 0, report.details


def test_fuzz_during_chaos(report: Report) -> None:
    """Malformed requests went out while each part was down (the fuzzer sends at least
    its examples, then on until the last fault is back); no 5xx other than
    engine_unavailable while the engine was down, every error in its protocol's shape,
    and the witness sessions' trajectories unchanged."""
    assert report.fuzz_error is None
    assert [(f.fault, f.fuzz_sent > 0) for f in report.faults] == [
        (f, True) for f in DEFAULT_FAULTS
    ], report.faults
    assert len(report.fuzz_requests) == 4
    assert min(report.fuzz_requests.values()) >= FUZZ_EXAMPLES
    assert report.fuzz_5xx == report.fuzz_5xx_engine_down, report.details
    assert report.fuzz_bad_shape == 0
    assert report.witnesses_unchanged
