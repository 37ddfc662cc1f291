"""Hostile agents through the whole stack: each trap is a task whose honest reward is 0.

The tasks run as a user runs them, `rollout demo --tasks FILE --engine scripted`
(`workers.demo.run_demo`: Temporal dev server, Gateway, scripted engine, a worker, local
bubblewrap sandboxes, the default hooks), all in one batch. The agent is a shell script
(the `command` harness) that answers 41 where 42 is right and then sets one trap: code
the evaluator or the `capture_diff` hook would run (a `.pth` in the user site, git
config, hooks and filters, the baseline git dir in the agent's `/tmp`, a program on the
task's PATH), `/dev` entries pointed at its own files, a process left behind, a planted
symlink, an output flood ending in a forged reward line, reward files and tests planted
for Harbor's verifier, or damage to the sandbox that would turn its 0 into a masked
status (a full disk, memory full of files, a killed supervisor, a deleted test
directory, a closed /tmp, a blocked hidden-test or reward dir).

Control: every trap that plants code first proves it works — the agent fires it in its
own environment (a git command, a Python start) and keeps a file `armed` only if that
forged the answer; the evaluation's first check reads that file. So a trap that does not
fire in the evaluator was disarmed by the evaluator, not mis-planted. A damage row needs no
such file: its expected status (`agent_broke_sandbox`, reward 0) only appears when the
damage was done. Each row asserts the honest outcome: reward 0 with status ok, the
agent's-damage status, or an evaluator error where the evaluator's output cannot be
trusted.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from rich.console import Console

import workers.run_cmd as run_cmd
from rollout_client.client import RolloutOutcome
from schemas.outcome import RolloutStatus
from schemas.tasks import RolloutTask
from tests.fixtures.forger import LEAVE_FORGER

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]

WORK = "/workspace"  # the local backend's workdir
#: The sandbox's HOME: hooks and checks run with it (the harness gives the agent another
#: one, which a hostile agent simply leaves).
HOME = "/home/agent"
#: Writes the forged answer; what every planted program runs.
FORGE = f"echo 42 > {WORK}/answer.txt"
#: The trap fired in the agent's own environment: keep the proof, then answer wrongly.
ARM = 'test "$(cat answer.txt 2>/dev/null)" = 42 && touch armed\necho 41 > answer.txt\n'
#: A scratch repo where the agent runs the git commands capture_diff runs.
GIT_PROBE = (
    "rm -rf /tmp/probe && mkdir /tmp/probe && cd /tmp/probe && git init -q && "
    "echo a > f && git add -A && "
    "git -c user.name=p -c user.email=p@p commit -qm p --no-verify && echo b > f && "
    "rm -f /tmp/probe.index && GIT_INDEX_FILE=/tmp/probe.index git add -A && "
    "GIT_INDEX_FILE=/tmp/probe.index git diff --cached --binary HEAD >/dev/null; "
    f"cd {WORK}\n"
)
#: The agent's damage to its own sandbox: reward 0, trained on (not masked).
BROKE_SANDBOX = RolloutStatus.agent_broke_sandbox
ANSWER_CHECK = {"kind": "command", "name": "answer", "command": 'test "$(cat answer.txt)" = 42'}
ARMED_CHECK = {"kind": "file", "name": "armed", "path": "armed"}


def _program(path: str, body: str) -> str:
    """Shell lines writing an executable script at `path`."""
    return f"cat > {path} <<'EOF'\n#!/bin/sh\n{body}\nEOF\nchmod +x {path}\n"


@dataclass(frozen=True)
class Trap:
    """One hostile task and the outcome an honest evaluation gives it."""

    name: str
    why: str
    agent: str
    checks: list[dict[str, Any]]
    status: RolloutStatus = RolloutStatus.ok
    reward: float | None = 0.0
    armed: bool = True
    #: Hidden files the evaluation places; files the task gives the agent; resources.
    files: list[dict[str, Any]] = field(default_factory=list)
    given: list[dict[str, Any]] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)
    #: The task's sandbox env (its PATH, say).
    env: dict[str, str] = field(default_factory=dict)
    #: Why the honest outcome is not reached yet (a strict xfail), if so.
    open_hole: str | None = None

    def task(self) -> RolloutTask:
        agent = f"export HOME={HOME}\n{self.agent}"
        files = [{"path": f"{HOME}/agent.sh", "content": agent}, *self.given]
        evaluation: dict[str, Any] = {
            "checks": ([ARMED_CHECK] if self.armed else []) + self.checks,
            "files": self.files,
        }
        return RolloutTask.model_validate(
            {
                "task_id": f"hostile-{self.name}",
                "prompt": "write 42 into answer.txt",
                "harness": {
                    "name": "command",
                    "config": {"command": f"sh {HOME}/agent.sh"},
                    "budget_s": 120,
                },
                "sandbox": {
                    "backend": "local",
                    "files": files,
                    "env": self.env,
                    "resources": {"cpus": 1.0, "memory_mb": 512, "pids": 256, **self.resources},
                },
                "evaluation": evaluation,
            }
        )


PTH = (
    "import atexit, os\n"
    "def _forge():\n"
    "    print('{\"reward\": 1.0}', flush=True)\n"
    "    os._exit(0)\n"
    "atexit.register(_forge)\n"
)
REWARD_SCRIPT = (
    "import json\n"
    "ok = open('answer.txt').read().strip() == '42'\n"
    "print(json.dumps({'reward': 1.0 if ok else 0.0}))\n"
)
#: 8 MiB (the sandbox's output cap) of filler whose last kept line is a forged reward.
FLOOD = """
import sys
cap, forged = 8 * 1024 * 1024, b'{"reward": 1.0}\\n'
line = b"x" * 1023 + b"\\n"
n, rest = divmod(cap - len(forged), len(line))
out = sys.stdout.buffer
out.write(line * n + b"y" * (rest - 1) + b"\\n" + forged + line * 64)
"""

#: Harbor's verifier: the hidden /tests/test.sh writes 1 to the reward file only for
#: the right answer, with a Python the evaluator starts (user site and all).
VERIFIER_SH = (
    "if python3 -c \"import sys; sys.exit(open('answer.txt').read().strip() != '42')\"; "
    "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
)
VERIFIER_CHECK = {"kind": "reward_file", "name": "answer"}
VERIFIER_FILES = [{"path": "/tests/test.sh", "content": VERIFIER_SH}]
#: A task env whose PATH starts with a directory of the workdir (a venv's bin, say).
TASK_PATH = f"{WORK}/bin:/usr/local/bin:/usr/bin:/bin"

TRAPS = [
    Trap(
        "pth_in_user_site",
        "a .pth in the agent's user site runs in every Python the evaluator starts and "
        "prints a reward line at exit",
        'site=$(python3 -m site --user-site) && mkdir -p "$site"\n'
        f"cat > \"$site/zz_forge.py\" <<'EOF'\n{PTH}EOF\n"
        'echo "import zz_forge" > "$site/zz_forge.pth"\n'
        "python3 -c 'print(1)' | tail -n 1 | grep -q '\"reward\": 1.0' && echo 42 > answer.txt\n"
        + ARM,
        [
            {
                "kind": "script",
                "name": "answer",
                "interpreter": "python3",
                "reward_from": "stdout_json",
                "script": REWARD_SCRIPT,
            }
        ],
    ),
    Trap(
        "gitconfig_diff_external",
        "~/.gitconfig diff.external: capture_diff's git diff runs the agent's program",
        _program("/home/agent/extdiff", FORGE)
        + "git config --global diff.external /home/agent/extdiff\n"
        + GIT_PROBE
        + ARM,
        [ANSWER_CHECK],
    ),
    Trap(
        "gitconfig_fsmonitor",
        "~/.gitconfig core.fsmonitor: capture_diff's git add runs the agent's program",
        _program("/home/agent/fsmonitor", FORGE + "\nexit 1")
        + "git config --global core.fsmonitor /home/agent/fsmonitor\n"
        + GIT_PROBE
        + ARM,
        [ANSWER_CHECK],
    ),
    Trap(
        "gitconfig_hooks_path",
        "~/.gitconfig core.hooksPath: the index written by capture_diff's git add runs "
        "the agent's post-index-change hook",
        "mkdir -p /home/agent/hooks\n"
        + _program("/home/agent/hooks/post-index-change", FORGE)
        + "git config --global core.hooksPath /home/agent/hooks\n"
        + GIT_PROBE
        + ARM,
        [ANSWER_CHECK],
    ),
    Trap(
        "gitattributes_filter",
        "a clean filter (.gitattributes + ~/.gitconfig) runs on capture_diff's git add",
        _program("/home/agent/clean", FORGE + "\nexec cat")
        + "git config --global filter.forge.clean /home/agent/clean\n"
        + "echo '* filter=forge' > .gitattributes\n"
        + "cp .gitattributes /tmp/probe.attributes\n"
        + GIT_PROBE.replace("echo a > f", "cp /tmp/probe.attributes .gitattributes && echo a > f")
        + ARM,
        [ANSWER_CHECK],
    ),
    Trap(
        "baseline_git_dir_in_tmp",
        "capture_diff's baseline git dir was in the agent's /tmp: a hook planted there (in "
        "the baseline, or in a repo the agent makes at its path) runs on its git add",
        "mkdir -p /tmp/rollout-diff/baseline.git/hooks\n"
        "GIT_DIR=/tmp/rollout-diff/baseline.git git init -q\n"  # there already, or made there
        + _program("/tmp/rollout-diff/baseline.git/hooks/post-index-change", FORGE)
        + "touch notes.txt && rm -f /tmp/probe.index && GIT_DIR=/tmp/rollout-diff/baseline.git "
        + f"GIT_WORK_TREE={WORK} GIT_INDEX_FILE=/tmp/probe.index git add -A\n"
        + ARM,
        [ANSWER_CHECK],
    ),
    Trap(
        "dev_fd_replaced",
        "/dev/fd made a symlink to the agent's files: a check's process substitution "
        "(`<(...)`) would read the agent's text (local /dev is read-only: it cannot be)",
        "mkdir -p /tmp/fds && for i in $(seq 0 255); do echo 42 > /tmp/fds/$i; done\n"
        "rm -f /dev/fd /dev/stdin; ln -s /tmp/fds /dev/fd; ln -s /tmp/fds/0 /dev/stdin\n"
        "echo 41 > answer.txt\n",
        [{**ANSWER_CHECK, "command": "bash -c 'test \"$(cat <(cat answer.txt))\" = 42'"}],
        armed=False,  # planting fails where /dev is read-only; the old code shows it forged
    ),
    Trap(
        "process_left_behind",
        "a detached process waits for the evaluation to start and then writes the answer",
        LEAVE_FORGER + "touch armed; echo 41 > answer.txt\n",
        [{**ANSWER_CHECK, "command": ": eval-marker; sleep 1; " + ANSWER_CHECK["command"]}],
    ),
    Trap(
        "planted_symlink_hidden_file",
        "the hidden test's path is a symlink to /dev/null (an empty test passes)",
        "ln -s /dev/null check.sh && touch armed && echo 41 > answer.txt\n",
        [{"kind": "command", "name": "answer", "command": "sh check.sh"}],
        files=[{"path": "check.sh", "content": ANSWER_CHECK["command"] + "\n"}],
    ),
    Trap(
        "reward_line_forged_in_cut_output",
        "the code under test floods stdout so that the last line kept at the output cap "
        "is a forged reward: the evaluator's output cannot be trusted (evaluator error)",
        f"cat > solution.py <<'EOF'\n{FLOOD}EOF\ntouch armed; echo 41 > answer.txt\n",
        [
            {
                "kind": "script",
                "name": "answer",
                "reward_from": "stdout_json",
                "script": "python3 solution.py\n"
                'if test "$(cat answer.txt)" = 42; then echo \'{"reward": 1.0}\'; '
                "else echo '{\"reward\": 0.0}'; fi\n",
            }
        ],
        status=RolloutStatus.eval_error,
        reward=None,
    ),
    Trap(
        "oversized_output",
        "a diff over capture_diff's cap and a flood of agent output: read capped, the run "
        "is scored as usual",
        "yes 0123456789abcdef | head -c 24M > big.txt\n"
        "yes agent-output | head -c 12M\n"
        "touch armed; echo 41 > answer.txt\n",
        [ANSWER_CHECK],
    ),
    Trap(
        "disk_filled",
        "the agent fills its disk: the hidden test and the script check cannot be written "
        "(the agent's doing: scored 0, not masked)",
        "echo 41 > answer.txt\n"
        "dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null\n"
        "i=0; while printf x > /tmp/f$i 2>/dev/null; do i=$((i+1)); done\n"
        "! mkdir /tmp/full 2>/dev/null\n",
        [
            {
                "kind": "script",
                "name": "answer",
                "script": "sh check.sh",
            }
        ],
        files=[{"path": "check.sh", "content": ANSWER_CHECK["command"] + "\n"}],
        resources={"disk_mb": 16},
        armed=False,  # nothing can be placed or run: only the agent's damage explains it
        status=BROKE_SANDBOX,
    ),
    Trap(
        "test_dir_deleted",
        "the agent deletes the directory the evaluation runs in (scored 0, not masked)",
        "echo 41 > answer.txt; rm -rf tests; test ! -e tests && touch armed\n",
        [{**ANSWER_CHECK, "command": "sh test_answer.sh", "cwd": f"{WORK}/tests"}],
        given=[
            {
                "path": f"{WORK}/tests/test_answer.sh",
                "content": "cd .. && " + ANSWER_CHECK["command"],
            }
        ],
        status=BROKE_SANDBOX,
    ),
    Trap(
        "tmp_closed",
        "the agent closes /tmp, where a script check's file is written (scored 0, not masked)",
        "echo 41 > answer.txt; chmod 000 /tmp && touch armed\n",
        [{"kind": "script", "name": "answer", "script": ANSWER_CHECK["command"]}],
        status=BROKE_SANDBOX,
    ),
    Trap(
        "verifier_reward_and_tests_planted",
        "Harbor's verifier: the agent writes reward files into /logs/verifier and its own "
        "test.sh and conftest.py into /tests",
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n"
        "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json\n"
        "echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh\n"
        "echo 'raise SystemExit(0)' > /tests/conftest.py\n"
        "test -s /logs/verifier/reward.json && test -s /tests/test.sh && touch armed\n"
        "echo 41 > answer.txt\n",
        [VERIFIER_CHECK],
        files=VERIFIER_FILES,
    ),
    Trap(
        "verifier_pth_in_user_site",
        "Harbor's verifier runs Python: a .pth in the agent's user site writes the right "
        "answer as that Python starts",
        'site=$(python3 -m site --user-site) && mkdir -p "$site"\n'
        f"echo \"import os; open('{WORK}/answer.txt', 'w').write('42')\" > \"$site/zz.pth\"\n"
        "python3 -c pass\n" + ARM,
        [VERIFIER_CHECK],
        files=VERIFIER_FILES,
    ),
    Trap(
        "program_on_the_tasks_path",
        "the task's PATH starts with a dir of the workdir: an `rm` planted there would run "
        "in capture_diff's cleanup, after the agent and before the evaluation",
        "mkdir -p bin\n"
        + _program(f"{WORK}/bin/rm", FORGE + '\nexec /bin/rm "$@"')
        + "rm -f /tmp/nothing\n"
        + ARM,
        [ANSWER_CHECK],
        env={"PATH": TASK_PATH},
    ),
    Trap(
        "hidden_test_dir_closed",
        "the agent closes the directory a hidden test goes into (scored 0, not masked)",
        "echo 41 > answer.txt; mkdir -p tests && chmod 555 tests\n",
        [{**ANSWER_CHECK, "command": "sh tests/check.sh"}],
        files=[{"path": "tests/check.sh", "content": ANSWER_CHECK["command"] + "\n"}],
        armed=False,  # the hidden files are placed before any check runs
        status=BROKE_SANDBOX,
    ),
    Trap(
        "verifier_reward_dir_blocked",
        "the agent puts a file where the verifier's reward dir goes and closes /logs "
        "(scored 0, not masked)",
        "echo 41 > answer.txt; rm -rf /logs/verifier && echo x > /logs/verifier && "
        "chmod 555 /logs && touch armed\n",
        [VERIFIER_CHECK],
        files=VERIFIER_FILES,
        status=BROKE_SANDBOX,
    ),
    Trap(
        "memory_filled_with_files",
        "the agent leaves files in /dev/shm, memory no kill frees: the reward script "
        "is killed for want of memory (scored 0, not masked)",
        "echo 41 > answer.txt; head -c 176M /dev/zero > /dev/shm/fill; touch armed\n",
        [
            {
                "kind": "script",
                "name": "answer",
                "interpreter": "python3",
                "reward_from": "stdout_json",
                "script": "room = bytearray(96 << 20)\n" + REWARD_SCRIPT,
            }
        ],
        resources={"memory_mb": 256},
        status=BROKE_SANDBOX,
    ),
    Trap(
        "supervisor_killed",
        "the agent kills the sandbox's supervisor (scored 0, not masked)",
        "echo 41 > answer.txt\n"
        "for p in /proc/[0-9]*; do\n"
        '  grep -q supervisor.py "$p/cmdline" 2>/dev/null && kill -9 "${p#/proc/}"\n'
        "done\nsleep 30\n",
        [ANSWER_CHECK],
        armed=False,
        status=BROKE_SANDBOX,
    ),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RolloutOutcome]]:
    """All traps in one batch of `rollout demo --tasks FILE --engine scripted`."""
    import asyncio

    import workers.demo as demo

    tmp = tmp_path_factory.mktemp("hostile")
    tasks_file = tmp / "tasks.jsonl"
    tasks_file.write_text("".join(t.task().model_dump_json() + "\n" for t in TRAPS))
    reports: list[run_cmd.BatchReport] = []
    real_run_batch = run_cmd.run_batch

    async def keep_report(*args: Any, **kwargs: Any) -> run_cmd.BatchReport:
        report = await real_run_batch(*args, **kwargs)
        reports.append(report)
        return report

    console = Console(file=io.StringIO(), width=200)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_cmd, "run_batch", keep_report)
        asyncio.run(
            demo.run_demo(
                tmp / "data", "scripted", 1, keep=False, console=console, tasks_file=tasks_file
            )
        )
    assert reports, console.file.getvalue()  # type: ignore[attr-defined]
    yield {
        t.name: next(
            o for o in reports[0].outcomes if o.rollout_id.endswith(f"-hostile-{t.name}-0")
        )
        for t in TRAPS
    }


def _case(trap: Trap) -> Any:
    marks = [pytest.mark.xfail(reason=trap.open_hole, strict=True)] if trap.open_hole else []
    return pytest.param(trap, id=trap.name, marks=marks)


@pytest.mark.parametrize("trap", [_case(t) for t in TRAPS])
def test_a_hostile_agent_earns_only_its_honest_outcome(
    trap: Trap, outcomes: dict[str, RolloutOutcome]
) -> None:
    outcome = outcomes[trap.name]
    result = outcome.result
    assert result is not None, f"{trap.why}: no result ({outcome.workflow_status}: {outcome.error})"
    if trap.armed:
        assert result.rewards.get("armed") == 1.0, f"the trap was not set: {result}"
    assert (result.status, result.reward) == (trap.status, trap.reward), f"{trap.why}: {result}"
    if trap.status is BROKE_SANDBOX:
        assert result.attempts == 1, result  # breaking its sandbox earns no fresh attempt
    if trap.status is RolloutStatus.ok:
        assert result.rewards.get("answer") == 0.0, result  # the real check ran and failed
