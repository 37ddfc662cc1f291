#!/usr/bin/env bash
# Install the agent CLIs at pinned versions into a cache prefix (idempotent).
#
# Why: e2e tests, the local (bubblewrap) backend on a host without the sandbox image, and
# developers all need the *same* agent builds whose wire behaviour the harnesses were
# written against. Pins live in schemas/agent_versions.py (read here by running that file).
#
# Layout under PREFIX (default ${ROLLOUT_CACHE_DIR:-$HOME/.cache/agentic-rollout}/agents):
#   npm/<name>-<version>/      npm --prefix install (native binaries from optional deps)
#   venvs/<name>-<version>/    one Python virtual environment per PyPI agent
#   bin/{claude,codex,hermes,mini}   symlinks to the pinned builds (put this on PATH)
# Each install dir gets a .complete marker only after its smoke check passes, so an
# interrupted run is redone and a finished one is skipped.
#
# Usage: scripts/install_agents.sh [--prefix DIR] [claude_code|codex|hermes|mini_swe_agent ...]
# Prints the bin directory on stdout when done.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX="${ROLLOUT_CACHE_DIR:-$HOME/.cache/agentic-rollout}/agents"
AGENTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) AGENTS+=("$1"); shift ;;
  esac
done
[ ${#AGENTS[@]} -gt 0 ] || AGENTS=(claude_code codex hermes mini_swe_agent)

PY=${PYTHON:-python3}
eval "$("$PY" "$ROOT/schemas/agent_versions.py")"
BIN="$PREFIX/bin"
mkdir -p "$PREFIX/npm" "$PREFIX/venvs" "$BIN"
log() { echo "[install_agents] $*" >&2; }
exec 9>"$PREFIX/.install.lock"
flock 9  # concurrent CI jobs / test sessions share the cache safely

need() {
  command -v "$1" >/dev/null 2>&1 || {
    log "missing '$1': install it first ($2)"; exit 1; }
}

npm_agent() {  # name package version bin-name relative-binary-path
  local name=$1 pkg=$2 ver=$3 binname=$4 rel=$5
  local dir="$PREFIX/npm/$name-$ver"
  if [ ! -f "$dir/.complete" ]; then
    need npm "apt-get install -y nodejs npm"
    log "npm install $pkg@$ver -> $dir"
    rm -rf "$dir"; mkdir -p "$dir"
    # --include=optional: the native binary is an optional (per-platform) dependency.
    npm install --prefix "$dir" --no-save --no-package-lock --no-fund --no-audit \
      --include=optional --loglevel=error "$pkg@$ver" >&2
    local target="$dir/$rel"
    [ -x "$target" ] || { log "no executable at $target after install"; exit 1; }
    file -b "$target" 2>/dev/null | grep -q ELF || head -c4 "$target" | grep -q ELF \
      || { log "$target is not a native binary (optional dependency missing?)"; exit 1; }
    (cd / && "$target" --version >&2)
    touch "$dir/.complete"
  fi
  ln -sfn "$dir/$rel" "$BIN/$binname"
}

pip_agent() {  # name package version module-to-import bin-names...
  local name=$1 pkg=$2 ver=$3 mod=$4; shift 4
  local dir="$PREFIX/venvs/$name-$ver"
  if [ ! -f "$dir/.complete" ]; then
    log "pip install $pkg==$ver -> $dir (python: $("$PY" --version 2>&1))"
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "$pkg==$ver" >&2
    # From / so a project checkout in the cwd cannot shadow the agent's own packages.
    (cd / && "$dir/bin/python" -c "import $mod" >&2)
    touch "$dir/.complete"
  fi
  for b in "$@"; do ln -sfn "$dir/bin/$b" "$BIN/$b"; done
}

codex_rel() {
  case "$(uname -m)" in
    x86_64) echo "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex" ;;
    aarch64) echo "node_modules/@openai/codex-linux-arm64/vendor/aarch64-unknown-linux-musl/bin/codex" ;;
    *) log "unsupported architecture $(uname -m) for codex"; exit 1 ;;
  esac
}

for a in "${AGENTS[@]}"; do
  case "$a" in
    claude_code) npm_agent claude-code "@anthropic-ai/claude-code" "$CLAUDE_CODE_VERSION" claude \
                   "node_modules/@anthropic-ai/claude-code/bin/claude.exe" ;;
    codex) npm_agent codex "@openai/codex" "$CODEX_VERSION" codex "$(codex_rel)" ;;
    hermes) pip_agent hermes "hermes-agent" "$HERMES_VERSION" "hermes_cli, run_agent" hermes ;;
    mini_swe_agent) pip_agent mini-swe-agent "mini-swe-agent" "$MINI_SWE_AGENT_VERSION" \
                      minisweagent mini ;;
    *) log "unknown agent '$a' (known: claude_code codex hermes mini_swe_agent)"; exit 2 ;;
  esac
done
log "done; agents in $BIN"
echo "$BIN"
