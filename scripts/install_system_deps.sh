#!/usr/bin/env bash
# Install and start the system services the sandbox backends need (idempotent).
#
# Why a script: CI (.ci/run) and developers must get the exact same setup —
# docker engine (docker backend, image recipe), bubblewrap, libseccomp
# and e2fsprogs (local backend), debootstrap (base image rootfs), iproute2 (network
# checks in tests).
# Safe to rerun: installs only what is missing, starts dockerd only if no engine answers.
set -euo pipefail

log() { echo "[install_system_deps] $*" >&2; }
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v tar >/dev/null 2>&1 || need+=(tar)
command -v zstd >/dev/null 2>&1 || need+=(zstd)
dpkg -s debian-archive-keyring >/dev/null 2>&1 || need+=(debian-archive-keyring)
command -v prlimit >/dev/null 2>&1 || need+=(util-linux)
# libseccomp compiles the bwrap sandboxes' seccomp filter (via pyseccomp); mkfs.ext4
# and loop mounts give each sandbox its sized disk (resources.disk_mb).
dpkg -s libseccomp2 >/dev/null 2>&1 || need+=(libseccomp2)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v mount >/dev/null 2>&1 || need+=(mount)

if [ "${#need[@]}" -gt 0 ]; then
  log "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  log "all packages present"
fi

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

# bubblewrap must be able to create user/net namespaces here.
if ! bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc true 2>/dev/null; then
  log "WARNING: bwrap cannot create namespaces on this host (check kernel.unprivileged_userns_clone / seccomp)"
fi
log "done"
