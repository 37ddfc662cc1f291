"""`TrlRolloutSource` (TRL's `rollout_func`) refuses what TRL would mis-train on, through
real rollouts: a prompt that is no task id of the run is refused before anything is
submitted, and a generation batch in which no rollout has a trained token is refused
(TRL would divide its loss by zero trained tokens). Control: a batch whose agents did
call the model comes back with trained tokens.

No trl import is needed: the source only builds TRL's fields. Real parts: Temporal dev
server, a worker process with local bubblewrap sandboxes, the Gateway in front of the
scripted engine (a FAKE LLM that follows a script), the chaos bench's stdlib agent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridges.trl import EventLoopThread, PolicyLabel, TrlBridgeError, TrlRolloutSource
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.temporal_dev_server import TemporalDevServer
from rollout_client import RolloutClient
from schemas.tasks import RolloutTask
from tests.fixtures.rollout_stack import rollout_stack
from tests.fixtures.sandboxes import require_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.needs("system", "vllm_venv")]

MODEL = "tiny-qwen3"
QUEUE = "trl-refusals-tests"
AGENT = Path(__file__).resolve().parents[2] / "stress" / "chaos_agent.py"
AGENT_PATH = "/home/agent/agent.py"


def task(task_id: str, command: str) -> RolloutTask:
    """A task whose agent runs `command`; graded on answer.txt holding 42."""
    return RolloutTask.model_validate(
        {
            "task_id": task_id,
            "prompt": "What is 6 times 7? Reply with the number only.",
            "harness": {
                "name": "command",
                "config": {"command": command, "env": {"AGENT_TURNS": "1", "AGENT_SLEEP_S": "0"}},
                "budget_s": 120,
            },
            "sandbox": {
                "backend": "local",
                "files": [{"path": AGENT_PATH, "content": AGENT.read_text()}],
            },
            "hooks": [{"name": "evaluate"}],
            "evaluation": {"checks": [{"kind": "file", "path": "answer.txt", "contains": ["42"]}]},
            "policy_version": "run-v0",
            "sampling": {"temperature": 1.0, "max_tokens": 16},
        }
    )


TASKS = {
    "talks": task("talks", f"python3 {AGENT_PATH}"),  # one call to the model
    "quiet": task("quiet", "true"),  # never calls the model
}


@dataclass
class Source:
    source: TrlRolloutSource
    client: RolloutClient
    runner: EventLoopThread
    samples: Path


@pytest.fixture(scope="module")
def trl_source(temporal_server: TemporalDevServer, tiny_model_dir: Path) -> Iterator[Source]:
    require_bwrap()
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json", Script(default_reply="42"), model=MODEL
    )
    runner = EventLoopThread()
    with rollout_stack(
        temporal_server,
        tiny_model_dir,
        "trl",
        engine_app=engine.app(),
        served_model=MODEL,
        queue=QUEUE,
    ) as stack:
        try:
            client = runner.run(RolloutClient.connect(temporal_server.address, task_queue=QUEUE))
            source = TrlRolloutSource(
                client=client,
                runner=runner,
                tasks=TASKS,
                samples_dir=stack.work / "samples",
                label=PolicyLabel("run-v0"),
                group_size=2,
            )
            yield Source(source, client, runner, stack.work / "samples")
        finally:
            stack.worker.stop()
            runner.close()


def workflows_of(src: Source, batch_id: str) -> int:
    query = f"RolloutBatchId = '{batch_id}'"
    return src.runner.run(src.client.client.count_workflows(query)).count


def test_a_prompt_that_is_no_task_id_is_refused_before_anything_runs(trl_source: Source) -> None:
    src = trl_source
    with pytest.raises(TrlBridgeError) as refused:
        src.source(["talks", "talks", "elsewhere", "elsewhere"])
    assert str(refused.value) == "prompt: 'elsewhere' is not a task id of this run"
    # nothing of that generation batch was submitted, not even its known task's group
    assert workflows_of(src, f"run-v0-trl{src.source.calls}") == 0
    assert not (src.samples / f"step-{src.source.calls:04d}").exists()


def test_a_batch_with_no_trained_token_is_refused_and_one_with_tokens_is_not(
    trl_source: Source,
) -> None:
    src = trl_source
    with pytest.raises(TrlBridgeError) as refused:
        src.source(["quiet", "quiet"])
    step = src.source.calls
    assert str(refused.value) == (
        f"env_mask: no rollout of batch run-v0-trl{step} has a trained token "
        "(0 infra_error, 2 rollouts); nothing to learn from"
    )
    assert workflows_of(src, f"run-v0-trl{step}") == 2  # they did run

    fields: dict[str, Any] = src.source(["talks", "talks"])  # control: the model was called
    assert [sum(mask) for mask in fields["env_mask"]] == [
        len(ids) for ids in fields["completion_ids"]
    ]
    assert all(len(ids) > 0 for ids in fields["completion_ids"])
    assert fields["rollout_reward"] == [1.0, 1.0]
