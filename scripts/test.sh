#!/usr/bin/env bash
# The one test command: installs what the selected tests need (system packages,
# services, virtual environments, caches), then runs them. With no arguments that is
# every test (unit, integration, e2e) and so every setup step, as CI runs it.
# Idempotent and cached, so a second run on the same machine is fast.
#
#   scripts/test.sh [--plan] [PYTEST ARGS]
#
# The steps come from the selection: pytest collects it and writes the steps its tests
# need (tests/setup_steps.py: fixtures and @pytest.mark.needs). --plan prints them and
# stops. Collection itself needs .venv and the real chat templates, so those come first.
set -euo pipefail
cd "$(dirname "$0")/.."
export ROLLOUT_CACHE_DIR=${ROLLOUT_CACHE_DIR:-$HOME/.cache/agentic-rollout}
mkdir -p "$ROLLOUT_CACHE_DIR"
dry_run=0
if [ "${1:-}" = "--plan" ]; then dry_run=1; shift; fi

echo "== project virtual environment (.venv; recreated if made for another location)"
python3 -c "import ensurepip, venv" 2>/dev/null || bash scripts/install_local_deps.sh
bash scripts/ensure_venv.sh

echo "== real chat templates (third-party test data, checked by sha256; fetched if missing)"
if ! .venv/bin/rollout templates check 2>/dev/null; then
  .venv/bin/rollout templates fetch \
    || echo "[test.sh] no chat templates: the tests that read them will fail" >&2
fi

echo "== setup steps the selected tests need (pytest --collect-only)"
plan_file=$(mktemp)
collect_log=$(mktemp)
trap 'rm -f "$plan_file" "$collect_log"' EXIT
if ! .venv/bin/python -m pytest -p tests.setup_steps --collect-only -q \
  --setup-plan-file="$plan_file" "$@" \
  >"$collect_log" 2>&1; then
  cat "$collect_log"
  echo "[test.sh] collecting the selected tests failed (above)" >&2
  exit 1
fi
mapfile -t steps <"$plan_file"
echo "${steps[*]:-(none)}"
if [ "$dry_run" = 1 ]; then exit 0; fi

describe() { .venv/bin/python -c "from tests.setup_steps import STEPS; print(STEPS['$1'])"; }
for step in ${steps[@]+"${steps[@]}"}; do
  case "$step" in
    trainer_env:*)  # all the trainers' environments, in one call (at the first one)
      [ -z "${trainers_done:-}" ] || continue
      trainers_done=1
      names=()
      for s in "${steps[@]}"; do [[ $s == trainer_env:* ]] && names+=("${s#trainer_env:}"); done
      echo "== $(describe trainer_env): ${names[*]}"
      .venv/bin/python -c "import sys; from tests.setup_steps import ensure_trainer_envs
ensure_trainer_envs(sys.argv[1:])" "${names[@]}"
      continue ;;
  esac
  echo "== $(describe "$step")"
  case "$step" in
    system) bash scripts/install_system_deps.sh ;;
    vllm_venv)
      .venv/bin/python -c "from devstack.vllm_server import ensure_vllm_venv; print(ensure_vllm_venv())" ;;
    warm_model)
      .venv/bin/python -c "
from devstack.tiny_model.warm import ensure_warm_model
from environments.vllm_cpu import ensure_vllm_venv, venv_python
print(ensure_warm_model(venv_python(ensure_vllm_venv())))
" ;;
    base_image) PYTHON=.venv/bin/python bash scripts/build_base_image.sh ;;
    *) echo "[test.sh] no command for setup step '$step' (tests/setup_steps.py)" >&2; exit 1 ;;
  esac
done

echo "== lint"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== import contract (what may import what: [tool.importlinter] in pyproject.toml)"
.venv/bin/lint-imports

echo "== tests"
# The fixtures of a step outside this plan fail their test, naming the step.
export ROLLOUT_SETUP_PLAN="${steps[*]:-}"
# The slowest setups and tests are listed at the end: where the suite's time goes.
exec .venv/bin/python -m pytest -q -ra --durations=30 "$@"
