#!/usr/bin/env bash
# The main job: set up, then generate synthetic data and train DLRM locally (about 2 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/recsync quickstart --out "${1:-runs/quickstart}"
