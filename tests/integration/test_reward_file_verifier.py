"""Integration: Harbor's verifier contract (`RewardFileCheck`) on real sandboxes.

Each test is one rollout of the `command` harness (the "agent" is a shell script, so no
model is needed) on the local (bubblewrap) and docker backends, with the evaluation a
Harbor task gets: the task's tests placed at `/tests` after the agent stopped, then
`bash /tests/test.sh`, whose reward file in `/logs/verifier` is the reward.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import SandboxBackend
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.integration

SESSION = SessionCreated(
    session_id="sess-reward-file",
    token="tok-reward-file",
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
)
HOOKS = [{"name": "collect_logs"}, {"name": "evaluate"}]


@pytest.fixture
def backend(sandbox_backend: SandboxBackend) -> SandboxBackend:  # noqa: F811
    """Each host backend in turn (local bubblewrap, docker), isolated state dir."""
    return sandbox_backend


def harbor_evaluation(test_sh: str, **check: Any) -> dict[str, Any]:
    """The evaluation of a Harbor task whose tests/ holds `test.sh` and a data file."""
    return {
        "aggregate": "mean",
        "checks": [{"kind": "reward_file", "name": "verifier", **check}],
        "files": [
            {"path": "/tests/test.sh", "content": test_sh, "mode": 0o755},
            {"path": "/tests/data/expected.txt", "content": "42\n"},
        ],
    }


async def run_agent(
    backend: SandboxBackend,
    tmp_path: Path,
    agent: str,
    evaluation: dict[str, Any],
    resources: dict[str, Any] | None = None,
) -> RunOutcome:
    task = RolloutTask.model_validate(
        {
            "task_id": "reward-file",
            "prompt": "write 42 to answer.txt",
            "sandbox": {"backend": backend.name, "resources": resources or {}},
            "harness": {"name": "command", "config": {"command": agent}, "budget_s": 120},
            "evaluation": evaluation,
            "hooks": HOOKS,
        }
    )
    rid = f"it-reward-file-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(task, SESSION, rid)
    assert r.agent is not None and r.agent.exit_code == 0, r.agent and r.agent.stderr_tail
    assert r.evaluation is not None
    return r


#: Answers, and leaves what a Harbor agent may leave: its log and an artifact.
HONEST_AGENT = """
set -e
echo 42 > answer.txt
echo "agent transcript" > /logs/agent/agent.log
mkdir -p /logs/artifacts/out && echo "built thing" > /logs/artifacts/out/result.txt
"""
#: Scores by comparing with the hidden expected answer; exits 1 all the same.
TXT_VERIFIER = """#!/bin/bash
if cmp -s answer.txt /tests/data/expected.txt; then echo 0.75 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
echo "verifier log" > /logs/verifier/test-output.txt
echo "ran the tests"
exit 1
"""


@pytest.mark.parametrize("disk_mb", [1024, None], ids=["sized-disk", "no-disk-limit"])
async def test_reward_txt_scores_and_the_log_dirs_are_collected(
    backend: SandboxBackend, tmp_path: Path, disk_mb: int | None
) -> None:
    """With a sized disk the task dirs are on it (docker: bind mounts over a read-only
    root); without one, docker makes them in the container's writable root."""
    evaluation = harbor_evaluation(TXT_VERIFIER)
    r = await run_agent(backend, tmp_path, HONEST_AGENT, evaluation, {"disk_mb": disk_mb})
    ev = r.evaluation
    assert ev is not None and ev.status == "ok", ev
    assert r.status == RolloutStatus.ok
    # The reward file decides, not the exit code (recorded).
    assert ev.reward == 0.75 and r.reward == 0.75
    assert ev.checks[0].exit_code == 1 and "ran the tests" in ev.checks[0].detail
    assert ev.metrics == {}
    # /logs/agent and /logs/artifacts (the agent's) and /logs/verifier (the verifier's)
    # land with the rollout's other artifacts.
    by_name = {a.name: a for a in r.artifacts}
    root = Path(r.artifacts_dir or "")
    want = {
        "logs/task_logs/agent/agent.log": "agent transcript\n",
        "logs/task_logs/artifacts/out/result.txt": "built thing\n",
        "logs/task_logs/verifier/test-output.txt": "verifier log\n",
        "logs/task_logs/verifier/reward.txt": "0.75\n",
    }
    for name, content in want.items():
        assert name in by_name, sorted(by_name)
        assert (root / name).read_text() == content


#: Writes several metrics; `reward` is the training reward.
JSON_VERIFIER = """#!/bin/bash
test "$X" = 1 || exit 3
python3 -c '
import json
ok = open("answer.txt").read() == open("/tests/data/expected.txt").read()
json.dump({"reward": 0.5 if ok else 0.0, "passed": 3, "total": 6, "ratio": 0.5},
          open("/logs/verifier/reward.json", "w"))
'
"""


async def test_reward_json_gives_reward_and_metrics(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    evaluation = harbor_evaluation(JSON_VERIFIER, user="agent", env={"X": "1"})
    r = await run_agent(backend, tmp_path, "echo 42 > answer.txt", evaluation)
    ev = r.evaluation
    assert ev is not None and ev.status == "ok", ev
    assert ev.reward == 0.5 and ev.checks[0].source == "reward.json"
    assert ev.metrics == {"passed": 3.0, "total": 6.0, "ratio": 0.5}


#: The agent's program, run by the verifier, writes reward.json 1.0 with a metric; the
#: verifier writes its reward.txt afterwards.
FORGING_PROGRAM = (
    "echo 41 > answer.txt\n"
    'printf \'import json\\njson.dump({"reward": 1.0, "passed": 1}, '
    'open("/logs/verifier/reward.json", "w"))\\n\' > check.py\n'
)
RUNS_THE_PROGRAM = """#!/bin/bash
python3 check.py
if cmp -s answer.txt /tests/data/expected.txt; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""


async def test_reward_txt_decides_over_a_reward_json_the_agents_program_wrote(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    """Harbor's precedence: reward.txt (the verifier's 0) is the reward, the planted
    reward.json's 1.0 is not; its other metric is kept, the disagreement noted."""
    r = await run_agent(backend, tmp_path, FORGING_PROGRAM, harbor_evaluation(RUNS_THE_PROGRAM))
    ev = r.evaluation
    assert ev is not None and (ev.status, ev.reward) == ("ok", 0.0), ev
    assert ev.checks[0].source == "reward.txt" and ev.metrics == {"passed": 1.0}
    assert "reward.json says reward=1.0; reward.txt decides" in ev.checks[0].detail


#: Plants a perfect reward in the reward dir and its own files in /tests, after checking
#: that /tests was empty for it (the task's tests arrive only after it stopped).
PLANTING_AGENT = """
set -e
echo "tests seen by the agent: [$(ls -A /tests)]"
echo 41 > answer.txt
echo '{"reward": 1.0}' > /logs/verifier/reward.json
echo 1 > /logs/verifier/reward.txt
printf 'import os\\nopen("/logs/verifier/reward.txt", "w").write("1")\\n' > /tests/conftest.py
mkdir -p /tests/data && echo 41 > /tests/data/expected.txt && echo x > /tests/planted.txt
echo "planted: $(ls -A /tests /logs/verifier | tr '\\n' ' ')"
"""
#: Writes no reward at all; says what it finds.
SILENT_VERIFIER = """#!/bin/bash
echo "tests: [$(cd /tests && find . -type f | sort | tr '\\n' ' ')]"
echo "verifier dir: [$(ls -A /logs/verifier)]"
echo "expected: $(cat /tests/data/expected.txt)"
"""


async def test_planted_reward_and_tests_do_not_survive(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    r = await run_agent(backend, tmp_path, PLANTING_AGENT, harbor_evaluation(SILENT_VERIFIER))
    out = r.agent.stdout_tail if r.agent else ""
    assert "tests seen by the agent: []" in out, out
    assert "conftest.py" in out and "reward.json" in out, out  # armed
    ev = r.evaluation
    assert ev is not None
    # The verifier wrote nothing: an evaluator error, never the planted 1.0.
    assert ev.status == "eval_error" and ev.reward is None and r.reward is None, ev
    assert r.status == RolloutStatus.eval_error
    error = ev.error or ""
    assert "wrote neither reward.txt nor reward.json" in error, error
    # Its output tail is in the error: it saw only the task's files, none of the agent's.
    assert "tests: [./data/expected.txt ./test.sh ]" in error, error
    assert "verifier dir: []" in error and "expected: 42" in error, error


async def test_verifier_timeout_is_an_eval_error(backend: SandboxBackend, tmp_path: Path) -> None:
    slow = "#!/bin/bash\necho started\nsleep 60\necho 1 > /logs/verifier/reward.txt\n"
    evaluation = harbor_evaluation(slow, timeout_s=2)
    r = await run_agent(backend, tmp_path, "echo 42 > answer.txt", evaluation)
    ev = r.evaluation
    assert ev is not None and ev.status == "eval_error" and ev.reward is None, ev
    error = ev.error or ""
    assert "timed out after 2.0s" in error and "started" in error, error


@pytest.mark.parametrize(
    "reward_txt,why",
    [("", "reward.txt is empty"), ("passed", "reward.txt is not one number")],
)
async def test_bad_reward_file_is_an_eval_error(
    backend: SandboxBackend, tmp_path: Path, reward_txt: str, why: str
) -> None:
    verifier = f"#!/bin/bash\necho 'my tail'\nprintf '{reward_txt}' > /logs/verifier/reward.txt\n"
    r = await run_agent(backend, tmp_path, "true", harbor_evaluation(verifier))
    ev = r.evaluation
    assert ev is not None and ev.status == "eval_error", ev
    error = ev.error or ""
    assert why in error and "my tail" in error, error


async def test_verifier_user_the_backend_cannot_switch_to_is_refused(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    verifier = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
    r = await run_agent(backend, tmp_path, "true", harbor_evaluation(verifier, user="root"))
    ev = r.evaluation
    assert ev is not None and ev.status == "eval_error" and ev.reward is None, ev
    error = ev.error or ""
    assert "must run as user 'root'" in error and "cannot switch users" in error, error
