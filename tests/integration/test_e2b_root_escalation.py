"""E2B: a template whose user can become root is refused before the agent runs.

Through the real `e2b` SDK against `FakeE2BApiForTests` (the E2B cloud cannot be reached
here), whose sandboxes are real bubblewrap sandboxes. Real sudo cannot raise privileges
there (no setuid in an unprivileged user namespace), so the template standing in for
E2B's default one (passwordless sudo for its user) has a stand-in `sudo` in
/usr/local/bin that runs its command: `sudo -n true` succeeds, as it does on E2B. The
base template has no sudo at all (the control).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities, SandboxBackends
from sandboxes.backends.e2b import TASK_ID_LABEL, RootEscalationRefused
from sandboxes.base import SandboxHandle, SandboxSpec
from schemas.rollout import BAD_TASK_SPEC
from schemas.tasks import RolloutTask
from tests.fixtures.sandboxes import provision_request

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

SUDO_TEMPLATE = "user-with-sudo"
#: Stand-in for a passwordless sudo: runs the command as it is (see the module docstring).
STAND_IN_SUDO = '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n'


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def sudo_rootfs(sandbox_base_image: Any, sandbox_state_dir: Path) -> Iterator[str]:
    """The base rootfs plus the stand-in sudo. A hard-linked copy (no file of the base is
    written: the sandbox binds it read-only, and the stand-in is a new file), where the
    sandbox uid can reach it."""
    root = sandbox_state_dir / f"rootfs-with-sudo-{uuid.uuid4().hex[:6]}"
    subprocess.run(["cp", "-al", sandbox_base_image.rootfs, str(root)], check=True)
    sudo = root / "usr" / "local" / "bin" / "sudo"
    sudo.write_text(STAND_IN_SUDO)
    sudo.chmod(0o755)
    yield str(root)
    subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.fixture
def sudo_template(fake_e2b_api: Any, sudo_rootfs: str) -> str:
    """A template of the fake whose sandboxes run `sudo_rootfs`."""
    fake_e2b_api.template_rootfs[SUDO_TEMPLATE] = sudo_rootfs
    return SUDO_TEMPLATE


async def test_a_template_whose_user_can_sudo_is_refused_naming_task_and_field(
    e2b_backend: Any, fake_e2b_api: Any, sudo_template: str
) -> None:
    spec = SandboxSpec(rollout_id=rid(), image=sudo_template, labels={TASK_ID_LABEL: "t-sudo"})
    with pytest.raises(RootEscalationRefused) as err:
        await e2b_backend.create(spec)
    message = str(err.value)
    assert "t-sudo" in message and sudo_template in message
    assert "sudo -n true" in message and "allow_root_escalation: true" in message
    assert fake_e2b_api.sandboxes == {}  # the refused sandbox was destroyed


async def test_the_task_can_opt_in_and_a_template_without_sudo_passes(
    e2b_backend: Any, sudo_template: str
) -> None:
    opted = await e2b_backend.create(
        SandboxSpec(rollout_id=rid(), image=sudo_template, allow_root_escalation=True)
    )
    try:
        assert opted.handle.details["root_escalation"] == "sudo"
        # The stand-in is what the check saw: the agent's user can run it.
        assert (await opted.exec(["sudo", "-n", "true"])).exit_code == 0
    finally:
        await opted.destroy()
    plain = await e2b_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        assert plain.handle.details["root_escalation"] is None
        assert (await plain.exec(["sudo", "-n", "true"])).exit_code != 0
    finally:
        await plain.destroy()


async def test_provision_ends_the_rollout_as_a_bad_task_before_the_agent(
    fake_e2b_api: Any, sudo_template: str
) -> None:
    """Through the provision activity: non-retryable `BadTaskSpec` (the rollout ends as
    an infra error, masked: never the agent's failure), naming the task and the field."""
    backends = SandboxBackends(
        {
            "e2b": {
                "api_key": "e2b_test_key",
                "api_url": fake_e2b_api.url,
                "sandbox_url": fake_e2b_api.url,
                "http_version": "1.1",
            }
        }
    )
    acts = SandboxActivities(backends, "h1", "q-h1")
    task = RolloutTask.model_validate(
        {
            "task_id": "t-root",
            "prompt": "p",
            "harness": {"name": "command", "config": {"command": "true"}},
            "sandbox": {"backend": "e2b", "image": sudo_template},
        }
    )
    request = provision_request(task, gateway="https://gw.example.invalid")
    try:
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(acts.provision_sandbox, request)
        assert err.value.type == BAD_TASK_SPEC and err.value.non_retryable
        assert "t-root" in err.value.message
        assert "sandbox.allow_root_escalation" in err.value.message
        assert fake_e2b_api.sandboxes == {}
        # Control: the same task opted in is provisioned.
        opted = task.model_copy(deep=True)
        opted.sandbox = opted.sandbox.model_validate(
            {"backend": "e2b", "image": sudo_template, "allow_root_escalation": True}
        )
        ref = await ActivityEnvironment().run(
            acts.provision_sandbox, request.model_copy(update={"task": opted})
        )
        assert ref.handle["details"]["root_escalation"] == "sudo"
        await backends.get("e2b").destroy(SandboxHandle.model_validate(ref.handle))
    finally:
        await backends.aclose()
