#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest (e.g. -k reader).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --durations: the slowest tests in every CI log (the suite should stay fast: see which grew)
exec .venv/bin/python -m pytest -q --durations=15 "$@"
