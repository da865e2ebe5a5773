#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest (e.g. -k reader).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
