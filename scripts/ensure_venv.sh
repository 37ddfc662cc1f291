#!/usr/bin/env bash
# The project's virtual environment, usable from where this checkout is now.
#
# Why: a venv hard-codes its own path (script shebangs, the editable install's path to
# the sources). A checkout that was moved or copied with its .venv would run the old
# location's interpreter and code, or fail on a missing one. So a .venv made for another
# location is recreated, then the project is (re)installed editable.
#
#   scripts/ensure_venv.sh [--check] [VENV_DIR]
#
# VENV_DIR defaults to <repo>/.venv; the checkout it serves is its parent directory.
# --check only says whether VENV_DIR is usable here (exit 0) or why not (exit 1).
set -euo pipefail

check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
venv=${1:-"$(cd "$(dirname "$0")/.." && pwd -P)/.venv"}
root=$(cd "$(dirname "$venv")" && pwd -P)
venv="$root/$(basename "$venv")"

log() { echo "[ensure_venv] $*" >&2; }

# Prints why $venv cannot serve $root; nothing when it can.
stale_reason() {
  if [ ! -e "$venv" ]; then echo "no $venv"; return; fi
  if ! "$venv/bin/python" -c pass >/dev/null 2>&1; then
    echo "$venv/bin/python does not run"; return
  fi
  local script line target
  for script in pip rollout; do
    [ -f "$venv/bin/$script" ] || continue
    IFS= read -r line <"$venv/bin/$script" || true
    target=${line#\#!}
    target=${target%% *}
    if [ "$(dirname "$target")" != "$venv/bin" ]; then
      echo "$venv/bin/$script runs $target (made for another location)"; return
    fi
  done
  # The editable install: where `import workers` lands, from a neutral directory.
  local found
  found=$(cd / && "$venv/bin/python" -c \
    'import os, workers; print(os.path.realpath(os.path.dirname(workers.__file__)))' \
    2>/dev/null) || return 0  # not installed yet: the install below does it
  if [ "$found" != "$root/workers" ]; then
    echo "the editable install points at $found, not $root"
  fi
}

reason=$(stale_reason)
if [ "$check_only" = 1 ]; then
  if [ -n "$reason" ]; then echo "$reason"; exit 1; fi
  exit 0
fi
if [ -n "$reason" ]; then
  if [ -e "$venv" ]; then
    log "recreating $venv: $reason"
    rm -rf "$venv"
  fi
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --upgrade pip >/dev/null
(cd "$root" && "$venv/bin/pip" install -q -e ".[dev]")
