#!/usr/bin/env bash
# The engine's and the loop's checks that need a CUDA GPU, as one script for a lent GPU machine.
#
#   bash scripts/gpu_check.sh            # writes logs under ${OUT:-gpu-check}/
#
# It installs the package into a fresh virtual environment next to the machine's CUDA torch (it never
# replaces an installed torch), then runs, each under its own time limit so one hang cannot eat the lease:
#   1. the CUDA tests (tests marked or named cuda, tests/engine -k cuda)
#   2. benchmarks/train_step.py and benchmarks/logprob_memory.py on cuda
#   3. a short `wai train --device cuda` on builtin:small (the loop end to end on the GPU)
#   4. one paper recipe at a small size on cuda (`wai recipe flash_reinforce`, 2 seeds)
# Record what it prints in BENCHMARKS.md, with the GPU's name.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
python3 -m venv --system-site-packages .venv-gpu
. .venv-gpu/bin/activate
python -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA GPU'; print(torch.__version__, torch.cuda.get_device_name(0))" \
  > "$out/torch.txt" 2>&1 || { cat "$out/torch.txt"; exit 1; }
pip install -q --no-deps -e . && pip install -q tqdm tensorboardX matplotlib pytest fastapi uvicorn httpx >/dev/null 2>&1
run() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "exit $? ($name)" | tee -a "$out/$name.txt"
  tail -5 "$out/$name.txt"
}
run cuda-tests 240 python -m pytest -q tests/engine -k cuda -p no:cacheprovider
run train-step 120 python benchmarks/train_step.py --device cuda
run logprob-memory 120 python benchmarks/logprob_memory.py --device cuda
rm -rf /tmp/wai-gpu-run
run wai-train 180 wai train --device cuda --model builtin:small --steps 20 --eval-tasks 32 --no-progress \
  --run-dir /tmp/wai-gpu-run
cp /tmp/wai-gpu-run/summary.json "$out/wai-train-summary.json" 2>/dev/null || true
run recipe 150 wai recipe flash_reinforce --seeds 2 --steps 10 --eval-tasks 32 --device cuda \
  --model builtin:small --run-dir /tmp/wai-gpu-recipe
