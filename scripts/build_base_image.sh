#!/usr/bin/env bash
# Build (or reuse from cache) the sandbox base image and export its rootfs for the
# local backend. Cached by recipe-input hash: a rerun on the same machine takes seconds.
# Needs docker + debootstrap: run scripts/install_system_deps.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m sandboxes.image.base_image build "$@"
