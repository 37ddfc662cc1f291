#!/usr/bin/env bash
# Install and start the system services every sandbox backend and the tests need
# (idempotent); the test command runs it.
#
# Why a script: CI (.ci/run) and developers must get the exact same setup — what the
# local backend needs (scripts/install_local_deps.sh: bubblewrap, libseccomp, e2fsprogs,
# ...), plus the docker engine (docker backend, image recipe), debootstrap, tar and zstd
# (base image rootfs), iproute2 (network checks in tests), iptables (the host rule that
# keeps public docker sandboxes off the host's services), headless Chromium and its
# driver (the viewer's browser tests).
# Safe to rerun: installs only what is missing, starts dockerd only if no engine answers.
set -euo pipefail

log() { echo "[install_system_deps] $*" >&2; }
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v tar >/dev/null 2>&1 || need+=(tar)
command -v zstd >/dev/null 2>&1 || need+=(zstd)
dpkg -s debian-archive-keyring >/dev/null 2>&1 || need+=(debian-archive-keyring)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)

bash "$(dirname "$0")/install_local_deps.sh" ${need[@]+"${need[@]}"}

# Start a docker engine if none answers. Logs go to a file so CI can show them.
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: $DOCKERD_LOG)"
  # containerd is embedded/spawned by dockerd from docker.io when not running.
  # setsid: its own session, so it outlives the shell (and process group) that started it.
  $SUDO setsid -f sh -c "exec dockerd >'$DOCKERD_LOG' 2>&1 </dev/null"
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then break; fi
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    log "dockerd did not come up; last log lines:"
    tail -n 30 "$DOCKERD_LOG" >&2 || true
    exit 1
  fi
fi
log "docker engine: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"

log "done"
