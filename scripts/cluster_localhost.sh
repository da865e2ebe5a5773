#!/usr/bin/env bash
# A Ray cluster of 3 nodes on this machine (1 CPU each, the head's port on 127.0.0.1), joined
# with --address: the same steps as on real nodes (docs/cluster.md "Joining a cluster").
#   head node:     ray start --head --port=6390      (prints the address others use)
#   other nodes:   ray start --address=HEAD_IP:6390  (RAY_AUTH_MODE=token and the head's token)
#   any node:      recsync train ... --address HEAD_IP:6390
# Every node needs the same recsync install and the data set at the same path (or data.path at
# a URL). The run spreads its 3 PS shards over the 3 nodes and prints where each actor went.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY=.venv/bin/ray
# Ray 2.60's head turns token authentication on (token in ~/.ray/auth_token); a joining node
# must be told to use it, or the head refuses it
export RAY_AUTH_MODE=token
trap '$RAY stop >/dev/null 2>&1 || true' EXIT
NODE=(--node-ip-address=127.0.0.1 --num-cpus=1 --object-store-memory=200000000 --disable-usage-stats)
$RAY start --head --port=6390 --include-dashboard=false "${NODE[@]}" >/dev/null
for _ in 1 2; do $RAY start --address=127.0.0.1:6390 "${NODE[@]}" >/dev/null; done
[ -f runs/cluster-demo-data/meta.json ] || .venv/bin/recsync data synth --rows 200000 --max-table-rows 20000 --out runs/cluster-demo-data
.venv/bin/recsync train --address 127.0.0.1:6390 --overwrite --out runs/cluster-demo \
  --set 'data.path="runs/cluster-demo-data"' --set 'mode="async"' --set cluster.workers=2 \
  --set cluster.ps_shards=3 --set cluster.shard_cpus=0.2 --set cluster.worker_cpus=0.2 \
  --set 'model.bottom_mlp=[64, 32]' --set 'model.top_mlp=[64, 32]' --set train.batch_size=1024 "$@"
