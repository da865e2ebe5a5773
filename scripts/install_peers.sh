#!/usr/bin/env bash
# Install TorchRec, the optional peer of `recsync bench peers`, into a virtual environment that
# already holds recsync and torch 2.13.0 (default .venv; VENV=/path/to/venv for another).
# TorchRec is never a dependency of training: without it, the scenario skips its arm.
#
# Not a pyproject extra: torchrec's wheel requires `fbgemm-gpu`, the CUDA build, which pulls
# a CUDA torch; the CPU build of the same FBGEMM is `fbgemm-gpu-cpu`. So its dependencies are
# installed by name here and torchrec itself with --no-deps, and torch is checked unchanged.
# Versions: TorchRec 1.8.0 and fbgemm-gpu-cpu 1.8.0 are the releases built for torch 2.13.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
before=$("$PY" -c "import torch; print(torch.__version__)")
"$PY" -m pip install --disable-pip-version-check --progress-bar off \
  "torch==${before%%+*}" fbgemm-gpu-cpu==1.8.0 tensordict torchmetrics==1.0.3 \
  pyre-extensions iopath
"$PY" -m pip install --disable-pip-version-check --progress-bar off --no-deps torchrec==1.8.0
after=$("$PY" -c "import torch; print(torch.__version__)")
if [ "$before" != "$after" ]; then
  echo "install_peers: torch changed from $before to $after;" \
       "reinstall it (requirements/cpu.txt)" >&2
  exit 1
fi
"$PY" -c "from recsync.bench.peers_torchrec import missing, versions; \
reason = missing(); assert reason is None, reason; \
print('install_peers: ok,', versions(), 'torch $after')"
