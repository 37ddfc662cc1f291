"""Pinned agent CLI versions: the one place to bump them.

The harnesses (`pinned_version`), the sandbox base image (`sandboxes.image.base_image`
passes `BUILD_ARGS` to its Dockerfile) and `scripts/install_agents.sh` all read these.
Why a dependency-free module: the script runs this file with any `python3`, without the
project installed: `python3 schemas/agent_versions.py` prints `KEY=VALUE` shell lines.
The harnesses and their scene profiles were written against these releases' wire
behaviour; bumping one means re-checking it (the e2e tests run the real CLIs through the
Gateway, and `tests/unit/test_harness_scenes.py` holds the request shapes they send),
and rebuilds the base image (its recipe hash covers them).
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

#: The pins under the names the image recipe's build args and the install script use.
BUILD_ARGS: dict[str, str] = {
    "CLAUDE_CODE_VERSION": CLAUDE_CODE_VERSION,
    "CODEX_VERSION": CODEX_VERSION,
    "HERMES_VERSION": HERMES_VERSION,
    "MINI_SWE_AGENT_VERSION": MINI_SWE_AGENT_VERSION,
}


def shell_lines() -> list[str]:
    """`KEY=VALUE` lines of `BUILD_ARGS`."""
    return [f"{key}={value}" for key, value in BUILD_ARGS.items()]


if __name__ == "__main__":
    print("\n".join(shell_lines()))
