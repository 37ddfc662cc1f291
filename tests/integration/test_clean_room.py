"""Integration: nothing the agent leaves in its sandbox runs code in the evaluation.

Each test is one rollout of the `command` harness (the "agent" is a shell script, so no
model is needed) on the real local (bubblewrap) and docker backends. The agent answers
wrong (41 where 42 is right) and plants traps that, if they ran in the evaluator, would
forge the reward; every trap has its own check, which passes only if its trap fired, so
an honest evaluation scores each of them 0. Each test also shows its traps are armed:
the agent sets them off itself, outside the clean room, and reports what they did.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import NO_PROFILE_ENV, SandboxBackend, SandboxSpec
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.session import SessionCreated
from schemas.tasks import RolloutTask
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    e2b_backend,
    fake_e2b_api,
    local_backend,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)

pytestmark = pytest.mark.integration

SESSION = SessionCreated(
    session_id="sess-clean-room",
    token="tok-clean-room",
    openai_base_url="http://127.0.0.1:9/v1",
    anthropic_base_url="http://127.0.0.1:9",
)


@pytest.fixture
def backend(sandbox_backend: SandboxBackend) -> SandboxBackend:  # noqa: F811
    """Each host backend in turn (local bubblewrap, docker), isolated state dir."""
    return sandbox_backend


async def run_agent(
    backend: SandboxBackend,
    tmp_path: Path,
    agent: str,
    evaluation: dict[str, Any],
    hooks: list[dict[str, Any]],
    **sandbox: Any,
) -> RunOutcome:
    task = RolloutTask.model_validate(
        {
            "task_id": "clean-room",
            "prompt": "write 42 to answer.txt",
            "sandbox": {"backend": backend.name, **sandbox},
            "harness": {"name": "command", "config": {"command": agent}, "budget_s": 120},
            "evaluation": evaluation,
            "hooks": hooks,
        }
    )
    rid = f"it-clean-{time.monotonic_ns()}"
    r = await RuntimeManager(tmp_path, backends={backend.name: backend}).run(task, SESSION, rid)
    assert r.status == RolloutStatus.ok, r.error
    assert r.agent is not None and r.agent.exit_code == 0, r.agent and r.agent.stderr_tail
    return r


def fired(r: RunOutcome) -> dict[str, bool]:
    """Check name → passed (for a trap check: whether the trap fired in the evaluator)."""
    assert r.evaluation is not None and r.evaluation.status == "ok", r.evaluation
    return {c.name: c.passed for c in r.evaluation.checks}


# ------------------------------------------------ Python start-up and login-shell traps

#: Forges a reward script's output: after the script's honest last line, one more.
_FORGE = (
    "import atexit, os\n"
    "if os.environ.get('TRAP') == '{trap}':\n"
    "    atexit.register(lambda: (print('{{\"reward\": 1.0}}', flush=True), os._exit(0)))\n"
)
STARTUP_AGENT = f"""
set -e
export HOME=/home/agent  # the sandbox user's HOME (the harness gave the agent its own)
echo 41 > answer.txt
echo 'print(open("answer.txt").read().strip())' > answer.py
site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site" ~/.local/bin
printf '%s\\n' "import os; exec(open(os.path.expanduser('~/.pth_payload')).read())" \\
  > "$site/forge.pth"
cat > ~/.pth_payload <<'EOF'
{_FORGE.format(trap="pth")}EOF
cat > "$site/usercustomize.py" <<'EOF'
{_FORGE.format(trap="usercustomize")}EOF
printf '#!/bin/sh\\necho 42\\n' > ~/.local/bin/python3 && chmod +x ~/.local/bin/python3
cat > ~/.profile <<'EOF'
export PATH="$HOME/.local/bin:$PATH"
export BASH_ENV="$HOME/.bashenv"
export LD_PRELOAD="$HOME/forge.so"
EOF
echo 'cat() {{ echo 42; }}' > ~/.bashenv
honest='print("{{\\"reward\\": 0.0}}")'
echo "armed pth: $(TRAP=pth python3 -c "$honest" | tail -n 1)"
echo "armed usercustomize: $(TRAP=usercustomize python3 -c "$honest" | tail -n 1)"
echo "armed path: $(bash -lc 'python3 -c pass' 2>/dev/null)"
echo "armed bash_env: $(bash -lc 'bash -c "cat answer.txt"' 2>/dev/null)"
echo "armed ld_preload: $(bash -lc 'echo "$LD_PRELOAD"' 2>/dev/null)"
"""
#: Honest: 1.0 only for the right answer.
_REWARD_SCRIPT = (
    "import json\n"
    "ok = open('answer.txt').read().strip() == '42'\n"
    "print(json.dumps({'reward': 1.0 if ok else 0.0}))\n"
)
STARTUP_EVALUATION = {
    "aggregate": "mean",
    "checks": [
        *(
            {"kind": "script", "name": trap, "interpreter": "python3", "env": {"TRAP": trap},
             "script": _REWARD_SCRIPT, "reward_from": "stdout_json"}
            for trap in ("pth", "usercustomize")
        ),
        {"kind": "command", "name": "path",
         "command": "bash -lc 'test \"$(python3 answer.py)\" = 42'"},
        {"kind": "command", "name": "bash_env",
         "command": """bash -lc 'bash -c "test \\"\\$(cat answer.txt)\\" = 42"'"""},
        {"kind": "command", "name": "ld_preload",
         "command": """bash -lc 'test -n "$LD_PRELOAD"'"""},
    ],
}  # fmt: skip


async def test_python_startup_files_and_login_shell_files_do_not_run_in_checks(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    """A `.pth` and a `usercustomize.py` in the agent's user site dir that print a forged
    reward after the reward script; a `~/.profile` that puts `~/.local/bin` (with a fake
    `python3`) first on PATH and exports BASH_ENV (a file that redefines `cat`) and
    LD_PRELOAD for any login shell a check starts."""
    r = await run_agent(
        backend, tmp_path, STARTUP_AGENT, STARTUP_EVALUATION, [{"name": "evaluate"}]
    )
    out = r.agent.stdout_tail if r.agent else ""
    # Armed: outside the clean room each trap does what it would do in the evaluator.
    for line in (
        'armed pth: {"reward": 1.0}',
        'armed usercustomize: {"reward": 1.0}',
        "armed path: 42",
        "armed bash_env: 42",
        "armed ld_preload: /home/agent/forge.so",
    ):
        assert line in out, out
    assert fired(r) == dict.fromkeys(
        ("pth", "usercustomize", "path", "bash_env", "ld_preload"), False
    )
    assert r.reward == 0.0


# ------------------------------------------------------------------- git traps, leftovers

#: Records that a trap's program ran (as "<trap>" in /tmp/fired); a filter passes its
#: input on, a textconv prints its file.
_MARK = """#!/bin/sh
touch "/tmp/fired/$1"
case "$1" in filter) exec cat ;; textconv) exec cat "$2" ;; esac
"""
#: A process the agent's code (run by a check) leaves behind: once a later check starts,
#: it writes the right answer.
_SURVIVOR = """
import os, time
open("/tmp/forger.armed", "w").close()
while True:
    for pid in os.listdir("/proc"):
        try:
            cmdline = open("/proc/%s/cmdline" % pid, "rb").read() if pid.isdigit() else b""
            seen = b"later" + b"-check" in cmdline
        except OSError:
            seen = False
        if seen:
            open("answer.txt", "w").write("42\\n")
            raise SystemExit
    time.sleep(0.01)
"""
GIT_AGENT = f"""
set -e
export HOME=/home/agent
mkdir -p ~/.x /tmp/fired
cat > ~/.x/mark <<'EOF'
{_MARK}EOF
chmod +x ~/.x/mark
printf '#!/bin/sh\\nexec /home/agent/.x/mark ext_diff </dev/null\\n' > ~/.x/ext_diff
chmod +x ~/.x/ext_diff
cat > ~/.gitconfig <<'EOF'
[diff]
	external = /home/agent/.x/ext_diff
[filter "evil"]
	clean = /home/agent/.x/mark filter
[diff "evil"]
	textconv = /home/agent/.x/mark textconv
EOF
echo '* filter=evil diff=evil' > .gitattributes
# The baseline git dir capture_diff kept under /tmp: fsmonitor and a hook.
for g in /tmp/rollout-diff/baseline.git "$HOME/armed.git"; do
  mkdir -p "$g/hooks"; [ -f "$g/HEAD" ] || git init -q --bare "$g"
  git --git-dir="$g" config core.fsmonitor "$HOME/.x/mark fsmonitor"
  printf '#!/bin/sh\\nexec /home/agent/.x/mark hook\\n' > "$g/hooks/post-index-change"
  chmod +x "$g/hooks/post-index-change"
done
# The agent's "solution", which a check runs: it leaves a process behind.
cat > solve.py <<'EOF'
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {_SURVIVOR!r}], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not os.path.exists("/tmp/forger.armed"):
    time.sleep(0.01)
EOF
# Armed: git under the agent's own config runs every program.
echo 0 > answer.txt
GIT_DIR="$HOME/armed.git" GIT_WORK_TREE=. GIT_INDEX_FILE="$HOME/armed.index" sh -c \\
  'git add -A && git diff --cached 4b825dc642cb6eb9a060e54bf8d69288fbee4904 >/dev/null &&
   git diff --cached --no-ext-diff 4b825dc642cb6eb9a060e54bf8d69288fbee4904 >/dev/null'
echo "armed: $(ls /tmp/fired | tr '\\n' ' ')"
rm -rf /tmp/fired/* "$HOME/armed.git" "$HOME/armed.index"
echo 41 > answer.txt
# The clean room's git reads /dev/null as its global config: try to make it this one.
{{ rm -f /dev/null || mv -f /dev/null /tmp/n; cp ~/.gitconfig /dev/null; }} 2>/dev/null || true
"""
GIT_TRAPS = ("ext_diff", "filter", "textconv", "fsmonitor", "hook")
GIT_EVALUATION = {
    "aggregate": "mean",
    "checks": [
        {"kind": "command", "name": "solution runs", "command": "python3 solve.py"},
        {"kind": "command", "name": "later check",
         "command": ': later-check; sleep 1; test "$(cat answer.txt)" = 42'},
        {"kind": "file", "name": "survivor started", "path": "/tmp/forger.armed"},
        *({"kind": "file", "name": t, "path": f"/tmp/fired/{t}"} for t in GIT_TRAPS),
    ],
}  # fmt: skip


async def test_git_config_hooks_filters_and_leftovers_do_not_run_in_the_evaluation(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    """`~/.gitconfig` with `diff.external` and a filter/textconv driver named by the
    agent's `.gitattributes`; fsmonitor and a post-index-change hook in the baseline git
    dir capture_diff used to keep under /tmp; and a process the agent's code, run by one
    check, leaves for the next. None of them may run while capture_diff and evaluate do;
    the diff is still right."""
    hooks = [{"name": "capture_diff"}, {"name": "evaluate"}]
    r = await run_agent(backend, tmp_path, GIT_AGENT, GIT_EVALUATION, hooks)
    out = r.agent.stdout_tail if r.agent else ""
    armed = next(ln for ln in out.splitlines() if ln.startswith("armed: ")).split()[1:]
    assert sorted(armed) == sorted(GIT_TRAPS), out
    assert fired(r) == {
        "solution runs": True,
        "later check": False,
        "survivor started": True,  # the leftover did start: it was killed in time
        **dict.fromkeys(GIT_TRAPS, False),
    }
    assert r.reward == pytest.approx(2 / 8)
    # The diff is the agent's: its files, none of the traps' output.
    assert r.diff is not None and not r.diff.truncated
    patch = (Path(r.artifacts_dir or "") / "diff.patch").read_text()
    assert {ln.split(" b/")[-1] for ln in patch.splitlines() if ln.startswith("diff --git")} == {
        ".gitattributes",
        "answer.txt",
        "solve.py",
    }
    assert "+41" in patch and r.diff.files_changed == 3


# ------------------------------------------------------------ the task repo's own .git

REPO_AGENT = f"""
set -e
export HOME=/home/agent
mkdir -p ~/.x /tmp/fired
cat > ~/.x/mark <<'EOF'
{_MARK}EOF
chmod +x ~/.x/mark
git config core.fsmonitor "$HOME/.x/mark fsmonitor"
git config filter.evil.clean "$HOME/.x/mark filter"
git config diff.external "$HOME/.x/mark ext_diff"
printf '#!/bin/sh\\nexec /home/agent/.x/mark hook\\n' > .git/hooks/post-index-change
chmod +x .git/hooks/post-index-change
echo '* filter=evil' > .gitattributes
echo 41 > answer.txt && echo changed > README
git status --porcelain >/dev/null && git diff >/dev/null
echo "armed: $(ls /tmp/fired | tr '\\n' ' ')"
rm -rf /tmp/fired/*
"""
REPO_TRAPS = ("ext_diff", "filter", "fsmonitor", "hook")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


async def test_the_task_repos_own_git_config_and_hooks_do_not_run_in_capture_diff(
    backend: SandboxBackend, tmp_path: Path
) -> None:
    """The agent writes fsmonitor, a filter driver and diff.external into the task repo's
    `.git/config` and a hook into `.git/hooks`; capture_diff diffs against the task's
    commit without running any of them, and the patch is right."""
    repo = tmp_path / "origin"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README").write_text("hello\n")
    _git(repo, "add", "README")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    commit = _git(repo, "rev-parse", "HEAD")
    evaluation = {
        "checks": [{"kind": "file", "name": t, "path": f"/tmp/fired/{t}"} for t in REPO_TRAPS],
        "aggregate": "mean",
    }
    hooks = [{"name": "capture_diff"}, {"name": "evaluate"}]
    r = await run_agent(
        backend,
        tmp_path,
        REPO_AGENT,
        evaluation,
        hooks,
        repo={"url": str(repo), "commit": commit, "path": "/workspace/repo"},
    )
    out = r.agent.stdout_tail if r.agent else ""
    armed = next(ln for ln in out.splitlines() if ln.startswith("armed: ")).split()[1:]
    assert sorted(armed) == sorted(REPO_TRAPS), out
    assert fired(r) == dict.fromkeys(REPO_TRAPS, False)
    assert r.diff is not None and r.diff.base == commit
    patch = (Path(r.artifacts_dir or "") / "diff.patch").read_text()
    assert {ln.split(" b/")[-1] for ln in patch.splitlines() if ln.startswith("diff --git")} == {
        ".gitattributes",
        "README",
        "answer.txt",
    }
    assert "-hello\n+changed" in patch and (r.diff.insertions, r.diff.deletions) == (3, 1)


# ------------------------------------------------- E2B: every command is a login shell

E2B_PLANT = f"""
set -e
site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site"
cat > "$site/usercustomize.py" <<'EOF'
{_FORGE.format(trap="usercustomize")}EOF
echo 'touch /tmp/profile.ran' > ~/.profile
"""
HONEST = "print('{\"reward\": 0.0}')"


async def test_e2b_login_shell_profile_and_user_site_do_not_reach_the_clean_room(
    e2b_backend: Any,  # noqa: F811
) -> None:
    """E2B runs every command as `bash -l -c`, which reads the profile files in HOME. The
    agent's `~/.profile` and user site dir run for a plain exec (the control) but not for
    an evaluation step, nor for the backend's own kill."""
    sb = await e2b_backend.create(SandboxSpec(rollout_id=f"it-clean-e2b-{time.monotonic_ns()}"))
    try:
        assert (await sb.exec(E2B_PLANT)).ok
        armed = await sb.exec(["python3", "-c", HONEST], env={"TRAP": "usercustomize"})
        assert armed.stdout.splitlines()[-1] == '{"reward": 1.0}'
        gone = await sb.exec(["sh", "-c", "test -e /tmp/profile.ran && rm /tmp/profile.ran"],
                             env=NO_PROFILE_ENV)  # fmt: skip
        assert gone.ok, gone  # the login shells above ran the profile
        res = await sb.evaluator_exec(["python3", "-c", HONEST], env={"TRAP": "usercustomize"})
        assert res.ok and res.stdout.splitlines() == ['{"reward": 0.0}'], res
        await sb.kill_all_processes()
        clean = await sb.exec(["test", "!", "-e", "/tmp/profile.ran"], env=NO_PROFILE_ENV)
        assert clean.ok and not clean.stderr, "the profile ran in an evaluation step or the kill"
    finally:
        await sb.destroy()


async def test_capture_diff_of_a_dir_inside_the_task_repo_is_that_dirs_change(
    local_backend: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`path` inside the task repo: the patch holds that dir's changes only, with the
    repo's own paths."""
    repo = tmp_path / "origin"
    (repo / "sub").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "README").write_text("hello\n")
    (repo / "sub" / "a.txt").write_text("one\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    commit = _git(repo, "rev-parse", "HEAD")
    agent = "echo two > sub/a.txt && echo new > sub/b.txt && echo changed > README"
    hooks = [{"name": "capture_diff", "params": {"path": "/workspace/repo/sub"}}]
    r = await run_agent(
        local_backend,
        tmp_path,
        agent,
        {"checks": [{"kind": "file", "path": "sub/b.txt"}]},
        hooks,
        repo={"url": str(repo), "commit": commit, "path": "/workspace/repo"},
    )
    assert r.diff is not None and r.diff.base == commit
    patch = (Path(r.artifacts_dir or "") / "diff.patch").read_text()
    assert {ln.split(" b/")[-1] for ln in patch.splitlines() if ln.startswith("diff --git")} == {
        "sub/a.txt",
        "sub/b.txt",
    }
    assert (r.diff.files_changed, r.diff.insertions, r.diff.deletions) == (2, 2, 1)


# ------------------------------------- the task's PATH names a dir the agent can write

#: A task whose env puts a directory of the workdir first on PATH (a venv's bin, say).
TASK_PATH = "/workspace/bin:/usr/local/bin:/usr/bin:/bin"
#: The agent plants there the programs the evaluator's own commands call; each records
#: that it ran, and `mktemp` hands out a file in /tmp whatever directory it is asked for.
PATH_AGENT = """
set -e
mkdir -p bin /tmp/fired
for p in rm head dirname; do
  printf '#!/bin/sh\\ntouch /tmp/fired/%s\\nexec /bin/%s "$@"\\n' "$p" "$p" > "bin/$p"
done
printf '#!/bin/sh\\ntouch /tmp/fired/mktemp\\necho /tmp/planted\\n' > bin/mktemp
chmod +x bin/*
rm -f /tmp/nothing && head -c 1 /dev/null && dirname / >/dev/null && mktemp >/dev/null
echo "armed: $(ls /tmp/fired | tr '\\n' ' ')"
rm -rf /tmp/fired/* && echo 41 > answer.txt
"""
PATH_TOOLS = ("rm", "head", "dirname", "mktemp")


async def test_programs_on_the_tasks_path_do_not_run_in_the_evaluators_own_commands(
    local_backend: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The task's env puts an agent-writable dir first on PATH; the agent plants `rm`,
    `head`, `dirname` and `mktemp` there. The evaluator's own commands after the agent
    (capture_diff's cleanup, the evaluation's probes) never run them."""
    evaluation = {
        "aggregate": "mean",
        "checks": [{"kind": "file", "name": t, "path": f"/tmp/fired/{t}"} for t in PATH_TOOLS],
    }
    hooks = [{"name": "capture_diff"}, {"name": "evaluate"}]
    r = await run_agent(
        local_backend, tmp_path, PATH_AGENT, evaluation, hooks, env={"PATH": TASK_PATH}
    )
    out = r.agent.stdout_tail if r.agent else ""
    armed = next(ln for ln in out.splitlines() if ln.startswith("armed: ")).split()[1:]
    assert sorted(armed) == sorted(PATH_TOOLS), out
    assert fired(r) == dict.fromkeys(PATH_TOOLS, False)


@pytest.mark.parametrize("defended", [True, False], ids=["system_tools", "control_task_path"])
async def test_a_planted_mktemp_cannot_hide_damage_from_the_probe(
    local_backend: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    defended: bool,
) -> None:
    """The agent closes its workdir for new files and plants a `mktemp` (first on the
    task's PATH) that hands out a writable file elsewhere: the damage probe still finds
    the workdir closed. Control: the probe run with the task's PATH is fooled (no
    damage found: the failure would be masked), so the planted program is where it
    would run."""
    import sandboxes.base as sandbox_base

    if not defended:
        monkeypatch.setattr(sandbox_base, "SYSTEM_TOOLS_ENV", {})
    spec = SandboxSpec(rollout_id=f"it-clean-probe-{time.monotonic_ns()}", env={"PATH": TASK_PATH})
    sb = await local_backend.create(spec)
    try:
        plant = await sb.exec(PATH_AGENT + "chmod 555 /workspace\n", cwd="/workspace")
        assert plant.ok, plant
        damage = await sb.agent_damage(sb.workdir)
        if defended:
            assert damage == "/workspace takes no new file", damage
        else:
            assert damage is None
    finally:
        await sb.destroy()


# --------------------------------------------------------------- /dev entries a check uses

#: The agent points /dev/fd and /dev/stdin at files of its own saying 42.
DEV_PLANT = """
mkdir -p /tmp/fds && for i in $(seq 0 255); do echo 42 > /tmp/fds/$i; done
rm -f /dev/fd /dev/stdin; ln -s /tmp/fds /dev/fd; ln -s /tmp/fds/0 /dev/stdin
true
"""
#: A check reading through both: a process substitution and `cat /dev/stdin`.
DEV_CHECK = ["bash", "-c", "cat <(echo honest) /dev/stdin"]


async def _dev_entries_seen_by_a_check(backend: SandboxBackend) -> tuple[str, str]:
    """(what a check read through /dev after the agent's plant, /dev/shm's echo)."""
    sb = await backend.create(SandboxSpec(rollout_id=f"it-clean-dev-{time.monotonic_ns()}"))
    try:
        assert (await sb.exec(["bash", "-c", DEV_PLANT])).ok
        shm = await sb.exec(["sh", "-c", "echo shm > /dev/shm/f && cat /dev/shm/f"])
        res = await sb.evaluator_exec(DEV_CHECK, stdin=b"real\n")
        assert res.ok, res
        return res.stdout, shm.stdout
    finally:
        await sb.destroy()


async def test_the_agent_cannot_replace_dev_entries_a_check_resolves(
    backend: SandboxBackend,
) -> None:
    """/dev is read-only to the agent (local: remounted so; docker: root's), so a check's
    process substitution and /dev/stdin are the real ones; /dev/shm stays writable."""
    seen, shm = await _dev_entries_seen_by_a_check(backend)
    assert (seen, shm) == ("honest\nreal\n", "shm\n")


async def test_control_a_writable_dev_lets_the_agent_answer_for_a_check(
    local_backend: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control: the local sandbox with /dev left writable (bwrap's default) — the same
    plant makes the check read the agent's 42, so the test above sees the defence."""
    from sandboxes.backends.local import LocalBackend

    real = LocalBackend._bwrap_args

    def writable_dev(self: LocalBackend, *args: Any, **kwargs: Any) -> list[str]:
        argv = real(self, *args, **kwargs)
        i = argv.index("--remount-ro")
        assert argv[i + 1] == "/dev", argv
        return argv[:i] + argv[i + 2 :]

    monkeypatch.setattr(LocalBackend, "_bwrap_args", writable_dev)
    seen, _ = await _dev_entries_seen_by_a_check(local_backend)
    assert seen == "42\n42\n"
