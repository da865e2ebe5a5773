#!/usr/bin/env bash
# A Ray cluster on this machine, joined with --address: the same steps as on real nodes.
#   head node:     ray start --head --port=6390      (prints the address others use)
#   other nodes:   ray start --address=HEAD_IP:6390
#   any node:      recsync train ... --address HEAD_IP:6390   (on the head: --address auto)
# Every node needs the same recsync install and the data set at the same path.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY=.venv/bin/ray
trap '$RAY stop >/dev/null 2>&1 || true' EXIT
$RAY start --head --port=6390 --num-cpus=2 --include-dashboard=false --disable-usage-stats >/dev/null
[ -f runs/cluster-demo-data/meta.json ] || .venv/bin/recsync data synth --rows 200000 --max-table-rows 20000 --out runs/cluster-demo-data
.venv/bin/recsync train --address auto --overwrite --out runs/cluster-demo \
  --set 'data.path="runs/cluster-demo-data"' --set 'mode="sync"' --set cluster.workers=2 \
  --set cluster.ps_shards=2 --set 'model.bottom_mlp=[64, 32]' --set 'model.top_mlp=[64, 32]' \
  --set train.batch_size=1024 "$@"
