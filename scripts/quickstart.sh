#!/usr/bin/env bash
# The main job: set up, generate synthetic data, then train DLRM on 4 workers (embedded Ray) with an
# emulated straggler in the middle third, on an EMULATED cluster: sync only, and with sync <-> gba
# switching (~7 minutes after set-up).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/recsync quickstart --out "${1:-runs/quickstart}"
