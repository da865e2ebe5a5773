#!/usr/bin/env bash
# Create .venv (if missing) and install recsync with its pinned CPU dependencies into it.
# Idempotent: a second run only checks that everything is installed (seconds).
# Elsewhere (GPU, another torch): see README "Installing elsewhere".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
start=$SECONDS
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
echo "setup: installing requirements/cpu.txt and recsync[dev] into .venv" \
     "(a few minutes on a fresh machine; one line per package)"
# pip's own lines, less the noise: what it collects and installs, and any error
.venv/bin/python -m pip install --disable-pip-version-check --progress-bar off \
  -r requirements/cpu.txt -e '.[dev]' \
  | { grep -E --line-buffered "^(Collecting|Installing|Successfully|ERROR|error)" || true; }
echo "setup: done in $((SECONDS - start)) s"
