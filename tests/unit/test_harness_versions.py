"""Unit test: the agent version pins reach everything that installs or names an agent.

The harnesses were written against these releases' wire behaviour; the sandbox image
recipe and scripts/install_agents.sh must install exactly these, or harness config facts
may not hold. `schemas/agent_versions.py` is the one place they are written; the recipe
and the script read it, so what is left to check is that each reader takes every pin.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sandboxes.image import base_image as images
from schemas import agent_versions as versions

ROOT = Path(__file__).resolve().parents[2]


def test_versions_module_prints_shell_assignments_without_the_package() -> None:
    # install_agents.sh runs the file directly with any python3, not as an import.
    out = subprocess.run(
        [sys.executable, str(ROOT / "schemas" / "agent_versions.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout
    pins = dict(line.split("=", 1) for line in out.split())
    assert pins == {
        "CLAUDE_CODE_VERSION": versions.CLAUDE_CODE_VERSION,
        "CODEX_VERSION": versions.CODEX_VERSION,
        "HERMES_VERSION": versions.HERMES_VERSION,
        "MINI_SWE_AGENT_VERSION": versions.MINI_SWE_AGENT_VERSION,
    }


def test_sandbox_image_recipe_installs_every_version_it_is_given() -> None:
    # A build arg the Dockerfile does not declare is dropped by docker (a warning only),
    # and one it declares but is not given installs whatever version resolves.
    dockerfile = (images.RECIPE_DIR / "Dockerfile").read_text()
    declared = set(re.findall(r"^ARG (\w+_VERSION)$", dockerfile, re.MULTILINE))
    assert declared == set(images.VERSIONS)
    assert versions.BUILD_ARGS.items() <= images.VERSIONS.items()
    for key in declared:
        assert "${" + key + "}" in dockerfile, f"{key} is declared but never used"


def test_harness_classes_carry_the_pins() -> None:
    from harnesses.registry import harness_class

    for name, (_registry, _package, version) in versions.AGENTS.items():
        assert harness_class(name).pinned_version == version  # type: ignore[attr-defined]
