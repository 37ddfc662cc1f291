#!/usr/bin/env bash
# Render the architecture picture: docs/img/architecture.dot -> docs/img/architecture.svg.
# Run it after editing the .dot file and commit both. Needs graphviz's `dot`
# (Debian/Ubuntu: apt-get install graphviz).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v dot >/dev/null 2>&1; then
  echo "graphviz 'dot' not found: apt-get install graphviz" >&2
  exit 1
fi
dot -Tsvg docs/img/architecture.dot -o docs/img/architecture.svg
echo "wrote docs/img/architecture.svg"
