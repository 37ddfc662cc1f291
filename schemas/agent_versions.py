"""Pinned agent CLI versions: the one place to bump them.

Why a dependency-free module: `scripts/install_agents.sh` (and the sandbox image recipe)
read these pins by running this file with any `python3`, without importing the project
package. Run `python3 schemas/agent_versions.py` to print them as `KEY=VALUE` shell lines.
The harnesses and their scene profiles were written against these releases' wire
behaviour; bumping one means re-checking it: the e2e tests run the real CLIs through the
Gateway, and `tests/unit/test_harness_scenes.py` holds the request shapes they send.
"""

from __future__ import annotations

#: npm packages (native binaries ship as per-platform optional dependencies).
CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"
#: PyPI packages, each installed into its own virtual environment (their pins conflict).
HERMES_VERSION = "0.19.0"
MINI_SWE_AGENT_VERSION = "2.4.6"

#: Harness name → (registry, package, version).
AGENTS: dict[str, tuple[str, str, str]] = {
    "claude_code": ("npm", "@anthropic-ai/claude-code", CLAUDE_CODE_VERSION),
    "codex": ("npm", "@openai/codex", CODEX_VERSION),
    "hermes": ("pypi", "hermes-agent", HERMES_VERSION),
    "mini_swe_agent": ("pypi", "mini-swe-agent", MINI_SWE_AGENT_VERSION),
}


def shell_lines() -> list[str]:
    """`KEY=VALUE` lines (the build-arg names the image recipe uses)."""
    return [
        f"CLAUDE_CODE_VERSION={CLAUDE_CODE_VERSION}",
        f"CODEX_VERSION={CODEX_VERSION}",
        f"HERMES_VERSION={HERMES_VERSION}",
        f"MINI_SWE_AGENT_VERSION={MINI_SWE_AGENT_VERSION}",
    ]


if __name__ == "__main__":
    print("\n".join(shell_lines()))
