#!/usr/bin/env bash
# On a machine with a CUDA GPU: the GPU tests, then a short benchmark of the same runs on CPU
# workers and on GPU workers (samples/s, AUC), each arm once, one after another. Nothing here is
# emulated. Usage: bash scripts/gpu_check.sh OUT_DIR [PYTHON] [ROWS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_check.sh OUT_DIR [PYTHON] [ROWS]}
py=${2:-.venv/bin/python}
rows=${3:-300000}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  torch.cuda.get_device_name(0), 'bf16', torch.cuda.is_bf16_supported())" | tee -a "$out/gpu.txt"

$py -m pytest -q -p no:cacheprovider -rs tests/integration/test_gpu.py 2>&1 | tee "$out/test_gpu.log"

$py -m recsync data synth --rows "$rows" --eval-rows $((rows / 10)) --out "$out/data" \
    --processes 4 >"$out/data.log" 2>&1 || { tail -5 "$out/data.log"; exit 1; }
arm() {  # name, then overrides
    local name=$1; shift
    local sets=(--set "data.path=\"$out/data\"" --set output.progress=false
                --set output.plot=false --set output.save_model=false)
    for s in "$@"; do sets+=(--set "$s"); done
    $py -m recsync train --out "$out/runs/$name" "${sets[@]}" >"$out/runs.log.$name" 2>&1 \
        || echo "$name failed: $(tail -3 "$out/runs.log.$name")"
}
arm sync_1w_cpu_fp32 mode=\"sync\" cluster.workers=1 cluster.ps_shards=2 train.dense_precision=\"float32\"
arm sync_1w_gpu_fp32 mode=\"sync\" cluster.workers=1 cluster.ps_shards=2 train.dense_precision=\"float32\" cluster.worker_gpus=1
arm sync_1w_gpu_bf16 mode=\"sync\" cluster.workers=1 cluster.ps_shards=2 train.dense_precision=\"bfloat16\" cluster.worker_gpus=1
arm async_4w_cpu mode=\"async\" cluster.workers=4 cluster.ps_shards=4
arm async_4w_gpu mode=\"async\" cluster.workers=4 cluster.ps_shards=4 cluster.worker_gpus=0.25
arm async_4w_gpu_raycalls mode=\"async\" cluster.workers=4 cluster.ps_shards=4 cluster.worker_gpus=0.25 cluster.transport=\"ray\"
$py - "$out/runs" <<'PY' | tee "$out/gpu_bench.md"
import json, sys
from pathlib import Path
print("| arm | status | samples/s | train s | eval AUC | eval logloss |")
print("|---|---|---|---|---|---|")
for d in sorted(Path(sys.argv[1]).iterdir()):
    s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
    ev = {k: (v if v is not None else float('nan')) for k, v in (s.get('eval') or {}).items()}
    print(f"| {d.name} | {s.get('status', 'no summary')} | {s.get('samples_per_s') or 0:,.0f} | "
          f"{s.get('train_s') or 0:.1f} | {ev.get('auc', float('nan')):.4f} | "
          f"{ev.get('logloss', float('nan')):.4f} |")
PY
