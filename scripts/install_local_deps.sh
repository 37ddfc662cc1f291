#!/usr/bin/env bash
# Install the system packages the local (bubblewrap) sandbox backend and the demo need
# (idempotent): bubblewrap, libseccomp (the sandboxes' seccomp filter, via pyseccomp),
# util-linux's prlimit (rlimits when no cgroup applies), e2fsprogs and mount (each
# sandbox's sized disk: an ext4 image, loop-mounted), python3-venv (the project's and
# the vLLM engine's virtual environments). No docker: that is the docker backend's and
# the test command's (scripts/install_system_deps.sh).
# Safe to rerun: installs only what is missing.
#
#   scripts/install_local_deps.sh [PACKAGE ...]   # also install these (one apt-get run)
set -euo pipefail

log() { echo "[install_local_deps] $*" >&2; }
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need=("$@")
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
dpkg -s libseccomp2 >/dev/null 2>&1 || need+=(libseccomp2)
command -v prlimit >/dev/null 2>&1 || need+=(util-linux)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v mount >/dev/null 2>&1 || need+=(mount)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)

if [ "${#need[@]}" -gt 0 ]; then
  log "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  log "all packages present"
fi

# bubblewrap must be able to create user/net namespaces here.
if ! bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc true 2>/dev/null; then
  log "WARNING: bwrap cannot create namespaces on this host (check kernel.unprivileged_userns_clone / seccomp)"
fi
log "done"
