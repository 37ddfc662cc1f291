"""Unit test: agent version pins agree everywhere they are written down.

The harnesses were written against these releases' wire behaviour; the sandbox image
recipe and scripts/install_agents.sh must install exactly these, or harness config facts
may not hold. `schemas/agent_versions.py` is the source; this catches a bump made in one place only.
"""

from __future__ import annotations

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


def test_sandbox_image_installs_the_pinned_agent_versions() -> None:
    pins = dict(line.split("=", 1) for line in versions.shell_lines())
    for key, value in pins.items():
        assert images.VERSIONS.get(key) == value, f"{key}: image {images.VERSIONS.get(key)}"


def test_harness_classes_carry_the_pins() -> None:
    from harnesses.registry import harness_class

    for name, (_registry, _package, version) in versions.AGENTS.items():
        assert harness_class(name).pinned_version == version  # type: ignore[attr-defined]
