#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest (e.g. -k reader): one pytest run
# of what they select. Without arguments, the whole suite in two runs: the layers without Ray
# (unit, harness, e2e) on up to 4 processes (pytest-xdist; a test file stays in one process),
# then the Ray tests in one process, one at a time (they share one Ray instance). Both runs
# always run; the script fails if either did.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --durations: the slowest tests in every CI log (the suite should stay fast: see which grew)
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q --durations=15 "$@"
fi
start=$SECONDS
rc=0
.venv/bin/python -m pytest -q --durations=15 -n auto --maxprocesses=4 --dist loadfile \
  tests/unit tests/harness tests/e2e || rc=$?
.venv/bin/python -m pytest -q --durations=15 tests/integration || rc=$?
echo "tests: both runs done in $((SECONDS - start)) s (exit status $rc)"
exit $rc
