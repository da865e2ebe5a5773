#!/usr/bin/env bash
# Create .venv (if missing) and install recsync with its pinned CPU dependencies into it.
# Idempotent: a second run only checks that everything is installed.
# Elsewhere (GPU, another torch): see README "Installing elsewhere".
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
echo "setup: installing requirements/cpu.txt and recsync[dev] into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  -r requirements/cpu.txt -e '.[dev]'
