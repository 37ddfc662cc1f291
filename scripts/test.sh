#!/usr/bin/env bash
# The one test command: installs what a fresh machine lacks (system packages, services,
# virtual environments, caches), then runs every test: unit, integration and e2e.
# Idempotent and cached, so a second run on the same machine is fast.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export ROLLOUT_CACHE_DIR=${ROLLOUT_CACHE_DIR:-$HOME/.cache/agentic-rollout}
mkdir -p "$ROLLOUT_CACHE_DIR"

echo "== system packages and services"
bash scripts/install_system_deps.sh

echo "== project virtual environment (.venv; recreated if made for another location)"
bash scripts/ensure_venv.sh

echo "== real chat templates (third-party test data, checked by sha256; fetched if missing)"
if ! .venv/bin/rollout templates check 2>/dev/null; then
  .venv/bin/rollout templates fetch \
    || echo "[test.sh] no chat templates: the tests that read them will fail" >&2
fi

echo "== vLLM CPU virtual environment (cached under $ROLLOUT_CACHE_DIR)"
.venv/bin/python -c "from devstack.vllm_server import ensure_vllm_venv; print(ensure_vllm_venv())"

echo "== trainer environments: one overlay per trainer (its extra in pyproject.toml; cached)"
.venv/bin/python -c "
from devstack.trainer_env import TRAINER_EXTRAS, ensure_trainer_env
for name, extras in TRAINER_EXTRAS.items():
    print(name, list(extras), ensure_trainer_env(extras=extras))
"

echo "== warm tiny model (cached by recipe; minutes of CPU training on a fresh machine)"
.venv/bin/python -c "
from devstack.tiny_model.warm import ensure_warm_model
from devstack.vllm_server import ensure_vllm_venv, venv_python
print(ensure_warm_model(venv_python(ensure_vllm_venv())))
"

if [ -f scripts/build_base_image.sh ]; then
  echo "== sandbox base image (cached by recipe hash)"
  PYTHON=.venv/bin/python bash scripts/build_base_image.sh
fi

echo "== lint"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== import contract (what may import what: [tool.importlinter] in pyproject.toml)"
.venv/bin/lint-imports

echo "== tests"
exec .venv/bin/python -m pytest -q -ra "$@"
